/*
 * bench_flinear — the OSFT layer (factorized linear) fwd+bwd, side by side
 * in one run with
 *   dense    : a plain linear of the same shape (y = x W^T, dx = g W,
 *              dW = g^T x; what full fine-tuning costs), and
 *   unfused  : the straightforward OSFT formulation (four GEMMs then an add
 *              in the forward, autograd-style GEMMs and adds in the
 *              backward), as a framework without fusion runs it;
 * and libosftrt's layer with the cost model's choice (auto) and with each
 * strategy forced. fp32 on the CPU (OpenBLAS).
 *
 *   bench_flinear [--scale S] [--tokens M,M,...] [--reps R] [--csv FILE]
 *
 * Shapes are Llama-3.1-8B's projections (4096x4096, 1024x4096, 14336x4096,
 * 4096x14336) divided by S (default 4 on the CPU), rank ratio 0.5. Prints a
 * table with times (median of R runs) and ratios to dense and to unfused.
 */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "osftrt/osftrt.h"

static float *fill(size_t n) {
  float *p = xmalloc(n * sizeof(float));
  fill_uniform(p, n, 12345u, 1.0f);
  return p;
}

/* C (m x n) = A op B, row-major, beta 0 or 1 */
static void gemm(int ta, int tb, int m, int n, int k, const float *a, int lda,
                 const float *b, int ldb, float beta, float *c, int ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans,
              tb ? CblasTrans : CblasNoTrans, m, n, k, 1.0f, a, lda, b, ldb, beta, c,
              ldc);
}

static void scale_cols(float *t, int rows, int cols, int ld, const float *s) {
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < cols; ++j) t[(size_t)i * ld + j] *= s[j];
}

typedef struct {
  int n, k, m, r, l;
  float *x, *g, *w, *y, *dx, *dw;
  float *uh, *sh, *vh, *ul, *sl, *vl; /* compact copies for the baseline */
  float *th, *tl, *tmp, *tmp2, *du, *dv, *ds;
} problem;

