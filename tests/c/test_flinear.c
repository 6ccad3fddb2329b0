/* Factorized linear (OSFT layer): decomposition, forward, backward, merge,
 * re-decomposition and every error, against float64 references computed
 * with plain loops from the factors as stored. Built twice: for the CPU,
 * and with OSFT_TEST_CUDA for a GPU (skipped where none is present). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_tensors.h"
#include "test_util.h"

/* ----------------------------------------------------------- references */

typedef struct {
  int64_t n, kin, r, l;
  double *f[6]; /* u_high, s_high, v_high, u_low, s_low, v_low as stored */
} ref_layer;

static ref_layer ref_read(osft_flinear_t layer) {
  ref_layer R;
  assert_ok(osft_flinear_get_dims(layer, &R.n, &R.kin, &R.r, &R.l));
  for (int i = 0; i < 6; ++i) {
    DLTensor v;
    assert_ok(osft_flinear_get_factor(layer, (osft_flinear_factor_t)i, &v));
    R.f[i] = tt_read_view(&v);
  }
  return R;
}

static void ref_free(ref_layer *R) {
  for (int i = 0; i < 6; ++i) free(R->f[i]);
}

/* W = U_high diag(S_high) V_high + U_low diag(S_low) V_low (n x kin). */
static double *ref_weight(const ref_layer *R) {
  double *w = calloc((size_t)(R->n * R->kin), sizeof(double));
  for (int part = 0; part < 2; ++part) {
    const double *u = R->f[3 * part], *s = R->f[3 * part + 1], *v = R->f[3 * part + 2];
    const int64_t c = part == 0 ? R->r : R->l;
    for (int64_t i = 0; i < R->n; ++i)
      for (int64_t j = 0; j < R->kin; ++j) {
        double acc = 0;
        for (int64_t t = 0; t < c; ++t) acc += u[i * c + t] * s[t] * v[t * R->kin + j];
        w[i * R->kin + j] += acc;
      }
  }
  return w;
}

/* c (m x n) = a (m x k) b^T (n x k) */
static double *matmul_nt(const double *a, const double *b, int64_t m, int64_t n,
                         int64_t k) {
  double *c = calloc((size_t)(m * n + 1), sizeof(double));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0;
      for (int64_t t = 0; t < k; ++t) acc += a[i * k + t] * b[j * k + t];
      c[i * n + j] = acc;
    }
  return c;
}

static double *ref_forward(const ref_layer *R, const double *x, const double *bias,
                           int64_t m) {
  double *w = ref_weight(R);
  double *y = matmul_nt(x, w, m, R->n, R->kin);
  if (bias)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < R->n; ++j) y[i * R->n + j] += bias[j];
  free(w);
  return y;
}

typedef struct {
  double *dx, *du, *ds, *dv, *db;
} ref_grads;

static ref_grads ref_backward(const ref_layer *R, const double *x, const double *g,
                              int64_t m) {
  const int64_t n = R->n, kin = R->kin, l = R->l;
  const double *ul = R->f[3], *sl = R->f[4], *vl = R->f[5];
  ref_grads out;
  double *w = ref_weight(R);
  double *G = calloc((size_t)(n * kin), sizeof(double)); /* g^T x */
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < kin; ++j)
      for (int64_t t = 0; t < m; ++t) G[i * kin + j] += g[t * n + i] * x[t * kin + j];
  out.dx = calloc((size_t)(m * kin + 1), sizeof(double));
  for (int64_t t = 0; t < m; ++t)
    for (int64_t j = 0; j < kin; ++j)
      for (int64_t i = 0; i < n; ++i)
        out.dx[t * kin + j] += g[t * n + i] * w[i * kin + j];
  out.du = calloc((size_t)(n * l), sizeof(double));
  out.dv = calloc((size_t)(l * kin), sizeof(double));
  out.ds = calloc((size_t)l, sizeof(double));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t c = 0; c < l; ++c)
      for (int64_t j = 0; j < kin; ++j) {
        out.du[i * l + c] += G[i * kin + j] * vl[c * kin + j] * sl[c];
        out.dv[c * kin + j] += sl[c] * ul[i * l + c] * G[i * kin + j];
        out.ds[c] += ul[i * l + c] * G[i * kin + j] * vl[c * kin + j];
      }
  out.db = calloc((size_t)n, sizeof(double));
  for (int64_t t = 0; t < m; ++t)
    for (int64_t i = 0; i < n; ++i) out.db[i] += g[t * n + i];
  free(w);
  free(G);
  return out;
}

static void ref_grads_free(ref_grads *g) {
  free(g->dx);
  free(g->du);
  free(g->ds);
  free(g->dv);
  free(g->db);
}

/* --------------------------------------------------------------- helpers */

static double tol_for(tt_dtype d) {
  return d == TT_BF16 ? 3e-2 : 2e-4;
}

static void expect_close(const char *what, const tt *t, const double *ref, double tol) {
  double *got = tt_get(t);
  const double err = rel_max_err(got, ref, (size_t)tt_logical_numel(t), 1e-6);
  free(got);
  if (!(err <= tol)) fail_msg("%s: relative max error %.3g > %.3g", what, err, tol);
}

static tt *mat(tt_dtype d, int64_t rows, int64_t cols) {
  const int64_t shape[2] = {rows, cols};
  return tt_new(d, 2, shape);
}

static tt *vec(tt_dtype d, int64_t n) {
  const int64_t shape[1] = {n};
  return tt_new(d, 1, shape);
}

static osft_flinear_t decompose(osft_context_t ctx, tt *w, double ratio,
                                osft_flinear_strategy_t strategy) {
  osft_flinear_options_t o;
  assert_ok(OSFT_FLINEAR_OPTIONS_INIT(&o));
  o.rank_ratio = ratio;
  o.strategy = strategy;
  osft_flinear_t layer = NULL;
  assert_ok(osft_flinear_create_from_weight(ctx, &w->t, &o, &layer));
  return layer;
}

static int setup(void **state) {
  *state = tt_context(NULL);
  return 0;
}

static int teardown(void **state) {
  assert_ok(osft_context_destroy((osft_context_t)*state));
  return 0;
}

#define CTX ((osft_context_t)*state)

/* ------------------------------------------------------------ decompose */

static void check_orthonormal(const double *a, int64_t rows, int64_t cols, int by_cols,
                              double tol) {
  /* by_cols: columns orthonormal (U, rows x cols); else rows orthonormal. */
  const int64_t dim = by_cols ? cols : rows, len = by_cols ? rows : cols;
  for (int64_t p = 0; p < dim; ++p)
    for (int64_t q = 0; q < dim; ++q) {
      double dot = 0;
      for (int64_t t = 0; t < len; ++t)
        dot += by_cols ? a[t * cols + p] * a[t * cols + q]
                       : a[p * cols + t] * a[q * cols + t];
      if (fabs(dot - (p == q)) > tol)
        fail_msg("orthonormality (%lld,%lld): %g", (long long)p, (long long)q, dot);
    }
}

