/*
 * bench_qr — batched QR for SOAP/Shampoo eigenbases, side by side in one
 * run with the one-at-a-time loop it must beat.
 *
 * The default list approximates what SOAP refreshes per step for a
 * 12-layer model with hidden size H = 1024 and MLP size F = 4096: per
 * layer 4 Kronecker factors of H x H and 4 of F x F, 96 fp32 QRs in all,
 * each dimension divided by --scale (default 8 on the CPU: 128 and 512; 1
 * on CUDA); --workload gives the exact list (below).
 *
 *   loop      one matrix at a time, as a plain optimizer does it: LAPACK
 *             sgeqrf + sorgqr in place (OpenBLAS with its own threads) on
 *             the CPU; cuSOLVER sgeqrf + sorgqr on one stream on CUDA.
 *   osft      osft_qr_batch on the whole list in place, each method
 *             (Householder, CholeskyQR2 = shifted CholeskyQR3 in fp64, TF32),
 *             with the default number of workers and with 1; the power step
 *             with each method.
 *   power     one power-iteration step Q <- qr(A Q) for 96 pairs (--power):
 *             on the CPU the loop (GEMM then QR, one pair at a time) against
 *             osft_qr_power_iteration; on CUDA osft_qr_power_iteration
 *             against osft_qr_batch alone (PyTorch's power step is in
 *             bench/gpu/peers_torch.py).
 *
 *   bench_qr [--workload soap-gpt2-1024|soap-gpt2-2048|soap-gpt2-2048-mlp8192]
 *            [--scale S] [--layers L] [--reps R] [--device cpu|cuda] [--power]
 *            [--quick] [--settle MS] [--csv FILE]
 *
 * --quick leaves out the two "1 worker" variants (GPU time: a round at
 * hidden 2048 is several seconds per variant).
 *
 * --workload: the lists of NeMo Emerging-Optimizers PR 118 (SOAP on a
 * 12-layer GPT-2-style model, hidden H, MLP F): per layer the two Kronecker
 * factors of c_attn (H x 3H), attn c_proj (H x H), c_fc (H x F) and mlp
 * c_proj (F x H), i.e. square QRs of H, 3H, H, H, H, F, F, H (96 in all;
 * dimensions divided by --scale, default 1 on CUDA and 8 on the CPU).
 * soap-gpt2-1024 is H 1024, F 4096 and soap-gpt2-2048 H 2048, F 4096, the
 * PR's two lists (its words: "hidden=2048, mlp=4096": F is not 4H there);
 * soap-gpt2-2048-mlp8192 (H 2048, F 8192, about 2.4x the flops) is the list
 * this benchmark used as soap-gpt2-2048 before. The inputs are SOAP's own: P Q with P = U
 * diag(lambda) U^T a symmetric positive definite factor with the power-law spectrum
 * lambda_k = (1 + k)^-alpha, alpha = ln(kappa) / ln(n) (so kappa(P) =
 * kappa, fast decay from the top), kappa = 1e4, 1e5, 1e6, 1e7 in turn
 * along the list, U a random orthogonal (LAPACK QR of a uniform random
 * matrix, fp64) and Q = a row permutation of U, then rows and columns
 * permuted at random per matrix (P' = Pi P Pi^T, Q' = Pi Q Pi2: still a
 * PSD factor times an orthogonal matrix). Built in fp64, stored in fp32.
 * With --power the pairs are (P', Q'), SOAP's refresh Q <- qr(P Q). On
 * CUDA the same construction runs on the GPU (soap_inputs_cuda: the host
 * draws the same random numbers, cuSOLVER/cuBLAS do the fp64 QR and GEMMs,
 * bench_qr_inputs.cu the permuting gathers into the device lists, no host
 * copy of the lists): seconds at hidden 2048, where the host version
 * (18 s at hidden 1024 on 16 cores, 8x the flops at 2048) does not fit a
 * GPU session.
 * bench/gpu/peers_qr_torch.py builds the same inputs for PyTorch. Without
 * --workload: the older list (4 of H^2 + 4 of 4H^2 per layer, uniform
 * random entries). Every osft variant then reports how many matrices fell
 * back to Householder and, for the 8 matrices of the first layer, the
 * largest ||Q^T Q - I||_F (fp64).
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
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cusolverDn.h>

/* bench_qr_inputs.cu: element-wise kernels on the legacy default stream;
 * each returns the launch's cudaError_t. out[r][c] = src[rows[r]][cols[c]]
 * (row-major n x n; cols NULL: c), and out[i] = src[i] widened. */
int bench_qr_gather_f32(const double *src, int n, const int *rows, const int *cols,
                        float *out);
int bench_qr_gather_f64(const double *src, int n, const int *rows, const int *cols,
                        double *out);
int bench_qr_widen(const float *src, size_t count, double *out);
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
  size_t offset[MAX_MATS];   /* in floats, into one allocation */
  size_t total;              /* floats */
  float *pristine;           /* the inputs, never modified */
  float *work;               /* what each run factors in place */
  float *factor;             /* power iteration: the A of each pair */
  float *qstart;             /* --workload: power iteration's starting Q */
  int kappa_class[MAX_MATS]; /* --workload: kappa = 10^(4 + class) */
} problem;

