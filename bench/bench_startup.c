/* What loading libosftrt costs a CPU program (issue 42): started as a fresh
 * process by bench/run_startup.sh, it prints its resident set at main's
 * first line and after one fused cross-entropy call on a CPU context (loss
 * and gradients; argv: tokens hidden vocabulary, default 8 64 1024, where
 * the start-up dominates), and the mapped CUDA-side libraries. The script
 * times whole processes (start to exit) against each library build,
 * interleaved. */
#include "bench_util.h"

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

int main(int argc, char **argv) {
  const long rss_main = rss_kib();
  const int maps_main = cuda_mappings();
  const int64_t M = argc > 1 ? atoll(argv[1]) : 8, H = argc > 2 ? atoll(argv[2]) : 64,
                V = argc > 3 ? atoll(argv[3]) : 1024;
  float *x = xmalloc(sizeof(float) * M * H), *w = xmalloc(sizeof(float) * V * H);
  float *gx = xmalloc(sizeof(float) * M * H), *gw = xmalloc(sizeof(float) * V * H);
  int64_t *y = xmalloc(sizeof(int64_t) * M);
  float loss = 0;
  fill_uniform(x, (size_t)(M * H), 1, 1.0f);
  fill_uniform(w, (size_t)(V * H), 2, 0.04f);
  for (int64_t i = 0; i < M; ++i) y[i] = (i * 7919) % V;
  int64_t xs[2] = {M, H}, ws[2] = {V, H}, ys[1] = {M};
  DLTensor tx = host_f32_tensor(x, 2, xs), tw = host_f32_tensor(w, 2, ws);
  DLTensor tgx = host_f32_tensor(gx, 2, xs), tgw = host_f32_tensor(gw, 2, ws);
  DLTensor tl = host_f32_tensor(&loss, 0, NULL), ty = host_f32_tensor(NULL, 1, ys);
  ty.data = y;
  ty.dtype.code = kDLInt;
  ty.dtype.bits = 64;
  osft_context_t ctx = NULL;
  osft_flce_t ce = NULL;
  osft_flce_inputs_t in;
  osft_flce_outputs_t out;
  CHECK(osft_context_create(&ctx, NULL));
  CHECK(osft_flce_create(ctx, NULL, &ce));
  CHECK(OSFT_FLCE_INPUTS_INIT(&in));
  CHECK(OSFT_FLCE_OUTPUTS_INIT(&out));
  in.x = &tx;
  in.weight = &tw;
  in.targets = &ty;
  out.loss = &tl;
  out.grad_x = &tgx;
  out.grad_weight = &tgw;
  CHECK(osft_flce_compute(ce, &in, &out));
  printf(
      "rss_main_kib=%ld rss_after_kib=%ld cuda_maps_main=%d cuda_maps_after=%d "
      "loss=%.6f\n",
      rss_main, rss_kib(), maps_main, cuda_mappings(), loss);
  osft_flce_destroy(ce);
  osft_context_destroy(ctx);
  free(x), free(w), free(gx), free(gw), free(y);
  return 0;
}