static void test_decompose_reconstructs_and_is_orthonormal(void **state) {
  const int64_t shapes[3][2] = {{9, 13}, {13, 9}, {10, 10}};
  for (int s = 0; s < 3; ++s) {
    test_seed("decompose");
    const int64_t n = shapes[s][0], kin = shapes[s][1], k = n < kin ? n : kin;
    tt *w = mat(TT_F32, n, kin);
    tt_random(w, -1, 1);
    osft_flinear_t layer = decompose(CTX, w, 0.5, OSFT_FLINEAR_AUTO);
    ref_layer R = ref_read(layer);
    assert_int_equal(R.r, (int64_t)llround(0.5 * (double)k));
    assert_int_equal(R.r + R.l, k);
    /* U = [U_high U_low] columns and V = [V_high; V_low] rows orthonormal. */
    double *u = malloc(sizeof(double) * (size_t)(n * k));
    double *v = malloc(sizeof(double) * (size_t)(k * kin));
    for (int64_t i = 0; i < n; ++i)
      for (int64_t c = 0; c < k; ++c)
        u[i * k + c] = c < R.r ? R.f[0][i * R.r + c] : R.f[3][i * R.l + c - R.r];
    memcpy(v, R.f[2], sizeof(double) * (size_t)(R.r * kin));
    memcpy(v + R.r * kin, R.f[5], sizeof(double) * (size_t)(R.l * kin));
    check_orthonormal(u, n, k, 1, 1e-5);
    check_orthonormal(v, k, kin, 0, 1e-5);
    /* singular values descending and non-negative across the split */
    for (int64_t c = 0; c + 1 < k; ++c) {
      const double a = c < R.r ? R.f[1][c] : R.f[4][c - R.r];
      const double b = c + 1 < R.r ? R.f[1][c + 1] : R.f[4][c + 1 - R.r];
      assert_true(a >= b && b >= 0);
    }
    double *w0 = tt_get(w);
    double *wr = ref_weight(&R);
    const double err = rel_max_err(wr, w0, (size_t)(n * kin), 1e-6);
    if (err > 1e-5) fail_msg("reconstruction error %g", err);
    /* merge gives the same */
    tt *m = mat(TT_F32, n, kin);
    tt_poison(m);
    assert_ok(osft_flinear_merge(layer, &m->t));
    expect_close("merge", m, w0, 1e-5);
    free(u);
    free(v);
    free(w0);
    free(wr);
    ref_free(&R);
    tt_free(m);
    tt_free(w);
    assert_ok(osft_flinear_destroy(layer));
  }
}

/* ------------------------------------------------- forward and backward */

typedef struct {
  int64_t n, kin, m;
  int r_is_one; /* 1: r = 1, 0: r = k - 1 */
  int bias;
  osft_flinear_strategy_t strategy;
  tt_dtype dtype;
} fwd_case;

static void describe(const fwd_case *c, char *buf, size_t size) {
  snprintf(buf, size, "N=%lld K=%lld M=%lld r=%s bias=%d %s %s", (long long)c->n,
           (long long)c->kin, (long long)c->m, c->r_is_one ? "1" : "k-1", c->bias,
           c->strategy == OSFT_FLINEAR_DENSE ? "dense" : "factorized",
           c->dtype == TT_BF16 ? "bf16" : "fp32");
}

static osft_flinear_t layer_for(osft_context_t ctx, const fwd_case *c) {
  const int64_t k = c->n < c->kin ? c->n : c->kin;
  const double ratio = c->r_is_one ? 1.0 / (double)k : (double)(k - 1) / (double)k;
  tt *w = mat(c->dtype, c->n, c->kin);
  tt_random(w, -1, 1);
  osft_flinear_t layer = decompose(ctx, w, ratio, c->strategy);
  tt_free(w);
  return layer;
}

static void run_case(osft_context_t ctx, const fwd_case *c) {
  char name[160];
  describe(c, name, sizeof name);
  test_seed(name);
  osft_flinear_t layer = layer_for(ctx, c);
  ref_layer R = ref_read(layer);
  assert_int_equal(R.r, c->r_is_one ? 1 : (c->n < c->kin ? c->n : c->kin) - 1);
  tt *x = mat(c->dtype, c->m, c->kin), *y = mat(c->dtype, c->m, c->n);
  tt *b = c->bias ? vec(c->dtype, c->n) : NULL;
  tt_random(x, -1, 1);
  if (b) tt_random(b, -1, 1);
  tt_poison(y);
  assert_ok(osft_flinear_forward(layer, &x->t, b ? &b->t : NULL, &y->t));
  double *xd = tt_get(x), *bd = b ? tt_get(b) : NULL;
  double *yref = ref_forward(&R, xd, bd, c->m);
  char what[200];
  snprintf(what, sizeof what, "forward %s", name);
  expect_close(what, y, yref, tol_for(c->dtype));

  /* backward: every gradient, written (poisoned first) */
  tt *g = mat(c->dtype, c->m, c->n);
  tt_random(g, -1, 1);
  tt *dx = mat(c->dtype, c->m, c->kin), *du = mat(c->dtype, R.n, R.l);
  tt *ds = vec(c->dtype, R.l), *dv = mat(c->dtype, R.l, R.kin);
  tt *db = vec(c->dtype, R.n);
  tt *outs[5] = {dx, du, ds, dv, db};
  for (int i = 0; i < 5; ++i) tt_poison(outs[i]);
  osft_flinear_grads_t gr;
  assert_ok(OSFT_FLINEAR_GRADS_INIT(&gr));
  gr.grad_x = &dx->t;
  gr.grad_u_low = &du->t;
  gr.grad_s_low = &ds->t;
  gr.grad_v_low = &dv->t;
  gr.grad_bias = &db->t;
  assert_ok(osft_flinear_backward(layer, &x->t, &g->t, &gr));
  double *gd = tt_get(g);
  ref_grads ref = ref_backward(&R, xd, gd, c->m);
  const double *refs[5] = {ref.dx, ref.du, ref.ds, ref.dv, ref.db};
  static const char *const names[5] = {"dx", "dU_low", "dS_low", "dV_low", "db"};
  /* bf16 gradients of the factors sum over M products: loosen a little */
  for (int i = 0; i < 5; ++i) {
    snprintf(what, sizeof what, "backward %s %s", names[i], name);
    expect_close(what, outs[i], refs[i], tol_for(c->dtype));
  }
  /* accumulate: grads hold the values just computed; adding once more doubles them */
  gr.accumulate = OSFT_FLINEAR_ACCUMULATE_ALL;
  double *before[5];
  for (int i = 0; i < 5; ++i) before[i] = tt_get(outs[i]);
  assert_ok(osft_flinear_backward(layer, &x->t, &g->t, &gr));
  for (int i = 0; i < 5; ++i) {
    const int64_t cnt = tt_logical_numel(outs[i]);
    double *expect = malloc(sizeof(double) * (size_t)cnt);
    for (int64_t e = 0; e < cnt; ++e) expect[e] = before[i][e] + refs[i][e];
    snprintf(what, sizeof what, "accumulate %s %s", names[i], name);
    expect_close(what, outs[i], expect, 2 * tol_for(c->dtype));
    free(expect);
    free(before[i]);
  }
  ref_grads_free(&ref);
  free(gd);
  free(xd);
  free(bd);
  free(yref);
  for (int i = 0; i < 5; ++i) tt_free(outs[i]);
  tt_free(g);
  tt_free(x);
  tt_free(y);
  tt_free(b);
  ref_free(&R);
  assert_ok(osft_flinear_destroy(layer));
}

