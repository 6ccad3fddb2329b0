#include "mlp_testlib.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_tensors.h"
#include "test_util.h"

const osft_mlp_variant_t kVariants[N_VARIANTS] = {
    OSFT_MLP_SWIGLU,   OSFT_MLP_GEGLU_TANH, OSFT_MLP_GEGLU_ERF, OSFT_MLP_GELU_TANH,
    OSFT_MLP_GELU_ERF, OSFT_MLP_SILU,       OSFT_MLP_RELU};

int variant_gated(osft_mlp_variant_t v) {
  return v <= OSFT_MLP_GEGLU_ERF;
}

int variant_act(osft_mlp_variant_t v) {
  switch (v) {
    case OSFT_MLP_SWIGLU:
    case OSFT_MLP_SILU: return ACT_SILU;
    case OSFT_MLP_GEGLU_TANH:
    case OSFT_MLP_GELU_TANH: return ACT_GELU_TANH;
    case OSFT_MLP_GEGLU_ERF:
    case OSFT_MLP_GELU_ERF: return ACT_GELU_ERF;
    default: return ACT_RELU;
  }
}

double act_eval(int act, double z, double *df) {
  switch (act) {
    case ACT_SILU: {
      const double s = 1.0 / (1.0 + exp(-z));
      *df = s + z * s * (1.0 - s);
      return z * s;
    }
    case ACT_GELU_TANH: {
      const double c = sqrt(2.0 / M_PI), a = 0.044715;
      const double t = tanh(c * (z + a * z * z * z));
      *df = 0.5 * (1.0 + t) + 0.5 * z * (1.0 - t * t) * c * (1.0 + 3.0 * a * z * z);
      return 0.5 * z * (1.0 + t);
    }
    case ACT_GELU_ERF: {
      *df = 0.5 * (1.0 + erf(z / sqrt(2.0))) + z * exp(-0.5 * z * z) / sqrt(2.0 * M_PI);
      return 0.5 * z * (1.0 + erf(z / sqrt(2.0)));
    }
    default: *df = z > 0 ? 1.0 : 0.0; return z > 0 ? z : 0.0;
  }
}

