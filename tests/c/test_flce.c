/* Fused linear cross-entropy: loss, gradients and the optional outputs
 * against a float64 reference computed with plain loops from the inputs as
 * stored; chunking (sizes that do not divide M), every option alone and all
 * together, the reductions, bias, fp32 and bf16, accumulation, all-ignored
 * batches, forward-only calls, the memory budget, and every error (outputs
 * bit-identical afterwards). Built twice: for the CPU, and with
 * OSFT_TEST_CUDA for a GPU (skipped where none is present). */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_tensors.h"
#include "test_util.h"

/* ------------------------------------------------------------- the cases */

enum {
  WANT_LOSS = 1,
  WANT_DX = 2,
  WANT_DW = 4,
  WANT_DB = 8,
  WANT_Z = 16,
  WANT_EXTRA = 32
};
#define WANT_ALL (WANT_LOSS | WANT_DX | WANT_DW | WANT_DB | WANT_Z | WANT_EXTRA)

typedef struct {
  int64_t m, h, v;
  tt_dtype dtype;      /* x and W */
  int bias;            /* 0: none, else its dtype is bias_dtype */
  tt_dtype bias_dtype; /* TT_F32 or the x dtype */
  int class_weights;
  int upstream;   /* pass grad_loss (0.7 scalar, or random per token) */
  double ignored; /* fraction of ignored tokens */
  int all_ignored;
  int64_t ignore_index;
  double smoothing, z_scale, softcap;
  osft_flce_reduction_t reduction;
  osft_flce_accumulator_t accumulator;
  int64_t chunk_rows;
  size_t budget;
  uint32_t accumulate; /* OSFT_FLCE_ACCUMULATE_* (start from random values) */
  tt_dtype grad_w_dtype, grad_b_dtype;
  tt_dtype target_dtype;
  unsigned want;
} flce_case;

static flce_case base_case(int64_t m, int64_t h, int64_t v, tt_dtype dt) {
  flce_case c;
  memset(&c, 0, sizeof c);
  c.m = m;
  c.h = h;
  c.v = v;
  c.dtype = dt;
  c.bias_dtype = TT_F32;
  c.ignored = 0.15;
  c.ignore_index = -100;
  c.reduction = OSFT_FLCE_MEAN;
  c.accumulator = OSFT_FLCE_ACCUMULATOR_FP32;
  c.grad_w_dtype = dt;
  c.grad_b_dtype = TT_F32;
  c.target_dtype = TT_I64;
  c.want = WANT_ALL;
  return c;
}

static void describe(const flce_case *c, char *buf, size_t size) {
  snprintf(buf, size,
           "M=%lld H=%lld V=%lld %s bias=%d cw=%d up=%d ign=%.2f%s a=%g z=%g cap=%g "
           "red=%d acc=%d chunk=%lld budget=%zu accum=%u gw=%d gb=%d",
           (long long)c->m, (long long)c->h, (long long)c->v,
           c->dtype == TT_BF16 ? "bf16" : "fp32", c->bias, c->class_weights, c->upstream,
           c->ignored, c->all_ignored ? "(all)" : "", c->smoothing, c->z_scale,
           c->softcap, (int)c->reduction, (int)c->accumulator, (long long)c->chunk_rows,
           c->budget, c->accumulate, (int)c->grad_w_dtype, (int)c->grad_b_dtype);
}

/* ------------------------------------------------------------ reference */

typedef struct {
  double *tok;    /* m per-token losses */
  double *ztok;   /* m per-token z-losses */
  double *logit;  /* m x v final logits */
  double loss, z; /* reduced (MEAN / SUM) */
  double *dx, *dw, *db;
} ref_out;

/* Everything in float64 with plain loops, straight from the formulas of
 * osftrt/flce.h. */
static ref_out reference(const flce_case *c, const double *x, const double *w,
                         const double *b, const double *cw, const int64_t *y,
                         const double *gl) {
  const int64_t m = c->m, h = c->h, v = c->v;
  const double a = c->smoothing, eps = a / (double)v, lam = c->z_scale, cap = c->softcap;
  ref_out r;
  r.tok = calloc((size_t)m + 1, sizeof(double));
  r.ztok = calloc((size_t)m + 1, sizeof(double));
  r.logit = calloc((size_t)(m * v) + 1, sizeof(double));
  r.dx = calloc((size_t)(m * h) + 1, sizeof(double));
  r.dw = calloc((size_t)(v * h) + 1, sizeof(double));
  r.db = calloc((size_t)v + 1, sizeof(double));
  double *g = calloc((size_t)(m * v) + 1, sizeof(double));
  double *chain = calloc((size_t)v + 1, sizeof(double));
  double wsum = 0, denom = 0;
  for (int64_t j = 0; j < v; ++j) wsum += cw ? cw[j] : 1.0;
  for (int64_t i = 0; i < m; ++i)
    if (y[i] != c->ignore_index) denom += cw ? cw[y[i]] : 1.0;
  for (int64_t i = 0; i < m; ++i) {
    double *z = r.logit + i * v;
    double mx = -INFINITY;
    for (int64_t j = 0; j < v; ++j) {
      double s = b ? b[j] : 0.0;
      for (int64_t k = 0; k < h; ++k) s += x[i * h + k] * w[j * h + k];
      chain[j] = 1.0;
      if (cap > 0) {
        const double t = tanh(s / cap);
        s = cap * t;
        chain[j] = 1.0 - t * t;
      }
      z[j] = s;
      if (s > mx) mx = s;
    }
    if (y[i] == c->ignore_index) continue;
    double se = 0, wz = 0;
    for (int64_t j = 0; j < v; ++j) {
      se += exp(z[j] - mx);
      wz += (cw ? cw[j] : 1.0) * z[j];
    }
    const double lse = mx + log(se), wy = cw ? cw[y[i]] : 1.0;
    r.ztok[i] = lam * lse * lse;
    r.tok[i] = (1 - a) * wy * (lse - z[y[i]]) + eps * (lse * wsum - wz) + r.ztok[i];
    double scale;
    if (c->reduction == OSFT_FLCE_NONE)
      scale = gl ? gl[i] : 1.0;
    else
      scale = (gl ? gl[0] : 1.0) *
              (c->reduction == OSFT_FLCE_MEAN ? (denom > 0 ? 1.0 / denom : 0.0) : 1.0);
    const double big_a = (1 - a) * wy + eps * wsum + 2 * lam * lse;
    for (int64_t j = 0; j < v; ++j) {
      const double p = exp(z[j] - lse);
      double d = big_a * p - eps * (cw ? cw[j] : 1.0) - (j == y[i] ? (1 - a) * wy : 0.0);
      g[i * v + j] = scale * d * chain[j];
    }
  }
  r.loss = r.z = 0;
  for (int64_t i = 0; i < m; ++i) {
    r.loss += r.tok[i];
    r.z += r.ztok[i];
  }
  if (c->reduction == OSFT_FLCE_MEAN) {
    r.loss = denom > 0 ? r.loss / denom : 0.0;
    r.z = denom > 0 ? r.z / denom : 0.0;
  }
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < v; ++j) {
      const double gij = g[i * v + j];
      r.db[j] += gij;
      for (int64_t k = 0; k < h; ++k) {
        r.dx[i * h + k] += gij * w[j * h + k];
        r.dw[j * h + k] += gij * x[i * h + k];
      }
    }
  free(g);
  free(chain);
  return r;
}

static void ref_free(ref_out *r) {
  free(r->tok);
  free(r->ztok);
  free(r->logit);
  free(r->dx);
  free(r->dw);
  free(r->db);
}

