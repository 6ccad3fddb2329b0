/*
 * bench_flinear — the OSFT layer (factorized linear) fwd+bwd, side by side
 * in one run with
 *   dense    : a plain linear of the same shape (y = x W^T, dx = g W,
 *              dW = g^T x; what full fine-tuning costs), and
 *   unfused  : the straightforward OSFT formulation (four GEMMs then an add
 *              in the forward, autograd-style GEMMs and adds in the
 *              backward), as a framework without fusion runs it (CPU only);
 * and libosftrt's layer (forward, then backward with grad_x and the three
 * trainable factor gradients) with the cost model's choice (auto) and with
 * each strategy forced.
 *
 *   bench_flinear [--device cpu|cuda] [--dtype fp32|bf16] [--scale S]
 *                 [--shapes NxK,...] [--tokens M,M,...] [--ratios F,F,...]
 *                 [--reps R] [--csv FILE]
 *
 * CPU: fp32 by default (the engine's sgemm); S defaults to 4, tokens to
 * 512,4096,16384, R to 3. --dtype bf16 on the CPU: bf16 x, grad_y, factors
 * and gradients; dense is three bf16 GEMMs (oneMKL's
 * cblas_gemm_bf16bf16f32; with OpenBLAS sgemm on widened copies: fp32
 * results, rounded to bf16 as a framework's bf16 linear returns them), unfused is not
 * run, and each shape first prints the engine's fp32 and bf16 GEMM rates (GFLOP/s,
 * interleaved) for its token GEMM (M x N x K) and for the dense form's
 * rebuild GEMM (N x K, inner l), and their ratio.
 * CUDA (builds with OSFT_BENCH_CUDA): bf16 x, grad_y, weight and factors
 * (factor gradients bf16 too), fp32 accumulation; dense is three cuBLAS
 * GEMMs (cublasGemmEx, CUBLAS_COMPUTE_32F, bf16 outputs), the layer runs on
 * a CUDA context; every step ends with a synchronize. S defaults to 1,
 * tokens to 8192, R to 5. The unfused baseline is not run on CUDA (n/a):
 * bench/gpu/peers_torch.py measures PyTorch's mini_trainer formulation.
 *
 * Shapes are Llama-3.1-8B's projections (4096x4096, 1024x4096, 14336x4096,
 * 4096x14336, N out x K in) divided by S, or those of --shapes (not
 * scaled), at each frozen rank ratio of --ratios (default 0.5); one layer
 * per shape and ratio, decomposed once. The layer is timed with auto and
 * with each of the three strategies forced (factorized, dense, hybrid). Each step of the
 * layer first changes the lowest bits of S_low[0] (CPU), as an optimizer step changes the
 * trainable factors, so the dense form pays its once-per-step rebuild. Prints a table
 * with times (median of R rounds after one warm-up, host clock; the baseline and the
 * three layer variants interleaved in each round) and ratios to dense and to unfused; on
 * CUDA also the peak device memory of the layer's context during the auto runs
 * (osft_context_get_memory_stats device_peak: factors, cache, workspace).
 * The CSV (--csv) has a device column and that peak for both devices
 * (host_peak on the CPU).
 */
#include <cblas.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#ifdef OSFT_BENCH_CUDA
#include "bench_cuda.h"
#endif
#include "osftrt/osftrt.h"

static float *fill(size_t n) {
  float *p = xmalloc(n * sizeof(float));
  fill_uniform(p, n, 12345u, 1.0f);
  return p;
}

/* ------------------------------------------------- CPU baselines (fp32) */

/* C (m x n) = A op B, row-major, beta 0 or 1 */
static void gemm(int ta, int tb, int m, int n, int k, const float *a, int lda,
                 const float *b, int ldb, float beta, float *c, int ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans,
              tb ? CblasTrans : CblasNoTrans, m, n, k, 1.0f, a, lda, b, ldb, beta, c,
              ldc);
}

/* ----------------------------------------------- CPU baselines (bf16) */

static float bf16_to_float(uint16_t h) {
  const uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* C (m x n, fp32) = A op B with bf16 A and B: oneMKL's own bf16 GEMM. */
static void gemm_bf16_f32(int ta, int tb, int m, int n, int k, const uint16_t *a, int lda,
                          const uint16_t *b, int ldb, float *c, int ldc) {
#ifdef OSFTRT_MKL_COMPAT_CBLAS_H
  cblas_gemm_bf16bf16f32(
      CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n,
      k, 1.0f, (const MKL_BF16 *)a, lda, (const MKL_BF16 *)b, ldb, 0.0f, c, ldc);
#else
  /* OpenBLAS: widened to fp32, as the library does there (its sbgemm is
   * not in every build). */
  const size_t na = (size_t)(ta ? k : m) * lda, nb = (size_t)(tb ? n : k) * ldb;
  float *a32 = xmalloc(na * sizeof(float)), *b32 = xmalloc(nb * sizeof(float));
  for (size_t i = 0; i < na; ++i) a32[i] = bf16_to_float(a[i]);
  for (size_t i = 0; i < nb; ++i) b32[i] = bf16_to_float(b[i]);
  gemm(ta, tb, m, n, k, a32, lda, b32, ldb, 0.0f, c, ldc);
  free(a32);
  free(b32);
#endif
}

static void narrow_into(uint16_t *dst, const float *src, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = to_bf16(src[i]);
}

static uint16_t *fill_bf16(size_t n, unsigned seed) {
  float *f = xmalloc(n * sizeof(float));
  fill_uniform(f, n, seed, 1.0f);
  uint16_t *b = xmalloc(n * sizeof(uint16_t));
  narrow_into(b, f, n);
  free(f);
  return b;
}

static void scale_cols(float *t, int rows, int cols, int ld, const float *s) {
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < cols; ++j) t[(size_t)i * ld + j] *= s[j];
}