double dot(const double *a, const double *b, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

ref_out ref_run(const ref_mlp *R, const double *x, const double *gy, int64_t m) {
  const int64_t H = R->H, I = R->I;
  ref_out o;
  memset(&o, 0, sizeof o);
  o.y = calloc((size_t)(m * H + 1), sizeof(double));
  o.dx = calloc((size_t)(m * H + 1), sizeof(double));
  for (int p = 0; p < 3; ++p) {
    if (R->w[p] == NULL) continue;
    o.dw[p] = calloc((size_t)(H * I), sizeof(double));
    o.db[p] = calloc((size_t)(p == DOWN ? H : I), sizeof(double));
  }
  double *g = calloc((size_t)I, sizeof(double)), *u = calloc((size_t)I, sizeof(double));
  double *h = calloc((size_t)I, sizeof(double)), *dh = calloc((size_t)I, sizeof(double));
  double *dg = calloc((size_t)I, sizeof(double)), *du = calloc((size_t)I, sizeof(double));
  for (int64_t t = 0; t < m; ++t) {
    const double *xt = x + t * H;
    for (int64_t i = 0; i < I; ++i) {
      u[i] = dot(R->w[UP] + i * H, xt, H) + (R->b[UP] ? R->b[UP][i] : 0);
      if (R->gated)
        g[i] = dot(R->w[GATE] + i * H, xt, H) + (R->b[GATE] ? R->b[GATE][i] : 0);
      double da;
      const double a = act_eval(R->act, R->gated ? g[i] : u[i], &da);
      h[i] = R->gated ? a * u[i] : a;
    }
    for (int64_t j = 0; j < H; ++j)
      o.y[t * H + j] = dot(R->w[DOWN] + j * I, h, I) + (R->b[DOWN] ? R->b[DOWN][j] : 0);
    if (gy == NULL) continue;
    const double *gt = gy + t * H;
    for (int64_t i = 0; i < I; ++i) {
      dh[i] = 0;
      for (int64_t j = 0; j < H; ++j) dh[i] += gt[j] * R->w[DOWN][j * I + i];
      double da;
      const double a = act_eval(R->act, R->gated ? g[i] : u[i], &da);
      if (R->gated) {
        dg[i] = dh[i] * u[i] * da;
        du[i] = dh[i] * a;
      } else {
        du[i] = dh[i] * da;
      }
    }
    for (int64_t j = 0; j < H; ++j) {
      o.db[DOWN][j] += gt[j];
      for (int64_t i = 0; i < I; ++i) o.dw[DOWN][j * I + i] += gt[j] * h[i];
    }
    for (int p = GATE; p <= UP; ++p) {
      if (R->w[p] == NULL) continue;
      const double *d = p == GATE ? dg : du;
      for (int64_t i = 0; i < I; ++i) {
        o.db[p][i] += d[i];
        for (int64_t k = 0; k < H; ++k) {
          o.dw[p][i * H + k] += d[i] * xt[k];
          o.dx[t * H + k] += d[i] * R->w[p][i * H + k];
        }
      }
    }
  }
  free(g);
  free(u);
  free(h);
  free(dh);
  free(dg);
  free(du);
  return o;
}

void ref_out_free(ref_out *o) {
  free(o->y);
  free(o->dx);
  for (int p = 0; p < 3; ++p) {
    free(o->dw[p]);
    free(o->db[p]);
  }
}

ref_layer ref_layer_read(osft_flinear_t layer) {
  ref_layer L;
  assert_ok(osft_flinear_get_dims(layer, &L.n, &L.kin, &L.r, &L.l));
  for (int i = 0; i < 6; ++i) {
    DLTensor v;
    assert_ok(osft_flinear_get_factor(layer, (osft_flinear_factor_t)i, &v));
    L.f[i] = tt_read_view(&v);
  }
  return L;
}

double *ref_layer_weight(const ref_layer *L) {
  double *w = calloc((size_t)(L->n * L->kin), sizeof(double));
  for (int part = 0; part < 2; ++part) {
    const double *u = L->f[3 * part], *s = L->f[3 * part + 1], *v = L->f[3 * part + 2];
    const int64_t c = part == 0 ? L->r : L->l;
    for (int64_t i = 0; i < L->n; ++i)
      for (int64_t j = 0; j < L->kin; ++j)
        for (int64_t t = 0; t < c; ++t)
          w[i * L->kin + j] += u[i * c + t] * s[t] * v[t * L->kin + j];
  }
  return w;
}

void ref_factor_grads(const ref_layer *L, const double *G, double *out[3]) {
  const int64_t n = L->n, kin = L->kin, l = L->l;
  const double *ul = L->f[3], *sl = L->f[4], *vl = L->f[5];
  out[0] = calloc((size_t)(n * l), sizeof(double));
  out[1] = calloc((size_t)l, sizeof(double));
  out[2] = calloc((size_t)(l * kin), sizeof(double));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t c = 0; c < l; ++c)
      for (int64_t j = 0; j < kin; ++j) {
        const double gij = G[i * kin + j];
        out[0][i * l + c] += gij * vl[c * kin + j] * sl[c];
        out[1][c] += ul[i * l + c] * gij * vl[c * kin + j];
        out[2][c * kin + j] += sl[c] * ul[i * l + c] * gij;
      }
}

tt *mat(tt_dtype d, int64_t rows, int64_t cols) {
  const int64_t shape[2] = {rows, cols};
  return tt_new(d, 2, shape);
}

tt *vec(tt_dtype d, int64_t n) {
  const int64_t shape[1] = {n};
  return tt_new(d, 1, shape);
}

DLDataType dl_dtype(tt_dtype d) {
  DLDataType t;
  t.code = d == TT_BF16 ? kDLBfloat : kDLFloat;
  t.bits = d == TT_BF16 ? 16 : 32;
  t.lanes = 1;
  return t;
}