/* -------------------------------------------------------------- helpers */

static tt *mat(tt_dtype d, int64_t rows, int64_t cols) {
  const int64_t shape[2] = {rows, cols};
  return tt_new(d, 2, shape);
}

static tt *vec(tt_dtype d, int64_t n) {
  const int64_t shape[1] = {n};
  return tt_new(d, 1, shape);
}

static tt *scalar(void) {
  return tt_new(TT_F32, 0, NULL);
}

static void expect_close(const char *what, const char *name, const tt *t,
                         const double *ref, double tol) {
  double *got = tt_get(t);
  const double err = rel_max_err(got, ref, (size_t)tt_logical_numel(t), 1e-6);
  free(got);
  if (!(err <= tol))
    fail_msg("%s (%s): relative max error %.3g > %.3g", what, name, err, tol);
}

static void expect_scalar(const char *what, const char *name, const tt *t, double ref,
                          double tol) {
  expect_close(what, name, t, &ref, tol);
}

/* Loss tolerance: fp32 logits from GEMMs of the stored inputs. */
static double loss_tol(const flce_case *c) {
  return c->dtype == TT_BF16 ? 5e-4 : 2e-5;
}

/* Gradient tolerance: bf16 outputs, and on CUDA bf16 gradients g. */
static double grad_tol(tt_dtype out_dtype, const flce_case *c) {
  return out_dtype == TT_BF16 || c->dtype == TT_BF16 ? 3e-2 : 5e-5;
}

static void case_options(const flce_case *c, osft_flce_options_t *o) {
  assert_ok(OSFT_FLCE_OPTIONS_INIT(o));
  o->ignore_index = c->ignore_index;
  o->label_smoothing = c->smoothing;
  o->z_loss_scale = c->z_scale;
  o->softcap = c->softcap;
  o->reduction = c->reduction;
  o->accumulator = c->accumulator;
  o->chunk_rows = c->chunk_rows;
  o->memory_budget = c->budget;
}

static osft_flce_t make_flce(osft_context_t ctx, const flce_case *c) {
  osft_flce_options_t o;
  case_options(c, &o);
  osft_flce_t f = NULL;
  assert_ok(osft_flce_create(ctx, &o, &f));
  return f;
}

/* All tensors of one case. */
typedef struct {
  tt *x, *w, *b, *cw, *y, *gl;
  tt *loss, *dx, *dw, *db, *z, *acc, *amax, *tok;
  int64_t *targets;
} flce_tensors;

static flce_tensors make_tensors(const flce_case *c) {
  flce_tensors T;
  memset(&T, 0, sizeof T);
  const int per_token = c->reduction == OSFT_FLCE_NONE;
  T.x = mat(c->dtype, c->m, c->h);
  T.w = mat(c->dtype, c->v, c->h);
  tt_random(T.x, -1, 1);
  tt_random(T.w, -1, 1);
  if (c->bias) {
    T.b = vec(c->bias_dtype, c->v);
    tt_random(T.b, -1, 1);
  }
  if (c->class_weights) {
    T.cw = vec(TT_F32, c->v);
    tt_random(T.cw, 0.2, 2.0);
  }
  T.targets = malloc(sizeof(int64_t) * (size_t)(c->m + 1));
  double *yd = malloc(sizeof(double) * (size_t)(c->m + 1));
  for (int64_t i = 0; i < c->m; ++i) {
    int64_t t = (int64_t)test_uniform(0, (double)c->v);
    if (t >= c->v) t = c->v - 1;
    if (c->all_ignored || test_uniform(0, 1) < c->ignored) t = c->ignore_index;
    T.targets[i] = t;
    yd[i] = (double)t;
  }
  T.y = vec(c->target_dtype, c->m);
  tt_set(T.y, yd);
  free(yd);
  if (c->upstream) {
    T.gl = per_token ? vec(TT_F32, c->m) : scalar();
    if (per_token)
      tt_random(T.gl, 0.5, 1.5);
    else
      tt_set(T.gl, (const double[]){0.7});
  }
  if (c->want & WANT_LOSS) T.loss = per_token ? vec(TT_F32, c->m) : scalar();
  if (c->want & WANT_Z) T.z = per_token ? vec(TT_F32, c->m) : scalar();
  if (c->want & WANT_DX) T.dx = mat(c->dtype, c->m, c->h);
  if (c->want & WANT_DW) T.dw = mat(c->grad_w_dtype, c->v, c->h);
  if (c->want & WANT_DB) T.db = vec(c->grad_b_dtype, c->v);
  if (c->want & WANT_EXTRA) {
    T.acc = vec(TT_F32, 1);
    T.amax = vec(c->target_dtype == TT_I32 ? TT_I64 : TT_I32, c->m);
    T.tok = vec(TT_F32, c->m);
  }
  tt *outs[8] = {T.loss, T.dx, T.dw, T.db, T.z, T.acc, T.amax, T.tok};
  for (int i = 0; i < 8; ++i)
    if (outs[i]) tt_poison(outs[i]);
  /* accumulated gradients start from random values */
  if (T.dx && (c->accumulate & OSFT_FLCE_ACCUMULATE_GRAD_X)) tt_random(T.dx, -1, 1);
  if (T.dw && (c->accumulate & OSFT_FLCE_ACCUMULATE_GRAD_WEIGHT)) tt_random(T.dw, -1, 1);
  if (T.db && (c->accumulate & OSFT_FLCE_ACCUMULATE_GRAD_BIAS)) tt_random(T.db, -1, 1);
  return T;
}

static void free_tensors(flce_tensors *T) {
  tt *all[14] = {T->x,  T->w,  T->b,  T->cw, T->y,   T->gl,   T->loss,
                 T->dx, T->dw, T->db, T->z,  T->acc, T->amax, T->tok};
  for (int i = 0; i < 14; ++i) tt_free(all[i]);
  free(T->targets);
}

static DLTensor *dl(tt *t) {
  return t ? &t->t : NULL;
}

static void bind(const flce_case *c, flce_tensors *T, osft_flce_inputs_t *in,
                 osft_flce_outputs_t *out) {
  assert_ok(OSFT_FLCE_INPUTS_INIT(in));
  assert_ok(OSFT_FLCE_OUTPUTS_INIT(out));
  in->x = dl(T->x);
  in->weight = dl(T->w);
  in->targets = dl(T->y);
  in->bias = dl(T->b);
  in->class_weight = dl(T->cw);
  in->grad_loss = dl(T->gl);
  out->loss = dl(T->loss);
  out->grad_x = dl(T->dx);
  out->grad_weight = dl(T->dw);
  out->grad_bias = dl(T->db);
  out->z_loss = dl(T->z);
  out->accuracy = dl(T->acc);
  out->argmax = dl(T->amax);
  out->token_loss = dl(T->tok);
  out->accumulate = c->accumulate;
}

static double *get_or_null(const tt *t) {
  return t ? tt_get(t) : NULL;
}

/* Expected = initial (when accumulating) + reference. */
static double *plus_initial(const double *init, const double *ref, int64_t n) {
  double *e = malloc(sizeof(double) * (size_t)(n + 1));
  for (int64_t i = 0; i < n; ++i) e[i] = (init ? init[i] : 0.0) + ref[i];
  return e;
}

/* Checks argmax against the reference logits (a near-tie may pick either)
 * and the accuracy against the argmax the call reported. */