/* Per layer, the side of each of SOAP's 8 Kronecker factors (GPT-2:
 * c_attn H x 3H, attn c_proj H x H, c_fc H x F, mlp c_proj F x H). */
static int soap_side(int k, int hidden, int mlp) {
  static const int kHiddens[8] = {1, 3, 1, 1, 1, 0, 0, 1}; /* 0: F */
  return kHiddens[k] != 0 ? kHiddens[k] * hidden : mlp;
}

/* The --workload lists: name, hidden, MLP. */
typedef struct {
  const char *name;
  int hidden, mlp;
} soap_workload;

static const soap_workload kWorkloads[] = {
    {"soap-gpt2-1024", 1024, 4096},
    {"soap-gpt2-2048", 2048, 4096},
    {"soap-gpt2-2048-mlp8192", 2048, 8192},
};

/* host 0: the inputs live only on the GPU (built there): no host copies. */
static void problem_make(problem *p, int layers, int hidden, int mlp, int soap,
                         int host) {
  memset(p, 0, sizeof *p);
  for (int l = 0; l < layers; ++l)
    for (int k = 0; k < 8 && p->count < MAX_MATS; ++k) {
      const int d = soap ? soap_side(k, hidden, mlp) : k % 2 == 0 ? hidden : mlp;
      p->kappa_class[p->count] = p->count % 4;
      p->dims[p->count] = d;
      p->offset[p->count] = p->total;
      p->total += (size_t)d * d;
      ++p->count;
    }
  if (!host) return;
  p->pristine = xmalloc(p->total * sizeof(float));
  p->work = xmalloc(p->total * sizeof(float));
  if (!soap) fill(p->pristine, p->total, 12345u);
}

/* ---------------------------------------------------- SOAP-like inputs */

/* ln, exp and sqrt to ~1e-15 without libm (the benchmarks link none). */
static double bench_ln(double x) { /* x > 0 */
  double k = 0;
  while (x > 1.5) x *= 0.5, k += 1;
  while (x < 0.75) x *= 2.0, k -= 1;
  const double z = (x - 1) / (x + 1), z2 = z * z; /* ln x = 2 atanh z */
  double term = z, sum = 0;
  for (int i = 1; i < 60; i += 2, term *= z2) sum += term / i;
  return 2 * sum + k * 0.69314718055994530942;
}

static double bench_exp(double x) {
  const double k = (double)(long)(x / 0.69314718055994530942);
  const double r = x - k * 0.69314718055994530942;
  double term = 1, sum = 1;
  for (int i = 1; i < 30; ++i) sum += (term *= r / i);
  for (long i = 0; i < (long)k; ++i) sum *= 2;
  for (long i = 0; i < -(long)k; ++i) sum *= 0.5;
  return sum;
}

static double bench_sqrt(double x) {
  if (!(x > 0)) return x == 0 ? 0 : x; /* NaN stays NaN */
  double y = x > 1 ? x : 1;
  for (int i = 0; i < 200 && y * y - x > 1e-16 * x; ++i) y = 0.5 * (y + x / y);
  return y;
}

static unsigned soap_rand(unsigned *state) {
  *state = *state * 1664525u + 1013904223u;
  return *state >> 8;
}

/* A random permutation of n (Fisher-Yates). */
static void soap_permutation(int *perm, int n, unsigned *state) {
  for (int i = 0; i < n; ++i) perm[i] = i;
  for (int i = n - 1; i > 0; --i) {
    const int j = (int)(soap_rand(state) % (unsigned)(i + 1)), t = perm[i];
    perm[i] = perm[j];
    perm[j] = t;
  }
}

/* u (n x n) = a random orthogonal matrix: Q of a uniform random one. */
static void soap_orthogonal(double *u, int n, unsigned *state) {
  for (size_t i = 0; i < (size_t)n * n; ++i)
    u[i] = (double)soap_rand(state) / 16777216.0 - 0.5;
  double *tau = xmalloc(sizeof(double) * (size_t)n), query = 0;
  int lwork = -1, info = 0;
  LAPACK_dgeqrf(&n, &n, u, &n, tau, &query, &lwork, &info);
  lwork = (int)query + n;
  double *work = xmalloc(sizeof(double) * (size_t)lwork);
  LAPACK_dgeqrf(&n, &n, u, &n, tau, work, &lwork, &info);
  if (info == 0) LAPACK_dorgqr(&n, &n, &n, u, &n, tau, work, &lwork, &info);
  if (info != 0) {
    fprintf(stderr, "LAPACK info %d building the inputs\n", info);
    exit(1);
  }
  free(tau);
  free(work);
}

/* out (fp32, n x n) = src with rows and columns permuted:
 * out[r][c] = src[rows[r]][cols[c]]. */
static void soap_permuted(float *out, const double *src, int n, const int *rows,
                          const int *cols) {
  for (int r = 0; r < n; ++r)
    for (int c = 0; c < n; ++c)
      out[(size_t)r * n + c] = (float)src[(size_t)rows[r] * n + cols[c]];
}

/* Scratch of one size: U, Q0 = a row permutation of U, B = U^T Q0, U
 * diag(lambda), and A = U diag(lambda) B = P Q0 (and P), all n x n fp64. */