static void test_forward_backward_grid(void **state) {
  const int64_t shapes[2][2] = {{9, 13}, {13, 9}};
  const int64_t ms[2] = {1, 37};
  const osft_flinear_strategy_t strategies[2] = {OSFT_FLINEAR_FACTORIZED,
                                                 OSFT_FLINEAR_DENSE};
  const tt_dtype dtypes[2] = {TT_F32, TT_BF16};
  for (int s = 0; s < 2; ++s)
    for (int mi = 0; mi < 2; ++mi)
      for (int r = 0; r < 2; ++r)
        for (int b = 0; b < 2; ++b)
          for (int st = 0; st < 2; ++st)
            for (int d = 0; d < 2; ++d) {
              const fwd_case c = {shapes[s][0],   shapes[s][1], ms[mi], r, b,
                                  strategies[st], dtypes[d]};
              run_case(CTX, &c);
            }
}

/* Both strategies on the same layer and inputs give the same y. */
static void test_strategies_agree(void **state) {
  test_seed("agree");
  tt *w = mat(TT_F32, 24, 17);
  tt_random(w, -1, 1);
  osft_flinear_t layer = decompose(CTX, w, 0.5, OSFT_FLINEAR_FACTORIZED);
  tt *x = mat(TT_F32, 50, 17), *y1 = mat(TT_F32, 50, 24), *y2 = mat(TT_F32, 50, 24);
  tt_random(x, -2, 2);
  assert_ok(osft_flinear_forward(layer, &x->t, NULL, &y1->t));
  assert_ok(osft_flinear_set_strategy(layer, OSFT_FLINEAR_DENSE));
  assert_ok(osft_flinear_forward(layer, &x->t, NULL, &y2->t));
  double *a = tt_get(y1);
  expect_close("dense vs factorized", y2, a, 1e-5);
  free(a);
  tt_free(w);
  tt_free(x);
  tt_free(y1);
  tt_free(y2);
  assert_ok(osft_flinear_destroy(layer));
}

/* x with several leading dims, padded rows in x and y, mixed precision
 * (fp32 factors, bf16 activations), and fp32 bias with bf16 activations. */
static void test_leading_dims_padding_mixed(void **state) {
  test_seed("leading");
  tt *w = mat(TT_F32, 11, 7);
  tt_random(w, -1, 1);
  osft_flinear_t layer = decompose(CTX, w, 0.4, OSFT_FLINEAR_AUTO);
  ref_layer R = ref_read(layer);
  /* 3-D x: (2, 3, 7) */
  const int64_t xs[3] = {2, 3, 7}, ys[3] = {2, 3, 11};
  tt *x = tt_new(TT_F32, 3, xs), *y = tt_new(TT_F32, 3, ys);
  tt_random(x, -1, 1);
  tt_poison(y);
  assert_ok(osft_flinear_forward(layer, &x->t, NULL, &y->t));
  double *xd = tt_get(x), *yr = ref_forward(&R, xd, NULL, 6);
  expect_close("3-D forward", y, yr, 2e-4);
  free(xd);
  free(yr);
  /* padded rows */
  tt *xp = tt_new_padded(TT_F32, 5, 7, 10), *yp = tt_new_padded(TT_F32, 5, 11, 16);
  tt_random(xp, -1, 1);
  tt_poison(yp);
  assert_ok(osft_flinear_forward(layer, &xp->t, NULL, &yp->t));
  xd = tt_get(xp);
  yr = ref_forward(&R, xd, NULL, 5);
  expect_close("padded forward", yp, yr, 2e-4);
  free(xd);
  free(yr);
  /* bf16 activations over fp32 factors, fp32 bias */
  tt *xb = mat(TT_BF16, 4, 7), *yb = mat(TT_BF16, 4, 11), *bias = vec(TT_F32, 11);
  tt_random(xb, -1, 1);
  tt_random(bias, -1, 1);
  tt_poison(yb);
  assert_ok(osft_flinear_forward(layer, &xb->t, &bias->t, &yb->t));
  xd = tt_get(xb);
  double *bd = tt_get(bias);
  yr = ref_forward(&R, xd, bd, 4);
  expect_close("bf16 over fp32 factors", yb, yr, 3e-2);
  free(xd);
  free(yr);
  free(bd);
  ref_free(&R);
  tt_free(w);
  tt_free(x);
  tt_free(y);
  tt_free(xp);
  tt_free(yp);
  tt_free(xb);
  tt_free(yb);
  tt_free(bias);
  assert_ok(osft_flinear_destroy(layer));
}

/* bf16 factors and activations with fp32 factor gradients (master grads). */
static void test_fp32_grads_for_bf16_factors(void **state) {
  test_seed("fp32 grads");
  tt *w = mat(TT_BF16, 12, 9);
  tt_random(w, -1, 1);
  osft_flinear_t layer = decompose(CTX, w, 0.5, OSFT_FLINEAR_AUTO);
  ref_layer R = ref_read(layer);
  tt *x = mat(TT_BF16, 20, 9), *g = mat(TT_BF16, 20, 12);
  tt *du = mat(TT_F32, 12, R.l), *ds = vec(TT_F32, R.l), *dv = mat(TT_F32, R.l, 9);
  tt_random(x, -1, 1);
  tt_random(g, -1, 1);
  tt *outs[3] = {du, ds, dv};
  for (int i = 0; i < 3; ++i) tt_poison(outs[i]);
  osft_flinear_grads_t gr;
  assert_ok(OSFT_FLINEAR_GRADS_INIT(&gr));
  gr.grad_u_low = &du->t;
  gr.grad_s_low = &ds->t;
  gr.grad_v_low = &dv->t;
  for (int st = OSFT_FLINEAR_FACTORIZED; st <= OSFT_FLINEAR_DENSE; ++st) {
    assert_ok(osft_flinear_set_strategy(layer, (osft_flinear_strategy_t)st));
    assert_ok(osft_flinear_backward(layer, &x->t, &g->t, &gr));
    double *xd = tt_get(x), *gd = tt_get(g);
    ref_grads rg = ref_backward(&R, xd, gd, 20);
    expect_close("fp32 dU of bf16 factors", du, rg.du, 3e-2);
    expect_close("fp32 dS of bf16 factors", ds, rg.ds, 3e-2);
    expect_close("fp32 dV of bf16 factors", dv, rg.dv, 3e-2);
    ref_grads_free(&rg);
    free(xd);
    free(gd);
  }
  ref_free(&R);
  tt *all[6] = {w, x, g, du, ds, dv};
  for (int i = 0; i < 6; ++i) tt_free(all[i]);
  assert_ok(osft_flinear_destroy(layer));
}

/* ------------------------------------------------------ finite differences */

static double loss(osft_flinear_t layer, tt *x, tt *bias, tt *y, const double *c) {
  assert_ok(osft_flinear_forward(layer, &x->t, &bias->t, &y->t));
  double *yd = tt_get(y), l = 0;
  for (int64_t i = 0; i < tt_logical_numel(y); ++i) l += c[i] * yd[i];
  free(yd);
  return l;
}