static void check_argmax(const flce_case *c, const flce_tensors *T, const ref_out *r,
                         const char *name) {
  double *am = tt_get(T->amax);
  int64_t correct = 0, valid = 0;
  for (int64_t i = 0; i < c->m; ++i) {
    const double *z = r->logit + i * c->v;
    double mx = -INFINITY;
    for (int64_t j = 0; j < c->v; ++j) mx = z[j] > mx ? z[j] : mx;
    const int64_t got = (int64_t)am[i];
    if (got < 0 || got >= c->v || z[got] < mx - 1e-3 * (1 + fabs(mx)))
      fail_msg("argmax (%s): token %lld got %lld", name, (long long)i, (long long)got);
    if (T->targets[i] != c->ignore_index) {
      valid++;
      correct += got == T->targets[i];
    }
  }
  expect_scalar("accuracy", name, T->acc, valid ? (double)correct / (double)valid : 0.0,
                1e-6);
  free(am);
}

/* Runs one case and checks every requested output. */
static void run_case(osft_context_t ctx, const flce_case *c) {
  char name[320];
  describe(c, name, sizeof name);
  test_seed(name);
  flce_tensors T = make_tensors(c);
  double *x = tt_get(T.x), *w = tt_get(T.w), *b = get_or_null(T.b);
  double *cw = get_or_null(T.cw), *gl = get_or_null(T.gl);
  double *dx0 = NULL, *dw0 = NULL, *db0 = NULL;
  if (c->accumulate & OSFT_FLCE_ACCUMULATE_GRAD_X) dx0 = get_or_null(T.dx);
  if (c->accumulate & OSFT_FLCE_ACCUMULATE_GRAD_WEIGHT) dw0 = get_or_null(T.dw);
  if (c->accumulate & OSFT_FLCE_ACCUMULATE_GRAD_BIAS) db0 = get_or_null(T.db);
  ref_out r = reference(c, x, w, b, cw, T.targets, gl);

  osft_flce_t f = make_flce(ctx, c);
  osft_flce_inputs_t in;
  osft_flce_outputs_t out;
  bind(c, &T, &in, &out);
  assert_ok(osft_flce_compute(f, &in, &out));

  const int per_token = c->reduction == OSFT_FLCE_NONE;
  const double lt = loss_tol(c);
  if (T.loss) {
    if (per_token)
      expect_close("loss", name, T.loss, r.tok, lt);
    else
      expect_scalar("loss", name, T.loss, r.loss, lt);
  }
  if (T.z) {
    if (per_token)
      expect_close("z_loss", name, T.z, r.ztok, lt);
    else
      expect_scalar("z_loss", name, T.z, r.z, lt);
  }
  if (T.tok) expect_close("token_loss", name, T.tok, r.tok, lt);
  if (T.amax) check_argmax(c, &T, &r, name);
  if (T.dx) {
    double *e = plus_initial(dx0, r.dx, c->m * c->h);
    expect_close("grad_x", name, T.dx, e, grad_tol(c->dtype, c));
    free(e);
  }
  if (T.dw) {
    double *e = plus_initial(dw0, r.dw, c->v * c->h);
    const int rounded_often =
        c->accumulator == OSFT_FLCE_ACCUMULATOR_OUTPUT && c->grad_w_dtype == TT_BF16;
    expect_close("grad_weight", name, T.dw, e,
                 grad_tol(c->grad_w_dtype, c) * (rounded_often ? 2 : 1));
    free(e);
  }
  if (T.db) {
    double *e = plus_initial(db0, r.db, c->v);
    expect_close("grad_bias", name, T.db, e, grad_tol(c->grad_b_dtype, c));
    free(e);
  }
  assert_ok(osft_flce_destroy(f));
  ref_free(&r);
  free(x);
  free(w);
  free(b);
  free(cw);
  free(gl);
  free(dx0);
  free(dw0);
  free(db0);
  free_tensors(&T);
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

/* -------------------------------------------------------------- numerics */

/* The reference itself: its gradient is the derivative of its loss (central
 * differences through x, W and the bias), with every feature on. */
static void test_reference_is_consistent(void **state) {
  (void)state;
  test_seed("reference");
  flce_case c = base_case(6, 4, 9, TT_F32);
  c.smoothing = 0.2;
  c.z_scale = 0.05;
  c.softcap = 1.3;
  c.class_weights = 1;
  c.bias = 1;
  double x[24], w[36], b[9], cw[9];
  int64_t y[6] = {3, -100, 0, 8, 5, 3};
  for (int i = 0; i < 24; ++i) x[i] = test_uniform(-1, 1);
  for (int i = 0; i < 36; ++i) w[i] = test_uniform(-1, 1);
  for (int i = 0; i < 9; ++i) {
    b[i] = test_uniform(-1, 1);
    cw[i] = test_uniform(0.2, 2);
  }
  for (int red = OSFT_FLCE_MEAN; red <= OSFT_FLCE_SUM; ++red) {
    c.reduction = (osft_flce_reduction_t)red;
    ref_out r = reference(&c, x, w, b, cw, y, NULL);
    double *params[3] = {x, w, b};
    double *grads[3] = {r.dx, r.dw, r.db};
    const int counts[3] = {24, 36, 9};
    for (int p = 0; p < 3; ++p)
      for (int k = 0; k < counts[p]; k += 5) {
        const double keep = params[p][k], step = 1e-6;
        params[p][k] = keep + step;
        ref_out up = reference(&c, x, w, b, cw, y, NULL);
        params[p][k] = keep - step;
        ref_out down = reference(&c, x, w, b, cw, y, NULL);
        params[p][k] = keep;
        const double fd = (up.loss - down.loss) / (2 * step);
        if (fabs(fd - grads[p][k]) > 1e-6 * (1 + fabs(fd)))
          fail_msg("reference gradient %d[%d]: %.9g vs finite difference %.9g", p, k,
                   grads[p][k], fd);
        ref_free(&up);
        ref_free(&down);
      }
    ref_free(&r);
  }
}

/* The odd shape, chunk sizes that do not divide M, every reduction, bias
 * on and off, fp32 and bf16. */
static void test_shapes_chunks_reductions(void **state) {
  const tt_dtype dtypes[2] = {TT_F32, TT_BF16};
  const int64_t chunks[3] = {0, 50, 7};
  for (int d = 0; d < 2; ++d)
    for (int red = 0; red < 3; ++red)
      for (int bias = 0; bias < 2; ++bias)
        for (int ch = 0; ch < 3; ++ch) {
          flce_case c = base_case(188, 31, 123, dtypes[d]);
          c.reduction = (osft_flce_reduction_t)red;
          c.bias = bias;
          c.bias_dtype = bias && d == 1 && ch == 1 ? TT_BF16 : TT_F32;
          c.grad_b_dtype = ch == 2 ? dtypes[d] : TT_F32;
          c.chunk_rows = chunks[ch];
          c.target_dtype = ch == 1 ? TT_I32 : TT_I64;
          run_case(CTX, &c);
        }
  /* a few more shapes: one class, one token, a vocabulary over several of
   * the CPU's 512-wide blocks with a ragged tail */
  const int64_t shapes[3][3] = {{1, 5, 1}, {1, 3, 17}, {9, 5, 1100}};
  for (int s = 0; s < 3; ++s)
    for (int d = 0; d < 2; ++d) {
      flce_case c = base_case(shapes[s][0], shapes[s][1], shapes[s][2], dtypes[d]);
      c.bias = 1;
      c.ignored = 0.0;
      c.softcap = s == 2 ? 2.0 : 0.0;
      run_case(CTX, &c);
    }
}

/* Every option alone, then all together, under each reduction. */
static void test_each_feature_and_all(void **state) {
  for (int red = 0; red < 3; ++red)
    for (int feature = 0; feature < 7; ++feature)
      for (int d = 0; d < 2; ++d) {
        flce_case c = base_case(61, 12, 37, d ? TT_BF16 : TT_F32);
        c.reduction = (osft_flce_reduction_t)red;
        c.chunk_rows = 16;
        const int all = feature == 6;
        if (feature == 0 || all) c.smoothing = 0.1;
        if (feature == 1 || all) c.z_scale = 0.02;
        if (feature == 2 || all) c.softcap = 1.5;
        if (feature == 3 || all) c.class_weights = 1;
        if (feature == 4 || all) c.ignore_index = 5; /* a class index, ignored */
        if (feature == 5 || all) c.upstream = 1;
        if (all) c.bias = 1;
        run_case(CTX, &c);
      }
  /* label smoothing 1 (uniform targets) is allowed */
  flce_case c = base_case(20, 6, 11, TT_F32);
  c.smoothing = 1.0;
  run_case(CTX, &c);
}

/* Gradients accumulate onto non-zero values, in fp32 and in bf16 with both
 * accumulators, and fp32 gradients of bf16 inputs. */
static void test_accumulate(void **state) {
  for (int d = 0; d < 2; ++d)
    for (int acc = 0; acc < 2; ++acc)
      for (int gw = 0; gw < 2; ++gw) {
        flce_case c = base_case(70, 9, 41, d ? TT_BF16 : TT_F32);
        c.bias = 1;
        c.chunk_rows = 32;
        c.accumulator = (osft_flce_accumulator_t)acc;
        c.grad_w_dtype = gw ? c.dtype : TT_F32;
        c.grad_b_dtype = gw ? c.dtype : TT_F32;
        c.accumulate = OSFT_FLCE_ACCUMULATE_ALL;
        run_case(CTX, &c);
        c.accumulate = OSFT_FLCE_ACCUMULATE_GRAD_WEIGHT;
        c.reduction = OSFT_FLCE_SUM;
        run_case(CTX, &c);
      }
}

/* Every target ignored: loss 0 (MEAN and SUM), zero gradients, accuracy 0;
 * accumulated gradients stay as they were. Also a call without tokens. */
static void test_all_ignored_and_empty(void **state) {
  for (int red = 0; red < 3; ++red)
    for (int acc = 0; acc < 2; ++acc) {
      flce_case c = base_case(33, 7, 19, TT_F32);
      c.all_ignored = 1;
      c.reduction = (osft_flce_reduction_t)red;
      c.bias = 1;
      c.z_scale = 0.1;
      c.smoothing = 0.1;
      c.chunk_rows = 10;
      c.class_weights = red == 1;
      c.accumulate = acc ? OSFT_FLCE_ACCUMULATE_ALL : 0;
      run_case(CTX, &c);
    }
  /* no tokens at all: x (0, H) */
  for (int acc = 0; acc < 2; ++acc) {
    flce_case c = base_case(0, 7, 19, TT_F32);
    c.bias = 1;
    c.accumulate = acc ? OSFT_FLCE_ACCUMULATE_ALL : 0;
    run_case(CTX, &c);
  }
}

/* (B, T, H) hidden states with (B, T) targets, padded rows in x and
 * grad_x, and a 1-D x (one token, 0-d target). */
static void test_leading_dims_and_padding(void **state) {
  test_seed("leading dims");
  const int64_t v = 13, h = 6;
  const int64_t xs[3] = {2, 5, 6}, ys[2] = {2, 5};
  tt *x3 = tt_new(TT_F32, 3, xs), *dx3 = tt_new(TT_F32, 3, xs);
  tt *y2 = tt_new(TT_I64, 2, ys), *tok = tt_new(TT_F32, 2, ys);
  tt *w = mat(TT_F32, v, h), *dw = mat(TT_F32, v, h), *loss = scalar();
  tt_random(x3, -1, 1);
  tt_random(w, -1, 1);
  double yd[10];
  for (int i = 0; i < 10; ++i) yd[i] = (double)((i * 7) % v);
  tt_set(y2, yd);
  tt_poison(dx3);
  tt_poison(dw);
  tt_poison(tok);
  tt_poison(loss);
  osft_flce_t f = NULL;
  assert_ok(osft_flce_create(CTX, NULL, &f));
  osft_flce_inputs_t in;
  osft_flce_outputs_t out;
  assert_ok(OSFT_FLCE_INPUTS_INIT(&in));
  assert_ok(OSFT_FLCE_OUTPUTS_INIT(&out));
  in.x = &x3->t;
  in.weight = &w->t;
  in.targets = &y2->t;
  out.loss = &loss->t;
  out.grad_x = &dx3->t;
  out.grad_weight = &dw->t;
  out.token_loss = &tok->t;
  assert_ok(osft_flce_compute(f, &in, &out));
  flce_case c = base_case(10, h, v, TT_F32);
  double *x = tt_get(x3), *wd = tt_get(w);
  int64_t yi[10];
  for (int i = 0; i < 10; ++i) yi[i] = (int64_t)yd[i];
  ref_out r = reference(&c, x, wd, NULL, NULL, yi, NULL);
  expect_scalar("loss", "3-D", loss, r.loss, 1e-4);
  expect_close("token_loss", "3-D", tok, r.tok, 1e-4);
  expect_close("grad_x", "3-D", dx3, r.dx, 2e-4);
  expect_close("grad_weight", "3-D", dw, r.dw, 2e-4);

  /* the same tokens as a padded 2-D x and grad_x */
  tt *xp = tt_new_padded(TT_F32, 10, h, h + 3),
     *dxp = tt_new_padded(TT_F32, 10, h, h + 5);
  tt *y1 = vec(TT_I32, 10);
  tt_set(xp, x);
  tt_set(y1, yd);
  tt_poison(dxp);
  in.x = &xp->t;
  in.targets = &y1->t;
  out.grad_x = &dxp->t;
  out.token_loss = NULL;
  assert_ok(osft_flce_compute(f, &in, &out));
  expect_scalar("loss", "padded", loss, r.loss, 1e-4);
  expect_close("grad_x", "padded", dxp, r.dx, 2e-4);
  ref_free(&r);

  /* one token: x (H), a 0-d target */
  tt *x1 = vec(TT_F32, h), *dx1 = vec(TT_F32, h), *y0 = tt_new(TT_I64, 0, NULL);
  tt_set(x1, x);
  tt_set(y0, yd);
  tt_poison(dx1);
  in.x = &x1->t;
  in.targets = &y0->t;
  out.grad_x = &dx1->t;
  assert_ok(osft_flce_compute(f, &in, &out));
  c.m = 1;
  r = reference(&c, x, wd, NULL, NULL, yi, NULL);
  expect_scalar("loss", "one token", loss, r.loss, 1e-4);
  expect_close("grad_x", "one token", dx1, r.dx, 2e-4);
  ref_free(&r);
  free(x);
  free(wd);
  assert_ok(osft_flce_destroy(f));
  tt *all[13] = {x3, dx3, y2, tok, w, dw, loss, xp, dxp, y1, x1, dx1, y0};
  for (int i = 0; i < 13; ++i) tt_free(all[i]);
}

/* Forward-only: no gradient output, the same loss as a full call, less
 * scratch (no gradient accumulator). */
static void test_forward_only(void **state) {
  for (int d = 0; d < 2; ++d) {
    flce_case c = base_case(45, 10, 29, d ? TT_BF16 : TT_F32);
    c.bias = 1;
    c.softcap = 3.0;
    c.chunk_rows = 20;
    c.want = WANT_LOSS | WANT_Z | WANT_EXTRA;
    run_case(CTX, &c); /* checks the loss against the reference */

    test_seed("forward only");
    c.want = WANT_ALL;
    c.grad_w_dtype = c.dtype;
    flce_tensors T = make_tensors(&c);
    osft_flce_t f = make_flce(CTX, &c);
    osft_flce_inputs_t in;
    osft_flce_outputs_t full, fwd;
    bind(&c, &T, &in, &full);
    assert_ok(osft_flce_compute(f, &in, &full));
    size_t bytes;
    void *loss_full = tt_bytes(T.loss, &bytes);
    assert_ok(OSFT_FLCE_OUTPUTS_INIT(&fwd));
    fwd.loss = &T.loss->t;
    tt_poison(T.loss);
    assert_ok(osft_flce_compute(f, &in, &fwd));
    size_t bytes2;
    void *loss_fwd = tt_bytes(T.loss, &bytes2);
    assert_memory_equal(loss_full, loss_fwd, bytes);
    osft_flce_plan_t pf, pw;
    pf.struct_size = pw.struct_size = sizeof pf;
    assert_ok(osft_flce_get_plan(f, &in, &full, &pf));
    assert_ok(osft_flce_get_plan(f, &in, &fwd, &pw));
    /* no fp32 accumulator for the bf16 grad_weight */
    assert_true(pw.scratch_bytes + (d ? 4 * 29 * 10 : 0) <= pf.scratch_bytes);
    assert_int_equal(pw.chunks, 3);
    free(loss_full);
    free(loss_fwd);
    assert_ok(osft_flce_destroy(f));
    free_tensors(&T);
  }
}

/* The budget decides the chunk size; what the call takes stays within it. */
static void test_budget_and_plan(void **state) {
  flce_case c = base_case(100, 8, 50, TT_F32);
  c.want = WANT_LOSS | WANT_DW;
  test_seed("budget");
  flce_tensors T = make_tensors(&c);
  osft_flce_inputs_t in;
  osft_flce_outputs_t out;
  bind(&c, &T, &in, &out);
  const size_t row = 4 * 64; /* padded V = 64 floats */
  int64_t last_chunks = 0;
  const size_t budgets[4] = {0, 200 * row + 4096, 30 * row + 4096, 4 * row + 3000};
  for (int i = 0; i < 4; ++i) {
    osft_context_t ctx = tt_context(NULL);
    c.budget = budgets[i];
    osft_flce_t f = make_flce(ctx, &c);
    osft_flce_plan_t p;
    p.struct_size = sizeof p;
    assert_ok(osft_flce_get_plan(f, &in, &out, &p));
    assert_int_equal(p.tokens, 100);
    assert_true(p.chunks * p.chunk_rows >= 100 && (p.chunks - 1) * p.chunk_rows < 100);
    assert_true(p.scratch_bytes <= p.budget_bytes);
    if (budgets[i] != 0) assert_int_equal(p.budget_bytes, budgets[i]);
    assert_true(p.chunks >= last_chunks);
    assert_true(p.chunk_rows * row <= p.budget_bytes);
    last_chunks = p.chunks;
    assert_ok(osft_flce_compute(f, &in, &out));
    osft_memory_stats_t st;
    st.struct_size = sizeof st;
    assert_ok(osft_context_get_memory_stats(ctx, &st));
    assert_true(st.workspace_bytes <= p.budget_bytes);
    assert_int_equal(st.workspace_bytes, p.scratch_bytes);
    assert_ok(osft_flce_destroy(f));
    assert_ok(osft_context_destroy(ctx));
  }
  assert_true(last_chunks >= 10);
  /* explicit chunk rows: exactly that many, when the budget allows */
  c.budget = 0;
  c.chunk_rows = 30;
  osft_flce_t f = make_flce(CTX, &c);
  osft_flce_plan_t p;
  p.struct_size = sizeof p;
  assert_ok(osft_flce_get_plan(f, &in, &out, &p));
  assert_int_equal(p.chunk_rows, 30);
  assert_int_equal(p.chunks, 4);
  assert_ok(osft_flce_destroy(f));
  /* the context's workspace limit bounds the budget */
  osft_context_options_t o;
  assert_ok(OSFT_CONTEXT_OPTIONS_INIT(&o));
  o.workspace_limit = 10 * row + 4096;
  osft_context_t small = tt_context(&o);
  c.chunk_rows = 0;
  f = make_flce(small, &c);
  assert_ok(osft_flce_get_plan(f, &in, &out, &p));
  assert_int_equal(p.budget_bytes, o.workspace_limit);
  assert_true(p.chunk_rows * row <= o.workspace_limit && p.chunks > 1);
  assert_ok(osft_flce_destroy(f));
  assert_ok(osft_context_destroy(small));
  free_tensors(&T);
}

/* ---------------------------------------------------------------- errors */

typedef struct {
  tt *t[8];
  void *bytes[8];
  size_t size[8];
  int n;
} snapshot;

static void take(snapshot *s, tt *const *ts, int n) {
  s->n = 0;
  for (int i = 0; i < n; ++i)
    if (ts[i]) {
      s->t[s->n] = ts[i];
      s->bytes[s->n] = tt_bytes(ts[i], &s->size[s->n]);
      s->n++;
    }
}

static void expect_untouched(const snapshot *s, int line) {
  for (int i = 0; i < s->n; ++i) {
    size_t size;
    void *now = tt_bytes(s->t[i], &size);
    assert_int_equal(size, s->size[i]);
    if (memcmp(now, s->bytes[i], size) != 0)
      fail_msg("output %d changed by the failed call on line %d", i, line);
    free(now);
  }
}

static void release(snapshot *s) {
  for (int i = 0; i < s->n; ++i) free(s->bytes[i]);
}

#define EXPECT_FAIL(call, status, needle) \
  do {                                    \
    assert_status((call), (status));      \
    assert_error_mentions(needle);        \
    expect_untouched(&snap, __LINE__);    \
  } while (0)

/* A case's tensors with every output set to random values (that a failed
 * call must keep), and their snapshot. */
static flce_tensors error_tensors(const flce_case *c, const char *seed, snapshot *snap) {
  test_seed(seed);
  flce_tensors T = make_tensors(c);
  tt *outs[8] = {T.loss, T.dx, T.dw, T.db, T.z, T.acc, T.amax, T.tok};
  for (int i = 0; i < 8; ++i) tt_random(outs[i], -1, 1);
  take(snap, outs, 8);
  return T;
}

static void test_call_errors_write_nothing(void **state) {
  flce_case c = base_case(40, 6, 21, TT_F32);
  c.bias = 1;
  c.accumulate = OSFT_FLCE_ACCUMULATE_ALL;
  c.chunk_rows = 16;
  snapshot snap;
  flce_tensors T = error_tensors(&c, "errors", &snap);
  tt *outs[8] = {T.loss, T.dx, T.dw, T.db, T.z, T.acc, T.amax, T.tok};
  osft_flce_t f = make_flce(CTX, &c);
  osft_flce_inputs_t in;
  osft_flce_outputs_t out;
  bind(&c, &T, &in, &out);

  /* targets out of range: too large, negative (not the ignore index); the
   * message names the first bad token */
  double *yd = tt_get(T.y);
  const double keep = yd[17];
  yd[17] = 21;
  yd[30] = -1;
  tt_set(T.y, yd);
  EXPECT_FAIL(osft_flce_compute(f, &in, &out), OSFT_STATUS_INDEX_OUT_OF_RANGE,
              "token 17");
  assert_error_mentions("21");
  yd[17] = keep;
  tt_set(T.y, yd);
  EXPECT_FAIL(osft_flce_compute(f, &in, &out), OSFT_STATUS_INDEX_OUT_OF_RANGE,
              "token 30");
  /* also in forward-only mode */
  osft_flce_outputs_t only_loss;
  assert_ok(OSFT_FLCE_OUTPUTS_INIT(&only_loss));
  only_loss.loss = &T.loss->t;
  EXPECT_FAIL(osft_flce_compute(f, &in, &only_loss), OSFT_STATUS_INDEX_OUT_OF_RANGE,
              "targets");
  yd[30] = 3;
  tt_set(T.y, yd);
  free(yd);

  /* shapes */
  tt *w_bad = mat(TT_F32, 21, 7), *y_bad = vec(TT_I64, 39), *b_bad = vec(TT_F32, 22);
  tt *dw_bad = mat(TT_F32, 20, 6), *loss_vec = vec(TT_F32, 40), *gl_bad = vec(TT_F32, 2);
  tt *dx_bad = mat(TT_F32, 41, 6), *w_empty = mat(TT_F32, 0, 6);
  tt_random(w_bad, -1, 1);
  tt_random(b_bad, -1, 1);
  tt_random(gl_bad, -1, 1);
  tt_set(y_bad, (const double[39]){0});
  in.weight = &w_bad->t;
  EXPECT_FAIL(osft_flce_compute(f, &in, &out), OSFT_STATUS_SHAPE_MISMATCH, "in->weight");
  in.weight = &w_empty->t;
  EXPECT_FAIL(osft_flce_compute(f, &in, &out), OSFT_STATUS_SHAPE_MISMATCH, "no classes");
  in.weight = &T.w->t;
  in.targets = &y_bad->t;
  EXPECT_FAIL(osft_flce_compute(f, &in, &out), OSFT_STATUS_SHAPE_MISMATCH, "in->targets");
  in.targets = &T.y->t;
  in.bias = &b_bad->t;
  EXPECT_FAIL(osft_flce_compute(f, &in, &out), OSFT_STATUS_SHAPE_MISMATCH, "in->bias");
  in.bias = &T.b->t;
  in.grad_loss = &gl_bad->t;
  EXPECT_FAIL(osft_flce_compute(f, &in, &out), OSFT_STATUS_SHAPE_MISMATCH,
              "in->grad_loss");
  in.grad_loss = NULL;
  out.grad_weight = &dw_bad->t;
  EXPECT_FAIL(osft_flce_compute(f, &in, &out), OSFT_STATUS_SHAPE_MISMATCH,
              "out->grad_weight");
  out.grad_weight = &T.dw->t;
  out.grad_x = &dx_bad->t;
  EXPECT_FAIL(osft_flce_compute(f, &in, &out), OSFT_STATUS_SHAPE_MISMATCH, "out->grad_x");
  out.grad_x = &T.dx->t;
  out.loss = &loss_vec->t; /* per-token loss, but the reduction is MEAN */
  EXPECT_FAIL(osft_flce_compute(f, &in, &out), OSFT_STATUS_SHAPE_MISMATCH, "out->loss");
  out.loss = &T.loss->t;

  /* dtypes */
  tt *w_bf = mat(TT_BF16, 21, 6), *y_f = vec(TT_F32, 40),
     *loss64 = tt_new(TT_F64, 0, NULL);
  tt *am_f = vec(TT_F32, 40), *cw64 = vec(TT_F64, 21);
  tt_random(w_bf, -1, 1);
  tt_random(y_f, 0, 5);
  tt_random(cw64, 0, 1);
  in.weight = &w_bf->t;
  EXPECT_FAIL(osft_flce_compute(f, &in, &out), OSFT_STATUS_DTYPE_MISMATCH, "in->weight");
  in.weight = &T.w->t;
  in.targets = &y_f->t;
  EXPECT_FAIL(osft_flce_compute(f, &in, &out), OSFT_STATUS_DTYPE_MISMATCH, "in->targets");
  in.targets = &T.y->t;
  in.class_weight = &cw64->t;
  EXPECT_FAIL(osft_flce_compute(f, &in, &out), OSFT_STATUS_DTYPE_MISMATCH,
              "in->class_weight");
  in.class_weight = NULL;
  out.loss = &loss64->t;
  EXPECT_FAIL(osft_flce_compute(f, &in, &out), OSFT_STATUS_DTYPE_MISMATCH, "out->loss");
  out.loss = &T.loss->t;
  out.argmax = &am_f->t;
  EXPECT_FAIL(osft_flce_compute(f, &in, &out), OSFT_STATUS_DTYPE_MISMATCH, "out->argmax");
  out.argmax = &T.amax->t;

  /* device, layout, aliasing */
  DLTensor other = T.x->t;
  other.device.device_type = tt_device() == OSFT_DEVICE_CPU ? kDLCUDA : kDLCPU;
  in.x = &other;
  EXPECT_FAIL(osft_flce_compute(f, &in, &out), OSFT_STATUS_DEVICE_MISMATCH, "in->x");
  in.x = &T.x->t;
  DLTensor wt = T.w->t; /* transposed strides */
  int64_t ws[2] = {1, 21};
  wt.strides = ws;
  in.weight = &wt;
  EXPECT_FAIL(osft_flce_compute(f, &in, &out), OSFT_STATUS_BAD_LAYOUT, "in->weight");
  in.weight = &T.w->t;
  out.grad_x = &T.x->t; /* overwriting the input */
  EXPECT_FAIL(osft_flce_compute(f, &in, &out), OSFT_STATUS_ALIASING, "out->grad_x");
  out.grad_x = &T.dx->t;
  DLTensor dw_over_w = T.w->t; /* a gradient over its parameter */
  out.grad_weight = &dw_over_w;
  EXPECT_FAIL(osft_flce_compute(f, &in, &out), OSFT_STATUS_ALIASING, "out->grad_weight");
  out.grad_weight = &T.dw->t;
  DLTensor z_over_acc = T.acc->t;
  out.z_loss = &z_over_acc;
  EXPECT_FAIL(osft_flce_compute(f, &in, &out), OSFT_STATUS_ALIASING, "out->z_loss");
  out.z_loss = &T.z->t;

  /* structs, NULLs, bits */
  EXPECT_FAIL(osft_flce_compute(f, NULL, &out), OSFT_STATUS_INVALID_ARGUMENT, "in");
  EXPECT_FAIL(osft_flce_compute(f, &in, NULL), OSFT_STATUS_INVALID_ARGUMENT, "out");
  in.x = NULL;
  EXPECT_FAIL(osft_flce_compute(f, &in, &out), OSFT_STATUS_INVALID_ARGUMENT, "in->x");
  in.x = &T.x->t;
  in.targets = NULL;
  EXPECT_FAIL(osft_flce_compute(f, &in, &out), OSFT_STATUS_INVALID_ARGUMENT,
              "in->targets");
  in.targets = &T.y->t;
  in.struct_size = 3;
  EXPECT_FAIL(osft_flce_compute(f, &in, &out), OSFT_STATUS_INVALID_STRUCT_SIZE, "in");
  in.struct_size = sizeof in;
  out.accumulate = 1u << 5;
  EXPECT_FAIL(osft_flce_compute(f, &in, &out), OSFT_STATUS_INVALID_ARGUMENT,
              "accumulate");
  out.accumulate = c.accumulate;
  osft_flce_outputs_t none;
  assert_ok(OSFT_FLCE_OUTPUTS_INIT(&none));
  EXPECT_FAIL(osft_flce_compute(f, &in, &none), OSFT_STATUS_INVALID_ARGUMENT,
              "no output");
  EXPECT_FAIL(osft_flce_compute(NULL, &in, &out), OSFT_STATUS_INVALID_HANDLE, "flce");

  /* a budget below one row */
  osft_flce_options_t o;
  assert_ok(OSFT_FLCE_OPTIONS_INIT(&o));
  o.memory_budget = 1000;
  osft_flce_t tiny = NULL;
  assert_ok(osft_flce_create(CTX, &o, &tiny));
  EXPECT_FAIL(osft_flce_compute(tiny, &in, &out), OSFT_STATUS_OUT_OF_MEMORY,
              "memory_budget");
  assert_ok(osft_flce_destroy(tiny));

  /* the same arguments work */
  assert_ok(osft_flce_compute(f, &in, &out));
  release(&snap);
  take(&snap, outs, 8);
  assert_ok(osft_flce_destroy(f));
  EXPECT_FAIL(osft_flce_compute(f, &in, &out), OSFT_STATUS_INVALID_HANDLE, "flce");
  release(&snap);
  tt *extra[13] = {w_bad,   y_bad, b_bad, dw_bad, loss_vec, gl_bad, dx_bad,
                   w_empty, w_bf,  y_f,   loss64, am_f,     cw64};
  for (int i = 0; i < 13; ++i) tt_free(extra[i]);
  free_tensors(&T);
}

static void test_options_and_handles(void **state) {
  osft_flce_options_t o;
  assert_ok(OSFT_FLCE_OPTIONS_INIT(&o));
  assert_int_equal(o.ignore_index, -100);
  assert_int_equal(o.reduction, OSFT_FLCE_MEAN);
  assert_true(o.label_smoothing == 0.0 && o.softcap == 0.0 && o.memory_budget == 0);
  osft_flce_t f = (osft_flce_t)(uintptr_t)0x5e5e;
  const double smooth[3] = {-0.1, 1.5, NAN};
  for (int i = 0; i < 3; ++i) {
    assert_ok(OSFT_FLCE_OPTIONS_INIT(&o));
    o.label_smoothing = smooth[i];
    assert_status(osft_flce_create(CTX, &o, &f), OSFT_STATUS_INVALID_ARGUMENT);
    assert_error_mentions("label_smoothing");
  }
  const double caps[3] = {-1.0, INFINITY, NAN};
  for (int i = 0; i < 3; ++i) {
    assert_ok(OSFT_FLCE_OPTIONS_INIT(&o));
    o.softcap = caps[i];
    assert_status(osft_flce_create(CTX, &o, &f), OSFT_STATUS_INVALID_ARGUMENT);
    assert_error_mentions("softcap");
  }
  assert_ok(OSFT_FLCE_OPTIONS_INIT(&o));
  o.z_loss_scale = -1e-4;
  assert_status(osft_flce_create(CTX, &o, &f), OSFT_STATUS_INVALID_ARGUMENT);
  assert_error_mentions("z_loss_scale");
  assert_ok(OSFT_FLCE_OPTIONS_INIT(&o));
  o.reduction = (osft_flce_reduction_t)7;
  assert_status(osft_flce_create(CTX, &o, &f), OSFT_STATUS_INVALID_ARGUMENT);
  assert_error_mentions("reduction");
  assert_ok(OSFT_FLCE_OPTIONS_INIT(&o));
  o.accumulator = (osft_flce_accumulator_t)-1;
  assert_status(osft_flce_create(CTX, &o, &f), OSFT_STATUS_INVALID_ARGUMENT);
  assert_error_mentions("accumulator");
  assert_ok(OSFT_FLCE_OPTIONS_INIT(&o));
  o.chunk_rows = -3;
  assert_status(osft_flce_create(CTX, &o, &f), OSFT_STATUS_INVALID_ARGUMENT);
  assert_error_mentions("chunk_rows");
  assert_ok(OSFT_FLCE_OPTIONS_INIT(&o));
  o.struct_size = 5;
  assert_status(osft_flce_create(CTX, &o, &f), OSFT_STATUS_INVALID_STRUCT_SIZE);
  assert_status(osft_flce_create(NULL, NULL, &f), OSFT_STATUS_INVALID_HANDLE);
  assert_status(osft_flce_create(CTX, NULL, NULL), OSFT_STATUS_INVALID_ARGUMENT);
  assert_ptr_equal(f, (osft_flce_t)(uintptr_t)0x5e5e);
  assert_status(OSFT_FLCE_OPTIONS_INIT((osft_flce_options_t *)NULL),
                OSFT_STATUS_INVALID_ARGUMENT);

  /* get_options gives back what was set */
  assert_ok(OSFT_FLCE_OPTIONS_INIT(&o));
  o.ignore_index = 3;
  o.softcap = 30.0;
  o.reduction = OSFT_FLCE_SUM;
  o.memory_budget = 12345;
  assert_ok(osft_flce_create(CTX, &o, &f));
  osft_flce_options_t back;
  back.struct_size = sizeof back;
  assert_ok(osft_flce_get_options(f, &back));
  assert_memory_equal(&back, &o, sizeof o);
  /* a context with a live handle refuses to go */
  osft_context_t ctx2 = tt_context(NULL);
  osft_flce_t f2 = NULL;
  assert_ok(osft_flce_create(ctx2, NULL, &f2));
  assert_status(osft_context_destroy(ctx2), OSFT_STATUS_INVALID_ARGUMENT);
  assert_ok(osft_flce_destroy(f2));
  assert_ok(osft_context_destroy(ctx2));
  assert_ok(osft_flce_destroy(f));
  assert_status(osft_flce_destroy(f), OSFT_STATUS_INVALID_HANDLE);
  assert_status(osft_flce_get_options(f, &back), OSFT_STATUS_INVALID_HANDLE);
  assert_ok(osft_flce_destroy(NULL));
}

/* ------------------------------------------------- one-rank vocab parallel */

/* A case's outputs after one call through `f` on fresh tensors from the
 * case's seed (so two runs start from the same inputs and initial
 * gradients), as raw bytes. */
static void run_bytes(osft_flce_t f, const flce_case *c, void *bytes[8], size_t size[8]) {
  test_seed("one-rank comm");
  flce_tensors T = make_tensors(c);
  osft_flce_inputs_t in;
  osft_flce_outputs_t out;
  bind(c, &T, &in, &out);
  assert_ok(osft_flce_compute(f, &in, &out));
  tt *outs[8] = {T.loss, T.dx, T.dw, T.db, T.z, T.acc, T.amax, T.tok};
  for (int i = 0; i < 8; ++i) bytes[i] = outs[i] ? tt_bytes(outs[i], &size[i]) : NULL;
  free_tensors(&T);
}

/* A one-rank communicator takes the single-rank path: every output is
 * bit-identical to a call without one, with vocab_size_global 0 or V. */
static void test_one_rank_comm_is_single_rank(void **state) {
  osft_comm_t comm = NULL;
  assert_ok(osft_comm_create_self(CTX, NULL, &comm));
  const osft_flce_reduction_t reds[2] = {OSFT_FLCE_MEAN, OSFT_FLCE_NONE};
  for (int r = 0; r < 2; ++r) {
    flce_case c = base_case(37, 19, 123, TT_F32);
    c.bias = 1;
    c.class_weights = 1;
    c.smoothing = 0.1;
    c.z_scale = 1e-3;
    c.softcap = 20.0;
    c.chunk_rows = 16;
    c.reduction = reds[r];
    c.accumulate = OSFT_FLCE_ACCUMULATE_ALL;
    void *plain[8], *shared[8];
    size_t plain_size[8], shared_size[8];
    osft_flce_t f = make_flce(CTX, &c);
    run_bytes(f, &c, plain, plain_size);
    assert_ok(osft_flce_destroy(f));
    for (int64_t global = 0; global <= c.v; global += c.v) {
      osft_flce_options_t o;
      case_options(&c, &o);
      o.comm = comm;
      o.vocab_size_global = global;
      assert_ok(osft_flce_create(CTX, &o, &f));
      /* the handle holds the communicator in use */
      assert_status(osft_comm_destroy(comm), OSFT_STATUS_INVALID_ARGUMENT);
      run_bytes(f, &c, shared, shared_size);
      assert_ok(osft_flce_destroy(f));
      for (int i = 0; i < 8; ++i) {
        assert_int_equal(plain_size[i], shared_size[i]);
        if (plain[i] != NULL && memcmp(plain[i], shared[i], plain_size[i]) != 0)
          fail_msg("output %d differs with a one-rank comm (reduction %d, global %lld)",
                   i, (int)c.reduction, (long long)global);
        free(shared[i]);
      }
    }
    for (int i = 0; i < 8; ++i) free(plain[i]);
  }
  assert_ok(osft_comm_destroy(comm));
}

/* The vocab-parallel options: each error names its field, and a failed
 * create or call leaves everything as it was. */
static void test_vocab_options_errors(void **state) {
  osft_comm_t comm = NULL, dead = NULL, foreign = NULL;
  assert_ok(osft_comm_create_self(CTX, NULL, &comm));
  assert_ok(osft_comm_create_self(CTX, NULL, &dead));
  assert_ok(osft_comm_destroy(dead));
  osft_context_t ctx2 = tt_context(NULL);
  assert_ok(osft_comm_create_self(ctx2, NULL, &foreign));
  osft_flce_t const sentinel = (osft_flce_t)(uintptr_t)0x5e5e;
  osft_flce_t f = sentinel;
  osft_flce_options_t o;

  assert_ok(OSFT_FLCE_OPTIONS_INIT(&o));
  assert_null(o.comm);
  assert_true(o.vocab_offset == 0 && o.vocab_size_global == 0);
  o.vocab_offset = 5; /* without a comm */
  assert_status(osft_flce_create(CTX, &o, &f), OSFT_STATUS_INVALID_ARGUMENT);
  assert_error_mentions("vocab_offset");
  assert_ok(OSFT_FLCE_OPTIONS_INIT(&o));
  o.vocab_size_global = 100; /* without a comm */
  assert_status(osft_flce_create(CTX, &o, &f), OSFT_STATUS_INVALID_ARGUMENT);
  assert_error_mentions("vocab_size_global");
  assert_ok(OSFT_FLCE_OPTIONS_INIT(&o));
  o.comm = comm;
  o.vocab_offset = 3; /* one rank holds the whole vocabulary */
  o.vocab_size_global = 20;
  assert_status(osft_flce_create(CTX, &o, &f), OSFT_STATUS_INVALID_ARGUMENT);
  assert_error_mentions("vocab_offset");
  o.vocab_offset = -1;
  assert_status(osft_flce_create(CTX, &o, &f), OSFT_STATUS_INVALID_ARGUMENT);
  assert_error_mentions("vocab_offset");
  o.vocab_offset = 0;
  o.vocab_size_global = -4;
  assert_status(osft_flce_create(CTX, &o, &f), OSFT_STATUS_INVALID_ARGUMENT);
  assert_error_mentions("vocab_size_global");
  o.vocab_size_global = 0;
  o.comm = foreign;
  assert_status(osft_flce_create(CTX, &o, &f), OSFT_STATUS_INVALID_ARGUMENT);
  assert_error_mentions("opts->comm");
  o.comm = dead;
  assert_status(osft_flce_create(CTX, &o, &f), OSFT_STATUS_INVALID_HANDLE);
  assert_error_mentions("opts->comm");
  assert_ptr_equal(f, sentinel);

  /* vocab_size_global other than in->weight's rows: the call fails, writing
   * nothing */
  flce_case c = base_case(20, 5, 13, TT_F32);
  c.accumulate = OSFT_FLCE_ACCUMULATE_ALL;
  c.bias = 1;
  snapshot snap;
  flce_tensors T = error_tensors(&c, "vocab option errors", &snap);
  case_options(&c, &o);
  o.comm = comm;
  o.vocab_size_global = 14;
  assert_ok(osft_flce_create(CTX, &o, &f));
  osft_flce_inputs_t in;
  osft_flce_outputs_t out;
  bind(&c, &T, &in, &out);
  EXPECT_FAIL(osft_flce_compute(f, &in, &out), OSFT_STATUS_SHAPE_MISMATCH,
              "vocab_size_global");
  osft_flce_options_t back;
  back.struct_size = sizeof back;
  assert_ok(osft_flce_get_options(f, &back));
  assert_ptr_equal(back.comm, comm);
  assert_int_equal(back.vocab_size_global, 14);
  assert_ok(osft_flce_destroy(f));
  release(&snap);
  free_tensors(&T);

  /* an older caller's struct (up to chunk_rows) is accepted: no comm */
  assert_ok(OSFT_FLCE_OPTIONS_INIT(&o));
  o.struct_size = offsetof(osft_flce_options_t, chunk_rows) + sizeof o.chunk_rows;
  f = NULL;
  assert_ok(osft_flce_create(CTX, &o, &f));
  assert_ok(osft_flce_get_options(f, &back));
  assert_null(back.comm);
  assert_ok(osft_flce_destroy(f));

  assert_ok(osft_comm_destroy(foreign));
  assert_ok(osft_context_destroy(ctx2));
  assert_ok(osft_comm_destroy(comm));
}

/* Every block the op takes goes back (counting allocator on the CPU). */
static void test_memory_is_returned(void **state) {
  (void)state;
  test_alloc_state a;
  osft_context_t ctx = tt_counting_context(&a);
  flce_case c = base_case(30, 5, 17, TT_BF16);
  c.bias = 1;
  c.chunk_rows = 8;
  c.grad_b_dtype = TT_BF16;
  run_case(ctx, &c);
  assert_ok(osft_context_destroy(ctx));
  if (tt_device() == OSFT_DEVICE_CPU) {
    assert_true(a.host_allocs > 0);
    assert_int_equal(a.host_allocs, a.host_frees);
    assert_int_equal(a.host_bytes_live, 0);
    assert_false(a.size_mismatch);
  }
}

int main(void) {
  if (!tt_device_present()) return OSFT_TEST_SKIP;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_reference_is_consistent),
      cmocka_unit_test_setup_teardown(test_shapes_chunks_reductions, setup, teardown),
      cmocka_unit_test_setup_teardown(test_each_feature_and_all, setup, teardown),
      cmocka_unit_test_setup_teardown(test_accumulate, setup, teardown),
      cmocka_unit_test_setup_teardown(test_all_ignored_and_empty, setup, teardown),
      cmocka_unit_test_setup_teardown(test_leading_dims_and_padding, setup, teardown),
      cmocka_unit_test_setup_teardown(test_forward_only, setup, teardown),
      cmocka_unit_test_setup_teardown(test_budget_and_plan, setup, teardown),
      cmocka_unit_test_setup_teardown(test_call_errors_write_nothing, setup, teardown),
      cmocka_unit_test_setup_teardown(test_options_and_handles, setup, teardown),
      cmocka_unit_test_setup_teardown(test_one_rank_comm_is_single_rank, setup, teardown),
      cmocka_unit_test_setup_teardown(test_vocab_options_errors, setup, teardown),
      cmocka_unit_test(test_memory_is_returned),
  };
  return cmocka_run_group_tests_name("flce", tests, NULL, NULL);
}
