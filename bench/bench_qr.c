/*
 * bench_qr — batched QR for SOAP/Shampoo eigenbases, side by side in one
 * run with the one-at-a-time loop it must beat.
 *
 * The list is what SOAP refreshes per step for a 12-layer model with
 * hidden size H = 1024 and MLP size F = 4096: per layer 4 Kronecker
 * factors of H x H and 4 of F x F, 96 fp32 QRs in all, each dimension
 * divided by --scale (default 8 on the CPU: 128 and 512; 1 on CUDA).
 *
 *   loop      one matrix at a time, as a plain optimizer does it: LAPACK
 *             sgeqrf + sorgqr in place (OpenBLAS with its own threads) on
 *             the CPU; cuSOLVER sgeqrf + sorgqr on one stream on CUDA.
 *   osft      osft_qr_batch on the whole list in place, Householder and
 *             CholeskyQR2, with the default number of workers and with 1.
 *   power     one power-iteration step Q <- qr(A Q) for 96 pairs (--power):
 *             on the CPU the loop (GEMM then QR, one pair at a time) against
 *             osft_qr_power_iteration; on CUDA osft_qr_power_iteration
 *             against osft_qr_batch alone (PyTorch's power step is in
 *             bench/gpu/peers_torch.py).
 *
 *   bench_qr [--scale S] [--layers L] [--reps R] [--device cpu|cuda]
 *            [--power] [--settle MS] [--csv FILE]
 *
 * --settle MS pauses (untimed) before each run: by default the runs follow
 * each other, so each starts while OpenBLAS's threads from the previous
 * run still busy-wait (~0.1 s), as in an optimizer step that does GEMMs
 * right before its QRs; --settle 300 measures each one on idle cores.
 *
 * Inputs are restored from a pristine copy before every timed run (not
 * timed). Variants run round-robin, R rounds after a warm-up round; the
 * table gives median, min and max times and the median over rounds of the
 * loop's time over the variant's (the speedup).
 */
#include <cblas.h>
#include <lapack.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef BENCH_QR_CUDA
#include <cuda_runtime.h>
#include <cusolverDn.h>
#endif

#include "bench_util.h"
#include "osftrt/osftrt.h"

#define MAX_MATS 512
#define MAX_REPS 31

static void fill(float *p, size_t n, unsigned seed) {
  fill_uniform(p, n, seed, 1.0f);
}

/* The list: dims[i] x dims[i] matrices, fp32, in host buffers. */
typedef struct {
  int count;
  int dims[MAX_MATS];
  size_t offset[MAX_MATS]; /* in floats, into one allocation */
  size_t total;            /* floats */
  float *pristine;         /* the inputs, never modified */
  float *work;             /* what each run factors in place */
  float *factor;           /* power iteration: the A of each pair */
} problem;

static void problem_make(problem *p, int layers, int hidden, int mlp) {
  memset(p, 0, sizeof *p);
  for (int l = 0; l < layers; ++l)
    for (int k = 0; k < 8 && p->count < MAX_MATS; ++k) {
      const int d = k % 2 == 0 ? hidden : mlp;
      p->dims[p->count] = d;
      p->offset[p->count] = p->total;
      p->total += (size_t)d * d;
      ++p->count;
    }
  p->pristine = xmalloc(p->total * sizeof(float));
  p->work = xmalloc(p->total * sizeof(float));
  fill(p->pristine, p->total, 12345u);
}

static void restore(problem *p) {
  memcpy(p->work, p->pristine, p->total * sizeof(float));
}

/* --------------------------------------------------------------- CPU */

/* LAPACK scratch for the largest matrix: tau and a work array of 64 n
 * (more than sgeqrf and sorgqr ask for with their block size 32). */
typedef struct {
  float *tau, *work;
  int lwork;
} lapack_scratch;