typedef struct {
  int n;
  double *u, *q0, *b, *ul, *a, *pf;
  int *perm, *perm2;
} soap_size;

/* The matrices of size n and kappa class k: A_i = Pi A Pi2 (and the pair
 * Pi P Pi^T, Pi Q0 Pi2 for --power). */
static void soap_class(problem *p, soap_size *z, int k, int power, unsigned *state) {
  const int n = z->n;
  const double ln_kappa = (4 + k) * bench_ln(10.0);
  const double alpha = n > 1 ? ln_kappa / bench_ln((double)n) : 0;
  for (int c = 0; c < n; ++c) {
    const double lambda = bench_exp(-alpha * bench_ln(1.0 + c));
    for (int r = 0; r < n; ++r)
      z->ul[(size_t)r * n + c] = z->u[(size_t)r * n + c] * lambda;
  }
  cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0, z->ul, n, z->b, n,
              0.0, z->a, n);
  if (power)
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0, z->ul, n, z->u, n,
                0.0, z->pf, n);
  for (int i = 0; i < p->count; ++i) {
    if (p->dims[i] != n || p->kappa_class[i] != k) continue;
    soap_permutation(z->perm, n, state);
    soap_permutation(z->perm2, n, state);
    soap_permuted(p->pristine + p->offset[i], z->a, n, z->perm, z->perm2);
    if (!power) continue;
    soap_permuted(p->factor + p->offset[i], z->pf, n, z->perm, z->perm);
    soap_permuted(p->qstart + p->offset[i], z->q0, n, z->perm, z->perm2);
  }
}

static void soap_inputs(problem *p, int power) {
  unsigned state = 2024u;
  if (power) {
    p->factor = xmalloc(p->total * sizeof(float));
    p->qstart = xmalloc(p->total * sizeof(float));
  }
  for (int i = 0; i < p->count; ++i) {
    int seen = 0;
    for (int j = 0; j < i; ++j) seen |= p->dims[j] == p->dims[i];
    if (seen) continue;
    soap_size z;
    const int n = z.n = p->dims[i];
    const size_t bytes = sizeof(double) * (size_t)n * n;
    z.u = xmalloc(bytes), z.q0 = xmalloc(bytes), z.b = xmalloc(bytes);
    z.ul = xmalloc(bytes), z.a = xmalloc(bytes), z.pf = power ? xmalloc(bytes) : NULL;
    z.perm = xmalloc(sizeof(int) * (size_t)n), z.perm2 = xmalloc(sizeof(int) * (size_t)n);
    soap_orthogonal(z.u, n, &state);
    soap_permutation(z.perm, n, &state);
    for (int r = 0; r < n; ++r)
      memcpy(z.q0 + (size_t)r * n, z.u + (size_t)z.perm[r] * n, sizeof(double) * n);
    cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, n, n, 1.0, z.u, n, z.q0, n,
                0.0, z.b, n);
    for (int k = 0; k < 4; ++k) soap_class(p, &z, k, power, &state);
    free(z.u), free(z.q0), free(z.b), free(z.ul), free(z.a), free(z.pf);
    free(z.perm), free(z.perm2);
  }
}

/* ||Q^T Q - I||_F in fp64 of the n x n fp32 q (row-major). */
static double orthogonality_error(const float *q, int n, double *x, double *g) {
  for (size_t i = 0; i < (size_t)n * n; ++i) x[i] = q[i];
  /* column-major, x is Q^T: Q^T Q = x x^T */
  cblas_dsyrk(CblasColMajor, CblasUpper, CblasNoTrans, n, n, 1.0, x, n, 0.0, g, n);
  double sum = 0;
  for (int j = 0; j < n; ++j)
    for (int i = 0; i <= j; ++i) {
      const double v = g[i + (size_t)j * n] - (i == j);
      sum += (i == j ? 1.0 : 2.0) * v * v;
    }
  return bench_sqrt(sum);
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
  double ratio;  /* median over rounds of (reference's time / this one's) */
  int fallbacks; /* matrices the library redid with Householder */
  double orth;   /* the largest ||Q^T Q - I||_F of the first layer's 8 */
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
  float *factor, *qstart; /* --workload --power, built on the device */
  cusolverDnHandle_t solver;
  cublasHandle_t blas;
  float *tau, *lapack;
  int *info;
  int lwork;
} cuda_state;

static cuda_state g_cuda;