int is_layer(const fixture *f, int p) {
  return (f->c.layers >> p) & 1;
}

osft_flinear_t make_layer(osft_context_t ctx, const cfg *c, int64_t out, int64_t in) {
  tt *w = mat(TT_F32, out, in);
  tt_random(w, -0.5, 0.5);
  osft_flinear_options_t o;
  assert_ok(OSFT_FLINEAR_OPTIONS_INIT(&o));
  o.rank_ratio = 0.5;
  o.factor_dtype = dl_dtype(c->fdtype);
  osft_flinear_t layer = NULL;
  assert_ok(osft_flinear_create_from_weight(ctx, &w->t, &o, &layer));
  tt_free(w);
  return layer;
}

osft_status_t create_mlp(osft_context_t ctx, fixture *f,
                         const osft_mlp_options_t *given) {
  osft_mlp_weights_t w;
  assert_ok(OSFT_MLP_WEIGHTS_INIT(&w));
  const DLTensor **dense[3] = {&w.gate, &w.up, &w.down};
  osft_flinear_t *layers[3] = {&w.gate_layer, &w.up_layer, &w.down_layer};
  const DLTensor **bias[3] = {&w.gate_bias, &w.up_bias, &w.down_bias};
  for (int p = 0; p < 3; ++p) {
    if (f->w[p]) *dense[p] = &f->w[p]->t;
    if (f->layer[p]) *layers[p] = f->layer[p];
    if (f->b[p]) *bias[p] = &f->b[p]->t;
  }
  osft_mlp_options_t o;
  if (given) {
    o = *given;
  } else {
    assert_ok(OSFT_MLP_OPTIONS_INIT(&o));
    o.dtype = dl_dtype(f->c.dtype);
  }
  return osft_mlp_create(ctx, f->c.variant, f->c.H, f->c.I, &w, &o, &f->mlp);
}

fixture *fx_new(osft_context_t ctx, cfg c) {
  fixture *f = calloc(1, sizeof *f);
  f->c = c;
  f->R.gated = variant_gated(c.variant);
  f->R.act = variant_act(c.variant);
  f->R.H = c.H;
  f->R.I = c.I;
  const int64_t out[3] = {c.I, c.I, c.H}, in[3] = {c.H, c.H, c.I};
  for (int p = 0; p < 3; ++p) {
    if (p == GATE && !f->R.gated) continue;
    if (is_layer(f, p)) {
      f->layer[p] = make_layer(ctx, &c, out[p], in[p]);
      f->L[p] = ref_layer_read(f->layer[p]);
      f->R.w[p] = ref_layer_weight(&f->L[p]);
    } else {
      f->w[p] = mat(c.dtype, out[p], in[p]);
      tt_random(f->w[p], -0.5, 0.5);
      f->R.w[p] = tt_get(f->w[p]);
    }
    if (c.bias) {
      f->b[p] = vec(p == DOWN ? TT_F32 : c.dtype, out[p]);
      tt_random(f->b[p], -0.5, 0.5);
      f->R.b[p] = tt_get(f->b[p]);
    }
  }
  assert_ok(create_mlp(ctx, f, NULL));
  return f;
}

void fx_free(fixture *f) {
  assert_ok(osft_mlp_destroy(f->mlp));
  for (int p = 0; p < 3; ++p) {
    tt_free(f->w[p]);
    tt_free(f->b[p]);
    if (f->layer[p]) {
      assert_ok(osft_flinear_destroy(f->layer[p]));
      for (int i = 0; i < 6; ++i) free(f->L[p].f[i]);
    }
    free(f->R.w[p]);
    free(f->R.b[p]);
  }
  free(f);
}