static lapack_scratch scratch_for(const problem *p) {
  int nmax = 1;
  for (int i = 0; i < p->count; ++i)
    if (p->dims[i] > nmax) nmax = p->dims[i];
  lapack_scratch s = {xmalloc(sizeof(float) * (size_t)nmax),
                      xmalloc(sizeof(float) * 64 * (size_t)nmax), 64 * nmax};
  return s;
}

static void scratch_free(lapack_scratch *s) {
  free(s->tau);
  free(s->work);
}

/* Q of the column-major n x n matrix a, in place. */
static void lapack_qr(int n, float *a, lapack_scratch *s) {
  int info = 0;
  LAPACK_sgeqrf(&n, &n, a, &n, s->tau, s->work, &s->lwork, &info);
  if (info == 0) LAPACK_sorgqr(&n, &n, &n, a, &n, s->tau, s->work, &s->lwork, &info);
  if (info != 0) {
    fprintf(stderr, "LAPACK info %d\n", info);
    exit(1);
  }
}

static void cpu_loop(problem *p) {
  lapack_scratch s = scratch_for(p);
  for (int i = 0; i < p->count; ++i) lapack_qr(p->dims[i], p->work + p->offset[i], &s);
  scratch_free(&s);
}

/* One power step one pair at a time: P = A Q (GEMM), Q = qr(P). */
static void cpu_power_loop(problem *p, float *scratch) {
  lapack_scratch s = scratch_for(p);
  for (int i = 0; i < p->count; ++i) {
    const int n = p->dims[i];
    float *q = p->work + p->offset[i];
    cblas_sgemm(CblasColMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f,
                p->factor + p->offset[i], n, q, n, 0.0f, scratch, n);
    lapack_qr(n, scratch, &s);
    memcpy(q, scratch, sizeof(float) * (size_t)n * n);
  }
  scratch_free(&s);
}

/* ------------------------------------------------------------ tensors */

typedef struct {
  DLTensor t[MAX_MATS], f[MAX_MATS];
  int64_t shape[MAX_MATS][2];
  const DLTensor *a[MAX_MATS], *fa[MAX_MATS];
  DLTensor *q[MAX_MATS];
} tensors;

static void tensors_make(tensors *T, const problem *p, float *base, float *factor_base,
                         DLDeviceType device) {
  for (int i = 0; i < p->count; ++i) {
    T->shape[i][0] = T->shape[i][1] = p->dims[i];
    DLTensor *t = &T->t[i];
    memset(t, 0, sizeof *t);
    t->data = base + p->offset[i];
    t->device.device_type = device;
    t->ndim = 2;
    t->dtype.code = kDLFloat;
    t->dtype.bits = 32;
    t->dtype.lanes = 1;
    t->shape = T->shape[i];
    T->a[i] = t;
    T->q[i] = t;
    if (factor_base) {
      T->f[i] = *t;
      T->f[i].data = factor_base + p->offset[i];
      T->fa[i] = &T->f[i];
    }
  }
}

/* -------------------------------------------------------------- timing */

typedef void (*run_fn)(void *);

/* One variant to time: prepare (untimed), then run. */
typedef struct {
  const char *name;
  run_fn run;
  void (*prepare)(void *);
  void *arg;
  double t[MAX_REPS];
  double median;
  double ratio; /* median over rounds of (reference's time / this one's) */
} variant;

/* Untimed pause before each timed run (--settle), so that OpenBLAS's
 * worker threads, which busy-wait ~0.1 s after a multithreaded call, are
 * asleep when the run starts. */
static int g_settle_ms = 0;