typedef struct {
  int n, k, m, r, l;
  int bf16; /* the bf16 buffers below, not fp32 */
  uint16_t *xb, *gb, *wb, *yb, *dxb, *dwb, *ub, *sb, *vb; /* bf16 (w: the weight) */
  float *c32; /* fp32 GEMM results before rounding */
  float *x, *g, *w, *y, *dx, *dw;
  float *uh, *sh, *vh, *ul, *sl, *vl; /* compact copies for the baseline */
  float *th, *tl, *tmp, *tmp2, *du, *dv, *ds;
} problem;

static void dense_step(problem *p) {
  if (p->bf16) {
    const size_t mn = (size_t)p->m * p->n, mk = (size_t)p->m * p->k;
    gemm_bf16_f32(0, 1, p->m, p->n, p->k, p->xb, p->k, p->wb, p->k, p->c32, p->n);
    narrow_into(p->yb, p->c32, mn);
    gemm_bf16_f32(0, 0, p->m, p->k, p->n, p->gb, p->n, p->wb, p->k, p->c32, p->k);
    narrow_into(p->dxb, p->c32, mk);
    gemm_bf16_f32(1, 0, p->n, p->k, p->m, p->gb, p->n, p->xb, p->k, p->c32, p->k);
    narrow_into(p->dwb, p->c32, (size_t)p->n * p->k);
    return;
  }
  gemm(0, 1, p->m, p->n, p->k, p->x, p->k, p->w, p->k, 0, p->y, p->n);
  gemm(0, 0, p->m, p->k, p->n, p->g, p->n, p->w, p->k, 0, p->dx, p->k);
  gemm(1, 0, p->n, p->k, p->m, p->g, p->n, p->x, p->k, 0, p->dw, p->k);
}

/* The straightforward formulation: no fused GEMMs, separate adds. */
static void unfused_step(problem *p) {
  const int m = p->m, n = p->n, k = p->k, r = p->r, l = p->l;
  /* forward: y = (x Vh^T Sh) Uh^T + (x Vl^T Sl) Ul^T */
  gemm(0, 1, m, r, k, p->x, k, p->vh, k, 0, p->th, r);
  scale_cols(p->th, m, r, r, p->sh);
  gemm(0, 1, m, n, r, p->th, r, p->uh, r, 0, p->y, n);
  gemm(0, 1, m, l, k, p->x, k, p->vl, k, 0, p->tl, l);
  memcpy(p->tmp2, p->tl, sizeof(float) * (size_t)m * l); /* saved for dS */
  scale_cols(p->tl, m, l, l, p->sl);
  gemm(0, 1, m, n, l, p->tl, l, p->ul, l, 0, p->tmp, n);
  for (size_t i = 0; i < (size_t)m * n; ++i) p->y[i] += p->tmp[i];
  /* backward */
  gemm(0, 0, m, r, n, p->g, n, p->uh, r, 0, p->th, r); /* dTh = g Uh */
  scale_cols(p->th, m, r, r, p->sh);
  gemm(0, 0, m, k, r, p->th, r, p->vh, k, 0, p->dx, k); /* dx_h */
  gemm(1, 0, n, l, m, p->g, n, p->tl, l, 0, p->du, l);  /* dUl = g^T Tl Sl */
  gemm(0, 0, m, l, n, p->g, n, p->ul, l, 0, p->tl, l);  /* dTl = g Ul */
  for (int j = 0; j < l; ++j) p->ds[j] = 0;
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < l; ++j)
      p->ds[j] += p->tl[(size_t)i * l + j] * p->tmp2[(size_t)i * l + j];
  scale_cols(p->tl, m, l, l, p->sl);
  gemm(1, 0, l, k, m, p->tl, l, p->x, k, 0, p->dv, k);   /* dVl */
  gemm(0, 0, m, k, l, p->tl, l, p->vl, k, 0, p->tmp, k); /* dx_l */
  for (size_t i = 0; i < (size_t)m * k; ++i) p->dx[i] += p->tmp[i];
}

