/*
 * bench_svd — the decomposition an OSFT layer starts from
 * (osft_flinear_create_from_weight: the SVD of W, in fp64, and the split
 * into the frozen and trainable factors), on Llama-3.1-8B's 4096x4096 and
 * 14336x4096 projections, so that a GPU run says whether a faster path
 * (fp64 eigendecomposition of the Gram matrix, or gesvdj) is needed. The
 * same shapes through torch.linalg.svd: bench/gpu/svd_torch.py, run side
 * by side (bench/gpu/run_svd.sh runs both).
 *
 *   bench_svd [--cpu] [--scale S] [--reps R] [--csv FILE]
 *
 * CUDA when the library has it and a GPU is visible (builds with
 * OSFT_BENCH_CUDA), else the CPU (LAPACK), where the shapes are divided by S
 * (default 4 on the CPU, 1 on a GPU). Prints the median and the minimum of R
 * runs (default 3) after one warm-up, and the context's peak device (or
 * host) memory. The weight is uniform random: its singular values decay
 * slowly, the hard case for QR-iteration SVDs.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef OSFT_BENCH_CUDA
#include <cuda_runtime.h>
#endif

#include "bench_util.h"
#include "osftrt/osftrt.h"

int main(int argc, char **argv) {
  int force_cpu = 0, reps = 3;
  double scale = 0;
  const char *csv = NULL;
  for (int i = 1; i < argc; ++i) {
    if (!strcmp(argv[i], "--cpu"))
      force_cpu = 1;
    else if (!strcmp(argv[i], "--scale") && i + 1 < argc)
      scale = atof(argv[++i]);
    else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
      reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--csv") && i + 1 < argc)
      csv = argv[++i];
    else {
      fprintf(stderr, "usage: bench_svd [--cpu] [--scale S] [--reps R] [--csv FILE]\n");
      return 2;
    }
  }
  if (reps < 1) reps = 1;
  int gpus = 0;
  osft_device_count(OSFT_DEVICE_CUDA, &gpus);
  const int cuda = !force_cpu && gpus > 0;
#ifndef OSFT_BENCH_CUDA
  if (cuda) {
    fprintf(stderr, "bench_svd: built without CUDA support in the benchmark\n");
    return 2;
  }
#endif
  if (scale <= 0) scale = cuda ? 1 : 4;
  osft_context_options_t o;
  CHECK(osft_context_options_init(&o, sizeof o));
  o.device_type = cuda ? OSFT_DEVICE_CUDA : OSFT_DEVICE_CPU;
  osft_context_t ctx;
  CHECK(osft_context_create(&ctx, &o));
  FILE *out = csv ? fopen(csv, "w") : NULL;
  if (out) fprintf(out, "device,n,k,reps,median_ms,min_ms,peak_bytes\n");
  printf(
      "decomposition (osft_flinear_create_from_weight, rank ratio 0.5), %s, scale 1/%g\n",
      cuda ? "CUDA" : "CPU", scale);
  printf("%8s %8s %12s %12s %14s\n", "N", "K", "median ms", "min ms", "peak MiB");
  const int shapes[2][2] = {{4096, 4096}, {14336, 4096}};
  for (int s = 0; s < 2; ++s) {
    const int64_t n = (int64_t)(shapes[s][0] / scale),
                  k = (int64_t)(shapes[s][1] / scale);
    const size_t count = (size_t)(n * k);
    float *w = xmalloc(count * sizeof(float));
    fill_uniform(w, count, 777u + (unsigned)s, 0.05f);
    int64_t shape[2] = {n, k};
    DLTensor t = host_f32_tensor(w, 2, shape);
    void *dev = NULL;
#ifdef OSFT_BENCH_CUDA
    if (cuda) {
      if (cudaMalloc(&dev, count * sizeof(float)) != cudaSuccess ||
          cudaMemcpy(dev, w, count * sizeof(float), cudaMemcpyHostToDevice) !=
              cudaSuccess) {
        fprintf(stderr, "bench_svd: cannot stage %lld x %lld on the GPU\n", (long long)n,
                (long long)k);
        return 1;
      }
      t.data = dev;
      t.device.device_type = kDLCUDA;
    }
#endif
    osft_flinear_options_t lo;
    CHECK(osft_flinear_options_init(&lo, sizeof lo));
    lo.rank_ratio = 0.5;
    double *ms = xmalloc(sizeof(double) * (size_t)reps);
    CHECK(osft_context_reset_peak_memory(ctx));
    for (int r = -1; r < reps; ++r) { /* r = -1: warm-up */
      osft_flinear_t layer;
      CHECK(osft_context_synchronize(ctx));
      const double t0 = now_ms();
      CHECK(osft_flinear_create_from_weight(ctx, &t, &lo, &layer));
      CHECK(osft_context_synchronize(ctx));
      const double t1 = now_ms();
      CHECK(osft_flinear_destroy(layer));
      if (r >= 0) ms[r] = t1 - t0;
    }
    osft_memory_stats_t st;
    memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    CHECK(osft_context_get_memory_stats(ctx, &st));
    const double peak = (double)(cuda ? st.device_peak : st.host_peak);
    qsort(ms, (size_t)reps, sizeof(double), cmp_double);
    printf("%8lld %8lld %12.1f %12.1f %14.1f\n", (long long)n, (long long)k, ms[reps / 2],
           ms[0], peak / 1048576.0);
    if (out)
      fprintf(out, "%s,%lld,%lld,%d,%.3f,%.3f,%.0f\n", cuda ? "cuda" : "cpu",
              (long long)n, (long long)k, reps, ms[reps / 2], ms[0], peak);
    free(ms);
#ifdef OSFT_BENCH_CUDA
    if (dev) cudaFree(dev);
#endif
    free(w);
  }
  if (out) fclose(out);
  CHECK(osft_context_destroy(ctx));
  return 0;
}
