/* What loading libosftrt costs a CPU program (issue 42): started as a fresh
 * process by bench/run_startup.sh, it prints its resident set at main's
 * first line and after one fused cross-entropy call on a CPU context (loss
 * and gradients; argv: tokens hidden vocabulary, default 8 64 1024, where
 * the start-up dominates), and the mapped CUDA-side libraries. The script
 * times whole processes (start to exit) against each library build,
 * interleaved. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <osftrt/osftrt.h>

static long rss_kib(void) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  long kib = -1;
  while (f != NULL && fgets(line, sizeof line, f) != NULL)
    if (sscanf(line, "VmRSS: %ld kB", &kib) == 1) break;
  if (f != NULL) fclose(f);
  return kib;
}

/* Mappings of the CUDA-side libraries (by file name). */
static int cuda_mappings(void) {
  static const char *const libs[] = {"libcuda",       "libcublas", "libcusolver",
                                     "libcusparse",   "libnccl",   "libnvJitLink",
                                     "libosftrt_cuda"};
  FILE *f = fopen("/proc/self/maps", "r");
  char line[1024];
  int n = 0;
  while (f != NULL && fgets(line, sizeof line, f) != NULL) {
    const char *base = strrchr(line, '/');
    for (size_t i = 0; base != NULL && i < sizeof libs / sizeof *libs; ++i)
      if (strncmp(base + 1, libs[i], strlen(libs[i])) == 0) {
        ++n;
        break;
      }
  }
  if (f != NULL) fclose(f);
  return n;
}

static DLTensor tensor(void *data, uint8_t code, uint8_t bits, int ndim, int64_t *shape) {
  DLTensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.device.device_type = kDLCPU;
  t.ndim = ndim;
  t.dtype.code = code;
  t.dtype.bits = bits;
  t.dtype.lanes = 1;
  t.shape = shape;
  return t;
}

int main(int argc, char **argv) {
  const long rss_main = rss_kib();
  const int maps_main = cuda_mappings();
  const int64_t M = argc > 1 ? atoll(argv[1]) : 8, H = argc > 2 ? atoll(argv[2]) : 64,
                V = argc > 3 ? atoll(argv[3]) : 1024;
  float *x = malloc(sizeof(float) * M * H), *w = malloc(sizeof(float) * (size_t)V * H);
  float *gx = malloc(sizeof(float) * M * H), *gw = malloc(sizeof(float) * (size_t)V * H);
  int64_t *y = malloc(sizeof(int64_t) * M);
  float loss = 0;
  unsigned s = 1;
  for (size_t i = 0; i < (size_t)M * H; ++i)
    x[i] = (float)((s = s * 1664525u + 1013904223u) >> 8) / 16777216.0f - 0.5f;
  for (size_t i = 0; i < (size_t)V * H; ++i)
    w[i] = (float)((s = s * 1664525u + 1013904223u) >> 8) / 16777216.0f * 0.02f;
  for (int i = 0; i < M; ++i)
    y[i] = (int64_t)((s = s * 1664525u + 1013904223u) % (unsigned)V);
  int64_t xs[2] = {M, H}, ws[2] = {V, H}, ys[1] = {M};
  DLTensor tx = tensor(x, kDLFloat, 32, 2, xs), tw = tensor(w, kDLFloat, 32, 2, ws);
  DLTensor tgx = tensor(gx, kDLFloat, 32, 2, xs), tgw = tensor(gw, kDLFloat, 32, 2, ws);
  DLTensor ty = tensor(y, kDLInt, 64, 1, ys), tl = tensor(&loss, kDLFloat, 32, 0, NULL);
  osft_context_t ctx = NULL;
  osft_flce_t ce = NULL;
  osft_flce_inputs_t in;
  osft_flce_outputs_t out;
  if (osft_context_create(&ctx, NULL) || osft_flce_create(ctx, NULL, &ce) ||
      OSFT_FLCE_INPUTS_INIT(&in) || OSFT_FLCE_OUTPUTS_INIT(&out)) {
    fprintf(stderr, "bench_startup: %s\n", osft_last_error());
    return 1;
  }
  in.x = &tx;
  in.weight = &tw;
  in.targets = &ty;
  out.loss = &tl;
  out.grad_x = &tgx;
  out.grad_weight = &tgw;
  if (osft_flce_compute(ce, &in, &out) != OSFT_STATUS_SUCCESS) {
    fprintf(stderr, "bench_startup: %s\n", osft_last_error());
    return 1;
  }
  printf(
      "rss_main_kib=%ld rss_after_kib=%ld cuda_maps_main=%d cuda_maps_after=%d "
      "loss=%.6f\n",
      rss_main, rss_kib(), maps_main, cuda_mappings(), loss);
  osft_flce_destroy(ce);
  osft_context_destroy(ctx);
  free(x), free(w), free(gx), free(gw), free(y);
  return 0;
}