static void cuda_setup(const problem *p) {
  CUDA_CHECK(cudaMalloc((void **)&g_cuda.work, p->total * sizeof(float)));
  if (!g_cuda.pristine) { /* else built on the device already */
    CUDA_CHECK(cudaMalloc((void **)&g_cuda.pristine, p->total * sizeof(float)));
    CUDA_CHECK(cudaMemcpy(g_cuda.pristine, p->pristine, p->total * sizeof(float),
                          cudaMemcpyHostToDevice));
  }
  if (!g_cuda.solver && cusolverDnCreate(&g_cuda.solver) != CUSOLVER_STATUS_SUCCESS) {
    fprintf(stderr, "cusolverDnCreate failed\n");
    exit(1);
  }
  if (!g_cuda.blas && cublasCreate(&g_cuda.blas) != CUBLAS_STATUS_SUCCESS) {
    fprintf(stderr, "cublasCreate failed\n");
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
  cublasDestroy(g_cuda.blas);
  cudaFree(g_cuda.work);
  cudaFree(g_cuda.pristine);
  cudaFree(g_cuda.factor);
  cudaFree(g_cuda.qstart);
  cudaFree(g_cuda.tau);
  cudaFree(g_cuda.lapack);
  cudaFree(g_cuda.info);
}

static void blas_ok(cublasStatus_t st, const char *what) {
  if (st != CUBLAS_STATUS_SUCCESS) {
    fprintf(stderr, "%s failed: cuBLAS status %d\n", what, (int)st);
    exit(1);
  }
}

static void solver_ok(cusolverStatus_t st, const char *what) {
  if (st != CUSOLVER_STATUS_SUCCESS) {
    fprintf(stderr, "%s failed: cuSOLVER status %d\n", what, (int)st);
    exit(1);
  }
}

/* soap_inputs on the GPU: the same construction, the same random numbers
 * (the host draws the uniform matrix and the permutations from the same
 * LCG in the same order), fp64 QR (cuSOLVER), GEMMs and scaling (cuBLAS)
 * and the permuting gathers (bench_qr_inputs.cu) on the device, written
 * straight into the device lists: the QR inputs into g_cuda.pristine, and
 * with --power the pairs' factors and starting Q into g_cuda.factor and
 * g_cuda.qstart. The host version takes minutes at hidden 2048 (18 s at
 * 1024 on 16 cores); this one seconds, the uploads of the uniform
 * matrices included. */
static void soap_inputs_cuda(problem *p, int power) {
  const size_t list_bytes = p->total * sizeof(float);
  CUDA_CHECK(cudaMalloc((void **)&g_cuda.pristine, list_bytes));
  if (power) {
    CUDA_CHECK(cudaMalloc((void **)&g_cuda.factor, list_bytes));
    CUDA_CHECK(cudaMalloc((void **)&g_cuda.qstart, list_bytes));
  }
  if (cusolverDnCreate(&g_cuda.solver) != CUSOLVER_STATUS_SUCCESS) {
    fprintf(stderr, "cusolverDnCreate failed\n");
    exit(1);
  }
  blas_ok(cublasCreate(&g_cuda.blas), "cublasCreate");
  cublasHandle_t h = g_cuda.blas;
  const double one = 1.0, zero = 0.0;
  unsigned state = 2024u;
  for (int i = 0; i < p->count; ++i) {
    int seen = 0;
    for (int j = 0; j < i; ++j) seen |= p->dims[j] == p->dims[i];
    if (seen) continue;
    const int n = p->dims[i];
    const size_t nn = (size_t)n * n, bytes = sizeof(double) * nn;
    double *u, *q0, *b, *ul, *a, *pf = NULL, *tau, *work, *lambda;
    int *perm, *perm2, *info, lwork = 0, l2 = 0, dev_info = 0;
    CUDA_CHECK(cudaMalloc((void **)&u, bytes));
    CUDA_CHECK(cudaMalloc((void **)&q0, bytes));
    CUDA_CHECK(cudaMalloc((void **)&b, bytes));
    CUDA_CHECK(cudaMalloc((void **)&ul, bytes));
    CUDA_CHECK(cudaMalloc((void **)&a, bytes));
    if (power) CUDA_CHECK(cudaMalloc((void **)&pf, bytes));
    CUDA_CHECK(cudaMalloc((void **)&tau, sizeof(double) * (size_t)n));
    CUDA_CHECK(cudaMalloc((void **)&lambda, sizeof(double) * (size_t)n));
    CUDA_CHECK(cudaMalloc((void **)&perm, sizeof(int) * (size_t)n));
    CUDA_CHECK(cudaMalloc((void **)&perm2, sizeof(int) * (size_t)n));
    CUDA_CHECK(cudaMalloc((void **)&info, sizeof(int)));
    int *hperm = xmalloc(sizeof(int) * (size_t)n),
        *hperm2 = xmalloc(sizeof(int) * (size_t)n);
    double *hl = xmalloc(sizeof(double) * (size_t)n);
    /* U: Q of a uniform random matrix (the LAPACK call of the host version:
     * column-major in place, so U row-major is that Q transposed) */
    double *hu = xmalloc(bytes);
    for (size_t e = 0; e < nn; ++e) hu[e] = (double)soap_rand(&state) / 16777216.0 - 0.5;
    CUDA_CHECK(cudaMemcpy(u, hu, bytes, cudaMemcpyHostToDevice));
    free(hu);
    solver_ok(cusolverDnDgeqrf_bufferSize(g_cuda.solver, n, n, u, n, &lwork),
              "cusolverDnDgeqrf_bufferSize");
    solver_ok(cusolverDnDorgqr_bufferSize(g_cuda.solver, n, n, n, u, n, tau, &l2),
              "cusolverDnDorgqr_bufferSize");
    if (l2 > lwork) lwork = l2;
    CUDA_CHECK(
        cudaMalloc((void **)&work, sizeof(double) * (size_t)(lwork > 0 ? lwork : 1)));
    solver_ok(cusolverDnDgeqrf(g_cuda.solver, n, n, u, n, tau, work, lwork, info),
              "cusolverDnDgeqrf");
    solver_ok(cusolverDnDorgqr(g_cuda.solver, n, n, n, u, n, tau, work, lwork, info),
              "cusolverDnDorgqr");
    CUDA_CHECK(cudaMemcpy(&dev_info, info, sizeof(int), cudaMemcpyDeviceToHost));
    if (dev_info != 0) {
      fprintf(stderr, "cuSOLVER info %d building the inputs\n", dev_info);
      exit(1);
    }
    /* Q0 = a row permutation of U; B = U^T Q0 (row-major: cuBLAS gets the
     * operands swapped, as column-major transposes) */
    soap_permutation(hperm, n, &state);
    CUDA_CHECK(cudaMemcpy(perm, hperm, sizeof(int) * (size_t)n, cudaMemcpyHostToDevice));
    CUDA_CHECK((cudaError_t)bench_qr_gather_f64(u, n, perm, NULL, q0));
    blas_ok(
        cublasDgemm(h, CUBLAS_OP_N, CUBLAS_OP_T, n, n, n, &one, q0, n, u, n, &zero, b, n),
        "cublasDgemm (B)");
    for (int k = 0; k < 4; ++k) {
      const double ln_kappa = (4 + k) * bench_ln(10.0);
      const double alpha = n > 1 ? ln_kappa / bench_ln((double)n) : 0;
      for (int c = 0; c < n; ++c) hl[c] = bench_exp(-alpha * bench_ln(1.0 + c));
      CUDA_CHECK(
          cudaMemcpy(lambda, hl, sizeof(double) * (size_t)n, cudaMemcpyHostToDevice));
      /* U diag(lambda): column c of row-major U is row c of its column-major
       * view */
      blas_ok(cublasDdgmm(h, CUBLAS_SIDE_LEFT, n, n, u, n, lambda, 1, ul, n),
              "cublasDdgmm");
      blas_ok(cublasDgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, b, n, ul, n, &zero,
                          a, n),
              "cublasDgemm (A)");
      if (power)
        blas_ok(cublasDgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, n, n, n, &one, u, n, ul, n,
                            &zero, pf, n),
                "cublasDgemm (P)");
      for (int m = 0; m < p->count; ++m) {
        if (p->dims[m] != n || p->kappa_class[m] != k) continue;
        soap_permutation(hperm, n, &state);
        soap_permutation(hperm2, n, &state);
        /* the previous matrix's gathers read perm and perm2: cudaMemcpy from
         * pageable memory waits for them (legacy default stream) */
        CUDA_CHECK(
            cudaMemcpy(perm, hperm, sizeof(int) * (size_t)n, cudaMemcpyHostToDevice));
        CUDA_CHECK(
            cudaMemcpy(perm2, hperm2, sizeof(int) * (size_t)n, cudaMemcpyHostToDevice));
        CUDA_CHECK((cudaError_t)bench_qr_gather_f32(a, n, perm, perm2,
                                                    g_cuda.pristine + p->offset[m]));
        if (!power) continue;
        CUDA_CHECK((cudaError_t)bench_qr_gather_f32(pf, n, perm, perm,
                                                    g_cuda.factor + p->offset[m]));
        CUDA_CHECK((cudaError_t)bench_qr_gather_f32(q0, n, perm, perm2,
                                                    g_cuda.qstart + p->offset[m]));
      }
    }
    CUDA_CHECK(cudaDeviceSynchronize());
    cudaFree(u), cudaFree(q0), cudaFree(b), cudaFree(ul), cudaFree(a), cudaFree(pf);
    cudaFree(tau), cudaFree(lambda), cudaFree(perm), cudaFree(perm2), cudaFree(info);
    cudaFree(work);
    free(hperm), free(hperm2), free(hl);
  }
}