/* Nudges element e of a factor view by delta. */
static void nudge_view(const DLTensor *v, int64_t e, double delta) {
  double *vals = tt_read_view(v);
  vals[e] += delta;
  tt_write_view(v, vals);
  free(vals);
}

static void test_finite_differences(void **state) {
  test_seed("fd");
  tt *w = mat(TT_F32, 6, 5);
  tt_random(w, -1, 1);
  osft_flinear_t layer = decompose(CTX, w, 0.4, OSFT_FLINEAR_FACTORIZED);
  const int64_t m = 4;
  tt *x = mat(TT_F32, m, 5), *y = mat(TT_F32, m, 6), *b = vec(TT_F32, 6);
  tt *g = mat(TT_F32, m, 6);
  tt_random(x, -1, 1);
  tt_random(b, -1, 1);
  tt_random(g, -1, 1);
  double *c = tt_get(g);
  int64_t l;
  assert_ok(osft_flinear_get_dims(layer, NULL, NULL, NULL, &l));
  tt *dx = mat(TT_F32, m, 5), *du = mat(TT_F32, 6, l), *ds = vec(TT_F32, l);
  tt *dv = mat(TT_F32, l, 5), *db = vec(TT_F32, 6);
  osft_flinear_grads_t gr;
  assert_ok(OSFT_FLINEAR_GRADS_INIT(&gr));
  gr.grad_x = &dx->t;
  gr.grad_u_low = &du->t;
  gr.grad_s_low = &ds->t;
  gr.grad_v_low = &dv->t;
  gr.grad_bias = &db->t;
  assert_ok(osft_flinear_backward(layer, &x->t, &g->t, &gr));
  /* The loss is linear in each single parameter, so central differences
   * are exact up to fp32 rounding. */
  const double h = 0.25;
  const struct {
    osft_flinear_factor_t f;
    tt *grad;
  } params[3] = {
      {OSFT_FACTOR_U_LOW, du}, {OSFT_FACTOR_S_LOW, ds}, {OSFT_FACTOR_V_LOW, dv}};
  for (int p = 0; p < 3; ++p) {
    DLTensor view;
    assert_ok(osft_flinear_get_factor(layer, params[p].f, &view));
    double *analytic = tt_get(params[p].grad);
    for (int64_t e = 0; e < tt_logical_numel(params[p].grad); ++e) {
      nudge_view(&view, e, h);
      const double up = loss(layer, x, b, y, c);
      nudge_view(&view, e, -2 * h);
      const double down = loss(layer, x, b, y, c);
      nudge_view(&view, e, h);
      const double fd = (up - down) / (2 * h);
      if (fabs(fd - analytic[e]) > 1e-3 * (1 + fabs(fd)))
        fail_msg("factor %d element %lld: finite difference %g, backward %g", p,
                 (long long)e, fd, analytic[e]);
    }
    free(analytic);
  }
  /* x and bias */
  tt *ins[2] = {x, b};
  tt *grads[2] = {dx, db};
  for (int p = 0; p < 2; ++p) {
    double *analytic = tt_get(grads[p]);
    double *vals = tt_get(ins[p]);
    for (int64_t e = 0; e < tt_logical_numel(ins[p]); ++e) {
      const double keep = vals[e];
      vals[e] = keep + h;
      tt_set(ins[p], vals);
      const double up = loss(layer, x, b, y, c);
      vals[e] = keep - h;
      tt_set(ins[p], vals);
      const double down = loss(layer, x, b, y, c);
      vals[e] = keep;
      tt_set(ins[p], vals);
      const double fd = (up - down) / (2 * h);
      if (fabs(fd - analytic[e]) > 1e-3 * (1 + fabs(fd)))
        fail_msg("input %d element %lld: finite difference %g, backward %g", p,
                 (long long)e, fd, analytic[e]);
    }
    free(analytic);
    free(vals);
  }
  free(c);
  tt *all[10] = {w, x, y, b, g, dx, du, ds, dv, db};
  for (int i = 0; i < 10; ++i) tt_free(all[i]);
  assert_ok(osft_flinear_destroy(layer));
}

/* ------------------------------------------ updates, merge, redecompose */

static void perturb_trainable(osft_flinear_t layer) {
  for (int f = OSFT_FACTOR_U_LOW; f <= OSFT_FACTOR_V_LOW; ++f) {
    DLTensor v;
    assert_ok(osft_flinear_get_factor(layer, (osft_flinear_factor_t)f, &v));
    double *vals = tt_read_view(&v);
    const int64_t cnt = v.ndim == 2 ? v.shape[0] * v.shape[1] : v.shape[0];
    for (int64_t e = 0; e < cnt; ++e) vals[e] += test_uniform(-0.1, 0.1);
    tt_write_view(&v, vals);
    free(vals);
  }
}

static void test_merge_after_updates_and_redecompose(void **state) {
  test_seed("merge");
  tt *w = mat(TT_F32, 12, 8);
  tt_random(w, -1, 1);
  osft_flinear_t layer = decompose(CTX, w, 0.5, OSFT_FLINEAR_DENSE);
  tt *x = mat(TT_F32, 3, 8), *y = mat(TT_F32, 3, 12);
  tt_random(x, -1, 1);
  assert_ok(osft_flinear_forward(layer, &x->t, NULL, &y->t)); /* builds the cache */
  perturb_trainable(layer);
  ref_layer R = ref_read(layer);
  double *wref = ref_weight(&R);
  /* merge into fp32, fp64 and bf16 weights */
  const tt_dtype outs[3] = {TT_F32, TT_F64, TT_BF16};
  for (int d = 0; d < 3; ++d) {
    tt *m = mat(outs[d], 12, 8);
    tt_poison(m);
    assert_ok(osft_flinear_merge(layer, &m->t));
    expect_close("merge after updates", m, wref, outs[d] == TT_BF16 ? 1e-2 : 1e-5);
    tt_free(m);
  }
  /* the dense strategy sees the updated factors, not stale ones */
  tt_poison(y);
  assert_ok(osft_flinear_forward(layer, &x->t, NULL, &y->t));
  double *xd = tt_get(x), *yr = ref_forward(&R, xd, NULL, 3);
  expect_close("dense forward after updates", y, yr, 2e-4);
  /* re-decompose the merged weight: same weight, orthonormal factors again */
  assert_ok(osft_flinear_redecompose(layer, NULL));
  ref_layer R2 = ref_read(layer);
  double *w2 = ref_weight(&R2);
  const double err = rel_max_err(w2, wref, 96, 1e-6);
  if (err > 1e-5) fail_msg("redecompose(NULL) changed the weight: %g", err);
  check_orthonormal(R2.f[0], 12, R2.r, 1, 1e-5);
  check_orthonormal(R2.f[5], R2.l, 8, 0, 1e-5);
  /* re-decompose a new weight */
  tt *w3 = mat(TT_F32, 12, 8);
  tt_random(w3, -1, 1);
  assert_ok(osft_flinear_redecompose(layer, &w3->t));
  ref_layer R3 = ref_read(layer);
  double *w3r = ref_weight(&R3), *w3d = tt_get(w3);
  if (rel_max_err(w3r, w3d, 96, 1e-6) > 1e-5) fail_msg("redecompose(weight) mismatch");
  tt_poison(y);
  assert_ok(osft_flinear_forward(layer, &x->t, NULL, &y->t)); /* cache was dropped */
  double *yr3 = ref_forward(&R3, xd, NULL, 3);
  expect_close("forward after redecompose", y, yr3, 2e-4);
  free(wref);
  free(xd);
  free(yr);
  free(w2);
  free(w3r);
  free(w3d);
  free(yr3);
  ref_free(&R);
  ref_free(&R2);
  ref_free(&R3);
  tt_free(w);
  tt_free(w3);
  tt_free(x);
  tt_free(y);
  assert_ok(osft_flinear_destroy(layer));
}

