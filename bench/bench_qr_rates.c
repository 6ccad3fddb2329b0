/*
 * bench_qr_rates — the cuBLAS and cuSOLVER steps that osft_qr_batch's
 * methods are made of (src/backend/qr_backend.h), timed one at a time on
 * one stream at the sizes of SOAP's lists, and what they add up to per
 * list and method. bench/results/qr_tensorcore_plan.md estimated the TF32
 * path from assumed rates (dpotrf's unknown, 10-15 TFLOP/s assumed); this
 * measures them, so that the same GPU call that times osft_qr_batch
 * (bench_qr) says which step a method's time goes to.
 *
 *   bench_qr_rates [--sizes 1024,2048,...] [--reps R] [--csv FILE]
 *
 * Per size n (square, as SOAP's are; default 1024, 2048, 3072, 4096,
 * 6144), the median of R runs (default 3) after a warm-up:
 *   householder   sgeqrf + sorgqr                          8/3 n^3
 *   gram_tf32     cublasGemmEx n x n x n, TF32             2 n^3
 *   dsyrk         fp64 Gram matrix                         n^3
 *   dpotrf        fp64 Cholesky                            n^3 / 3
 *   dtrsm         fp64 W R^-1, n x n                       n^3
 *   upd_tf32      one TF32 product of the blocked solve's
 *                 updates, W_J -= X_<J R_<J,J over the 256-column
 *                 blocks J (3 of them per 3xTF32 solve)    n^3
 *   strsm_blk     the fp32 diagonal-block solves (n x 256)  n^2 256
 *   dtrsm_blk     the fp64 ones of the TF32 path's last pass n^2 256
 * Per list (soap-gpt2-1024, soap-gpt2-2048; 96 matrices), the sum of its
 * matrices' steps, one after another on one stream: Householder; the fp64
 * CholeskyQR3 (3 x dsyrk + dpotrf + dtrsm); the TF32 path (3 x gram_tf32 +
 * dpotrf + 3 upd_tf32 + strsm_blk, then dsyrk + dpotrf + 3 upd_tf32 +
 * dtrsm_blk). Element-wise passes (splits, conversions) are not counted:
 * the difference to bench_qr's measured time is them plus the overlap of
 * osft_qr_batch's lanes.
 */
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cusolverDn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"

enum { kMaxSizes = 16, kBlock = 256 };

enum step {
  HOUSEHOLDER,
  GRAM_TF32,
  DSYRK,
  DPOTRF,
  DTRSM,
  UPD_TF32,
  STRSM_BLK,
  DTRSM_BLK,
  STEPS
};
static const char *const kStepName[STEPS] = {"householder", "gram_tf32", "dsyrk",
                                             "dpotrf",      "dtrsm",     "upd_tf32",
                                             "strsm_blk",   "dtrsm_blk"};

static void check(int ok, const char *what) {
  if (!ok) {
    fprintf(stderr, "bench_qr_rates: %s failed\n", what);
    exit(1);
  }
}
#define CUDA(x) check((x) == cudaSuccess, #x)
#define BLAS(x) check((x) == CUBLAS_STATUS_SUCCESS, #x)
#define SOLVER(x) check((x) == CUSOLVER_STATUS_SUCCESS, #x)

/* Flops of a step at size n (the columns above). */
static double step_flops(int s, double n) {
  switch (s) {
    case HOUSEHOLDER: return 8.0 / 3.0 * n * n * n;
    case GRAM_TF32: return 2.0 * n * n * n;
    case DPOTRF: return n * n * n / 3.0;
    case STRSM_BLK:
    case DTRSM_BLK: return n * n * kBlock;
    default: return n * n * n;
  }
}

/* The device buffers of one size. */
typedef struct {
  int n, lwork; /* lwork: doubles of `work` (the fp32 solver calls get twice as many
                   floats) */
  float *a32, *b32, *r32, *tau;
  double *a64, *g64, *w64, *r64, *work;
  int *info;
} bufs;

/* A uniform in [-0.5, 0.5) (a32, a64), and R = I + triu(A) / n (r32, r64):
 * a unit upper triangle whose solves stay bounded. */
