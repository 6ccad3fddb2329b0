#include "flinear_testlib.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_tensors.h"
#include "test_util.h"

ref_layer ref_read(osft_flinear_t layer) {
  ref_layer R;
  assert_ok(osft_flinear_get_dims(layer, &R.n, &R.kin, &R.r, &R.l));
  for (int i = 0; i < 6; ++i) {
    DLTensor v;
    assert_ok(osft_flinear_get_factor(layer, (osft_flinear_factor_t)i, &v));
    R.f[i] = tt_read_view(&v);
  }
  return R;
}

void ref_free(ref_layer *R) {
  for (int i = 0; i < 6; ++i) free(R->f[i]);
}

double *ref_weight(const ref_layer *R) {
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

double *matmul_nt(const double *a, const double *b, int64_t m, int64_t n, int64_t k) {
  double *c = calloc((size_t)(m * n + 1), sizeof(double));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0;
      for (int64_t t = 0; t < k; ++t) acc += a[i * k + t] * b[j * k + t];
      c[i * n + j] = acc;
    }
  return c;
}

double *ref_forward(const ref_layer *R, const double *x, const double *bias, int64_t m) {
  double *w = ref_weight(R);
  double *y = matmul_nt(x, w, m, R->n, R->kin);
  if (bias)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < R->n; ++j) y[i * R->n + j] += bias[j];
  free(w);
  return y;
}

ref_grads ref_backward(const ref_layer *R, const double *x, const double *g, int64_t m) {
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

void ref_grads_free(ref_grads *g) {
  free(g->dx);
  free(g->du);
  free(g->ds);
  free(g->dv);
  free(g->db);
}

void expect_close(const char *what, const tt *t, const double *ref, double tol) {
  double *got = tt_get(t);
  const double err = rel_max_err(got, ref, (size_t)tt_logical_numel(t), 1e-6);
  free(got);
  if (!(err <= tol)) fail_msg("%s: relative max error %.3g > %.3g", what, err, tol);
}

tt *mat(tt_dtype d, int64_t rows, int64_t cols) {
  const int64_t shape[2] = {rows, cols};
  return tt_new(d, 2, shape);
}

tt *vec(tt_dtype d, int64_t n) {
  const int64_t shape[1] = {n};
  return tt_new(d, 1, shape);
}

osft_flinear_t decompose(osft_context_t ctx, tt *w, double ratio,
                         osft_flinear_strategy_t strategy) {
  osft_flinear_options_t o;
  assert_ok(OSFT_FLINEAR_OPTIONS_INIT(&o));
  o.rank_ratio = ratio;
  o.strategy = strategy;
  osft_flinear_t layer = NULL;
  assert_ok(osft_flinear_create_from_weight(ctx, &w->t, &o, &layer));
  return layer;
}

osft_flinear_grads_t grads_of(tt *dx, tt *du, tt *ds, tt *dv, tt *db) {
  osft_flinear_grads_t gr;
  assert_ok(OSFT_FLINEAR_GRADS_INIT(&gr));
  gr.grad_x = dx ? &dx->t : NULL;
  gr.grad_u_low = du ? &du->t : NULL;
  gr.grad_s_low = ds ? &ds->t : NULL;
  gr.grad_v_low = dv ? &dv->t : NULL;
  gr.grad_bias = db ? &db->t : NULL;
  return gr;
}