/* A compact fp32 host copy of one factor of the layer (fp32 or bf16). */
static float *copy_view(osft_flinear_t layer, osft_flinear_factor_t which, int rows,
                        int cols) {
  DLTensor v;
  CHECK(osft_flinear_get_factor(layer, which, &v));
  float *out = xmalloc(sizeof(float) * (size_t)rows * cols);
  const int64_t ld = v.ndim == 2 ? v.strides[0] : cols;
  for (int i = 0; i < rows; ++i)
    if (v.dtype.bits == 16)
      for (int j = 0; j < cols; ++j) {
        out[(size_t)i * cols + j] = bf16_to_float(((const uint16_t *)v.data)[i * ld + j]);
      }
    else
      memcpy(out + (size_t)i * cols, (float *)v.data + i * ld, sizeof(float) * cols);
  return out;
}

/* The baseline's buffers for m tokens over the layer's weight w (not owned). */
static void cpu_problem_init(problem *p, osft_flinear_t layer, float *w, int m) {
  int64_t n64, k64, r64, l64;
  CHECK(osft_flinear_get_dims(layer, &n64, &k64, &r64, &l64));
  memset(p, 0, sizeof *p);
  const int n = p->n = (int)n64, k = p->k = (int)k64;
  p->r = (int)r64;
  p->l = (int)l64;
  p->m = m;
  p->w = w;
  p->x = fill((size_t)m * k);
  p->g = fill((size_t)m * n);
  p->y = fill((size_t)m * n);
  p->dx = fill((size_t)m * k);
  p->dw = fill((size_t)n * k);
  p->uh = copy_view(layer, OSFT_FACTOR_U_HIGH, n, p->r);
  p->ul = copy_view(layer, OSFT_FACTOR_U_LOW, n, p->l);
  p->vh = copy_view(layer, OSFT_FACTOR_V_HIGH, p->r, k);
  p->vl = copy_view(layer, OSFT_FACTOR_V_LOW, p->l, k);
  p->sh = copy_view(layer, OSFT_FACTOR_S_HIGH, 1, p->r);
  p->sl = copy_view(layer, OSFT_FACTOR_S_LOW, 1, p->l);
  p->th = fill((size_t)m * p->r);
  p->tl = fill((size_t)m * p->l);
  p->tmp = fill((size_t)m * (n > k ? n : k));
  p->tmp2 = fill((size_t)m * p->l);
  p->du = fill((size_t)n * p->l);
  p->dv = fill((size_t)p->l * k);
  p->ds = fill((size_t)p->l);
}

/* The bf16 twins of x, g, w and the outputs, plus the layer's gradients. */
static void cpu_problem_bf16(problem *p) {
  const size_t m = (size_t)p->m, n = (size_t)p->n, k = (size_t)p->k, l = (size_t)p->l;
  const size_t big = (m > n ? m : n) * (m > k ? m : k);
  p->bf16 = 1;
  p->xb = fill_bf16(m * k, 1u);
  p->gb = fill_bf16(m * n, 2u);
  p->wb = xmalloc(n * k * sizeof(uint16_t));
  narrow_into(p->wb, p->w, n * k);
  p->yb = fill_bf16(m * n, 3u);
  p->dxb = fill_bf16(m * k, 4u);
  p->dwb = fill_bf16(n * k, 5u);
  p->ub = fill_bf16(n * l, 6u);
  p->sb = fill_bf16(l, 7u);
  p->vb = fill_bf16(l * k, 8u);
  p->c32 = fill(big > n * k ? big : n * k);
}

static void cpu_problem_free(problem *p) {
  float *bufs[] = {p->x,  p->g,  p->y,  p->dx, p->dw,  p->uh,   p->ul, p->vh, p->vl,
                   p->sh, p->sl, p->th, p->tl, p->tmp, p->tmp2, p->du, p->dv, p->ds};
  for (size_t b = 0; b < sizeof bufs / sizeof bufs[0]; ++b) free(bufs[b]);
  uint16_t *bb[] = {p->xb, p->gb, p->wb, p->yb, p->dxb, p->dwb, p->ub, p->sb, p->vb};
  for (size_t b = 0; b < sizeof bb / sizeof bb[0]; ++b) free(bb[b]);
  free(p->c32);
}

/* ------------------------------------------------ CUDA baseline (bf16) */

#ifdef OSFT_BENCH_CUDA
/* n fresh values uniform in [-scale/2, scale/2) from `seed`, as bf16 on the
 * GPU. */
static void *upload_bf16(size_t n, unsigned seed, float scale) {
  float *host = xmalloc(n * sizeof(float));
  fill_uniform(host, n, seed, scale);
  void *dev = upload(host, n, 1);
  free(host);
  return dev;
}

typedef struct {
  cublasHandle_t blas;
  int n, k, m;
  void *x, *g, *w, *y, *dx, *dw; /* bf16 on the GPU; w belongs to the shape */
} gpu_problem;