static void fill(bufs *b, unsigned seed) {
  const int n = b->n;
  const size_t nn = (size_t)n * n;
  float *h32 = xmalloc(nn * sizeof(float));
  double *h64 = xmalloc(nn * sizeof(double));
  fill_uniform(h32, nn, seed, 1.0f);
  for (size_t e = 0; e < nn; ++e) h64[e] = h32[e];
  CUDA(cudaMemcpy(b->a32, h32, nn * sizeof(float), cudaMemcpyHostToDevice));
  CUDA(cudaMemcpy(b->a64, h64, nn * sizeof(double), cudaMemcpyHostToDevice));
  for (int j = 0; j < n; ++j)
    for (int i = 0; i < n; ++i) {
      const size_t e = (size_t)i + (size_t)j * n;
      h64[e] = i == j ? 1.0 : i < j ? h64[e] / n : 0.0;
      h32[e] = (float)h64[e];
    }
  CUDA(cudaMemcpy(b->r32, h32, nn * sizeof(float), cudaMemcpyHostToDevice));
  CUDA(cudaMemcpy(b->r64, h64, nn * sizeof(double), cudaMemcpyHostToDevice));
  free(h32);
  free(h64);
}

/* Runs step s once (the setup copies before `t0`, which brackets the step). */
static void run_step(int s, bufs *b, cublasHandle_t blas, cusolverDnHandle_t solver,
                     cudaStream_t stream, cudaEvent_t t0) {
  const int n = b->n;
  const size_t nn = (size_t)n * n;
  const float one = 1.0f, zero = 0.0f, minus = -1.0f;
  const double one64 = 1.0, zero64 = 0.0;
  switch (s) {
    case HOUSEHOLDER:
      CUDA(cudaMemcpyAsync(b->b32, b->a32, nn * sizeof(float), cudaMemcpyDeviceToDevice,
                           stream));
      CUDA(cudaEventRecord(t0, stream));
      SOLVER(cusolverDnSgeqrf(solver, n, n, b->b32, n, b->tau, (float *)b->work,
                              2 * b->lwork, b->info));
      SOLVER(cusolverDnSorgqr(solver, n, n, n, b->b32, n, b->tau, (float *)b->work,
                              2 * b->lwork, b->info));
      return;
    case GRAM_TF32:
      CUDA(cudaEventRecord(t0, stream));
      BLAS(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, n, n, n, &one, b->a32, CUDA_R_32F,
                        n, b->a32, CUDA_R_32F, n, &zero, b->b32, CUDA_R_32F, n,
                        CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_GEMM_DEFAULT));
      return;
    case DSYRK:
      CUDA(cudaEventRecord(t0, stream));
      BLAS(cublasDsyrk(blas, CUBLAS_FILL_MODE_UPPER, CUBLAS_OP_T, n, n, &one64, b->a64, n,
                       &zero64, b->g64, n));
      return;
    case DPOTRF: /* of A^T A (SPD), rebuilt before each run */
      BLAS(cublasDsyrk(blas, CUBLAS_FILL_MODE_UPPER, CUBLAS_OP_T, n, n, &one64, b->a64, n,
                       &zero64, b->g64, n));
      CUDA(cudaEventRecord(t0, stream));
      SOLVER(cusolverDnDpotrf(solver, CUBLAS_FILL_MODE_UPPER, n, b->g64, n, b->work,
                              b->lwork, b->info));
      return;
    case DTRSM: /* W R^-1 with R = I + triu(A) / n */
    case DTRSM_BLK:
      CUDA(cudaMemcpyAsync(b->w64, b->a64, nn * sizeof(double), cudaMemcpyDeviceToDevice,
                           stream));
      CUDA(cudaEventRecord(t0, stream));
      for (int j0 = 0; j0 < n; j0 += (s == DTRSM ? n : kBlock)) {
        const int jb = s == DTRSM ? n : (n - j0 < kBlock ? n - j0 : kBlock);
        BLAS(cublasDtrsm(blas, CUBLAS_SIDE_RIGHT, CUBLAS_FILL_MODE_UPPER, CUBLAS_OP_N,
                         CUBLAS_DIAG_UNIT, n, jb, &one64, b->r64 + j0 + (size_t)j0 * n, n,
                         b->w64 + (size_t)j0 * n, n));
      }
      return;
    case UPD_TF32:
      CUDA(cudaEventRecord(t0, stream));
      for (int j0 = kBlock; j0 < n; j0 += kBlock) {
        const int jb = n - j0 < kBlock ? n - j0 : kBlock;
        BLAS(cublasGemmEx(blas, CUBLAS_OP_N, CUBLAS_OP_N, n, jb, j0, &minus, b->a32,
                          CUDA_R_32F, n, b->r32 + (size_t)j0 * n, CUDA_R_32F, n, &one,
                          b->b32 + (size_t)j0 * n, CUDA_R_32F, n,
                          CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_GEMM_DEFAULT));
      }
      return;
    case STRSM_BLK:
      CUDA(cudaEventRecord(t0, stream));
      for (int j0 = 0; j0 < n; j0 += kBlock) {
        const int jb = n - j0 < kBlock ? n - j0 : kBlock;
        BLAS(cublasStrsm(blas, CUBLAS_SIDE_RIGHT, CUBLAS_FILL_MODE_UPPER, CUBLAS_OP_N,
                         CUBLAS_DIAG_UNIT, n, jb, &one, b->r32 + j0 + (size_t)j0 * n, n,
                         b->b32 + (size_t)j0 * n, n));
      }
      return;
  }
}