/* ||Q^T Q - I||_F in fp64 of the n x n fp32 q on the device: widened, the
 * Gram matrix by DGEMM, the identity subtracted along its diagonal (stride
 * n + 1), then DNRM2. x, g: n x n doubles; ones: n doubles of 1. */
static double orthogonality_error_cuda(const float *q, int n, double *x, double *g,
                                       const double *ones) {
  const double one = 1.0, zero = 0.0, minus = -1.0;
  double r = 0;
  CUDA_CHECK((cudaError_t)bench_qr_widen(q, (size_t)n * n, x));
  blas_ok(cublasDgemm(g_cuda.blas, CUBLAS_OP_N, CUBLAS_OP_T, n, n, n, &one, x, n, x, n,
                      &zero, g, n),
          "cublasDgemm (Q^T Q)");
  blas_ok(cublasDaxpy(g_cuda.blas, n, &minus, ones, 1, g, n + 1), "cublasDaxpy");
  blas_ok(cublasDnrm2(g_cuda.blas, n * n, g, 1, &r), "cublasDnrm2");
  return r;
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
static const char *g_workload = "default";

static void report(FILE *csv, const char *device, int scale, const problem *p,
                   const variant *v, int n, int hidden, int mlp, int reps) {
  for (int i = 0; i < n; ++i) {
    printf("%-42s %9.1f %9.1f %9.1f %8.2fx %9d %10.2e\n", v[i].name, v[i].median,
           v[i].t[0], v[i].t[reps - 1], v[i].ratio, v[i].fallbacks, v[i].orth);
    if (csv)
      fprintf(csv, "%s,%s,%d,%d,%d,%d,%s,%.3f,%.3f,%.3f,%.4f,%d,%.3e\n", device,
              g_workload, scale, p->count, hidden, mlp, v[i].name, v[i].median, v[i].t[0],
              v[i].t[reps - 1], v[i].ratio, v[i].fallbacks, v[i].orth);
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

/* The library's own count of fall-backs to Householder (logged at debug
 * level, "qr: K of N matrices fell back to Householder"). */
static int g_fallbacks = 0;

static void count_fallbacks(void *user, osft_log_level_t level, const char *message) {
  (void)user;
  (void)level;
  const char *at = strstr(message, "qr: ");
  size_t k = 0, total = 0;
  if (at && sscanf(at, "qr: %zu of %zu matrices fell back", &k, &total) == 2)
    g_fallbacks += (int)k;
}

/* One more (untimed) run of v: its fall-backs, and the orthogonality of
 * the first layer's Q (the list is factored in place). */
static void verify(variant *v, const problem *p, int cuda) {
  g_fallbacks = 0;
  CHECK(osft_set_log_callback(count_fallbacks, NULL, OSFT_LOG_DEBUG));
  v->prepare(v->arg);
  v->run(v->arg);
  CHECK(osft_set_log_callback(NULL, NULL, OSFT_LOG_OFF));
  v->fallbacks = g_fallbacks;
  const int checked = p->count < 8 ? p->count : 8;
  int nmax = 1;
  for (int i = 0; i < checked; ++i)
    if (p->dims[i] > nmax) nmax = p->dims[i];
  v->orth = 0;
#ifdef BENCH_QR_CUDA
  if (cuda) { /* on the device: the host's fp64 SYRK of 8192^2 takes seconds */
    double *x, *g, *ones;
    double *hones = xmalloc(sizeof(double) * (size_t)nmax);
    for (int i = 0; i < nmax; ++i) hones[i] = 1.0;
    CUDA_CHECK(cudaMalloc((void **)&x, sizeof(double) * (size_t)nmax * nmax));
    CUDA_CHECK(cudaMalloc((void **)&g, sizeof(double) * (size_t)nmax * nmax));
    CUDA_CHECK(cudaMalloc((void **)&ones, sizeof(double) * (size_t)nmax));
    CUDA_CHECK(
        cudaMemcpy(ones, hones, sizeof(double) * (size_t)nmax, cudaMemcpyHostToDevice));
    for (int i = 0; i < checked; ++i) {
      const double e =
          orthogonality_error_cuda(g_cuda.work + p->offset[i], p->dims[i], x, g, ones);
      if (!(e <= v->orth)) v->orth = e; /* NaN wins */
    }
    cudaFree(x), cudaFree(g), cudaFree(ones);
    free(hones);
    return;
  }
#else
  (void)cuda;
#endif
  double *x = xmalloc(sizeof(double) * (size_t)nmax * nmax);
  double *g = xmalloc(sizeof(double) * (size_t)nmax * nmax);
  for (int i = 0; i < checked; ++i) {
    const double e = orthogonality_error(p->work + p->offset[i], p->dims[i], x, g);
    if (!(e <= v->orth)) v->orth = e; /* NaN wins */
  }
  free(x);
  free(g);
}

/* osft_qr_power_iteration timed against `reference` (reported first). */
static void time_power(variant reference, const problem *p, const run_args *r, FILE *csv,
                       const char *device, int scale, int hidden, int mlp, int reps) {
  run_args pw = osft_args(r, OSFT_QR_HOUSEHOLDER, 0);
  run_args pc = osft_args(r, OSFT_QR_CHOLESKY_QR2, 0);
  run_args pt = osft_args(r, OSFT_QR_CHOLESKY_TF32, 0);
  variant pv[4] = {
      reference,
      {"power step: osft_qr_power_iteration", run_power_osft, prepare_inputs, &pw},
      {"power step: osft_qr_power_iteration chol", run_power_osft, prepare_inputs, &pc},
      {"power step: osft_qr_power_iteration tf32", run_power_osft, prepare_inputs, &pt},
  };
  time_variants(pv, 4, reps);
  for (int i = 0; i < 4; ++i) verify(&pv[i], p, r->cuda);
  printf("\n");
  report(csv, device, scale, p, pv, 4, hidden, mlp, reps);
}

/* --workload: the power pairs are (P, Q) as built, the start Q in place of
 * the QR list's inputs. */
static void use_power_inputs(problem *p) {
  if (!p->qstart) return;
  float *t = p->pristine;
  p->pristine = p->qstart;
  p->qstart = t;
}

/* The power step Q <- qr(A Q) for the 96 pairs (A_i a fixed random matrix,
 * Q_i the list itself) on the CPU: the loop GEMM + LAPACK against
 * osft_qr_power_iteration. */
static void power_cpu(problem *p, run_args *r, tensors *T, FILE *csv, int scale,
                      int hidden, int mlp, int reps) {
  if (!p->factor) {
    p->factor = xmalloc(p->total * sizeof(float));
    fill(p->factor, p->total, 777u);
  }
  use_power_inputs(p);
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
}

#ifdef BENCH_QR_CUDA
/* The same on CUDA: osft_qr_power_iteration against the plain batched QR of
 * the list (the step's QR part alone; bench/gpu/peers_torch.py times
 * PyTorch's power step on the same shapes). */
static void power_cuda(problem *p, run_args *r, tensors *T, FILE *csv, int scale,
                       int hidden, int mlp, int reps) {
  float *factor = g_cuda.factor;
  if (g_cuda.qstart) { /* --workload: the pairs were built on the device */
    cudaFree(g_cuda.pristine);
    g_cuda.pristine = g_cuda.qstart;
    g_cuda.qstart = NULL;
  } else {
    float *host = xmalloc(p->total * sizeof(float));
    fill(host, p->total, 777u);
    CUDA_CHECK(cudaMalloc((void **)&factor, p->total * sizeof(float)));
    CUDA_CHECK(
        cudaMemcpy(factor, host, p->total * sizeof(float), cudaMemcpyHostToDevice));
    free(host);
    g_cuda.factor = factor;
  }
  tensors_make(T, p, g_cuda.work, factor, kDLCUDA);
  run_args qr = osft_args(r, OSFT_QR_HOUSEHOLDER, 0);
  const variant qr_only = {
      "qr only: osft_qr_batch householder", run_osft, prepare_inputs, &qr, {0}, 0};
  time_power(qr_only, p, r, csv, "cuda", scale, hidden, mlp, reps);
}
#endif

typedef struct {
  int scale, layers, reps, cuda, power, soap_hidden, soap_mlp, quick;
  const char *csv_path;
} bench_args;

/* 1 if `name` is a --workload (sets its hidden and MLP sizes; "default":
 * the older uniform-random list, 0 and 0). */
static int parse_workload(const char *name, bench_args *a) {
  if (!strcmp(name, "default")) {
    a->soap_hidden = a->soap_mlp = 0;
    return 1;
  }
  for (size_t w = 0; w < sizeof kWorkloads / sizeof kWorkloads[0]; ++w)
    if (!strcmp(name, kWorkloads[w].name)) {
      a->soap_hidden = kWorkloads[w].hidden;
      a->soap_mlp = kWorkloads[w].mlp;
      return 1;
    }
  return 0;
}

static int parse_args(int argc, char **argv, bench_args *a) {
  memset(a, 0, sizeof *a);
  a->layers = 12, a->reps = 5;
  for (int i = 1; i < argc; ++i) {
    if (!strcmp(argv[i], "--scale") && i + 1 < argc)
      a->scale = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--layers") && i + 1 < argc)
      a->layers = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
      a->reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--csv") && i + 1 < argc)
      a->csv_path = argv[++i];
    else if (!strcmp(argv[i], "--settle") && i + 1 < argc)
      g_settle_ms = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--power"))
      a->power = 1;
    else if (!strcmp(argv[i], "--quick"))
      a->quick = 1;
    else if (!strcmp(argv[i], "--device") && i + 1 < argc)
      a->cuda = !strcmp(argv[++i], "cuda");
    else if (!strcmp(argv[i], "--workload") && i + 1 < argc &&
             parse_workload(argv[i + 1], a))
      g_workload = argv[++i];
    else {
      fprintf(stderr,
              "usage: %s [--workload soap-gpt2-1024|soap-gpt2-2048|"
              "soap-gpt2-2048-mlp8192|default] [--scale S] [--layers L] [--reps R] "
              "[--device cpu|cuda] [--power] [--quick] [--settle MS] [--csv FILE]\n",
              argv[0]);
      return 2;
    }
  }
#ifndef BENCH_QR_CUDA
  if (a->cuda) {
    fprintf(stderr, "this bench_qr was built without CUDA\n");
    return 2;
  }
#endif
  if (a->scale < 1) a->scale = a->cuda ? 1 : 8;
  if (a->reps < 1 || a->reps > MAX_REPS) a->reps = 5;
  if (a->layers < 1 || a->layers * 8 > MAX_MATS) a->layers = 12;
  return 0;
}

static void print_header(const bench_args *a, const problem *p, int hidden, int mlp) {
  printf("# %s\n", osft_build_info());
  const char *timeout = getenv("OPENBLAS_THREAD_TIMEOUT");
  printf(
      "# OpenBLAS %d threads, OPENBLAS_THREAD_TIMEOUT=%s, %d ms pause before each run\n",
      openblas_get_num_threads(),
      timeout ? timeout : "(unset: idle OpenBLAS threads spin ~2^28 cycles)",
      g_settle_ms);
  if (a->soap_hidden)
    printf(
        "# workload %s / scale %d: %d layers x (%d^2, %d^2, 3 x %d^2, 2 x %d^2, %d^2) = "
        "%d fp32 QRs of P Q (kappa(P) 1e4..1e7) on %s; %d rounds, variants "
        "interleaved\n",
        g_workload, a->scale, a->layers, hidden, 3 * hidden, hidden, mlp, hidden,
        p->count, a->cuda ? "CUDA" : "the CPU", a->reps);
  else
    printf(
        "# SOAP-like list: %d layers x (4 of %d^2 + 4 of %d^2) = %d fp32 QRs on %s; "
        "%d rounds, variants interleaved\n",
        a->layers, hidden, mlp, p->count, a->cuda ? "CUDA" : "the CPU", a->reps);
  printf("%-42s %9s %9s %9s %9s %9s %10s\n", "variant", "median ms", "min ms", "max ms",
         "speedup", "fallbacks", "max orth");
}

/* The QR list: the loop against osft_qr_batch's variants. */
static void time_batch(const bench_args *a, problem *p, run_args *r, FILE *csv,
                       int hidden, int mlp) {
  run_args args[6] = {
      osft_args(r, OSFT_QR_HOUSEHOLDER, 0),   osft_args(r, OSFT_QR_HOUSEHOLDER, 1),
      osft_args(r, OSFT_QR_CHOLESKY_QR2, 0),  osft_args(r, OSFT_QR_CHOLESKY_QR2, 1),
      osft_args(r, OSFT_QR_CHOLESKY_TF32, 0), osft_args(r, OSFT_QR_CHOLESKY_TF32, 1)};
  static const char *names[6] = {
      "osft_qr_batch householder", "osft_qr_batch householder, 1 worker",
      "osft_qr_batch cholesky",    "osft_qr_batch cholesky, 1 worker",
      "osft_qr_batch tf32",        "osft_qr_batch tf32, 1 worker"};
  variant v[7] = {{a->cuda ? "loop: cuSOLVER sgeqrf+sorgqr, one stream"
                           : "loop: LAPACK sgeqrf+sorgqr one at a time",
                   run_loop, prepare_inputs, r}};
  /* --quick: without the 1-worker variants */
  int nv = 1;
  for (int k = 0; k < 6; ++k)
    if (!a->quick || k % 2 == 0)
      v[nv++] = (variant){names[k], run_osft, prepare_inputs, &args[k]};
  time_variants(v, nv, a->reps);
  for (int i = 0; i < nv; ++i) verify(&v[i], p, a->cuda);
  report(csv, a->cuda ? "cuda" : "cpu", a->scale, p, v, nv, hidden, mlp, a->reps);
}

int main(int argc, char **argv) {
  bench_args a;
  if (parse_args(argc, argv, &a) != 0) return 2;
  const int base_hidden = a.soap_hidden ? a.soap_hidden : 1024;
  const int base_mlp = a.soap_hidden ? a.soap_mlp : 4096;
  const int hidden = base_hidden / a.scale, mlp = base_mlp / a.scale;

  problem p;
  /* CUDA with --workload: the inputs are built on the device, no host copy */
  const int on_device = a.cuda && a.soap_hidden;
  problem_make(&p, a.layers, hidden, mlp, a.soap_hidden != 0, !on_device);
  if (a.soap_hidden) {
    const double t0 = now_ms();
#ifdef BENCH_QR_CUDA
    if (on_device)
      soap_inputs_cuda(&p, a.power);
    else
#endif
      soap_inputs(&p, a.power);
    printf("# inputs built in %.1f s (%s, fp64): %.2f GB per list\n",
           (now_ms() - t0) / 1e3, on_device ? "GPU" : "host", p.total * 4.0 / 1e9);
  }
  osft_context_options_t co;
  CHECK(OSFT_CONTEXT_OPTIONS_INIT(&co));
  co.device_type = a.cuda ? OSFT_DEVICE_CUDA : OSFT_DEVICE_CPU;
  run_args r;
  memset(&r, 0, sizeof r);
  r.p = &p;
  r.cuda = a.cuda;
  CHECK(osft_context_create(&r.ctx, &co));
  tensors *T = xmalloc(sizeof *T);
  float *base = p.work;
#ifdef BENCH_QR_CUDA
  if (a.cuda) {
    cuda_setup(&p);
    base = g_cuda.work;
  }
#endif
  tensors_make(T, &p, base, NULL, a.cuda ? kDLCUDA : kDLCPU);
  r.T = T;
  print_header(&a, &p, hidden, mlp);
  FILE *csv = a.csv_path ? fopen(a.csv_path, "w") : NULL;
  if (csv)
    fprintf(csv,
            "device,workload,scale,count,hidden,mlp,variant,median_ms,min_ms,max_ms,"
            "median_round_speedup_vs_loop,fallbacks,max_orth_err_fro\n");
  time_batch(&a, &p, &r, csv, hidden, mlp);
  if (a.power) {
#ifdef BENCH_QR_CUDA
    if (a.cuda)
      power_cuda(&p, &r, T, csv, a.scale, hidden, mlp, a.reps);
    else
#endif
      power_cpu(&p, &r, T, csv, a.scale, hidden, mlp, a.reps);
  }
  if (csv) fclose(csv);
  CHECK(osft_context_destroy(r.ctx));
#ifdef BENCH_QR_CUDA
  if (a.cuda) cuda_teardown();
#endif
  free(T);
  free(p.pristine);
  free(p.work);
  free(p.factor);
  free(p.qstart);
  return 0;
}