static void gpu_dense_step(gpu_problem *p) {
  const int m = p->m, n = p->n, k = p->k;
  /* y = x W^T, dx = g W, dW = g^T x, all bf16 */
  gemm_bf16(p->blas, 0, 1, m, n, k, p->x, k, p->w, k, p->y, n, CUDA_R_16BF);
  gemm_bf16(p->blas, 0, 0, m, k, n, p->g, n, p->w, k, p->dx, k, CUDA_R_16BF);
  gemm_bf16(p->blas, 1, 0, n, k, m, p->g, n, p->x, k, p->dw, k, CUDA_R_16BF);
  cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

static void run_gpu_dense(void *p) {
  gpu_dense_step(p);
}
#endif

/* --------------------------------------------------------- the layer */

/* A compact tensor: fp32 or bf16 on the host, or bf16 on the GPU. */
static DLTensor dev_tensor(void *data, int cuda, int bf16, int ndim, int64_t *shape) {
  DLTensor t = host_f32_tensor(data, ndim, shape);
  if (cuda) t.device.device_type = kDLCUDA;
  if (cuda || bf16) {
    t.dtype.code = kDLBfloat;
    t.dtype.bits = 16;
  }
  return t;
}

typedef struct {
  osft_context_t ctx;
  int cuda, bf16;
  osft_flinear_t layer;
  int64_t xs[2], ys[2], us[2], ss[1], vs[2];
  DLTensor x, g, y, dx, du, ds, dv;
  unsigned char *s_low; /* the layer's S_low[0]: its lowest byte, changed per step */
  unsigned steps;
  osft_flinear_grads_t grads;
} osft_run;

/* The buffers a step reads and writes (the device's dtype). */
typedef struct {
  void *x, *g, *y, *dx, *du, *ds, *dv;
} osft_io;

/* Points the run's tensors at io for m tokens of an n x k layer of rank l. */
static void osft_bind(osft_run *o, int m, int n, int k, int l, const osft_io *io) {
  o->xs[0] = o->ys[0] = m;
  o->xs[1] = o->vs[1] = k;
  o->ys[1] = o->us[0] = n;
  o->us[1] = o->ss[0] = o->vs[0] = l;
  o->x = dev_tensor(io->x, o->cuda, o->bf16, 2, o->xs);
  o->g = dev_tensor(io->g, o->cuda, o->bf16, 2, o->ys);
  o->y = dev_tensor(io->y, o->cuda, o->bf16, 2, o->ys);
  o->dx = dev_tensor(io->dx, o->cuda, o->bf16, 2, o->xs);
  o->du = dev_tensor(io->du, o->cuda, o->bf16, 2, o->us);
  o->ds = dev_tensor(io->ds, o->cuda, o->bf16, 1, o->ss);
  o->dv = dev_tensor(io->dv, o->cuda, o->bf16, 2, o->vs);
  CHECK(OSFT_FLINEAR_GRADS_INIT(&o->grads));
  o->grads.grad_x = &o->dx;
  o->grads.grad_u_low = &o->du;
  o->grads.grad_s_low = &o->ds;
  o->grads.grad_v_low = &o->dv;
}

static void osft_step(osft_run *o) {
  /* What an optimizer step does to the layer: the trainable factors change
   * (the 3 lowest bits of S_low[0], fp32 or bf16, on the host, count the
   * steps: 8 states, so no step returns to the values of the weight the
   * layer kept a few steps ago), so the dense form rebuilds its weight
   * once per step as in training. */
  if (o->s_low) o->s_low[0] = (unsigned char)((o->s_low[0] & ~7u) | (++o->steps & 7u));
  CHECK(osft_flinear_forward(o->layer, &o->x, NULL, &o->y));
  CHECK(osft_flinear_backward(o->layer, &o->x, &o->g, &o->grads));
  if (o->cuda) CHECK(osft_context_synchronize(o->ctx));
}

/* ------------------------------------------------------------- timing */

typedef void (*step_fn)(void *);
static void run_dense(void *p) {
  dense_step(p);
}
static void run_unfused(void *p) {
  unfused_step(p);
}

static double median_ms(step_fn f, void *arg, int reps) {
  double t[32];
  f(arg); /* warm-up: caches, workspace, thread pool, cuBLAS heuristics */
  for (int i = 0; i < reps; ++i) {
    const double t0 = now_ms();
    f(arg);
    t[i] = now_ms() - t0;
  }
  for (int i = 1; i < reps; ++i)
    for (int j = i; j > 0 && t[j] < t[j - 1]; --j) {
      double s = t[j];
      t[j] = t[j - 1];
      t[j - 1] = s;
    }
  return t[reps / 2];
}

/* One row of the table. */
typedef struct {
  int n, k, m, r, l;
  double dense, unfused, autot, fact, rebuild, hybrid; /* ms; unfused < 0: not run */
  double ratio;                                        /* frozen rank ratio */
  double peak_mib; /* the context's peak during the auto runs */
  osft_flinear_strategy_t fwd, bwd;
} result;

/* Peak memory of the context (device on CUDA, host on the CPU), in MiB. */
static double context_peak_mib(osft_context_t ctx, int cuda) {
  osft_memory_stats_t st;
  memset(&st, 0, sizeof st);
  st.struct_size = sizeof st;
  CHECK(osft_context_get_memory_stats(ctx, &st));
  return (double)(cuda ? st.device_peak : st.host_peak) / (1 << 20);
}

/* The layer with the cost model's choice (its peak memory measured from
 * the factors alone: caches dropped, workspace released) and with each
 * strategy forced. */
static void sort_ms(double *t, int n) {
  for (int i = 1; i < n; ++i)
    for (int j = i; j > 0 && t[j] < t[j - 1]; --j) {
      double s = t[j];
      t[j] = t[j - 1];
      t[j - 1] = s;
    }
}

/* One step of the layer with the given strategy, in ms. */
static double osft_once(osft_run *o, osft_flinear_strategy_t s) {
  CHECK(osft_flinear_set_strategy(o->layer, s));
  const double t0 = now_ms();
  osft_step(o);
  return now_ms() - t0;
}

/* The baseline, the layer with the cost model's choice and with each
 * strategy forced, interleaved round by round (a shared machine's load
 * then weighs on all alike); medians. The layer's peak memory is measured
 * over the warm-up auto step alone, from the factors (caches dropped,
 * workspace released). */
static void time_osft(osft_run *o, step_fn base, void *base_arg, int reps, result *res) {
  CHECK(osft_flinear_set_strategy(o->layer, OSFT_FLINEAR_AUTO));
  CHECK(osft_flinear_refresh(o->layer));
  CHECK(osft_flinear_choose_strategy(o->layer, res->m, OSFT_FLINEAR_FORWARD, &res->fwd));
  CHECK(osft_flinear_choose_strategy(o->layer, res->m, OSFT_FLINEAR_BACKWARD, &res->bwd));
  CHECK(osft_context_release_workspace(o->ctx));
  CHECK(osft_context_reset_peak_memory(o->ctx));
  osft_once(o, OSFT_FLINEAR_AUTO);
  res->peak_mib = context_peak_mib(o->ctx, o->cuda);
  osft_once(o, OSFT_FLINEAR_FACTORIZED);
  osft_once(o, OSFT_FLINEAR_DENSE);
  osft_once(o, OSFT_FLINEAR_HYBRID);
  base(base_arg);
  double tb[32], ta[32], tf[32], td[32], th[32];
  for (int i = 0; i < reps; ++i) {
    double t0 = now_ms();
    base(base_arg);
    tb[i] = now_ms() - t0;
    tf[i] = osft_once(o, OSFT_FLINEAR_FACTORIZED);
    td[i] = osft_once(o, OSFT_FLINEAR_DENSE);
    th[i] = osft_once(o, OSFT_FLINEAR_HYBRID);
    ta[i] = osft_once(o, OSFT_FLINEAR_AUTO);
  }
  sort_ms(th, reps);
  res->hybrid = th[reps / 2];
  sort_ms(tb, reps);
  sort_ms(ta, reps);
  sort_ms(tf, reps);
  sort_ms(td, reps);
  res->dense = tb[reps / 2];
  res->autot = ta[reps / 2];
  res->fact = tf[reps / 2];
  res->rebuild = td[reps / 2];
}

/* GFLOP/s of the engine's fp32 and bf16 GEMMs, C (m x n) = A (m x k) B^T,
 * interleaved (median of reps each). */
static void gemm_rates(int m, int n, int k, int reps, double *f32, double *b16) {
  float *a = fill((size_t)m * k), *b = fill((size_t)n * k), *c = fill((size_t)m * n);
  uint16_t *ab = fill_bf16((size_t)m * k, 9u), *bb = fill_bf16((size_t)n * k, 10u);
  double t32[32], t16[32];
  gemm(0, 1, m, n, k, a, k, b, k, 0, c, n);
  gemm_bf16_f32(0, 1, m, n, k, ab, k, bb, k, c, n);
  for (int i = 0; i < reps; ++i) {
    double t0 = now_ms();
    gemm(0, 1, m, n, k, a, k, b, k, 0, c, n);
    t32[i] = now_ms() - t0;
    t0 = now_ms();
    gemm_bf16_f32(0, 1, m, n, k, ab, k, bb, k, c, n);
    t16[i] = now_ms() - t0;
  }
  double best32 = t32[0], best16 = t16[0];
  for (int i = 1; i < reps; ++i) {
    if (t32[i] < best32) best32 = t32[i];
    if (t16[i] < best16) best16 = t16[i];
  }
  *f32 = 2e-6 * m * n * (double)k / best32;
  *b16 = 2e-6 * m * n * (double)k / best16;
  free(a);
  free(b);
  free(c);
  free(ab);
  free(bb);
}

/* CPU: dense, unfused and the layer for m tokens; w is the layer's weight. */
static void cpu_case(osft_run *o, float *w, int reps, result *res) {
  problem p;
  cpu_problem_init(&p, o->layer, w, res->m);
  osft_io io = {p.x, p.g, p.y, p.dx, p.du, p.ds, p.dv};
  if (o->bf16) {
    cpu_problem_bf16(&p);
    const osft_io b = {p.xb, p.gb, p.yb, p.dxb, p.ub, p.sb, p.vb};
    io = b;
    double tok32, tok16, reb32, reb16;
    gemm_rates(p.m, p.n, p.k, reps, &tok32, &tok16);
    gemm_rates(p.n, p.k, p.l, reps, &reb32, &reb16);
    printf(
        "# rates %dx%d M=%d (GFLOP/s, best of %d): token GEMM fp32 %.0f bf16 %.0f "
        "(x%.2f); rebuild GEMM %dx%dx%d fp32 %.0f bf16 %.0f (x%.2f)\n",
        p.n, p.k, p.m, reps, tok32, tok16, tok16 / tok32, p.n, p.k, p.l, reb32, reb16,
        reb16 / reb32);
  }
  osft_bind(o, p.m, p.n, p.k, p.l, &io);
  res->unfused = o->bf16 ? -1.0 : median_ms(run_unfused, &p, reps);
  time_osft(o, run_dense, &p, reps, res);
  cpu_problem_free(&p);
}

#ifdef OSFT_BENCH_CUDA
/* CUDA: cuBLAS dense and the layer for m tokens, fresh bf16 inputs (outputs
 * pre-filled with random values too). p holds the handle and the weight. */
static void cuda_case(osft_run *o, gpu_problem *p, int reps, result *res) {
  const size_t m = (size_t)res->m, n = (size_t)res->n, k = (size_t)res->k;
  const size_t l = (size_t)res->l;
  p->m = res->m;
  p->x = upload_bf16(m * k, 1u, 2.0f);
  p->g = upload_bf16(m * n, 2u, 0.02f);
  p->y = upload_bf16(m * n, 3u, 1.0f);
  p->dx = upload_bf16(m * k, 4u, 1.0f);
  p->dw = upload_bf16(n * k, 5u, 1.0f);
  const osft_io io = {p->x,
                      p->g,
                      p->y,
                      p->dx,
                      upload_bf16(n * l, 6u, 1.0f),
                      upload_bf16(l, 7u, 1.0f),
                      upload_bf16(l * k, 8u, 1.0f)};
  osft_bind(o, res->m, res->n, res->k, res->l, &io);
  res->unfused = -1.0;
  time_osft(o, run_gpu_dense, p, reps, res);
  void *bufs[] = {p->x, p->g, p->y, p->dx, p->dw, io.du, io.ds, io.dv};
  for (size_t b = 0; b < sizeof bufs / sizeof bufs[0]; ++b)
    cuda_check(cudaFree(bufs[b]), "cudaFree");
}
#endif

/* -------------------------------------------------------------- output */

typedef struct {
  int cuda, bf16, scale, reps, n_tokens, tokens[8];
  int n_shapes, shapes[8][2]; /* --shapes (unscaled); 0: Llama's / scale */
  int n_ratios;
  double ratios[8]; /* --ratios: frozen rank ratios */
  const char *csv_path;
} config;

static const char *strategy_name(osft_flinear_strategy_t s) {
  return s == OSFT_FLINEAR_DENSE    ? "dense"
         : s == OSFT_FLINEAR_HYBRID ? "hybrid"
                                    : "factorized";
}

static void print_header(const config *c) {
  printf("# %s\n", osft_build_info());
  if (c->cuda)
    printf(
        "# bf16 (fp32 accumulate), CUDA, shapes / %d, median of %d; "
        "unfused: see bench/gpu/peers_torch.py; peak: the context's device_peak "
        "(auto)\n",
        c->scale, c->reps);
  else
    printf("# %s, CPU, shapes / %d, median of %d\n",
           c->bf16 ? "bf16 (fp32 accumulate)" : "fp32", c->n_shapes ? 1 : c->scale,
           c->reps);
  printf("%-12s %4s %6s | %9s %9s | %9s %9s %9s %9s | %-17s | %8s %8s %8s", "N x K",
         "fro", "M", "dense", "unfused", "osft", "fact", "rebuild", "hybrid", "choice",
         "osft/dns", "unf/osft", "osft/bst");
  if (c->cuda) printf(" | %8s", "peak MiB");
  printf("\n");
}

static void print_row(const result *r, int cuda) {
  char shape[24], choice[24], unf[24] = "n/a", speedup[24] = "n/a";
  snprintf(shape, sizeof shape, "%dx%d", r->n, r->k);
  snprintf(choice, sizeof choice, "%s/%s", strategy_name(r->fwd), strategy_name(r->bwd));
  if (r->unfused >= 0) {
    snprintf(unf, sizeof unf, "%.2f", r->unfused);
    snprintf(speedup, sizeof speedup, "%.3f", r->unfused / r->autot);
  }
  double best = r->fact < r->rebuild ? r->fact : r->rebuild;
  if (r->hybrid < best) best = r->hybrid;
  printf(
      "%-12s %4.2f %6d | %9.2f %9s | %9.2f %9.2f %9.2f %9.2f | %-17.17s | %8.3f %8s "
      "%8.3f",
      shape, r->ratio, r->m, r->dense, unf, r->autot, r->fact, r->rebuild, r->hybrid,
      choice, r->autot / r->dense, speedup, r->autot / best);
  if (cuda) printf(" | %8.1f", r->peak_mib);
  printf("\n");
  fflush(stdout);
}

static void csv_header(FILE *csv) {
  fprintf(csv,
          "device,n,k,m,r,l,dense_ms,unfused_ms,auto_ms,factorized_ms,denseosft_ms,"
          "auto_choice_fwd,auto_choice_bwd,auto_over_dense,auto_speedup_vs_unfused,"
          "osft_peak_mib,hybrid_ms,rank_ratio\n");
}

/* unfused_ms and auto_speedup_vs_unfused are empty where unfused did not run. */
static void csv_row(FILE *csv, const result *r, int cuda) {
  char unf[24] = "", speedup[24] = "";
  if (r->unfused >= 0) {
    snprintf(unf, sizeof unf, "%.3f", r->unfused);
    snprintf(speedup, sizeof speedup, "%.4f", r->unfused / r->autot);
  }
  fprintf(csv, "%s,%d,%d,%d,%d,%d,%.3f,%s,%.3f,%.3f,%.3f,%s,%s,%.4f,%s,%.2f,%.3f,%.3f\n",
          cuda ? "cuda" : "cpu", r->n, r->k, r->m, r->r, r->l, r->dense, unf, r->autot,
          r->fact, r->rebuild, strategy_name(r->fwd), strategy_name(r->bwd),
          r->autot / r->dense, speedup, r->peak_mib, r->hybrid, r->ratio);
  fflush(csv);
}

/* ---------------------------------------------------------------- main */

typedef struct {
  config c;
  osft_context_t ctx;
  void *blas; /* cublasHandle_t on CUDA */
  FILE *csv;
} bench_env;

/* A random N x K weight: fp32 on the host, or bf16 on the GPU. */
static void *make_weight(const bench_env *e, int n, int k) {
#ifdef OSFT_BENCH_CUDA
  if (e->c.cuda) return upload_bf16((size_t)n * k, 12345u, 1.0f);
#else
  (void)e;
#endif
  return fill((size_t)n * k);
}

static void free_weight(const bench_env *e, void *w) {
#ifdef OSFT_BENCH_CUDA
  if (e->c.cuda) {
    cuda_check(cudaFree(w), "cudaFree");
    return;
  }
#else
  (void)e;
#endif
  free(w);
}

static void bench_case(const bench_env *e, osft_run *o, void *w, result *res) {
#ifdef OSFT_BENCH_CUDA
  if (e->c.cuda) {
    gpu_problem p;
    memset(&p, 0, sizeof p);
    p.blas = (cublasHandle_t)e->blas;
    p.n = res->n;
    p.k = res->k;
    p.w = w;
    cuda_case(o, &p, e->c.reps, res);
    return;
  }
#endif
  cpu_case(o, w, e->c.reps, res);
}

/* One shape at one frozen rank ratio: the weight decomposed once, then
 * every token count. */
static void bench_shape(const bench_env *e, int n, int k, double ratio) {
  void *w = make_weight(e, n, k);
  int64_t wshape[2] = {n, k};
  DLTensor wt = dev_tensor(w, e->c.cuda, 0, 2, wshape);
  osft_flinear_options_t opts;
  CHECK(OSFT_FLINEAR_OPTIONS_INIT(&opts));
  opts.rank_ratio = ratio;
  if (e->c.bf16) {
    opts.factor_dtype.code = kDLBfloat;
    opts.factor_dtype.bits = 16;
    opts.factor_dtype.lanes = 1;
  }
  osft_run o;
  memset(&o, 0, sizeof o);
  o.ctx = e->ctx;
  o.cuda = e->c.cuda;
  o.bf16 = e->c.bf16;
  CHECK(osft_flinear_create_from_weight(e->ctx, &wt, &opts, &o.layer));
  if (!o.cuda) {
    DLTensor sl;
    CHECK(osft_flinear_get_factor(o.layer, OSFT_FACTOR_S_LOW, &sl));
    o.s_low = (unsigned char *)sl.data;
  }
  int64_t r64, l64;
  CHECK(osft_flinear_get_dims(o.layer, NULL, NULL, &r64, &l64));
  for (int ti = 0; ti < e->c.n_tokens; ++ti) {
    result res;
    memset(&res, 0, sizeof res);
    res.n = n;
    res.k = k;
    res.m = e->c.tokens[ti];
    res.r = (int)r64;
    res.l = (int)l64;
    res.ratio = ratio;
    bench_case(e, &o, w, &res);
    print_row(&res, e->c.cuda);
    if (e->csv) csv_row(e->csv, &res, e->c.cuda);
  }
  CHECK(osft_flinear_destroy(o.layer));
  free_weight(e, w);
}

static int usage(const char *argv0) {
  fprintf(stderr,
          "usage: %s [--device cpu|cuda] [--dtype fp32|bf16] [--scale S] "
          "[--shapes NxK,..] [--tokens M,..] [--ratios F,..] [--reps R] [--csv FILE]\n",
          argv0);
  return 2;
}

/* 0, or 2 after a usage message; then the device's defaults. */
static int parse_args(config *c, int argc, char **argv) {
  memset(c, 0, sizeof *c);
  for (int i = 1; i < argc; ++i) {
    const int has_value = i + 1 < argc;
    if (!strcmp(argv[i], "--scale") && has_value)
      c->scale = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--reps") && has_value)
      c->reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--csv") && has_value)
      c->csv_path = argv[++i];
    else if (!strcmp(argv[i], "--device") && has_value) {
      const char *d = argv[++i];
      if (strcmp(d, "cpu") && strcmp(d, "cuda")) return usage(argv[0]);
      c->cuda = !strcmp(d, "cuda");
    } else if (!strcmp(argv[i], "--dtype") && has_value) {
      const char *d = argv[++i];
      if (strcmp(d, "fp32") && strcmp(d, "bf16")) return usage(argv[0]);
      c->bf16 = !strcmp(d, "bf16");
    } else if (!strcmp(argv[i], "--shapes") && has_value) {
      c->n_shapes = 0;
      for (char *tok = strtok(argv[++i], ","); tok && c->n_shapes < 8;
           tok = strtok(NULL, ",")) {
        int n = 0, k = 0;
        if (sscanf(tok, "%dx%d", &n, &k) != 2 || n < 2 || k < 2) return usage(argv[0]);
        c->shapes[c->n_shapes][0] = n;
        c->shapes[c->n_shapes++][1] = k;
      }
    } else if (!strcmp(argv[i], "--ratios") && has_value) {
      c->n_ratios = 0;
      for (char *tok = strtok(argv[++i], ","); tok && c->n_ratios < 8;
           tok = strtok(NULL, ",")) {
        const double f = atof(tok);
        if (!(f > 0.0 && f < 1.0)) return usage(argv[0]);
        c->ratios[c->n_ratios++] = f;
      }
    } else if (!strcmp(argv[i], "--tokens") && has_value) {
      c->n_tokens = 0;
      for (char *tok = strtok(argv[++i], ","); tok && c->n_tokens < 8;
           tok = strtok(NULL, ","))
        if (atoi(tok) > 0) c->tokens[c->n_tokens++] = atoi(tok);
    } else
      return usage(argv[0]);
  }
  if (c->cuda && c->bf16 == 0) c->bf16 = 1; /* CUDA runs bf16 only */
  if (c->scale < 1) c->scale = c->cuda ? 1 : 4;
  if (c->reps < 1 || c->reps > 31) c->reps = c->cuda ? 5 : 3;
  if (c->n_ratios == 0) {
    c->n_ratios = 1;
    c->ratios[0] = 0.5;
  }
  if (c->n_tokens == 0) {
    const int cpu[3] = {512, 4096, 16384};
    c->n_tokens = c->cuda ? 1 : 3;
    if (c->cuda)
      c->tokens[0] = 8192;
    else
      memcpy(c->tokens, cpu, sizeof cpu);
  }
  return 0;
}

/* The context (and on CUDA the cuBLAS handle) for the run. */
static void env_open(bench_env *e) {
  osft_context_options_t co;
  CHECK(OSFT_CONTEXT_OPTIONS_INIT(&co));
  co.device_type = e->c.cuda ? OSFT_DEVICE_CUDA : OSFT_DEVICE_CPU;
  CHECK(osft_context_create(&e->ctx, &co));
  e->blas = NULL;
#ifdef OSFT_BENCH_CUDA
  if (e->c.cuda) {
    cublasHandle_t h;
    cublas_check(cublasCreate(&h), "cublasCreate");
    e->blas = h;
  }
#endif
}

static void env_close(bench_env *e) {
#ifdef OSFT_BENCH_CUDA
  if (e->blas) cublas_check(cublasDestroy((cublasHandle_t)e->blas), "cublasDestroy");
#endif
  CHECK(osft_context_destroy(e->ctx));
  if (e->csv && fclose(e->csv)) {
    fprintf(stderr, "writing %s failed\n", e->c.csv_path);
    exit(1);
  }
}

int main(int argc, char **argv) {
  bench_env e;
  memset(&e, 0, sizeof e);
  if (parse_args(&e.c, argc, argv)) return 2;
#ifndef OSFT_BENCH_CUDA
  if (e.c.cuda) {
    fprintf(stderr, "this bench_flinear was built without CUDA\n");
    return 2;
  }
#endif
  if (e.c.csv_path && !(e.csv = fopen(e.c.csv_path, "w"))) {
    fprintf(stderr, "cannot open %s\n", e.c.csv_path);
    return 1;
  }
  if (e.csv) csv_header(e.csv);
  print_header(&e.c);
  env_open(&e);
  const int shapes[4][2] = {{4096, 4096}, {1024, 4096}, {14336, 4096}, {4096, 14336}};
  for (int q = 0; q < e.c.n_ratios; ++q) {
    const double f = e.c.ratios[q];
    if (e.c.n_shapes > 0)
      for (int s = 0; s < e.c.n_shapes; ++s)
        bench_shape(&e, e.c.shapes[s][0], e.c.shapes[s][1], f);
    else
      for (int s = 0; s < 4; ++s)
        bench_shape(&e, shapes[s][0] / e.c.scale, shapes[s][1] / e.c.scale, f);
  }
  env_close(&e);
  return 0;
}