/* The median ms of `reps` runs of step s after a warm-up. */
static double time_step(int s, bufs *b, cublasHandle_t blas, cusolverDnHandle_t solver,
                        cudaStream_t stream, int reps) {
  cudaEvent_t t0, t1;
  CUDA(cudaEventCreate(&t0));
  CUDA(cudaEventCreate(&t1));
  double ms[64];
  if (reps > 64) reps = 64;
  for (int r = -1; r < reps; ++r) {
    run_step(s, b, blas, solver, stream, t0);
    CUDA(cudaEventRecord(t1, stream));
    CUDA(cudaEventSynchronize(t1));
    float f = 0.0f;
    CUDA(cudaEventElapsedTime(&f, t0, t1));
    if (r >= 0) ms[r] = f;
  }
  CUDA(cudaEventDestroy(t0));
  CUDA(cudaEventDestroy(t1));
  qsort(ms, (size_t)reps, sizeof(double), cmp_double);
  return ms[reps / 2];
}

static int workspace(cusolverDnHandle_t solver, int n, float *a32, double *g64) {
  int l1 = 0, l2 = 0, l3 = 0;
  SOLVER(cusolverDnSgeqrf_bufferSize(solver, n, n, a32, n, &l1));
  SOLVER(cusolverDnSorgqr_bufferSize(solver, n, n, n, a32, n, a32, &l2));
  SOLVER(cusolverDnDpotrf_bufferSize(solver, CUBLAS_FILL_MODE_UPPER, n, g64, n, &l3));
  /* lwork in doubles: enough for either (the float ones take half) */
  const int f = l1 > l2 ? l1 : l2;
  return (f + 1) / 2 > l3 ? (f + 1) / 2 : l3;
}

/* ms[s] for one size. */
static void measure(int n, int reps, cublasHandle_t blas, cusolverDnHandle_t solver,
                    cudaStream_t stream, double *ms) {
  bufs b;
  memset(&b, 0, sizeof b);
  b.n = n;
  const size_t nn = (size_t)n * n;
  CUDA(cudaMalloc((void **)&b.a32, nn * sizeof(float)));
  CUDA(cudaMalloc((void **)&b.b32, nn * sizeof(float)));
  CUDA(cudaMalloc((void **)&b.tau, (size_t)n * sizeof(float)));
  CUDA(cudaMalloc((void **)&b.a64, nn * sizeof(double)));
  CUDA(cudaMalloc((void **)&b.g64, nn * sizeof(double)));
  CUDA(cudaMalloc((void **)&b.w64, nn * sizeof(double)));
  CUDA(cudaMalloc((void **)&b.r32, nn * sizeof(float)));
  CUDA(cudaMalloc((void **)&b.r64, nn * sizeof(double)));
  CUDA(cudaMalloc((void **)&b.info, sizeof(int)));
  b.lwork = workspace(solver, n, b.a32, b.g64);
  CUDA(cudaMalloc((void **)&b.work, (size_t)b.lwork * sizeof(double)));
  fill(&b, 12345u + (unsigned)n);
  CUDA(cudaMemcpy(b.b32, b.a32, nn * sizeof(float), cudaMemcpyDeviceToDevice));
  for (int s = 0; s < STEPS; ++s) ms[s] = time_step(s, &b, blas, solver, stream, reps);
  cudaFree(b.a32);
  cudaFree(b.b32);
  cudaFree(b.tau);
  cudaFree(b.a64);
  cudaFree(b.g64);
  cudaFree(b.w64);
  cudaFree(b.r32);
  cudaFree(b.r64);
  cudaFree(b.info);
  cudaFree(b.work);
}

/* A method's serial time for one matrix from its steps' times. */
static double method_ms(int method, const double *ms) {
  switch (method) {
    case 0: return ms[HOUSEHOLDER];
    case 1: return 3.0 * (ms[DSYRK] + ms[DPOTRF] + ms[DTRSM]);
    default:
      return 3.0 * (ms[GRAM_TF32] + ms[DPOTRF] + 3.0 * ms[UPD_TF32] + ms[STRSM_BLK]) +
             ms[DSYRK] + ms[DPOTRF] + 3.0 * ms[UPD_TF32] + ms[DTRSM_BLK];
  }
}