void grads_new(const fixture *f, const tt *x, grads *G) {
  memset(G, 0, sizeof *G);
  assert_ok(OSFT_MLP_GRADS_INIT(&G->g));
  G->dx = tt_new(f->c.dtype, x->t.ndim, x->shape);
  G->g.grad_x = &G->dx->t;
  DLTensor **dw[3] = {&G->g.grad_gate, &G->g.grad_up, &G->g.grad_down};
  DLTensor **db[3] = {&G->g.grad_gate_bias, &G->g.grad_up_bias, &G->g.grad_down_bias};
  const osft_flinear_grads_t **fg[3] = {&G->g.gate_factors, &G->g.up_factors,
                                        &G->g.down_factors};
  const int64_t out[3] = {f->c.I, f->c.I, f->c.H}, in[3] = {f->c.H, f->c.H, f->c.I};
  for (int p = 0; p < 3; ++p) {
    if (f->R.w[p] == NULL) continue;
    if (is_layer(f, p)) {
      const ref_layer *L = &f->L[p];
      G->df[p][0] = mat(f->c.fdtype, L->n, L->l);
      G->df[p][1] = vec(f->c.fdtype, L->l);
      G->df[p][2] = mat(f->c.fdtype, L->l, L->kin);
      assert_ok(OSFT_FLINEAR_GRADS_INIT(&G->fg[p]));
      G->fg[p].grad_u_low = &G->df[p][0]->t;
      G->fg[p].grad_s_low = &G->df[p][1]->t;
      G->fg[p].grad_v_low = &G->df[p][2]->t;
      *fg[p] = &G->fg[p];
    } else {
      G->dw[p] = mat(f->c.gdtype, out[p], in[p]);
      *dw[p] = &G->dw[p]->t;
    }
    if (f->c.bias) {
      G->db[p] = vec(f->c.gdtype, out[p]);
      *db[p] = &G->db[p]->t;
    }
  }
}

void grad_slots(const grads *G, tt *slot[SLOTS]) {
  slot[0] = G->dx;
  for (int p = 0; p < 3; ++p) {
    slot[1 + 5 * p] = G->dw[p];
    slot[2 + 5 * p] = G->db[p];
    for (int q = 0; q < 3; ++q) slot[3 + 5 * p + q] = G->df[p][q];
  }
}

void grads_free(grads *G) {
  tt *slot[SLOTS];
  grad_slots(G, slot);
  for (int i = 0; i < SLOTS; ++i) tt_free(slot[i]);
}

double tol_for(tt_dtype d) {
  return d == TT_BF16 ? 4e-2 : 5e-5;
}

void expect_close(const char *what, const tt *t, const double *ref, double tol) {
  double *got = tt_get(t);
  const double err = rel_max_err(got, ref, (size_t)tt_logical_numel(t), 1e-3);
  free(got);
  if (!(err <= tol)) fail_msg("%s: relative max error %.3g > %.3g", what, err, tol);
}

double *plus(const double *ref, const double *prior, int64_t n) {
  double *out = malloc((size_t)(n > 0 ? n : 1) * sizeof(double));
  for (int64_t i = 0; i < n; ++i) out[i] = ref[i] + (prior ? prior[i] : 0.0);
  return out;
}

const char *const kProj[3] = {"gate", "up", "down"};

void expect_grads(const fixture *f, const grads *G, const ref_out *o,
                  double *const *prior, const char *label) {
  const double tol = tol_for(f->c.dtype) + tol_for(f->c.gdtype) / 2;
  char what[160];
  int k = 0;
  const int64_t mx = tt_logical_numel(G->dx);
  double *e = plus(o->dx, prior ? prior[k] : NULL, mx);
  snprintf(what, sizeof what, "%s: grad_x", label);
  expect_close(what, G->dx, e, tol);
  free(e);
  ++k;
  for (int p = 0; p < 3; ++p, k += 5) {
    if (f->R.w[p] == NULL) continue;
    if (G->dw[p]) {
      e = plus(o->dw[p], prior ? prior[k] : NULL, tt_logical_numel(G->dw[p]));
      snprintf(what, sizeof what, "%s: grad_%s", label, kProj[p]);
      expect_close(what, G->dw[p], e, tol);
      free(e);
    }
    if (G->db[p]) {
      e = plus(o->db[p], prior ? prior[k + 1] : NULL, tt_logical_numel(G->db[p]));
      snprintf(what, sizeof what, "%s: grad_%s_bias", label, kProj[p]);
      expect_close(what, G->db[p], e, tol);
      free(e);
    }
    if (!is_layer(f, p)) continue;
    double *fr[3];
    ref_factor_grads(&f->L[p], o->dw[p], fr);
    static const char *const names[3] = {"u_low", "s_low", "v_low"};
    for (int q = 0; q < 3; ++q) {
      e = plus(fr[q], prior ? prior[k + 2 + q] : NULL, tt_logical_numel(G->df[p][q]));
      snprintf(what, sizeof what, "%s: %s layer grad_%s", label, kProj[p], names[q]);
      expect_close(what, G->df[p][q], e, tol_for(f->c.dtype) + tol_for(f->c.fdtype) / 2);
      free(e);
      free(fr[q]);
    }
  }
}

