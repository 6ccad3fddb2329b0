/* Tiled MLP: forward and backward over tiles, against an untiled float64
 * reference computed token by token with plain loops; every variant, biases,
 * fp32 and bf16, accumulation, factorized (OSFT) projections, the tiling
 * rules, the sum-over-tiles property, and every error. Built twice: for the
 * CPU, and with OSFT_TEST_CUDA for a GPU (skipped where none is present). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_tensors.h"
#include "test_util.h"

enum { GATE = 0, UP = 1, DOWN = 2 };
enum { ACT_SILU, ACT_GELU_TANH, ACT_GELU_ERF, ACT_RELU };

static const osft_mlp_variant_t kVariants[7] = {
    OSFT_MLP_SWIGLU,   OSFT_MLP_GEGLU_TANH, OSFT_MLP_GEGLU_ERF, OSFT_MLP_GELU_TANH,
    OSFT_MLP_GELU_ERF, OSFT_MLP_SILU,       OSFT_MLP_RELU};

static int variant_gated(osft_mlp_variant_t v) {
  return v <= OSFT_MLP_GEGLU_ERF;
}

static int variant_act(osft_mlp_variant_t v) {
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

/* ----------------------------------------------------------- reference */

/* act(z) and act'(z) in float64, written from the definitions. */
static double act_eval(int act, double z, double *df) {
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

/* The MLP as float64 arrays: effective weights (a layer's merged weight). */
typedef struct {
  int gated, act;
  int64_t H, I;
  double *w[3]; /* gate I x H, up I x H, down H x I (NULL: absent) */
  double *b[3]; /* biases (NULL: none) */
} ref_mlp;

/* Gradients of the sum over tokens: dW = sum_t grad_out_t^T in_t, etc. */
typedef struct {
  double *y, *dx, *dw[3], *db[3];
} ref_out;

static double dot(const double *a, const double *b, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

/* Token by token, untiled: y, and with gy the gradients. */
static ref_out ref_run(const ref_mlp *R, const double *x, const double *gy, int64_t m) {
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

static void ref_out_free(ref_out *o) {
  free(o->y);
  free(o->dx);
  for (int p = 0; p < 3; ++p) {
    free(o->dw[p]);
    free(o->db[p]);
  }
}

/* A factorized layer's factors as stored, read back as doubles. */
typedef struct {
  int64_t n, kin, r, l;
  double *f[6]; /* u_high, s_high, v_high, u_low, s_low, v_low */
} ref_layer;

static ref_layer ref_layer_read(osft_flinear_t layer) {
  ref_layer L;
  assert_ok(osft_flinear_get_dims(layer, &L.n, &L.kin, &L.r, &L.l));
  for (int i = 0; i < 6; ++i) {
    DLTensor v;
    assert_ok(osft_flinear_get_factor(layer, (osft_flinear_factor_t)i, &v));
    L.f[i] = tt_read_view(&v);
  }
  return L;
}

/* W = U_high diag(S_high) V_high + U_low diag(S_low) V_low. */
static double *ref_layer_weight(const ref_layer *L) {
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

/* The factor gradients from the dense one, G = sum grad_out^T in:
 * dU_low = G V_low^T S_low, dS_low = diag(U_low^T G V_low^T),
 * dV_low = S_low U_low^T G. out[0..2] = du, ds, dv (malloc'ed). */
static void ref_factor_grads(const ref_layer *L, const double *G, double *out[3]) {
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

/* ----------------------------------------------------------- fixtures */

typedef struct {
  osft_mlp_variant_t variant;
  tt_dtype dtype;  /* compute dtype: weights, activations */
  int bias;        /* biases on */
  int layers;      /* bit p: projection p is a factorized layer */
  tt_dtype fdtype; /* the layers' factor dtype */
  tt_dtype gdtype; /* dense weight and bias gradients */
  int64_t H, I;
} cfg;

typedef struct {
  cfg c;
  tt *w[3], *b[3];
  osft_flinear_t layer[3];
  ref_layer L[3];
  ref_mlp R;
  osft_mlp_t mlp;
} fixture;

static tt *mat(tt_dtype d, int64_t rows, int64_t cols) {
  const int64_t shape[2] = {rows, cols};
  return tt_new(d, 2, shape);
}

static tt *vec(tt_dtype d, int64_t n) {
  const int64_t shape[1] = {n};
  return tt_new(d, 1, shape);
}

static DLDataType dl_dtype(tt_dtype d) {
  DLDataType t;
  t.code = d == TT_BF16 ? kDLBfloat : kDLFloat;
  t.bits = d == TT_BF16 ? 16 : 32;
  t.lanes = 1;
  return t;
}

static int is_layer(const fixture *f, int p) {
  return (f->c.layers >> p) & 1;
}

static osft_flinear_t make_layer(osft_context_t ctx, const cfg *c, int64_t out,
                                 int64_t in) {
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

static osft_status_t create_mlp(osft_context_t ctx, fixture *f,
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

static fixture *fx_new(osft_context_t ctx, cfg c) {
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

static void fx_free(fixture *f) {
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

/* The gradient outputs of one backward, as tensors. */
typedef struct {
  tt *dx, *dw[3], *db[3], *df[3][3]; /* df: u_low, s_low, v_low per layer */
  osft_flinear_grads_t fg[3];
  osft_mlp_grads_t g;
} grads;

static void grads_new(const fixture *f, const tt *x, grads *G) {
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

/* Every gradient output in fixed slots: 0 grad_x, then per projection p
 * 1 + 5p weight, 2 + 5p bias, 3 + 5p + q factor q (NULL: not requested). */
enum { SLOTS = 16 };
static void grad_slots(const grads *G, tt *slot[SLOTS]) {
  slot[0] = G->dx;
  for (int p = 0; p < 3; ++p) {
    slot[1 + 5 * p] = G->dw[p];
    slot[2 + 5 * p] = G->db[p];
    for (int q = 0; q < 3; ++q) slot[3 + 5 * p + q] = G->df[p][q];
  }
}

static void grads_free(grads *G) {
  tt *slot[SLOTS];
  grad_slots(G, slot);
  for (int i = 0; i < SLOTS; ++i) tt_free(slot[i]);
}

/* --------------------------------------------------------------- checks */

static double tol_for(tt_dtype d) {
  return d == TT_BF16 ? 4e-2 : 5e-5;
}

static void expect_close(const char *what, const tt *t, const double *ref, double tol) {
  double *got = tt_get(t);
  const double err = rel_max_err(got, ref, (size_t)tt_logical_numel(t), 1e-3);
  free(got);
  if (!(err <= tol)) fail_msg("%s: relative max error %.3g > %.3g", what, err, tol);
}

/* ref + prior (accumulation), or ref alone. */
static double *plus(const double *ref, const double *prior, int64_t n) {
  double *out = malloc((size_t)(n > 0 ? n : 1) * sizeof(double));
  for (int64_t i = 0; i < n; ++i) out[i] = ref[i] + (prior ? prior[i] : 0.0);
  return out;
}

static const char *const kProj[3] = {"gate", "up", "down"};

/* Compares every gradient with the reference (plus prior values where the
 * call accumulated; prior[] by grad_slots()). */
static void expect_grads(const fixture *f, const grads *G, const ref_out *o,
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

/* x of shape dims (any rank >= 2, last = H), random; gy likewise. */
static tt *activations(const fixture *f, int ndim, const int64_t *lead) {
  int64_t shape[4];
  for (int d = 0; d < ndim - 1; ++d) shape[d] = lead[d];
  shape[ndim - 1] = f->c.H;
  tt *t = tt_new(f->c.dtype, ndim, shape);
  tt_random(t, -1, 1);
  return t;
}

/* Forward and backward with `tiles`, all gradients requested (poisoned
 * first, or random priors with accumulate), against the reference. */
static void check_pass(fixture *f, int ndim, const int64_t *lead, int64_t tiles,
                       int accumulate, const char *label) {
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

/* Warnings the library logs (e.g. a layer outgrowing the workspace the MLP
 * reserved for it): none is expected anywhere in these tests. */
static int g_warnings;
static char g_last_warning[512];

static void count_warnings(void *user, osft_log_level_t level, const char *message) {
  (void)user;
  if (level != OSFT_LOG_WARN) return;
  ++g_warnings;
  snprintf(g_last_warning, sizeof g_last_warning, "%s", message);
}

static int setup(void **state) {
  assert_ok(osft_set_log_callback(count_warnings, NULL, OSFT_LOG_WARN));
  g_warnings = 0;
  *state = tt_context(NULL);
  return 0;
}

static int teardown(void **state) {
  assert_ok(osft_context_destroy((osft_context_t)*state));
  assert_ok(osft_set_log_callback(NULL, NULL, OSFT_LOG_OFF));
  if (g_warnings != 0)
    fail_msg("%d warning(s), the last: %s", g_warnings, g_last_warning);
  return 0;
}

#define CTX ((osft_context_t)*state)

static cfg base_cfg(osft_mlp_variant_t v, tt_dtype d) {
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

/* ---------------------------------------------------------------- tests */

/* Every variant, biases off and on, fp32: tile counts 1, 2, 7 and the
 * automatic rule on a batch of two sequences of 15 tokens (30 rows: 7 tiles
 * of 4 or 5 tokens do not divide it). */
static void test_every_variant_fp32(void **state) {
  for (int v = 0; v < 7; ++v)
    for (int bias = 0; bias < 2; ++bias) {
      test_seed("variants fp32");
      cfg c = base_cfg(kVariants[v], TT_F32);
      c.bias = bias;
      fixture *f = fx_new(CTX, c);
      const int64_t lead[2] = {2, 15};
      const int64_t tiles[4] = {1, 2, 7, 0};
      for (int t = 0; t < 4; ++t) {
        char label[96];
        snprintf(label, sizeof label, "variant %d bias %d tiles %lld", (int)kVariants[v],
                 bias, (long long)tiles[t]);
        check_pass(f, 3, lead, tiles[t], 0, label);
      }
      fx_free(f);
    }
}

/* bf16 activations and weights; weight/bias gradients in fp32 and in bf16
 * (several tiles: summed in an fp32 accumulator, rounded once). */
static void test_every_variant_bf16(void **state) {
  for (int v = 0; v < 7; ++v)
    for (int gd = 0; gd < 2; ++gd) {
      test_seed("variants bf16");
      cfg c = base_cfg(kVariants[v], TT_BF16);
      c.bias = 1;
      c.gdtype = gd ? TT_BF16 : TT_F32;
      fixture *f = fx_new(CTX, c);
      const int64_t lead[2] = {3, 9};
      const int64_t tiles[3] = {1, 2, 7};
      for (int t = 0; t < 3; ++t) {
        char label[96];
        snprintf(label, sizeof label, "bf16 variant %d grads %s tiles %lld",
                 (int)kVariants[v], gd ? "bf16" : "fp32", (long long)tiles[t]);
        check_pass(f, 3, lead, tiles[t], 0, label);
      }
      fx_free(f);
    }
}

/* Accumulate mode adds onto existing gradients (micro-batches), in fp32 and
 * bf16, with one tile and with several. */
static void test_accumulate(void **state) {
  const tt_dtype dts[2] = {TT_F32, TT_BF16};
  for (int d = 0; d < 2; ++d)
    for (int layers = 0; layers < 2; ++layers) {
      test_seed("accumulate");
      cfg c = base_cfg(OSFT_MLP_SWIGLU, dts[d]);
      c.bias = 1;
      c.gdtype = dts[d];
      c.layers = layers ? (1 << UP) : 0;
      c.fdtype = dts[d];
      fixture *f = fx_new(CTX, c);
      const int64_t lead[1] = {23};
      check_pass(f, 2, lead, 1, 1, "accumulate, 1 tile");
      check_pass(f, 2, lead, 7, 1, "accumulate, 7 tiles");
      fx_free(f);
    }
}

/* Factorized (OSFT) projections inside: each projection in turn, then all
 * three; fp32 and bf16 factors (bf16 with several tiles goes through fp32
 * copies), fp32 and bf16 activations. */
static void test_layer_projections(void **state) {
  const int masks[4] = {1 << UP, 1 << GATE, 1 << DOWN, 7};
  const tt_dtype fdts[2] = {TT_F32, TT_BF16};
  for (int mk = 0; mk < 4; ++mk)
    for (int fd = 0; fd < 2; ++fd)
      for (int ad = 0; ad < 2; ++ad) {
        test_seed("layers");
        cfg c = base_cfg(OSFT_MLP_SWIGLU, ad ? TT_BF16 : TT_F32);
        c.layers = masks[mk];
        c.fdtype = fdts[fd];
        c.bias = mk == 1;
        fixture *f = fx_new(CTX, c);
        const int64_t lead[2] = {2, 13};
        const int64_t tiles[3] = {1, 2, 7};
        for (int t = 0; t < 3; ++t) {
          char label[128];
          snprintf(label, sizeof label, "layers 0x%x factors %s act %s tiles %lld",
                   masks[mk], fd ? "bf16" : "fp32", ad ? "bf16" : "fp32",
                   (long long)tiles[t]);
          check_pass(f, 3, lead, tiles[t], 0, label);
        }
        fx_free(f);
      }
  /* a plain variant with a factorized down projection */
  test_seed("layers plain");
  cfg c = base_cfg(OSFT_MLP_GELU_TANH, TT_F32);
  c.layers = 1 << DOWN;
  c.bias = 1;
  fixture *f = fx_new(CTX, c);
  const int64_t lead[1] = {17};
  check_pass(f, 2, lead, 3, 0, "plain, factorized down");
  fx_free(f);
}

/* Backward into the given gradients; returns copies of them as doubles. */
static void backward_copy(fixture *f, const tt *x, const tt *gy, int64_t tiles,
                          uint32_t accumulate, grads *G) {
  G->g.accumulate = accumulate;
  assert_ok(osft_mlp_backward(f->mlp, &x->t, &gy->t, &G->g, tiles));
}

/* The weight gradients are the plain SUM over the tiles, each tile once:
 *  - 1 tile and 7 tiles agree with each other and with the untiled
 *    reference (a mean would be 7 times smaller, a repeated tile larger);
 *  - with one tile's upstream gradient zero, the result equals the
 *    reference over the other tokens: that tile contributes nothing, and
 *    no other tile is counted twice in its place;
 *  - running the backward once per tile with only that tile's upstream
 *    gradient and accumulating gives the same sum. */
static void test_gradients_are_the_sum_over_tiles(void **state) {
  test_seed("sum over tiles");
  cfg c = base_cfg(OSFT_MLP_SWIGLU, TT_F32);
  c.bias = 1;
  fixture *f = fx_new(CTX, c);
  const int64_t m = 28, T = 7, per = 4; /* 7 tiles of 4 tokens */
  const int64_t lead[1] = {m};
  tt *x = activations(f, 2, lead), *gy = activations(f, 2, lead);
  double *xd = tt_get(x), *gyd = tt_get(gy);

  grads one, seven;
  grads_new(f, x, &one);
  grads_new(f, x, &seven);
  backward_copy(f, x, gy, 1, 0, &one);
  backward_copy(f, x, gy, T, 0, &seven);
  ref_out o = ref_run(&f->R, xd, gyd, m);
  expect_grads(f, &one, &o, NULL, "1 tile");
  expect_grads(f, &seven, &o, NULL, "7 tiles");
  for (int p = 0; p < 3; ++p) {
    double *a = tt_get(one.dw[p]), *b = tt_get(seven.dw[p]);
    const double err = rel_max_err(b, a, (size_t)tt_logical_numel(one.dw[p]), 1e-3);
    if (!(err <= 1e-5)) fail_msg("grad_%s: 7 tiles vs 1 tile: %.3g", kProj[p], err);
    free(a);
    free(b);
  }

  /* tile 3 (tokens 12..15) gets a zero upstream gradient */
  double *masked = malloc(sizeof(double) * (size_t)(m * c.H));
  memcpy(masked, gyd, sizeof(double) * (size_t)(m * c.H));
  for (int64_t t = 3 * per; t < 4 * per; ++t)
    for (int64_t j = 0; j < c.H; ++j) masked[t * c.H + j] = 0.0;
  tt_set(gy, masked);
  backward_copy(f, x, gy, T, 0, &seven);
  ref_out o_masked = ref_run(&f->R, xd, masked, m);
  expect_grads(f, &seven, &o_masked, NULL, "tile 3 zero");

  /* one backward per tile, each with only its own tokens' gradient */
  for (int64_t k = 0; k < T; ++k) {
    for (int64_t i = 0; i < m * c.H; ++i) masked[i] = i / c.H / per == k ? gyd[i] : 0.0;
    tt_set(gy, masked);
    backward_copy(f, x, gy, T, k == 0 ? 0 : OSFT_MLP_ACCUMULATE_ALL, &seven);
  }
  expect_grads(f, &seven, &o, NULL, "per-tile accumulation");

  ref_out_free(&o);
  ref_out_free(&o_masked);
  free(masked);
  free(xd);
  free(gyd);
  grads_free(&one);
  grads_free(&seven);
  tt_free(x);
  tt_free(gy);
  fx_free(f);
}

/* |got - ref| within half a bf16 ulp of ref (plus fp32 noise): a bf16
 * gradient summed over many tiles is rounded once, not once per tile. */
static void expect_rounded_once(const char *what, const tt *t, const double *ref) {
  double *got = tt_get(t);
  const int64_t n = tt_logical_numel(t);
  double scale = 0;
  for (int64_t i = 0; i < n; ++i) scale = fmax(scale, fabs(ref[i]));
  for (int64_t i = 0; i < n; ++i) {
    const double a = fabs(ref[i]);
    const double ulp = a > 0 ? ldexp(1.0, ilogb(a) - 7) : 0.0;
    if (fabs(got[i] - ref[i]) > 0.5 * ulp + 1e-5 * scale)
      fail_msg("%s[%lld]: %.9g vs %.9g: more than half a bf16 ulp (%.3g)", what,
               (long long)i, got[i], ref[i], ulp);
  }
  free(got);
}

/* fp32 activations (exact intermediates), bf16 gradients and bf16 factors,
 * 16 tiles: each gradient is within half a bf16 ulp of the float64 sum,
 * overwriting and accumulating. Per-tile rounding would drift further. */
static void test_bf16_gradients_rounded_once(void **state) {
  test_seed("rounded once");
  cfg c = base_cfg(OSFT_MLP_SWIGLU, TT_F32);
  c.bias = 1;
  c.gdtype = TT_BF16;
  c.layers = 1 << UP;
  c.fdtype = TT_BF16;
  fixture *f = fx_new(CTX, c);
  const int64_t m = 64;
  const int64_t lead[1] = {m};
  tt *x = activations(f, 2, lead), *gy = activations(f, 2, lead);
  double *xd = tt_get(x), *gyd = tt_get(gy);
  ref_out o = ref_run(&f->R, xd, gyd, m);
  double *fr[3];
  ref_factor_grads(&f->L[UP], o.dw[UP], fr);
  grads G;
  grads_new(f, x, &G);
  for (int acc = 0; acc < 2; ++acc) {
    double *prior[4] = {NULL};
    tt *checked[4] = {G.dw[GATE], G.dw[DOWN], G.db[DOWN], G.df[UP][2]};
    const double *refs[4] = {o.dw[GATE], o.dw[DOWN], o.db[DOWN], fr[2]};
    for (int i = 0; i < 4; ++i) {
      if (acc) {
        tt_random(checked[i], -1, 1);
        prior[i] = tt_get(checked[i]);
      } else {
        tt_poison(checked[i]);
      }
    }
    G.g.accumulate = acc ? OSFT_MLP_ACCUMULATE_ALL : 0;
    G.fg[UP].accumulate = acc ? OSFT_FLINEAR_ACCUMULATE_ALL : 0;
    assert_ok(osft_mlp_backward(f->mlp, &x->t, &gy->t, &G.g, 16));
    static const char *const names[4] = {"grad_gate", "grad_down", "grad_down_bias",
                                         "up layer grad_v_low"};
    for (int i = 0; i < 4; ++i) {
      double *e = plus(refs[i], prior[i], tt_logical_numel(checked[i]));
      expect_rounded_once(names[i], checked[i], e);
      free(e);
      free(prior[i]);
    }
  }
  for (int q = 0; q < 3; ++q) free(fr[q]);
  ref_out_free(&o);
  free(xd);
  free(gyd);
  grads_free(&G);
  tt_free(x);
  tt_free(gy);
  fx_free(f);
}

/* Leading dims of any rank (4-D), padded rows in x, y and grad_x, more
 * tiles than tokens (empty tiles), and zero tokens. */
static void test_shapes_padding_and_edges(void **state) {
  test_seed("shapes");
  cfg c = base_cfg(OSFT_MLP_GEGLU_TANH, TT_F32);
  c.bias = 1;
  fixture *f = fx_new(CTX, c);
  const int64_t lead4[3] = {2, 2, 5};
  check_pass(f, 4, lead4, 3, 0, "4-D x");
  const int64_t lead2[1] = {5};
  check_pass(f, 2, lead2, 9, 0, "9 tiles over 5 tokens");

  /* padded rows */
  const int64_t m = 11, H = c.H;
  tt *x = tt_new_padded(TT_F32, m, H, H + 3), *gy = tt_new_padded(TT_F32, m, H, H + 1);
  tt *y = tt_new_padded(TT_F32, m, H, H + 5), *dx = tt_new_padded(TT_F32, m, H, H + 2);
  tt_random(x, -1, 1);
  tt_random(gy, -1, 1);
  tt_poison(y);
  tt_poison(dx);
  double *xd = tt_get(x), *gyd = tt_get(gy);
  ref_out o = ref_run(&f->R, xd, gyd, m);
  assert_ok(osft_mlp_forward(f->mlp, &x->t, &y->t, 4));
  expect_close("padded y", y, o.y, tol_for(TT_F32));
  osft_mlp_grads_t g;
  assert_ok(OSFT_MLP_GRADS_INIT(&g));
  g.grad_x = &dx->t;
  assert_ok(osft_mlp_backward(f->mlp, &x->t, &gy->t, &g, 4));
  expect_close("padded grad_x", dx, o.dx, tol_for(TT_F32));
  /* padding stays untouched (still NaN) */
  double *raw_bytes = NULL;
  (void)raw_bytes;
  size_t size;
  float *yb = tt_bytes(y, &size);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = H; j < H + 5; ++j) assert_true(isnan(yb[i * (H + 5) + j]));
  free(yb);
  ref_out_free(&o);
  free(xd);
  free(gyd);

  /* zero tokens: overwritten gradients become 0, accumulated ones stay */
  const int64_t shape0[3] = {0, 4, H};
  tt *x0 = tt_new(TT_F32, 3, shape0), *g0 = tt_new(TT_F32, 3, shape0);
  tt *y0 = tt_new(TT_F32, 3, shape0);
  assert_ok(osft_mlp_forward(f->mlp, &x0->t, &y0->t, 0));
  grads G;
  grads_new(f, x0, &G);
  tt *slot[SLOTS];
  grad_slots(&G, slot);
  for (int i = 0; i < SLOTS; ++i)
    if (slot[i]) tt_random(slot[i], -1, 1);
  double *kept = tt_get(G.db[UP]);
  G.g.accumulate = OSFT_MLP_ACCUMULATE_GRAD_UP_BIAS;
  assert_ok(osft_mlp_backward(f->mlp, &x0->t, &g0->t, &G.g, 0));
  double *zero_w = tt_get(G.dw[DOWN]), *zero_b = tt_get(G.db[GATE]);
  for (int64_t i = 0; i < H * c.I; ++i) assert_true(zero_w[i] == 0.0);
  for (int64_t i = 0; i < c.I; ++i) assert_true(zero_b[i] == 0.0);
  expect_close("accumulated bias over 0 tokens", G.db[UP], kept, 0.0);
  free(kept);
  free(zero_w);
  free(zero_b);
  grads_free(&G);
  tt *keep[7] = {x, gy, y, dx, x0, g0, y0};
  for (int i = 0; i < 7; ++i) tt_free(keep[i]);
  fx_free(f);
}

/* Only some gradients requested: each computed alone matches. */
static void test_partial_requests(void **state) {
  test_seed("partial");
  cfg c = base_cfg(OSFT_MLP_SWIGLU, TT_F32);
  c.bias = 1;
  c.layers = 1 << DOWN;
  fixture *f = fx_new(CTX, c);
  const int64_t lead[1] = {19};
  tt *x = activations(f, 2, lead), *gy = activations(f, 2, lead);
  double *xd = tt_get(x), *gyd = tt_get(gy);
  ref_out o = ref_run(&f->R, xd, gyd, 19);
  grads G;
  grads_new(f, x, &G);
  /* down bias only; then gate weight only; then the down factors only */
  osft_mlp_grads_t one;
  assert_ok(OSFT_MLP_GRADS_INIT(&one));
  one.grad_down_bias = &G.db[DOWN]->t;
  tt_poison(G.db[DOWN]);
  assert_ok(osft_mlp_backward(f->mlp, &x->t, &gy->t, &one, 5));
  expect_close("down bias alone", G.db[DOWN], o.db[DOWN], tol_for(TT_F32));
  assert_ok(OSFT_MLP_GRADS_INIT(&one));
  one.grad_gate = &G.dw[GATE]->t;
  tt_poison(G.dw[GATE]);
  assert_ok(osft_mlp_backward(f->mlp, &x->t, &gy->t, &one, 5));
  expect_close("gate alone", G.dw[GATE], o.dw[GATE], tol_for(TT_F32));
  assert_ok(OSFT_MLP_GRADS_INIT(&one));
  osft_flinear_grads_t fg;
  assert_ok(OSFT_FLINEAR_GRADS_INIT(&fg));
  fg.grad_v_low = &G.df[DOWN][2]->t;
  one.down_factors = &fg;
  tt_poison(G.df[DOWN][2]);
  assert_ok(osft_mlp_backward(f->mlp, &x->t, &gy->t, &one, 5));
  double *fr[3];
  ref_factor_grads(&f->L[DOWN], o.dw[DOWN], fr);
  expect_close("down v_low alone", G.df[DOWN][2], fr[2], tol_for(TT_F32));
  for (int q = 0; q < 3; ++q) free(fr[q]);
  /* nothing requested: a no-op */
  assert_ok(OSFT_MLP_GRADS_INIT(&one));
  assert_ok(osft_mlp_backward(f->mlp, &x->t, &gy->t, &one, 5));
  ref_out_free(&o);
  free(xd);
  free(gyd);
  grads_free(&G);
  tt_free(x);
  tt_free(gy);
  fx_free(f);
}

/* Pre-activations of a few units (where gelu_tanh's polynomial matters)
 * and large ones (|z| well beyond 10: saturated, finite, exact). */
static void test_large_inputs(void **state) {
  for (int v = 0; v < 14; ++v) {
    const double scale = v < 7 ? 6.0 : 60.0;
    test_seed("large");
    cfg c = base_cfg(kVariants[v % 7], TT_F32);
    fixture *f = fx_new(CTX, c);
    const int64_t m = 6;
    const int64_t lead[1] = {m};
    tt *x = activations(f, 2, lead), *gy = activations(f, 2, lead);
    double *xd = tt_get(x);
    for (int64_t i = 0; i < m * c.H; ++i) xd[i] *= scale;
    tt_set(x, xd);
    free(xd);
    char label[64];
    snprintf(label, sizeof label, "inputs x%g, variant %d", scale, (int)kVariants[v % 7]);
    tt *y = tt_new(TT_F32, 2, x->shape);
    assert_ok(osft_mlp_forward(f->mlp, &x->t, &y->t, 2));
    double *yd = tt_get(y);
    xd = tt_get(x);
    double *gyd = tt_get(gy);
    ref_out o = ref_run(&f->R, xd, gyd, m);
    expect_close(label, y, o.y, tol_for(TT_F32));
    grads G;
    grads_new(f, x, &G);
    assert_ok(osft_mlp_backward(f->mlp, &x->t, &gy->t, &G.g, 2));
    expect_grads(f, &G, &o, NULL, label);
    grads_free(&G);
    ref_out_free(&o);
    free(yd);
    free(xd);
    free(gyd);
    tt_free(x);
    tt_free(gy);
    tt_free(y);
    fx_free(f);
  }
}

/* The tile count query: every rule, the workspace cap, forced counts. */
static void test_tile_count(void **state) {
  test_seed("tile count");
  cfg c = base_cfg(OSFT_MLP_SWIGLU, TT_F32);
  fixture *f = fx_new(CTX, c);
  int64_t n = -1, per = -1;
  assert_ok(osft_mlp_get_tile_count(f->mlp, 100, &n, &per)); /* auto: H = 12 */
  assert_int_equal(n, 9);
  assert_int_equal(per, 12);
  assert_ok(osft_mlp_get_tile_count(f->mlp, 0, &n, &per));
  assert_int_equal(n, 0);
  assert_int_equal(per, 0);
  assert_ok(osft_mlp_get_tile_count(f->mlp, 5, &n, NULL));
  assert_int_equal(n, 1);
  assert_ok(osft_mlp_destroy(f->mlp));

  osft_mlp_options_t o;
  assert_ok(OSFT_MLP_OPTIONS_INIT(&o));
  o.tiling = OSFT_MLP_TILING_TOKENS;
  o.tile_tokens = 7;
  assert_ok(create_mlp(CTX, f, &o));
  assert_ok(osft_mlp_get_tile_count(f->mlp, 30, &n, &per));
  assert_int_equal(n, 5); /* ceil(30 / 7), balanced as 6,6,6,6,6 */
  assert_int_equal(per, 6);
  assert_ok(osft_mlp_destroy(f->mlp));

  /* budget: SwiGLU fp32 backward = 3 * I * 4 = 240 bytes per token */
  o.tiling = OSFT_MLP_TILING_BUDGET;
  o.tile_tokens = 0;
  o.memory_budget = 240 * 10 + 239;
  assert_ok(create_mlp(CTX, f, &o));
  assert_ok(osft_mlp_get_tile_count(f->mlp, 95, &n, &per));
  assert_int_equal(n, 10);
  assert_int_equal(per, 10);
  const int64_t lead[1] = {95};
  check_pass(f, 2, lead, 0, 0, "budget tiling");
  assert_ok(osft_mlp_destroy(f->mlp));
  f->mlp = NULL;

  /* a context workspace limit caps the automatic tile size */
  osft_context_options_t co;
  assert_ok(OSFT_CONTEXT_OPTIONS_INIT(&co));
  co.workspace_limit = 240 * 4 + 5 * 256; /* 4 tokens, with the alignment slack */
  osft_context_t small = tt_context(&co);
  assert_ok(create_mlp(small, f, NULL));
  assert_ok(osft_mlp_get_tile_count(f->mlp, 20, &n, &per));
  assert_int_equal(n, 5);
  assert_int_equal(per, 4);
  /* and the call fits in it */
  check_pass(f, 2, lead, 0, 0, "capped by the workspace limit");
  assert_ok(osft_mlp_destroy(f->mlp));
  assert_ok(osft_context_destroy(small));
  assert_ok(create_mlp(CTX, f, NULL));
  fx_free(f);
}

/* One tile's intermediates, not all tokens': the peak memory of a tiled
 * backward is 3 * I * 4 bytes per token of one tile (fp32 SwiGLU, no
 * biases: nothing else is allocated). */
static void test_memory_is_one_tile(void **state) {
  test_seed("memory");
  cfg c = base_cfg(OSFT_MLP_SWIGLU, TT_F32);
  c.I = 40;
  fixture *f = fx_new(CTX, c);
  const int64_t m = 64;
  const int64_t lead[1] = {m};
  tt *x = activations(f, 2, lead), *gy = activations(f, 2, lead);
  tt *y = tt_new(TT_F32, 2, x->shape);
  grads G;
  grads_new(f, x, &G);
  const int64_t tiles[2] = {1, 8};
  uint64_t peaks[2][2];
  for (int i = 0; i < 2; ++i)
    for (int pass = 0; pass < 2; ++pass) {
      /* each pass from an empty workspace: growing one would count both */
      assert_ok(osft_context_release_workspace(CTX));
      assert_ok(osft_context_reset_peak_memory(CTX));
      osft_memory_stats_t before, after;
      before.struct_size = after.struct_size = sizeof before;
      assert_ok(osft_context_get_memory_stats(CTX, &before));
      if (pass == 0)
        assert_ok(osft_mlp_forward(f->mlp, &x->t, &y->t, tiles[i]));
      else
        assert_ok(osft_mlp_backward(f->mlp, &x->t, &gy->t, &G.g, tiles[i]));
      assert_ok(osft_context_get_memory_stats(CTX, &after));
      const uint64_t peak = tt_device() == OSFT_DEVICE_CPU
                                ? after.host_peak - before.host_in_use
                                : after.device_peak - before.device_in_use;
      const int buffers = pass == 0 ? 2 : 3;
      const uint64_t tile = (uint64_t)(buffers * c.I * 4 * (m / tiles[i]));
      if (peak > tile + (uint64_t)buffers * 256)
        fail_msg("%s, %lld tiles: peak %llu bytes, one tile's intermediates are %llu",
                 pass == 0 ? "forward" : "backward", (long long)tiles[i],
                 (unsigned long long)peak, (unsigned long long)tile);
      peaks[i][pass] = peak;
    }
  assert_true(peaks[1][1] * 4 < peaks[0][1]);
  grads_free(&G);
  tt_free(x);
  tt_free(gy);
  tt_free(y);
  fx_free(f);
}

/* ------------------------------------------------------------- errors */

/* Every output of a call (y and the gradients), filled with random values
 * and remembered byte for byte, to prove a failing call wrote nothing. */
typedef struct {
  tt *t[SLOTS + 1];
  void *bytes[SLOTS + 1];
  size_t size[SLOTS + 1];
  int n;
} snapshot;

static void snapshot_take(snapshot *s, tt *y, const grads *G) {
  tt *slot[SLOTS];
  grad_slots(G, slot);
  s->n = 0;
  s->t[s->n++] = y;
  for (int i = 0; i < SLOTS; ++i)
    if (slot[i]) s->t[s->n++] = slot[i];
  for (int i = 0; i < s->n; ++i) {
    tt_random(s->t[i], -1, 1);
    s->bytes[i] = tt_bytes(s->t[i], &s->size[i]);
  }
}

/* Asserts that nothing changed, and forgets the snapshot. */
static void snapshot_expect_untouched(snapshot *s) {
  for (int i = 0; i < s->n; ++i) {
    size_t now_size;
    void *now = tt_bytes(s->t[i], &now_size);
    assert_int_equal(now_size, s->size[i]);
    assert_memory_equal(now, s->bytes[i], s->size[i]);
    free(now);
    free(s->bytes[i]);
  }
}

static void test_creation_errors(void **state) {
  test_seed("create errors");
  cfg c = base_cfg(OSFT_MLP_SWIGLU, TT_F32);
  c.bias = 1;
  fixture *f = fx_new(CTX, c);
  osft_mlp_t keep = f->mlp, out = NULL;
  osft_mlp_weights_t w;
  assert_ok(OSFT_MLP_WEIGHTS_INIT(&w));
  w.gate = &f->w[GATE]->t;
  w.up = &f->w[UP]->t;
  w.down = &f->w[DOWN]->t;
  const int64_t H = c.H, I = c.I;
#define EXPECT_CREATE(variant, h, i, weights, opts, status, needle)                   \
  do {                                                                                \
    out = NULL;                                                                       \
    assert_status(osft_mlp_create(CTX, (variant), (h), (i), (weights), (opts), &out), \
                  (status));                                                          \
    assert_error_mentions(needle);                                                    \
    assert_null(out);                                                                 \
  } while (0)
  EXPECT_CREATE(OSFT_MLP_SWIGLU, H, I, NULL, NULL, OSFT_STATUS_INVALID_ARGUMENT,
                "weights");
  assert_status(osft_mlp_create(CTX, OSFT_MLP_SWIGLU, H, I, &w, NULL, NULL),
                OSFT_STATUS_INVALID_ARGUMENT);
  assert_status(osft_mlp_create(NULL, OSFT_MLP_SWIGLU, H, I, &w, NULL, &out),
                OSFT_STATUS_INVALID_HANDLE);
  EXPECT_CREATE((osft_mlp_variant_t)7, H, I, &w, NULL, OSFT_STATUS_INVALID_ARGUMENT,
                "variant");
  EXPECT_CREATE(OSFT_MLP_SWIGLU, 0, I, &w, NULL, OSFT_STATUS_INVALID_ARGUMENT, "hidden");
  EXPECT_CREATE(OSFT_MLP_SWIGLU, H, I + 1, &w, NULL, OSFT_STATUS_SHAPE_MISMATCH, "gate");
  EXPECT_CREATE(OSFT_MLP_SWIGLU, H + 1, I, &w, NULL, OSFT_STATUS_SHAPE_MISMATCH, "gate");
  /* a gate for a plain variant, a missing up */
  EXPECT_CREATE(OSFT_MLP_RELU, H, I, &w, NULL, OSFT_STATUS_INVALID_ARGUMENT, "gate");
  w.up = NULL;
  EXPECT_CREATE(OSFT_MLP_SWIGLU, H, I, &w, NULL, OSFT_STATUS_INVALID_ARGUMENT, "up");
  w.up = &f->w[UP]->t;
  /* dtypes: fp64 weight, mixed weights, opts->dtype disagreeing */
  tt *w64 = mat(TT_F64, I, H), *wbf = mat(TT_BF16, I, H);
  tt_random(w64, -1, 1);
  tt_random(wbf, -1, 1);
  w.up = &w64->t;
  EXPECT_CREATE(OSFT_MLP_SWIGLU, H, I, &w, NULL, OSFT_STATUS_DTYPE_MISMATCH, "up");
  w.up = &wbf->t;
  EXPECT_CREATE(OSFT_MLP_SWIGLU, H, I, &w, NULL, OSFT_STATUS_DTYPE_MISMATCH, "up");
  w.up = &f->w[UP]->t;
  osft_mlp_options_t o;
  assert_ok(OSFT_MLP_OPTIONS_INIT(&o));
  o.dtype = dl_dtype(TT_BF16);
  EXPECT_CREATE(OSFT_MLP_SWIGLU, H, I, &w, &o, OSFT_STATUS_DTYPE_MISMATCH, "dtype");
  o.dtype.code = kDLInt;
  EXPECT_CREATE(OSFT_MLP_SWIGLU, H, I, &w, &o, OSFT_STATUS_DTYPE_MISMATCH, "dtype");
  /* tiling: tile size 0, unknown rule, budget below one token */
  assert_ok(OSFT_MLP_OPTIONS_INIT(&o));
  o.tiling = OSFT_MLP_TILING_TOKENS;
  EXPECT_CREATE(OSFT_MLP_SWIGLU, H, I, &w, &o, OSFT_STATUS_INVALID_ARGUMENT,
                "tile_tokens");
  o.tile_tokens = -3;
  EXPECT_CREATE(OSFT_MLP_SWIGLU, H, I, &w, &o, OSFT_STATUS_INVALID_ARGUMENT,
                "tile_tokens");
  o.tiling = (osft_mlp_tiling_t)5;
  EXPECT_CREATE(OSFT_MLP_SWIGLU, H, I, &w, &o, OSFT_STATUS_INVALID_ARGUMENT, "tiling");
  o.tiling = OSFT_MLP_TILING_BUDGET;
  o.memory_budget = 3 * I * 4 - 1;
  EXPECT_CREATE(OSFT_MLP_SWIGLU, H, I, &w, &o, OSFT_STATUS_INVALID_ARGUMENT,
                "memory_budget");
  o.struct_size = 3;
  EXPECT_CREATE(OSFT_MLP_SWIGLU, H, I, &w, &o, OSFT_STATUS_INVALID_STRUCT_SIZE, "opts");
  w.struct_size = 3;
  EXPECT_CREATE(OSFT_MLP_SWIGLU, H, I, &w, NULL, OSFT_STATUS_INVALID_STRUCT_SIZE,
                "weights");
  w.struct_size = sizeof w;
  /* biases: wrong length, wrong dtype */
  tt *b = vec(TT_F32, I + 1), *b64 = vec(TT_F64, I);
  tt_random(b, -1, 1);
  tt_random(b64, -1, 1);
  w.up_bias = &b->t;
  EXPECT_CREATE(OSFT_MLP_SWIGLU, H, I, &w, NULL, OSFT_STATUS_SHAPE_MISMATCH, "up_bias");
  w.up_bias = &b64->t;
  EXPECT_CREATE(OSFT_MLP_SWIGLU, H, I, &w, NULL, OSFT_STATUS_DTYPE_MISMATCH, "up_bias");
  w.up_bias = NULL;
  /* layout and device */
  DLTensor trans = f->w[UP]->t;
  int64_t ts[2] = {1, H};
  trans.strides = ts;
  w.up = &trans;
  EXPECT_CREATE(OSFT_MLP_SWIGLU, H, I, &w, NULL, OSFT_STATUS_BAD_LAYOUT, "up");
  DLTensor other = f->w[UP]->t;
  other.device.device_type = tt_device() == OSFT_DEVICE_CPU ? kDLCUDA : kDLCPU;
  w.up = &other;
  EXPECT_CREATE(OSFT_MLP_SWIGLU, H, I, &w, NULL, OSFT_STATUS_DEVICE_MISMATCH, "up");
  w.up = &f->w[UP]->t;
  /* layers: both a weight and a layer, wrong shape, destroyed, other context */
  tt *lw = mat(TT_F32, I, H), *lw_bad = mat(TT_F32, H, H);
  tt_random(lw, -1, 1);
  tt_random(lw_bad, -1, 1);
  osft_flinear_t layer = NULL, bad_layer = NULL, foreign = NULL;
  assert_ok(osft_flinear_create_from_weight(CTX, &lw->t, NULL, &layer));
  assert_ok(osft_flinear_create_from_weight(CTX, &lw_bad->t, NULL, &bad_layer));
  osft_context_t ctx2 = tt_context(NULL);
  assert_ok(osft_flinear_create_from_weight(ctx2, &lw->t, NULL, &foreign));
  w.up_layer = layer;
  EXPECT_CREATE(OSFT_MLP_SWIGLU, H, I, &w, NULL, OSFT_STATUS_INVALID_ARGUMENT,
                "exactly one");
  w.up = NULL;
  w.up_layer = bad_layer;
  EXPECT_CREATE(OSFT_MLP_SWIGLU, H, I, &w, NULL, OSFT_STATUS_SHAPE_MISMATCH, "up_layer");
  w.up_layer = foreign;
  EXPECT_CREATE(OSFT_MLP_SWIGLU, H, I, &w, NULL, OSFT_STATUS_INVALID_ARGUMENT,
                "another context");
  w.up_layer = (osft_flinear_t)(void *)&w;
  EXPECT_CREATE(OSFT_MLP_SWIGLU, H, I, &w, NULL, OSFT_STATUS_INVALID_HANDLE, "up_layer");
  /* a layer destroyed after the MLP was made: calls say so */
  w.up_layer = layer;
  out = NULL;
  assert_ok(osft_mlp_create(CTX, OSFT_MLP_SWIGLU, H, I, &w, NULL, &out));
  assert_status(osft_context_destroy(CTX), OSFT_STATUS_INVALID_ARGUMENT);
  assert_ok(osft_flinear_destroy(layer));
  const int64_t lead[2] = {3, 2};
  tt *x = activations(f, 3, lead), *y = activations(f, 3, lead);
  assert_status(osft_mlp_forward(out, &x->t, &y->t, 0), OSFT_STATUS_INVALID_HANDLE);
  assert_error_mentions("up layer");
  assert_ok(osft_mlp_destroy(out));
  assert_status(osft_mlp_destroy(out), OSFT_STATUS_INVALID_HANDLE);
  assert_status(osft_mlp_forward(out, &x->t, &y->t, 0), OSFT_STATUS_INVALID_HANDLE);
  assert_ok(osft_mlp_destroy(NULL));
  assert_status(osft_mlp_destroy((osft_mlp_t)(void *)&w), OSFT_STATUS_INVALID_HANDLE);
  /* an MLP is not a layer and vice versa */
  assert_status(osft_mlp_destroy((osft_mlp_t)(void *)bad_layer),
                OSFT_STATUS_INVALID_HANDLE);
  assert_status(osft_flinear_destroy((osft_flinear_t)(void *)keep),
                OSFT_STATUS_INVALID_HANDLE);
  /* init functions */
  assert_status(osft_mlp_weights_init(NULL, sizeof w), OSFT_STATUS_INVALID_ARGUMENT);
  assert_status(osft_mlp_options_init(&o, 2), OSFT_STATUS_INVALID_STRUCT_SIZE);
  osft_mlp_grads_t g;
  assert_status(osft_mlp_grads_init(&g, 1), OSFT_STATUS_INVALID_STRUCT_SIZE);
  /* the query */
  int64_t n;
  assert_status(osft_mlp_get_tile_count(keep, -1, &n, NULL),
                OSFT_STATUS_INVALID_ARGUMENT);
  assert_status(osft_mlp_get_tile_count(keep, 4, NULL, NULL),
                OSFT_STATUS_INVALID_ARGUMENT);
  assert_status(osft_mlp_get_tile_count(NULL, 4, &n, NULL), OSFT_STATUS_INVALID_HANDLE);
#undef EXPECT_CREATE
  assert_ok(osft_flinear_destroy(bad_layer));
  assert_ok(osft_flinear_destroy(foreign));
  assert_ok(osft_context_destroy(ctx2));
  tt *rest[8] = {w64, wbf, b, b64, lw, lw_bad, x, y};
  for (int i = 0; i < 8; ++i) tt_free(rest[i]);
  fx_free(f);
}

/* Every failing call leaves every output bit-identical. */
static void test_call_errors_write_nothing(void **state) {
  test_seed("call errors");
  cfg c = base_cfg(OSFT_MLP_SWIGLU, TT_F32);
  c.bias = 1;
  c.layers = 1 << DOWN;
  fixture *f = fx_new(CTX, c);
  const int64_t H = c.H;
  const int64_t lead[2] = {2, 5};
  tt *x = activations(f, 3, lead), *gy = activations(f, 3, lead);
  tt *y = activations(f, 3, lead);
  grads G;
  grads_new(f, x, &G);
  snapshot snap;
  snapshot_take(&snap, y, &G);

  /* forward */
  const int64_t lead_bad[2] = {2, 4};
  tt *x_short = activations(f, 3, lead_bad);
  tt *xh = tt_new(TT_F32, 2, (int64_t[]){10, H + 1}), *xb = tt_new(TT_BF16, 3, x->shape);
  tt_random(xh, -1, 1);
  tt_random(xb, -1, 1);
  assert_status(osft_mlp_forward(f->mlp, &xh->t, &y->t, 0), OSFT_STATUS_SHAPE_MISMATCH);
  assert_error_mentions("x");
  assert_status(osft_mlp_forward(f->mlp, &x_short->t, &y->t, 0),
                OSFT_STATUS_SHAPE_MISMATCH);
  assert_error_mentions("leading");
  assert_status(osft_mlp_forward(f->mlp, &xb->t, &y->t, 0), OSFT_STATUS_DTYPE_MISMATCH);
  assert_status(osft_mlp_forward(f->mlp, NULL, &y->t, 0), OSFT_STATUS_INVALID_ARGUMENT);
  assert_status(osft_mlp_forward(f->mlp, &x->t, NULL, 0), OSFT_STATUS_INVALID_ARGUMENT);
  assert_status(osft_mlp_forward(f->mlp, &x->t, &y->t, -1), OSFT_STATUS_INVALID_ARGUMENT);
  assert_error_mentions("num_tiles");
  assert_status(osft_mlp_forward(f->mlp, &y->t, &y->t, 0), OSFT_STATUS_ALIASING);
  DLTensor y_on_w = y->t; /* the output over the gate weight */
  y_on_w.data = f->w[GATE]->t.data;
  int64_t ys[2] = {c.I * H / H / 2, H};
  y_on_w.ndim = 2;
  y_on_w.shape = ys;
  DLTensor x2 = x->t;
  int64_t xs[2] = {ys[0], H};
  x2.ndim = 2;
  x2.shape = xs;
  assert_status(osft_mlp_forward(f->mlp, &x2, &y_on_w, 0), OSFT_STATUS_ALIASING);
  assert_error_mentions("weights->gate");
  DLTensor y_on_factor = y_on_w; /* over the down layer's factors */
  DLTensor uview;
  assert_ok(osft_flinear_get_factor(f->layer[DOWN], OSFT_FACTOR_U_HIGH, &uview));
  y_on_factor.data = uview.data;
  assert_status(osft_mlp_forward(f->mlp, &x2, &y_on_factor, 0), OSFT_STATUS_ALIASING);
  assert_error_mentions("down layer");
  DLTensor ydev = y->t;
  ydev.device.device_type = tt_device() == OSFT_DEVICE_CPU ? kDLCUDA : kDLCPU;
  assert_status(osft_mlp_forward(f->mlp, &x->t, &ydev, 0), OSFT_STATUS_DEVICE_MISMATCH);
  DLTensor ytrans = y->t;
  int64_t tstr[3] = {1, 2, 10};
  ytrans.strides = tstr;
  assert_status(osft_mlp_forward(f->mlp, &x->t, &ytrans, 0), OSFT_STATUS_BAD_LAYOUT);

  /* backward */
  assert_status(osft_mlp_backward(f->mlp, &x->t, &gy->t, NULL, 0),
                OSFT_STATUS_INVALID_ARGUMENT);
  G.g.struct_size = 4;
  assert_status(osft_mlp_backward(f->mlp, &x->t, &gy->t, &G.g, 0),
                OSFT_STATUS_INVALID_STRUCT_SIZE);
  G.g.struct_size = sizeof G.g;
  G.g.accumulate = 1u << 12;
  assert_status(osft_mlp_backward(f->mlp, &x->t, &gy->t, &G.g, 0),
                OSFT_STATUS_INVALID_ARGUMENT);
  assert_error_mentions("accumulate");
  G.g.accumulate = 0;
  assert_status(osft_mlp_backward(f->mlp, &x->t, &x_short->t, &G.g, 0),
                OSFT_STATUS_SHAPE_MISMATCH);
  assert_status(osft_mlp_backward(f->mlp, &x->t, &gy->t, &G.g, -2),
                OSFT_STATUS_INVALID_ARGUMENT);
  /* gradient shapes and dtypes */
  DLTensor *keep_up = G.g.grad_up;
  tt *wrong = mat(TT_F32, c.I, H + 1), *w64 = mat(TT_F64, c.I, H);
  G.g.grad_up = &wrong->t;
  assert_status(osft_mlp_backward(f->mlp, &x->t, &gy->t, &G.g, 0),
                OSFT_STATUS_SHAPE_MISMATCH);
  assert_error_mentions("grad_up");
  G.g.grad_up = &w64->t;
  assert_status(osft_mlp_backward(f->mlp, &x->t, &gy->t, &G.g, 0),
                OSFT_STATUS_DTYPE_MISMATCH);
  G.g.grad_up = keep_up;
  DLTensor *keep_dx = G.g.grad_x;
  G.g.grad_x = &x_short->t;
  assert_status(osft_mlp_backward(f->mlp, &x->t, &gy->t, &G.g, 0),
                OSFT_STATUS_SHAPE_MISMATCH);
  G.g.grad_x = &x->t; /* over the input */
  assert_status(osft_mlp_backward(f->mlp, &x->t, &gy->t, &G.g, 0), OSFT_STATUS_ALIASING);
  G.g.grad_x = keep_dx;
  G.g.grad_gate_bias = G.g.grad_up_bias; /* two outputs in one buffer */
  assert_status(osft_mlp_backward(f->mlp, &x->t, &gy->t, &G.g, 0), OSFT_STATUS_ALIASING);
  G.g.grad_gate_bias = &G.db[GATE]->t;
  DLTensor bias_view = f->b[UP]->t; /* writing a gradient over a bias */
  G.g.grad_up_bias = &bias_view;
  assert_status(osft_mlp_backward(f->mlp, &x->t, &gy->t, &G.g, 0), OSFT_STATUS_ALIASING);
  G.g.grad_up_bias = &G.db[UP]->t;
  /* dense gradient for the layer, factors for a dense projection */
  G.g.grad_down = &G.dw[GATE]->t;
  assert_status(osft_mlp_backward(f->mlp, &x->t, &gy->t, &G.g, 0),
                OSFT_STATUS_INVALID_ARGUMENT);
  assert_error_mentions("down_factors");
  G.g.grad_down = NULL;
  G.g.up_factors = &G.fg[DOWN];
  assert_status(osft_mlp_backward(f->mlp, &x->t, &gy->t, &G.g, 0),
                OSFT_STATUS_INVALID_ARGUMENT);
  G.g.up_factors = NULL;
  /* factor struct: grad_x set, unknown bits, wrong shape/dtype, struct size */
  G.fg[DOWN].grad_x = &G.dx->t;
  assert_status(osft_mlp_backward(f->mlp, &x->t, &gy->t, &G.g, 0),
                OSFT_STATUS_INVALID_ARGUMENT);
  assert_error_mentions("grad_x");
  G.fg[DOWN].grad_x = NULL;
  G.fg[DOWN].accumulate = 1u << 7;
  assert_status(osft_mlp_backward(f->mlp, &x->t, &gy->t, &G.g, 0),
                OSFT_STATUS_INVALID_ARGUMENT);
  G.fg[DOWN].accumulate = 0;
  DLTensor *keep_u = G.fg[DOWN].grad_u_low;
  G.fg[DOWN].grad_u_low = &wrong->t;
  assert_status(osft_mlp_backward(f->mlp, &x->t, &gy->t, &G.g, 0),
                OSFT_STATUS_SHAPE_MISMATCH);
  assert_error_mentions("down_factors->grad_u_low");
  tt *ubf = mat(TT_BF16, f->L[DOWN].n, f->L[DOWN].l);
  G.fg[DOWN].grad_u_low = &ubf->t;
  assert_status(osft_mlp_backward(f->mlp, &x->t, &gy->t, &G.g, 0),
                OSFT_STATUS_DTYPE_MISMATCH);
  G.fg[DOWN].grad_u_low = keep_u;
  DLTensor u_param;
  assert_ok(osft_flinear_get_factor(f->layer[DOWN], OSFT_FACTOR_U_LOW, &u_param));
  G.fg[DOWN].grad_u_low = &u_param; /* a gradient over its own parameter */
  assert_status(osft_mlp_backward(f->mlp, &x->t, &gy->t, &G.g, 0), OSFT_STATUS_ALIASING);
  G.fg[DOWN].grad_u_low = keep_u;
  G.fg[DOWN].struct_size = 5;
  assert_status(osft_mlp_backward(f->mlp, &x->t, &gy->t, &G.g, 0),
                OSFT_STATUS_INVALID_STRUCT_SIZE);
  G.fg[DOWN].struct_size = sizeof G.fg[DOWN];
  /* a plain variant's gate gradient */
  cfg cp = base_cfg(OSFT_MLP_RELU, TT_F32);
  fixture *fp = fx_new(CTX, cp);
  osft_mlp_grads_t pg;
  assert_ok(OSFT_MLP_GRADS_INIT(&pg));
  pg.grad_gate = G.g.grad_up;
  assert_status(osft_mlp_backward(fp->mlp, &x->t, &gy->t, &pg, 0),
                OSFT_STATUS_INVALID_ARGUMENT);
  assert_error_mentions("grad_gate");
  fx_free(fp);

  snapshot_expect_untouched(&snap);
  /* and the valid call still works afterwards */
  assert_ok(osft_mlp_backward(f->mlp, &x->t, &gy->t, &G.g, 0));
  tt *rest[8] = {x, gy, y, x_short, xh, xb, wrong, w64};
  for (int i = 0; i < 8; ++i) tt_free(rest[i]);
  tt_free(ubf);
  grads_free(&G);
  fx_free(f);
}

/* A workspace limit below a factorized projection's own scratch fails the
 * call before anything is written (not halfway through the tiles). */
static void test_workspace_limit_fails_before_writing(void **state) {
  (void)state;
  test_seed("limit");
  osft_context_options_t co;
  assert_ok(OSFT_CONTEXT_OPTIONS_INIT(&co));
  co.workspace_limit = 2048;
  osft_context_t small = tt_context(&co);
  cfg c = base_cfg(OSFT_MLP_SWIGLU, TT_F32);
  c.layers = 1 << DOWN;
  c.bias = 1;
  fixture *f = fx_new(small, c);
  assert_ok(osft_flinear_set_strategy(f->layer[DOWN], OSFT_FLINEAR_FACTORIZED));
  const int64_t lead[1] = {40};
  tt *x = activations(f, 2, lead), *gy = activations(f, 2, lead);
  tt *y = activations(f, 2, lead);
  grads G;
  grads_new(f, x, &G);
  snapshot snap;
  snapshot_take(&snap, y, &G);
  assert_status(osft_mlp_forward(f->mlp, &x->t, &y->t, 1), OSFT_STATUS_OUT_OF_MEMORY);
  assert_error_mentions("workspace_limit");
  assert_status(osft_mlp_backward(f->mlp, &x->t, &gy->t, &G.g, 4),
                OSFT_STATUS_OUT_OF_MEMORY);
  assert_error_mentions("down projection");
  snapshot_expect_untouched(&snap);
  grads_free(&G);
  tt_free(x);
  tt_free(gy);
  tt_free(y);
  fx_free(f);
  assert_ok(osft_context_destroy(small));
}

/* Every byte is returned (an MLP with a layer allocates its tile buffers
 * per call), and nothing is kept between calls; a context with a live MLP
 * refuses to go. */
static void test_memory_is_returned(void **state) {
  (void)state;
  test_alloc_state a;
  osft_context_t ctx = tt_counting_context(&a);
  test_seed("memory returned");
  cfg c = base_cfg(OSFT_MLP_SWIGLU, TT_BF16);
  c.layers = 1 << UP;
  c.fdtype = TT_BF16;
  fixture *f = fx_new(ctx, c);
  /* the factorized strategy keeps no caches in the layer either */
  assert_ok(osft_flinear_set_strategy(f->layer[UP], OSFT_FLINEAR_FACTORIZED));
  osft_memory_stats_t before, after;
  before.struct_size = after.struct_size = sizeof before;
  assert_ok(osft_context_release_workspace(ctx));
  assert_ok(osft_context_get_memory_stats(ctx, &before));
  const int64_t lead[1] = {10};
  check_pass(f, 2, lead, 3, 0, "per-call buffers");
  assert_ok(osft_context_release_workspace(ctx));
  assert_ok(osft_context_get_memory_stats(ctx, &after));
  assert_int_equal(after.host_in_use, before.host_in_use);
  assert_int_equal(after.device_in_use, before.device_in_use);
  assert_status(osft_context_destroy(ctx), OSFT_STATUS_INVALID_ARGUMENT);
  assert_error_mentions("still");
  fx_free(f);
  assert_ok(osft_context_destroy(ctx));
  if (tt_device() == OSFT_DEVICE_CPU) {
    assert_int_equal(a.host_allocs, a.host_frees);
    assert_int_equal(a.host_bytes_live, 0);
    assert_false(a.size_mismatch);
  }
}

int main(void) {
  if (!tt_device_present()) return OSFT_TEST_SKIP;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_every_variant_fp32, setup, teardown),
      cmocka_unit_test_setup_teardown(test_every_variant_bf16, setup, teardown),
      cmocka_unit_test_setup_teardown(test_accumulate, setup, teardown),
      cmocka_unit_test_setup_teardown(test_layer_projections, setup, teardown),
      cmocka_unit_test_setup_teardown(test_gradients_are_the_sum_over_tiles, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_bf16_gradients_rounded_once, setup, teardown),
      cmocka_unit_test_setup_teardown(test_shapes_padding_and_edges, setup, teardown),
      cmocka_unit_test_setup_teardown(test_partial_requests, setup, teardown),
      cmocka_unit_test_setup_teardown(test_large_inputs, setup, teardown),
      cmocka_unit_test_setup_teardown(test_tile_count, setup, teardown),
      cmocka_unit_test_setup_teardown(test_memory_is_one_tile, setup, teardown),
      cmocka_unit_test_setup_teardown(test_creation_errors, setup, teardown),
      cmocka_unit_test_setup_teardown(test_call_errors_write_nothing, setup, teardown),
      cmocka_unit_test(test_workspace_limit_fails_before_writing),
      cmocka_unit_test(test_memory_is_returned),
  };
  return cmocka_run_group_tests_name("mlp", tests, NULL, NULL);
}