static void dense_step(problem *p) {
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

typedef struct {
  osft_flinear_t layer;
  DLTensor x, g, y, dx, du, ds, dv;
  osft_flinear_grads_t grads;
} osft_run;

static void osft_step(osft_run *o) {
  CHECK(osft_flinear_forward(o->layer, &o->x, NULL, &o->y));
  CHECK(osft_flinear_backward(o->layer, &o->x, &o->g, &o->grads));
}

typedef void (*step_fn)(void *);
static void run_dense(void *p) {
  dense_step(p);
}
static void run_unfused(void *p) {
  unfused_step(p);
}
static void run_osft(void *o) {
  osft_step(o);
}

static double median_ms(step_fn f, void *arg, int reps) {
  double t[32];
  f(arg); /* warm-up: caches, workspace, thread pool */
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

static float *copy_view(osft_flinear_t layer, osft_flinear_factor_t which, int rows,
                        int cols) {
  DLTensor v;
  CHECK(osft_flinear_get_factor(layer, which, &v));
  float *out = malloc(sizeof(float) * (size_t)rows * cols);
  const int64_t ld = v.ndim == 2 ? v.strides[0] : cols;
  for (int i = 0; i < rows; ++i)
    memcpy(out + (size_t)i * cols, (float *)v.data + i * ld, sizeof(float) * cols);
  return out;
}

static const char *strategy_name(osft_flinear_strategy_t s) {
  return s == OSFT_FLINEAR_DENSE ? "dense" : "factorized";
}

int main(int argc, char **argv) {
  int scale = 4, reps = 3, tokens[8] = {512, 4096, 16384}, n_tokens = 3;
  const char *csv_path = NULL;
  for (int i = 1; i < argc; ++i) {
    if (!strcmp(argv[i], "--scale") && i + 1 < argc)
      scale = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
      reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--csv") && i + 1 < argc)
      csv_path = argv[++i];
    else if (!strcmp(argv[i], "--tokens") && i + 1 < argc) {
      n_tokens = 0;
      for (char *tok = strtok(argv[++i], ","); tok && n_tokens < 8;
           tok = strtok(NULL, ","))
        tokens[n_tokens++] = atoi(tok);
    } else {
      fprintf(stderr, "usage: %s [--scale S] [--tokens M,..] [--reps R] [--csv FILE]\n",
              argv[0]);
      return 2;
    }
  }
  if (reps < 1 || reps > 31) reps = 3;
  const int shapes[4][2] = {{4096, 4096}, {1024, 4096}, {14336, 4096}, {4096, 14336}};
  FILE *csv = csv_path ? fopen(csv_path, "w") : NULL;
  if (csv)
    fprintf(
        csv,
        "n,k,m,r,dense_ms,unfused_ms,auto_ms,factorized_ms,denseosft_ms,auto_choice_fwd,"
        "auto_choice_bwd,auto_over_dense,auto_speedup_vs_unfused\n");
  printf("# %s\n# fp32, CPU, rank ratio 0.5, shapes / %d, median of %d\n",
         osft_build_info(), scale, reps);
  printf("%-12s %6s | %9s %9s | %9s %9s %9s | %-10s | %8s %8s\n", "N x K", "M", "dense",
         "unfused", "osft", "fact", "rebuild", "choice", "osft/dns", "unf/osft");
  osft_context_t ctx;
  CHECK(osft_context_create(&ctx, NULL));
  for (int s = 0; s < 4; ++s) {
    const int n = shapes[s][0] / scale, k = shapes[s][1] / scale;
    const int kk = n < k ? n : k;
    for (int ti = 0; ti < n_tokens; ++ti) {
      problem p;
      memset(&p, 0, sizeof p);
      p.n = n;
      p.k = k;
      p.m = tokens[ti];
      const int m = p.m;
      p.w = fill((size_t)n * k);
      int64_t wshape[2] = {n, k};
      DLTensor wt = host_f32_tensor(p.w, 2, wshape);
      osft_flinear_options_t opts;
      CHECK(OSFT_FLINEAR_OPTIONS_INIT(&opts));
      osft_run o;
      memset(&o, 0, sizeof o);
      CHECK(osft_flinear_create_from_weight(ctx, &wt, &opts, &o.layer));
      int64_t r64, l64;
      CHECK(osft_flinear_get_dims(o.layer, NULL, NULL, &r64, &l64));
      p.r = (int)r64;
      p.l = (int)l64;
      p.x = fill((size_t)m * k);
      p.g = fill((size_t)m * n);
      p.y = fill((size_t)m * n);
      p.dx = fill((size_t)m * k);
      p.dw = fill((size_t)n * k);
      p.uh = copy_view(o.layer, OSFT_FACTOR_U_HIGH, n, p.r);
      p.ul = copy_view(o.layer, OSFT_FACTOR_U_LOW, n, p.l);
      p.vh = copy_view(o.layer, OSFT_FACTOR_V_HIGH, p.r, k);
      p.vl = copy_view(o.layer, OSFT_FACTOR_V_LOW, p.l, k);
      p.sh = copy_view(o.layer, OSFT_FACTOR_S_HIGH, 1, p.r);
      p.sl = copy_view(o.layer, OSFT_FACTOR_S_LOW, 1, p.l);
      p.th = fill((size_t)m * p.r);
      p.tl = fill((size_t)m * p.l);
      p.tmp = fill((size_t)m * (n > k ? n : k));
      p.tmp2 = fill((size_t)m * p.l);
      p.du = fill((size_t)n * p.l);
      p.dv = fill((size_t)p.l * k);
      p.ds = fill((size_t)p.l);
      int64_t xs[2] = {m, k}, ys[2] = {m, n}, us[2] = {n, p.l}, ss[1] = {p.l},
              vs[2] = {p.l, k};
      o.x = host_f32_tensor(p.x, 2, xs);
      o.g = host_f32_tensor(p.g, 2, ys);
      o.y = host_f32_tensor(p.y, 2, ys);
      o.dx = host_f32_tensor(p.dx, 2, xs);
      o.du = host_f32_tensor(p.du, 2, us);
      o.ds = host_f32_tensor(p.ds, 1, ss);
      o.dv = host_f32_tensor(p.dv, 2, vs);
      CHECK(OSFT_FLINEAR_GRADS_INIT(&o.grads));
      o.grads.grad_x = &o.dx;
      o.grads.grad_u_low = &o.du;
      o.grads.grad_s_low = &o.ds;
      o.grads.grad_v_low = &o.dv;

      const double t_dense = median_ms(run_dense, &p, reps);
      const double t_unfused = median_ms(run_unfused, &p, reps);
      osft_flinear_strategy_t fwd, bwd;
      CHECK(osft_flinear_choose_strategy(o.layer, m, OSFT_FLINEAR_FORWARD, &fwd));
      CHECK(osft_flinear_choose_strategy(o.layer, m, OSFT_FLINEAR_BACKWARD, &bwd));
      const double t_auto = median_ms(run_osft, &o, reps);
      CHECK(osft_flinear_set_strategy(o.layer, OSFT_FLINEAR_FACTORIZED));
      const double t_fact = median_ms(run_osft, &o, reps);
      CHECK(osft_flinear_set_strategy(o.layer, OSFT_FLINEAR_DENSE));
      const double t_rebuild = median_ms(run_osft, &o, reps);
      char choice[24];
      snprintf(choice, sizeof choice, "%s/%s", strategy_name(fwd) + 0,
               strategy_name(bwd));
      char shape[24];
      snprintf(shape, sizeof shape, "%dx%d", n, k);
      printf("%-12s %6d | %9.2f %9.2f | %9.2f %9.2f %9.2f | %-10.10s | %8.3f %8.3f\n",
             shape, m, t_dense, t_unfused, t_auto, t_fact, t_rebuild, choice,
             t_auto / t_dense, t_unfused / t_auto);
      fflush(stdout);
      if (csv)
        fprintf(csv, "%d,%d,%d,%d,%.3f,%.3f,%.3f,%.3f,%.3f,%s,%s,%.4f,%.4f\n", n, k, m,
                p.r, t_dense, t_unfused, t_auto, t_fact, t_rebuild, strategy_name(fwd),
                strategy_name(bwd), t_auto / t_dense, t_unfused / t_auto);
      CHECK(osft_flinear_destroy(o.layer));
      float *bufs[] = {p.w,  p.x,  p.g,  p.y,  p.dx,  p.dw,   p.uh, p.ul, p.vh, p.vl,
                       p.sh, p.sl, p.th, p.tl, p.tmp, p.tmp2, p.du, p.dv, p.ds};
      for (size_t b = 0; b < sizeof bufs / sizeof bufs[0]; ++b) free(bufs[b]);
      (void)kk;
    }
  }
  CHECK(osft_context_destroy(ctx));
  if (csv) fclose(csv);
  return 0;
}