tt *activations(const fixture *f, int ndim, const int64_t *lead) {
  int64_t shape[4];
  for (int d = 0; d < ndim - 1; ++d) shape[d] = lead[d];
  shape[ndim - 1] = f->c.H;
  tt *t = tt_new(f->c.dtype, ndim, shape);
  tt_random(t, -1, 1);
  return t;
}

void check_pass(fixture *f, int ndim, const int64_t *lead, int64_t tiles, int accumulate,
                const char *label) {
  tt *x = activations(f, ndim, lead), *gy = activations(f, ndim, lead);
  tt *y = tt_new(f->c.dtype, ndim, x->shape);
  tt_poison(y);
  const int64_t m = tt_logical_numel(x) / f->c.H;
  double *xd = tt_get(x), *gyd = tt_get(gy);
  ref_out o = ref_run(&f->R, xd, gyd, m);
  assert_ok(osft_mlp_forward(f->mlp, &x->t, &y->t, tiles));
  char what[160];
  snprintf(what, sizeof what, "%s: y", label);
  expect_close(what, y, o.y, tol_for(f->c.dtype));

  grads G;
  grads_new(f, x, &G);
  /* priors by slot (NULL where nothing is requested) */
  double *prior[SLOTS] = {NULL};
  tt *slot[SLOTS];
  grad_slots(&G, slot);
  for (int i = 0; i < SLOTS; ++i) {
    if (slot[i] == NULL) continue;
    if (accumulate) {
      tt_random(slot[i], -1, 1);
      prior[i] = tt_get(slot[i]);
    } else {
      tt_poison(slot[i]);
    }
  }
  if (accumulate) {
    G.g.accumulate = OSFT_MLP_ACCUMULATE_ALL;
    for (int p = 0; p < 3; ++p) G.fg[p].accumulate = OSFT_FLINEAR_ACCUMULATE_ALL;
  }
  assert_ok(osft_mlp_backward(f->mlp, &x->t, &gy->t, &G.g, tiles));
  expect_grads(f, &G, &o, accumulate ? prior : NULL, label);
  for (int i = 0; i < SLOTS; ++i) free(prior[i]);
  grads_free(&G);
  ref_out_free(&o);
  free(xd);
  free(gyd);
  tt_free(x);
  tt_free(gy);
  tt_free(y);
}

cfg base_cfg(osft_mlp_variant_t v, tt_dtype d) {
  cfg c;
  memset(&c, 0, sizeof c);
  c.variant = v;
  c.dtype = d;
  c.fdtype = TT_F32;
  c.gdtype = TT_F32;
  c.H = 12;
  c.I = 20;
  return c;
}

void snapshot_take(snapshot *s, tt *y, const grads *G) {
  tt *all[SLOTS + 1];
  all[0] = y;
  grad_slots(G, all + 1);
  for (int i = 0; i <= SLOTS; ++i)
    if (all[i]) tt_random(all[i], -1, 1);
  tt_snapshot_take(s, all, SLOTS + 1);
}

void snapshot_expect_untouched(snapshot *s) {
  tt_snapshot_expect_untouched(s, "MLP call");
  tt_snapshot_release(s);
}