/* ------------------------------------------------- caller-owned factors */

static void caller_factors_case(osft_context_t ctx, int fused) {
  test_seed(fused ? "caller fused" : "caller separate");
  const int64_t n = 10, kin = 7, r = 3, l = 3; /* r + l < min(n, kin): allowed */
  tt *u_all = NULL, *v_all = NULL, *s_all = NULL;
  tt *uh = NULL, *ul = NULL, *vh = NULL, *vl = NULL, *sh = NULL, *sl = NULL;
  DLTensor views[6];
  if (fused) {
    /* one U (n x 6), one V^T (6 x kin), one S: high/low as views */
    u_all = mat(TT_F32, n, r + l);
    v_all = mat(TT_F32, r + l, kin);
    s_all = vec(TT_F32, r + l);
    tt_random(u_all, -1, 1);
    tt_random(v_all, -1, 1);
    tt_random(s_all, 0.5, 2);
    static int64_t shp[6][2], str[6][2];
    const int64_t sz[6][2] = {{n, r}, {r, 0}, {r, kin}, {n, l}, {l, 0}, {l, kin}};
    for (int i = 0; i < 6; ++i) {
      tt *base = i % 3 == 0 ? u_all : i % 3 == 1 ? s_all : v_all;
      views[i] = base->t;
      shp[i][0] = sz[i][0];
      shp[i][1] = sz[i][1];
      views[i].shape = shp[i];
      views[i].ndim = i % 3 == 1 ? 1 : 2;
      str[i][0] = i % 3 == 0 ? r + l : kin;
      str[i][1] = 1;
      views[i].strides = i % 3 == 1 ? NULL : str[i];
      const int low = i >= 3;
      views[i].byte_offset =
          !low ? 0 : (uint64_t)(i % 3 == 2 ? r * kin : r) * sizeof(float);
    }
  } else {
    uh = tt_new_padded(TT_F32, n, r, r + 2); /* padded rows too */
    ul = mat(TT_F32, n, l);
    vh = mat(TT_F32, r, kin);
    vl = tt_new_padded(TT_F32, l, kin, kin + 3);
    sh = vec(TT_F32, r);
    sl = vec(TT_F32, l);
    tt *all[6] = {uh, sh, vh, ul, sl, vl};
    for (int i = 0; i < 6; ++i) {
      tt_random(all[i], i % 3 == 1 ? 0.5 : -1, i % 3 == 1 ? 2 : 1);
      views[i] = all[i]->t;
    }
  }
  osft_flinear_factors_t f;
  assert_ok(OSFT_FLINEAR_FACTORS_INIT(&f));
  f.u_high = &views[0];
  f.s_high = &views[1];
  f.v_high = &views[2];
  f.u_low = &views[3];
  f.s_low = &views[4];
  f.v_low = &views[5];
  osft_flinear_t layer = NULL;
  assert_ok(osft_flinear_create_from_factors(ctx, &f, NULL, &layer));
  ref_layer R = ref_read(layer);
  assert_int_equal(R.r, r);
  assert_int_equal(R.l, l);
  for (int st = OSFT_FLINEAR_FACTORIZED; st <= OSFT_FLINEAR_DENSE; ++st) {
    assert_ok(osft_flinear_set_strategy(layer, (osft_flinear_strategy_t)st));
    tt *x = mat(TT_F32, 5, kin), *y = mat(TT_F32, 5, n), *g = mat(TT_F32, 5, n);
    tt *dx = mat(TT_F32, 5, kin), *du = mat(TT_F32, n, l), *ds = vec(TT_F32, l);
    tt *dv = mat(TT_F32, l, kin);
    tt_random(x, -1, 1);
    tt_random(g, -1, 1);
    tt_poison(y);
    assert_ok(osft_flinear_forward(layer, &x->t, NULL, &y->t));
    double *xd = tt_get(x), *gd = tt_get(g), *yr = ref_forward(&R, xd, NULL, 5);
    expect_close("caller factors forward", y, yr, 2e-4);
    osft_flinear_grads_t gr;
    assert_ok(OSFT_FLINEAR_GRADS_INIT(&gr));
    gr.grad_x = &dx->t;
    gr.grad_u_low = &du->t;
    gr.grad_s_low = &ds->t;
    gr.grad_v_low = &dv->t;
    tt_poison(dx);
    tt_poison(du);
    tt_poison(ds);
    tt_poison(dv);
    assert_ok(osft_flinear_backward(layer, &x->t, &g->t, &gr));
    ref_grads rg = ref_backward(&R, xd, gd, 5);
    expect_close("caller dx", dx, rg.dx, 2e-4);
    expect_close("caller du", du, rg.du, 2e-4);
    expect_close("caller ds", ds, rg.ds, 2e-4);
    expect_close("caller dv", dv, rg.dv, 2e-4);
    ref_grads_free(&rg);
    free(xd);
    free(gd);
    free(yr);
    tt *all[7] = {x, y, g, dx, du, ds, dv};
    for (int i = 0; i < 7; ++i) tt_free(all[i]);
  }
  ref_free(&R);
  assert_ok(osft_flinear_destroy(layer));
  if (fused) {
    tt_free(u_all);
    tt_free(v_all);
    tt_free(s_all);
  } else {
    tt_free(uh);
    tt_free(ul);
    tt_free(vh);
    tt_free(vl);
    tt_free(sh);
    tt_free(sl);
  }
}

static void test_caller_owned_factors(void **state) {
  caller_factors_case(CTX, 0);
  caller_factors_case(CTX, 1);
}

/* --------------------------------------------------------- cost model */

static void test_strategy_choice(void **state) {
  test_seed("choice");
  tt *w = mat(TT_F32, 64, 64);
  tt_random(w, -1, 1);
  osft_flinear_t layer = decompose(CTX, w, 0.5, OSFT_FLINEAR_AUTO);
  osft_flinear_strategy_t s;
  assert_ok(osft_flinear_choose_strategy(layer, 1, OSFT_FLINEAR_FORWARD, &s));
  assert_int_equal(s, OSFT_FLINEAR_FACTORIZED);
  assert_ok(osft_flinear_choose_strategy(layer, 100000, OSFT_FLINEAR_FORWARD, &s));
  assert_int_equal(s, OSFT_FLINEAR_DENSE);
  assert_ok(osft_flinear_choose_strategy(layer, 100000, OSFT_FLINEAR_BACKWARD, &s));
  assert_int_equal(s, OSFT_FLINEAR_DENSE);
  assert_ok(osft_flinear_set_strategy(layer, OSFT_FLINEAR_FACTORIZED));
  assert_ok(osft_flinear_choose_strategy(layer, 100000, OSFT_FLINEAR_FORWARD, &s));
  assert_int_equal(s, OSFT_FLINEAR_FACTORIZED);
  assert_ok(osft_flinear_destroy(layer));
  /* a workspace limit too small for the dense weight rules it out */
  osft_context_options_t o;
  assert_ok(OSFT_CONTEXT_OPTIONS_INIT(&o));
  o.workspace_limit = 1024; /* below even U diag(S) of the rebuild */
  osft_context_t small = tt_context(&o);
  layer = decompose(small, w, 0.5, OSFT_FLINEAR_AUTO);
  assert_ok(osft_flinear_choose_strategy(layer, 100000, OSFT_FLINEAR_FORWARD, &s));
  assert_int_equal(s, OSFT_FLINEAR_FACTORIZED);
  assert_ok(osft_flinear_destroy(layer));
  assert_ok(osft_context_destroy(small));
  tt_free(w);
}