int main(int argc, char **argv) {
  int sizes[kMaxSizes] = {1024, 2048, 3072, 4096, 6144}, count = 5, reps = 3;
  const char *csv = NULL;
  for (int i = 1; i < argc; ++i) {
    if (!strcmp(argv[i], "--sizes") && i + 1 < argc) {
      count = 0;
      for (char *p = strtok(argv[++i], ","); p != NULL && count < kMaxSizes;
           p = strtok(NULL, ","))
        sizes[count++] = atoi(p);
    } else if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
      reps = atoi(argv[++i]);
    } else if (!strcmp(argv[i], "--csv") && i + 1 < argc) {
      csv = argv[++i];
    } else {
      fprintf(stderr,
              "usage: bench_qr_rates [--sizes 1024,2048,...] [--reps R] [--csv FILE]\n");
      return 2;
    }
  }
  if (reps < 1) reps = 1;
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus == 0) {
    fprintf(stderr,
            "bench_qr_rates: no CUDA device (it times cuBLAS and cuSOLVER only)\n");
    return 2;
  }
  struct cudaDeviceProp prop;
  CUDA(cudaGetDeviceProperties(&prop, 0));
  cudaStream_t stream;
  cublasHandle_t blas;
  cusolverDnHandle_t solver;
  CUDA(cudaStreamCreate(&stream));
  BLAS(cublasCreate(&blas));
  BLAS(cublasSetStream(blas, stream));
  SOLVER(cusolverDnCreate(&solver));
  SOLVER(cusolverDnSetStream(solver, stream));

  static double ms[kMaxSizes][STEPS];
  printf("# %s; one stream, median of %d after a warm-up; ms (TFLOP/s)\n", prop.name,
         reps);
  printf("%6s", "n");
  for (int s = 0; s < STEPS; ++s) printf(" %21s", kStepName[s]);
  printf("\n");
  FILE *out = csv != NULL ? fopen(csv, "w") : NULL;
  if (out != NULL) fprintf(out, "device,n,step,ms,tflops\n");
  for (int i = 0; i < count; ++i) {
    measure(sizes[i], reps, blas, solver, stream, ms[i]);
    printf("%6d", sizes[i]);
    for (int s = 0; s < STEPS; ++s) {
      const double tf = step_flops(s, sizes[i]) / (ms[i][s] * 1e9);
      printf(" %11.3f (%6.1f)", ms[i][s], tf);
      if (out != NULL)
        fprintf(out, "%s,%d,%s,%.4f,%.2f\n", prop.name, sizes[i], kStepName[s], ms[i][s],
                tf);
    }
    printf("\n");
  }
  /* The two SOAP lists of bench_qr --workload (12 layers of H, 3H, H, H,
   * H, F, F, H), from the measured sizes. */
  static const int kList[2][8] = {{1024, 3072, 1024, 1024, 1024, 4096, 4096, 1024},
                                  {2048, 6144, 2048, 2048, 2048, 4096, 4096, 2048}};
  static const char *const kListName[2] = {"soap-gpt2-1024", "soap-gpt2-2048"};
  static const char *const kMethod[3] = {"householder", "cholesky (fp64 CholeskyQR3)",
                                         "tf32"};
  printf(
      "# per list, the steps summed one after another (no lanes, no element-wise "
      "passes), ms\n");
  for (int l = 0; l < 2; ++l) {
    double total[3] = {0, 0, 0};
    int missing = 0;
    for (int k = 0; k < 8; ++k) {
      int found = -1;
      for (int i = 0; i < count; ++i)
        if (sizes[i] == kList[l][k]) found = i;
      if (found < 0) {
        missing = kList[l][k];
        break;
      }
      for (int m = 0; m < 3; ++m) total[m] += 12.0 * method_ms(m, ms[found]);
    }
    if (missing) {
      printf("%s: size %d not measured\n", kListName[l], missing);
      continue;
    }
    for (int m = 0; m < 3; ++m) {
      printf("%s %-28s %9.1f\n", kListName[l], kMethod[m], total[m]);
      if (out != NULL)
        fprintf(out, "%s,%s,%s,%.2f,\n", prop.name, kListName[l], kMethod[m], total[m]);
    }
  }
  if (out != NULL) fclose(out);
  cusolverDnDestroy(solver);
  cublasDestroy(blas);
  cudaStreamDestroy(stream);
  return 0;
}