static void settle(void) {
  if (g_settle_ms <= 0) return;
  struct timespec ts = {g_settle_ms / 1000, (long)(g_settle_ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static int cmp_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Round-robin over the variants, `reps` rounds after a warm-up round, so
 * that load from elsewhere on the machine hits them alike; medians, and
 * the median of the per-round speedups over v[0] (robust to load that
 * comes and goes between rounds). */
static void time_variants(variant *v, int n, int reps) {
  for (int i = 0; i < n; ++i) {
    v[i].prepare(v[i].arg);
    v[i].run(v[i].arg); /* warm-up: workspace, threads, handles */
  }
  for (int r = 0; r < reps; ++r)
    for (int i = 0; i < n; ++i) {
      v[i].prepare(v[i].arg);
      settle();
      const double t0 = now_ms();
      v[i].run(v[i].arg);
      v[i].t[r] = now_ms() - t0;
    }
  for (int i = n - 1; i >= 0; --i) { /* v[0] last: the others need its times */
    double ratios[MAX_REPS];
    for (int r = 0; r < reps; ++r) ratios[r] = v[0].t[r] / v[i].t[r];
    qsort(ratios, (size_t)reps, sizeof(double), cmp_double);
    v[i].ratio = ratios[reps / 2];
    qsort(v[i].t, (size_t)reps, sizeof(double), cmp_double);
    v[i].median = v[i].t[reps / 2];
  }
}

typedef struct {
  problem *p;
  tensors *T;
  osft_context_t ctx;
  osft_qr_options_t opts;
  float *scratch;
  int cuda;
} run_args;

static void sync_device(const run_args *r);
static void prepare_inputs(void *arg);

static void run_loop(void *arg);
static void run_osft(void *arg) {
  run_args *r = arg;
  CHECK(osft_qr_batch(r->ctx, &r->opts, (size_t)r->p->count, r->T->a, NULL, NULL, NULL));
  sync_device(r);
}
static void run_power_loop(void *arg) {
  run_args *r = arg;
  cpu_power_loop(r->p, r->scratch);
}
static void run_power_osft(void *arg) {
  run_args *r = arg;
  CHECK(osft_qr_power_iteration(r->ctx, &r->opts, (size_t)r->p->count, r->T->fa, r->T->q,
                                1, NULL));
  sync_device(r);
}

/* -------------------------------------------------------------- CUDA */

#ifdef BENCH_QR_CUDA
#define CUDA_CHECK(call)                                                 \
  do {                                                                   \
    cudaError_t e_ = (call);                                             \
    if (e_ != cudaSuccess) {                                             \
      fprintf(stderr, "%s failed: %s\n", #call, cudaGetErrorString(e_)); \
      exit(1);                                                           \
    }                                                                    \
  } while (0)

typedef struct {
  float *work; /* device copy of the list */
  float *pristine;
  cusolverDnHandle_t solver;
  float *tau, *lapack;
  int *info;
  int lwork;
} cuda_state;

static cuda_state g_cuda;

static void cuda_setup(const problem *p) {
  CUDA_CHECK(cudaMalloc((void **)&g_cuda.work, p->total * sizeof(float)));
  CUDA_CHECK(cudaMalloc((void **)&g_cuda.pristine, p->total * sizeof(float)));
  CUDA_CHECK(cudaMemcpy(g_cuda.pristine, p->pristine, p->total * sizeof(float),
                        cudaMemcpyHostToDevice));
  if (cusolverDnCreate(&g_cuda.solver) != CUSOLVER_STATUS_SUCCESS) {
    fprintf(stderr, "cusolverDnCreate failed\n");
    exit(1);
  }
  int nmax = 0, lwork = 0;
  for (int i = 0; i < p->count; ++i) {
    const int n = p->dims[i];
    int l1 = 0, l2 = 0;
    float *a = g_cuda.work + p->offset[i];
    cusolverDnSgeqrf_bufferSize(g_cuda.solver, n, n, a, n, &l1);
    cusolverDnSorgqr_bufferSize(g_cuda.solver, n, n, n, a, n, a, &l2);
    if (l1 > lwork) lwork = l1;
    if (l2 > lwork) lwork = l2;
    if (n > nmax) nmax = n;
  }
  g_cuda.lwork = lwork;
  CUDA_CHECK(cudaMalloc((void **)&g_cuda.tau, sizeof(float) * (size_t)nmax));
  CUDA_CHECK(cudaMalloc((void **)&g_cuda.lapack, sizeof(float) * (size_t)lwork));
  CUDA_CHECK(cudaMalloc((void **)&g_cuda.info, sizeof(int)));
}

static void cuda_teardown(void) {
  cusolverDnDestroy(g_cuda.solver);
  cudaFree(g_cuda.work);
  cudaFree(g_cuda.pristine);
  cudaFree(g_cuda.tau);
  cudaFree(g_cuda.lapack);
  cudaFree(g_cuda.info);
}

static void cuda_loop(const problem *p) {
  for (int i = 0; i < p->count; ++i) {
    const int n = p->dims[i];
    float *a = g_cuda.work + p->offset[i];
    if (cusolverDnSgeqrf(g_cuda.solver, n, n, a, n, g_cuda.tau, g_cuda.lapack,
                         g_cuda.lwork, g_cuda.info) != CUSOLVER_STATUS_SUCCESS ||
        cusolverDnSorgqr(g_cuda.solver, n, n, n, a, n, g_cuda.tau, g_cuda.lapack,
                         g_cuda.lwork, g_cuda.info) != CUSOLVER_STATUS_SUCCESS) {
      fprintf(stderr, "cuSOLVER failed\n");
      exit(1);
    }
  }
  CUDA_CHECK(cudaDeviceSynchronize());
}
#endif

static void sync_device(const run_args *r) {
  if (r->cuda) CHECK(osft_context_synchronize(r->ctx));
}

static void prepare_inputs(void *arg) {
  run_args *r = arg;
#ifdef BENCH_QR_CUDA
  if (r->cuda) {
    CUDA_CHECK(cudaMemcpy(g_cuda.work, g_cuda.pristine, r->p->total * sizeof(float),
                          cudaMemcpyDeviceToDevice));
    return;
  }
#endif
  restore(r->p);
}

static void run_loop(void *arg) {
  run_args *r = arg;
#ifdef BENCH_QR_CUDA
  if (r->cuda) return cuda_loop(r->p);
#endif
  cpu_loop(r->p);
}

/* ---------------------------------------------------------------- main */

/* Prints the variants (the first is the reference) and their CSV rows. */
static void report(FILE *csv, const char *device, int scale, const problem *p,
                   const variant *v, int n, int hidden, int mlp, int reps) {
  for (int i = 0; i < n; ++i) {
    printf("%-42s %9.1f %9.1f %9.1f %8.2fx\n", v[i].name, v[i].median, v[i].t[0],
           v[i].t[reps - 1], v[i].ratio);
    if (csv)
      fprintf(csv, "%s,%d,%d,%d,%d,%s,%.3f,%.3f,%.3f,%.4f\n", device, scale, p->count,
              hidden, mlp, v[i].name, v[i].median, v[i].t[0], v[i].t[reps - 1],
              v[i].ratio);
  }
}

static run_args osft_args(const run_args *base, osft_qr_method_t method, int workers) {
  run_args r = *base;
  CHECK(OSFT_QR_OPTIONS_INIT(&r.opts));
  r.opts.method = method;
  r.opts.max_concurrency = workers;
  r.opts.rank_tolerance = -1.0; /* timing only: never refuse a matrix */
  return r;
}

/* The library's own count of CholeskyQR2 fall-backs (logged at debug
 * level): how many matrices the check sent back to Householder. */
static void print_fallbacks(void *user, osft_log_level_t level, const char *message) {
  (void)user;
  (void)level;
  if (strstr(message, "fell back") != NULL) printf("# cholesky_qr2: %s\n", message);
}

static void report_fallbacks(variant *cholesky) {
  CHECK(osft_set_log_callback(print_fallbacks, NULL, OSFT_LOG_DEBUG));
  cholesky->prepare(cholesky->arg);
  cholesky->run(cholesky->arg);
  CHECK(osft_set_log_callback(NULL, NULL, OSFT_LOG_OFF));
}

/* osft_qr_power_iteration timed against `reference` (reported first). */
static void time_power(variant reference, const problem *p, const run_args *r, FILE *csv,
                       const char *device, int scale, int hidden, int mlp, int reps) {
  run_args pw = osft_args(r, OSFT_QR_HOUSEHOLDER, 0);
  variant pv[2] = {
      reference,
      {"power step: osft_qr_power_iteration",
       run_power_osft,
       prepare_inputs,
       &pw,
       {0},
       0},
  };
  time_variants(pv, 2, reps);
  printf("\n");
  report(csv, device, scale, p, pv, 2, hidden, mlp, reps);
}

/* The power step Q <- qr(A Q) for the 96 pairs (A_i a fixed random matrix,
 * Q_i the list itself) on the CPU: the loop GEMM + LAPACK against
 * osft_qr_power_iteration. */
static void power_cpu(problem *p, run_args *r, tensors *T, FILE *csv, int scale,
                      int hidden, int mlp, int reps) {
  p->factor = xmalloc(p->total * sizeof(float));
  fill(p->factor, p->total, 777u);
  tensors_make(T, p, p->work, p->factor, kDLCPU);
  int nmax = 0;
  for (int i = 0; i < p->count; ++i)
    if (p->dims[i] > nmax) nmax = p->dims[i];
  r->scratch = xmalloc(sizeof(float) * (size_t)nmax * nmax);
  const variant loop = {"power step: loop GEMM + sgeqrf + sorgqr",
                        run_power_loop,
                        prepare_inputs,
                        r,
                        {0},
                        0};
  time_power(loop, p, r, csv, "cpu", scale, hidden, mlp, reps);
  free(r->scratch);
  free(p->factor);
}

#ifdef BENCH_QR_CUDA
/* The same on CUDA: osft_qr_power_iteration against the plain batched QR of
 * the list (the step's QR part alone; bench/gpu/peers_torch.py times
 * PyTorch's power step on the same shapes). */
static void power_cuda(problem *p, run_args *r, tensors *T, FILE *csv, int scale,
                       int hidden, int mlp, int reps) {
  float *host = xmalloc(p->total * sizeof(float)), *factor = NULL;
  fill(host, p->total, 777u);
  CUDA_CHECK(cudaMalloc((void **)&factor, p->total * sizeof(float)));
  CUDA_CHECK(cudaMemcpy(factor, host, p->total * sizeof(float), cudaMemcpyHostToDevice));
  free(host);
  tensors_make(T, p, g_cuda.work, factor, kDLCUDA);
  run_args qr = osft_args(r, OSFT_QR_HOUSEHOLDER, 0);
  const variant qr_only = {
      "qr only: osft_qr_batch householder", run_osft, prepare_inputs, &qr, {0}, 0};
  time_power(qr_only, p, r, csv, "cuda", scale, hidden, mlp, reps);
  CUDA_CHECK(cudaFree(factor));
}
#endif

int main(int argc, char **argv) {
  int scale = 0, layers = 12, reps = 5, cuda = 0, power = 0;
  const char *csv_path = NULL;
  for (int i = 1; i < argc; ++i) {
    if (!strcmp(argv[i], "--scale") && i + 1 < argc)
      scale = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--layers") && i + 1 < argc)
      layers = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
      reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--csv") && i + 1 < argc)
      csv_path = argv[++i];
    else if (!strcmp(argv[i], "--settle") && i + 1 < argc)
      g_settle_ms = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--power"))
      power = 1;
    else if (!strcmp(argv[i], "--device") && i + 1 < argc)
      cuda = !strcmp(argv[++i], "cuda");
    else {
      fprintf(stderr,
              "usage: %s [--scale S] [--layers L] [--reps R] [--device cpu|cuda] "
              "[--power] [--settle MS] [--csv FILE]\n",
              argv[0]);
      return 2;
    }
  }
#ifndef BENCH_QR_CUDA
  if (cuda) {
    fprintf(stderr, "this bench_qr was built without CUDA\n");
    return 2;
  }
#endif
  if (scale < 1) scale = cuda ? 1 : 8;
  if (reps < 1 || reps > MAX_REPS) reps = 5;
  if (layers < 1 || layers * 8 > MAX_MATS) layers = 12;
  const int hidden = 1024 / scale, mlp = 4096 / scale;

  problem p;
  problem_make(&p, layers, hidden, mlp);
  osft_context_options_t co;
  CHECK(OSFT_CONTEXT_OPTIONS_INIT(&co));
  co.device_type = cuda ? OSFT_DEVICE_CUDA : OSFT_DEVICE_CPU;
  run_args r;
  memset(&r, 0, sizeof r);
  r.p = &p;
  r.cuda = cuda;
  CHECK(osft_context_create(&r.ctx, &co));
  tensors *T = xmalloc(sizeof *T);
  float *base = p.work;
#ifdef BENCH_QR_CUDA
  if (cuda) {
    cuda_setup(&p);
    base = g_cuda.work;
  }
#endif
  tensors_make(T, &p, base, NULL, cuda ? kDLCUDA : kDLCPU);
  r.T = T;

  printf("# %s\n", osft_build_info());
  const char *timeout = getenv("OPENBLAS_THREAD_TIMEOUT");
  printf(
      "# OpenBLAS %d threads, OPENBLAS_THREAD_TIMEOUT=%s, %d ms pause before each run\n",
      openblas_get_num_threads(),
      timeout ? timeout : "(unset: idle OpenBLAS threads spin ~2^28 cycles)",
      g_settle_ms);
  printf(
      "# SOAP-like list: %d layers x (4 of %d^2 + 4 of %d^2) = %d fp32 QRs on %s; "
      "%d rounds, variants interleaved\n",
      layers, hidden, mlp, p.count, cuda ? "CUDA" : "the CPU", reps);
  printf("%-42s %9s %9s %9s %9s\n", "variant", "median ms", "min ms", "max ms",
         "speedup");
  run_args args[4] = {
      osft_args(&r, OSFT_QR_HOUSEHOLDER, 0), osft_args(&r, OSFT_QR_HOUSEHOLDER, 1),
      osft_args(&r, OSFT_QR_CHOLESKY_QR2, 0), osft_args(&r, OSFT_QR_CHOLESKY_QR2, 1)};
  variant v[5] = {
      {cuda ? "loop: cuSOLVER sgeqrf+sorgqr, one stream"
            : "loop: LAPACK sgeqrf+sorgqr one at a time",
       run_loop,
       prepare_inputs,
       &r,
       {0},
       0},
      {"osft_qr_batch householder", run_osft, prepare_inputs, &args[0], {0}, 0},
      {"osft_qr_batch householder, 1 worker", run_osft, prepare_inputs, &args[1], {0}, 0},
      {"osft_qr_batch cholesky_qr2", run_osft, prepare_inputs, &args[2], {0}, 0},
      {"osft_qr_batch cholesky_qr2, 1 worker",
       run_osft,
       prepare_inputs,
       &args[3],
       {0},
       0},
  };
  time_variants(v, 5, reps);
  FILE *csv = csv_path ? fopen(csv_path, "w") : NULL;
  if (csv)
    fprintf(csv,
            "device,scale,count,hidden,mlp,variant,median_ms,min_ms,max_ms,"
            "median_round_speedup_vs_loop\n");
  report(csv, cuda ? "cuda" : "cpu", scale, &p, v, 5, hidden, mlp, reps);
  report_fallbacks(&v[3]);

  if (power) {
#ifdef BENCH_QR_CUDA
    if (cuda)
      power_cuda(&p, &r, T, csv, scale, hidden, mlp, reps);
    else
#endif
      power_cpu(&p, &r, T, csv, scale, hidden, mlp, reps);
  }
  if (csv) fclose(csv);
  CHECK(osft_context_destroy(r.ctx));
#ifdef BENCH_QR_CUDA
  if (cuda) cuda_teardown();
#endif
  free(T);
  free(p.pristine);
  free(p.work);
  return 0;
}