/* ---------------------------------------------------------------- errors */

static void expect_untouched(const tt *t, const void *before, size_t size) {
  size_t now_size;
  void *now = tt_bytes(t, &now_size);
  assert_int_equal(now_size, size);
  assert_memory_equal(now, before, size);
  free(now);
}

static void test_creation_errors(void **state) {
  test_seed("create errors");
  tt *w = mat(TT_F32, 8, 6);
  tt_random(w, -1, 1);
  osft_flinear_options_t o;
  osft_flinear_t layer = (osft_flinear_t)(uintptr_t)0x5e5e;
  assert_ok(OSFT_FLINEAR_OPTIONS_INIT(&o));
  assert_true(o.rank_ratio == 0.5);
  assert_status(osft_flinear_create_from_weight(NULL, &w->t, &o, &layer),
                OSFT_STATUS_INVALID_HANDLE);
  assert_status(osft_flinear_create_from_weight(CTX, NULL, &o, &layer),
                OSFT_STATUS_INVALID_ARGUMENT);
  assert_error_mentions("weight");
  assert_status(osft_flinear_create_from_weight(CTX, &w->t, &o, NULL),
                OSFT_STATUS_INVALID_ARGUMENT);
  const double bad_ratios[5] = {0.0, 1.0, -0.5, 0.05 /* r = 0 */, 0.95 /* r = k */};
  for (int i = 0; i < 5; ++i) {
    o.rank_ratio = bad_ratios[i];
    assert_status(osft_flinear_create_from_weight(CTX, &w->t, &o, &layer),
                  OSFT_STATUS_INVALID_ARGUMENT);
    assert_error_mentions("rank_ratio");
  }
  o.rank_ratio = NAN;
  assert_status(osft_flinear_create_from_weight(CTX, &w->t, &o, &layer),
                OSFT_STATUS_INVALID_ARGUMENT);
  assert_ok(OSFT_FLINEAR_OPTIONS_INIT(&o));
  o.struct_size = 3;
  assert_status(osft_flinear_create_from_weight(CTX, &w->t, &o, &layer),
                OSFT_STATUS_INVALID_STRUCT_SIZE);
  assert_ok(OSFT_FLINEAR_OPTIONS_INIT(&o));
  o.strategy = (osft_flinear_strategy_t)7;
  assert_status(osft_flinear_create_from_weight(CTX, &w->t, &o, &layer),
                OSFT_STATUS_INVALID_ARGUMENT);
  assert_ok(OSFT_FLINEAR_OPTIONS_INIT(&o));
  o.factor_dtype.code = kDLInt;
  o.factor_dtype.bits = 32;
  o.factor_dtype.lanes = 1;
  assert_status(osft_flinear_create_from_weight(CTX, &w->t, &o, &layer),
                OSFT_STATUS_DTYPE_MISMATCH);
  /* weight: non-finite, wrong dtype, wrong rank, 1 x K */
  double *vals = tt_get(w);
  vals[7] = NAN;
  tt_set(w, vals);
  assert_status(osft_flinear_create_from_weight(CTX, &w->t, NULL, &layer),
                OSFT_STATUS_NUMERICAL_ERROR);
  assert_error_mentions("NaN");
  vals[7] = INFINITY;
  tt_set(w, vals);
  assert_status(osft_flinear_create_from_weight(CTX, &w->t, NULL, &layer),
                OSFT_STATUS_NUMERICAL_ERROR);
  free(vals);
  tt *wi = mat(TT_I32, 8, 6);
  assert_status(osft_flinear_create_from_weight(CTX, &wi->t, NULL, &layer),
                OSFT_STATUS_DTYPE_MISMATCH);
  const int64_t s3[3] = {2, 4, 6};
  tt *w3 = tt_new(TT_F32, 3, s3);
  assert_status(osft_flinear_create_from_weight(CTX, &w3->t, NULL, &layer),
                OSFT_STATUS_SHAPE_MISMATCH);
  tt *w1 = mat(TT_F32, 1, 6);
  tt_random(w1, -1, 1);
  assert_status(osft_flinear_create_from_weight(CTX, &w1->t, NULL, &layer),
                OSFT_STATUS_SHAPE_MISMATCH);
  /* device mismatch: a tensor claiming to be on another device */
  tt_random(w, -1, 1);
  DLTensor other = w->t;
  other.device.device_type = tt_device() == OSFT_DEVICE_CPU ? kDLCUDA : kDLCPU;
  assert_status(osft_flinear_create_from_weight(CTX, &other, NULL, &layer),
                OSFT_STATUS_DEVICE_MISMATCH);
  assert_ptr_equal(layer, (osft_flinear_t)(uintptr_t)0x5e5e);
  tt_free(w);
  tt_free(wi);
  tt_free(w3);
  tt_free(w1);
}

