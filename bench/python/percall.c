/* The C side of the Python binding's per-call overhead benchmark
 * (bench/python/bench_python.py): the same calls, at the same tiny shapes,
 * made directly from C. Prints "<name> <ns per call>" lines.
 *
 *   cc -O2 percall.c $(pkg-config --cflags --libs osftrt) -o percall && ./percall 200000
 */
#include <osftrt/osftrt.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

#define CHECK(x)                                          \
  do {                                                    \
    if ((x) != OSFT_STATUS_SUCCESS) {                     \
      fprintf(stderr, "%s: %s\n", #x, osft_last_error()); \
      return 1;                                           \
    }                                                     \
  } while (0)

static DLTensor mk(float *data, int64_t *shape, int ndim) {
  DLTensor t = {0};
  t.data = data;
  t.device.device_type = kDLCPU;
  t.ndim = ndim;
  t.dtype.code = kDLFloat;
  t.dtype.bits = 32;
  t.dtype.lanes = 1;
  t.shape = shape;
  return t;
}

int main(int argc, char **argv) {
  long iters = argc > 1 ? atol(argv[1]) : 100000;
  osft_context_t ctx;
  CHECK(osft_context_create(&ctx, NULL));
  float w[64], x[16], y[16];
  for (int i = 0; i < 64; ++i) w[i] = (float)((i * 37 % 17) - 8) / 7.0f + (i % 9 == 0);
  for (int i = 0; i < 16; ++i) x[i] = (float)(i % 5) - 2.0f + 0.5f;
  int64_t sw[2] = {8, 8}, sx[2] = {2, 8}, sy[2] = {2, 8};
  DLTensor tw = mk(w, sw, 2), tx = mk(x, sx, 2), ty = mk(y, sy, 2);
  osft_flinear_t layer;
  CHECK(osft_flinear_create_from_weight(ctx, &tw, NULL, &layer));
  double t0;
  size_t bytes;

  /* a handle-only call */
  for (long i = 0; i < 1000; ++i) CHECK(osft_context_get_workspace_size(ctx, &bytes));
  t0 = now();
  for (long i = 0; i < iters; ++i) CHECK(osft_context_get_workspace_size(ctx, &bytes));
  printf("context_get_workspace_size %.1f\n", (now() - t0) / iters * 1e9);

  /* a compute call with three tensors (bias NULL) */
  for (long i = 0; i < 1000; ++i) CHECK(osft_flinear_forward(layer, &tx, NULL, &ty));
  t0 = now();
  for (long i = 0; i < iters; ++i) CHECK(osft_flinear_forward(layer, &tx, NULL, &ty));
  printf("flinear_forward_2x8x8 %.1f\n", (now() - t0) / iters * 1e9);

  CHECK(osft_flinear_destroy(layer));
  CHECK(osft_context_destroy(ctx));
  return 0;
}