static void test_factor_errors(void **state) {
  test_seed("factor errors");
  tt *u = mat(TT_F32, 8, 2), *s = vec(TT_F32, 2), *v = mat(TT_F32, 2, 6);
  tt *ul = mat(TT_F32, 8, 3), *sl = vec(TT_F32, 3), *vl = mat(TT_F32, 3, 6);
  tt *all[6] = {u, s, v, ul, sl, vl};
  for (int i = 0; i < 6; ++i) tt_random(all[i], -1, 1);
  osft_flinear_factors_t f;
  assert_ok(OSFT_FLINEAR_FACTORS_INIT(&f));
  const DLTensor **slots[6] = {&f.u_high, &f.s_high, &f.v_high,
                               &f.u_low,  &f.s_low,  &f.v_low};
  for (int i = 0; i < 6; ++i) *slots[i] = &all[i]->t;
  osft_flinear_t layer = NULL;
  assert_ok(osft_flinear_create_from_factors(CTX, &f, NULL, &layer));
  assert_ok(osft_flinear_destroy(layer));
  /* each factor missing */
  for (int i = 0; i < 6; ++i) {
    const DLTensor *keep = *slots[i];
    *slots[i] = NULL;
    assert_status(osft_flinear_create_from_factors(CTX, &f, NULL, &layer),
                  OSFT_STATUS_INVALID_ARGUMENT);
    *slots[i] = keep;
  }
  /* mismatched shapes */
  tt *bad_s = vec(TT_F32, 4), *bad_v = mat(TT_F32, 3, 5), *bad_ul = mat(TT_F32, 7, 3);
  f.s_high = &bad_s->t;
  assert_status(osft_flinear_create_from_factors(CTX, &f, NULL, &layer),
                OSFT_STATUS_SHAPE_MISMATCH);
  assert_error_mentions("s_high");
  f.s_high = &s->t;
  f.v_low = &bad_v->t;
  assert_status(osft_flinear_create_from_factors(CTX, &f, NULL, &layer),
                OSFT_STATUS_SHAPE_MISMATCH);
  assert_error_mentions("v_low");
  f.v_low = &vl->t;
  f.u_low = &bad_ul->t;
  assert_status(osft_flinear_create_from_factors(CTX, &f, NULL, &layer),
                OSFT_STATUS_SHAPE_MISMATCH);
  f.u_low = &ul->t;
  /* r + l > min(N, K) */
  tt *big_ul = mat(TT_F32, 8, 5), *big_sl = vec(TT_F32, 5), *big_vl = mat(TT_F32, 5, 6);
  f.u_low = &big_ul->t;
  f.s_low = &big_sl->t;
  f.v_low = &big_vl->t;
  assert_status(osft_flinear_create_from_factors(CTX, &f, NULL, &layer),
                OSFT_STATUS_SHAPE_MISMATCH);
  f.u_low = &ul->t;
  f.s_low = &sl->t;
  f.v_low = &vl->t;
  /* mixed dtypes */
  tt *bf = vec(TT_BF16, 3);
  f.s_low = &bf->t;
  assert_status(osft_flinear_create_from_factors(CTX, &f, NULL, &layer),
                OSFT_STATUS_DTYPE_MISMATCH);
  f.s_low = &sl->t;
  /* overlapping factors */
  f.u_low = &u->t;
  DLTensor u_as_low = u->t;
  int64_t shp[2] = {8, 2};
  u_as_low.shape = shp;
  tt *sl2 = vec(TT_F32, 2), *vl2 = mat(TT_F32, 2, 6);
  f.s_low = &sl2->t;
  f.v_low = &vl2->t;
  f.u_low = &u_as_low;
  assert_status(osft_flinear_create_from_factors(CTX, &f, NULL, &layer),
                OSFT_STATUS_ALIASING);
  assert_status(osft_flinear_create_from_factors(CTX, NULL, NULL, &layer),
                OSFT_STATUS_INVALID_ARGUMENT);
  tt *extra[8] = {bad_s, bad_v, bad_ul, big_ul, big_sl, big_vl, bf, sl2};
  for (int i = 0; i < 8; ++i) tt_free(extra[i]);
  tt_free(vl2);
  for (int i = 0; i < 6; ++i) tt_free(all[i]);
}

static void test_call_errors_write_nothing(void **state) {
  test_seed("call errors");
  tt *w = mat(TT_F32, 8, 6);
  tt_random(w, -1, 1);
  osft_flinear_t layer = decompose(CTX, w, 0.5, OSFT_FLINEAR_AUTO);
  tt *x = mat(TT_F32, 5, 6), *y = mat(TT_F32, 5, 8), *g = mat(TT_F32, 5, 8);
  tt_random(x, -1, 1);
  tt_random(g, -1, 1);
  tt_random(y, -1, 1);
  size_t ysize;
  void *y0 = tt_bytes(y, &ysize);
  /* forward: wrong K, wrong N, y leading dims, dtype mix, bias size, aliasing */
  tt *xk = mat(TT_F32, 5, 7), *yn = mat(TT_F32, 5, 9), *ym = mat(TT_F32, 4, 8);
  tt *xb = mat(TT_BF16, 5, 6), *x64 = mat(TT_F64, 5, 6), *bias = vec(TT_F32, 7);
  tt_random(xk, -1, 1);
  tt_random(xb, -1, 1);
  tt_random(x64, -1, 1);
  tt_random(bias, -1, 1);
  assert_status(osft_flinear_forward(layer, &xk->t, NULL, &y->t),
                OSFT_STATUS_SHAPE_MISMATCH);
  assert_error_mentions("x");
  assert_status(osft_flinear_forward(layer, &x->t, NULL, &yn->t),
                OSFT_STATUS_SHAPE_MISMATCH);
  assert_status(osft_flinear_forward(layer, &x->t, NULL, &ym->t),
                OSFT_STATUS_SHAPE_MISMATCH);
  assert_error_mentions("leading");
  assert_status(osft_flinear_forward(layer, &xb->t, NULL, &y->t),
                OSFT_STATUS_DTYPE_MISMATCH);
  assert_status(osft_flinear_forward(layer, &x64->t, NULL, &y->t),
                OSFT_STATUS_DTYPE_MISMATCH);
  assert_status(osft_flinear_forward(layer, &x->t, &bias->t, &y->t),
                OSFT_STATUS_SHAPE_MISMATCH);
  assert_error_mentions("bias");
  assert_status(osft_flinear_forward(layer, NULL, NULL, &y->t),
                OSFT_STATUS_INVALID_ARGUMENT);
  assert_status(osft_flinear_forward(layer, &x->t, NULL, NULL),
                OSFT_STATUS_INVALID_ARGUMENT);
  DLTensor x_as_y = y->t; /* y's memory read as x */
  int64_t xs[2] = {5, 6};
  x_as_y.shape = xs;
  assert_status(osft_flinear_forward(layer, &x_as_y, NULL, &y->t), OSFT_STATUS_ALIASING);
  DLTensor ycuda = y->t;
  ycuda.device.device_type = tt_device() == OSFT_DEVICE_CPU ? kDLCUDA : kDLCPU;
  assert_status(osft_flinear_forward(layer, &x->t, NULL, &ycuda),
                OSFT_STATUS_DEVICE_MISMATCH);
  DLTensor ytrans = y->t; /* transposed strides */
  int64_t ts[2] = {1, 5};
  ytrans.strides = ts;
  assert_status(osft_flinear_forward(layer, &x->t, NULL, &ytrans),
                OSFT_STATUS_BAD_LAYOUT);
  expect_untouched(y, y0, ysize);

  /* backward: struct size, wrong grad shapes/dtypes, unknown accumulate bits,
   * aliasing between outputs; every output stays bit-identical */
  int64_t l;
  assert_ok(osft_flinear_get_dims(layer, NULL, NULL, NULL, &l));
  tt *dx = mat(TT_F32, 5, 6), *du = mat(TT_F32, 8, l), *dv = mat(TT_F32, l, 6);
  tt *ds = vec(TT_F32, l), *bad = mat(TT_F32, 8, l + 1), *bfg = vec(TT_BF16, l);
  tt *outs[4] = {dx, du, dv, ds};
  void *before[4];
  size_t sizes[4];
  for (int i = 0; i < 4; ++i) {
    tt_random(outs[i], -1, 1);
    before[i] = tt_bytes(outs[i], &sizes[i]);
  }
  osft_flinear_grads_t gr;
  assert_ok(OSFT_FLINEAR_GRADS_INIT(&gr));
  gr.grad_x = &dx->t;
  gr.grad_u_low = &du->t;
  gr.grad_v_low = &dv->t;
  gr.grad_s_low = &ds->t;
  gr.struct_size = 4;
  assert_status(osft_flinear_backward(layer, &x->t, &g->t, &gr),
                OSFT_STATUS_INVALID_STRUCT_SIZE);
  gr.struct_size = sizeof gr;
  gr.grad_u_low = &bad->t;
  assert_status(osft_flinear_backward(layer, &x->t, &g->t, &gr),
                OSFT_STATUS_SHAPE_MISMATCH);
  assert_error_mentions("grad_u_low");
  gr.grad_u_low = &du->t;
  gr.grad_s_low = &bfg->t;
  assert_status(osft_flinear_backward(layer, &x->t, &g->t, &gr),
                OSFT_STATUS_DTYPE_MISMATCH);
  gr.grad_s_low = &ds->t;
  gr.accumulate = 1u << 9;
  assert_status(osft_flinear_backward(layer, &x->t, &g->t, &gr),
                OSFT_STATUS_INVALID_ARGUMENT);
  gr.accumulate = 0;
  gr.grad_x = &x->t; /* overwriting the input */
  assert_status(osft_flinear_backward(layer, &x->t, &g->t, &gr), OSFT_STATUS_ALIASING);
  gr.grad_x = &dx->t;
  DLTensor dv_in_du = du->t; /* two outputs in one buffer */
  int64_t dvs[2] = {l, 6};
  dv_in_du.shape = dvs;
  gr.grad_v_low = &dv_in_du;
  assert_status(osft_flinear_backward(layer, &x->t, &g->t, &gr), OSFT_STATUS_ALIASING);
  gr.grad_v_low = &dv->t;
  DLTensor factor_view;
  assert_ok(osft_flinear_get_factor(layer, OSFT_FACTOR_U_LOW, &factor_view));
  gr.grad_u_low = &factor_view; /* writing a gradient over the parameter */
  assert_status(osft_flinear_backward(layer, &x->t, &g->t, &gr), OSFT_STATUS_ALIASING);
  gr.grad_u_low = &du->t;
  assert_status(osft_flinear_backward(layer, &x->t, &yn->t, &gr),
                OSFT_STATUS_SHAPE_MISMATCH);
  assert_status(osft_flinear_backward(layer, &x->t, &g->t, NULL),
                OSFT_STATUS_INVALID_ARGUMENT);
  for (int i = 0; i < 4; ++i) {
    expect_untouched(outs[i], before[i], sizes[i]);
    free(before[i]);
  }
  /* merge into a wrong shape */
  tt *wm = mat(TT_F32, 6, 8);
  assert_status(osft_flinear_merge(layer, &wm->t), OSFT_STATUS_SHAPE_MISMATCH);
  /* queries */
  osft_flinear_strategy_t s;
  assert_status(osft_flinear_choose_strategy(layer, -1, OSFT_FLINEAR_FORWARD, &s),
                OSFT_STATUS_INVALID_ARGUMENT);
  assert_status(osft_flinear_choose_strategy(layer, 1, (osft_flinear_pass_t)3, &s),
                OSFT_STATUS_INVALID_ARGUMENT);
  assert_status(osft_flinear_set_strategy(layer, (osft_flinear_strategy_t)9),
                OSFT_STATUS_INVALID_ARGUMENT);
  DLTensor view;
  assert_status(osft_flinear_get_factor(layer, (osft_flinear_factor_t)6, &view),
                OSFT_STATUS_INVALID_ARGUMENT);
  /* a destroyed layer */
  assert_ok(osft_flinear_destroy(layer));
  assert_status(osft_flinear_forward(layer, &x->t, NULL, &y->t),
                OSFT_STATUS_INVALID_HANDLE);
  assert_status(osft_flinear_destroy(layer), OSFT_STATUS_INVALID_HANDLE);
  assert_ok(osft_flinear_destroy(NULL));
  expect_untouched(y, y0, ysize);
  free(y0);
  tt *rest[13] = {w, x, y, g, xk, yn, ym, xb, x64, bias, bad, bfg, wm};
  for (int i = 0; i < 13; ++i) tt_free(rest[i]);
  for (int i = 0; i < 4; ++i) tt_free(outs[i]);
}

/* Layers return all their memory; a layer whose context is gone says so. */
static void test_memory_is_returned(void **state) {
  (void)state;
  test_alloc_state a;
  osft_context_t ctx = tt_counting_context(&a);
  test_seed("memory");
  tt *w = mat(TT_F32, 16, 12), *x = mat(TT_F32, 64, 12), *y = mat(TT_F32, 64, 16);
  tt_random(w, -1, 1);
  tt_random(x, -1, 1);
  osft_flinear_t layer = decompose(ctx, w, 0.5, OSFT_FLINEAR_DENSE);
  assert_ok(osft_flinear_forward(layer, &x->t, NULL, &y->t));
  assert_ok(osft_flinear_destroy(layer));
  osft_memory_stats_t st;
  st.struct_size = sizeof st;
  assert_ok(osft_context_get_memory_stats(ctx, &st));
  assert_ok(osft_context_release_workspace(ctx));
  osft_memory_stats_t after;
  after.struct_size = sizeof after;
  assert_ok(osft_context_get_memory_stats(ctx, &after));
  assert_int_equal(after.device_in_use, 0);
  /* A context with a live layer refuses to go (the layer would dangle). */
  layer = decompose(ctx, w, 0.5, OSFT_FLINEAR_AUTO);
  assert_status(osft_context_destroy(ctx), OSFT_STATUS_INVALID_ARGUMENT);
  assert_error_mentions("still");
  assert_ok(osft_flinear_forward(layer, &x->t, NULL, &y->t));
  assert_ok(osft_flinear_destroy(layer));
  assert_ok(osft_context_destroy(ctx));
  if (tt_device() == OSFT_DEVICE_CPU) {
    assert_int_equal(a.host_allocs, a.host_frees);
    assert_int_equal(a.host_bytes_live, 0);
    assert_false(a.size_mismatch);
  }
  tt_free(w);
  tt_free(x);
  tt_free(y);
}

int main(void) {
  if (!tt_device_present()) return OSFT_TEST_SKIP;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_decompose_reconstructs_and_is_orthonormal,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(test_forward_backward_grid, setup, teardown),
      cmocka_unit_test_setup_teardown(test_strategies_agree, setup, teardown),
      cmocka_unit_test_setup_teardown(test_leading_dims_padding_mixed, setup, teardown),
      cmocka_unit_test_setup_teardown(test_fp32_grads_for_bf16_factors, setup, teardown),
      cmocka_unit_test_setup_teardown(test_finite_differences, setup, teardown),
      cmocka_unit_test_setup_teardown(test_merge_after_updates_and_redecompose, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_caller_owned_factors, setup, teardown),
      cmocka_unit_test_setup_teardown(test_strategy_choice, setup, teardown),
      cmocka_unit_test_setup_teardown(test_creation_errors, setup, teardown),
      cmocka_unit_test_setup_teardown(test_factor_errors, setup, teardown),
      cmocka_unit_test_setup_teardown(test_call_errors_write_nothing, setup, teardown),
      cmocka_unit_test(test_memory_is_returned),
  };
  return cmocka_run_group_tests_name("flinear", tests, NULL, NULL);
}
