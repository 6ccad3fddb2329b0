#include "flce_testlib.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_tensors.h"
#include "test_util.h"

flce_case base_case(int64_t m, int64_t h, int64_t v, tt_dtype dt) {
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
  c.chunking = flce_test_chunking();
  c.slice_cols = c.chunking == OSFT_FLCE_CHUNKING_VOCAB ? flce_test_slice_cols(v) : 0;
  return c;
}

void describe(const flce_case *c, char *buf, size_t size) {
  snprintf(buf, size,
           "M=%lld H=%lld V=%lld %s bias=%d cw=%d up=%d ign=%.2f%s a=%g z=%g cap=%g "
           "red=%d acc=%d chunk=%lld budget=%zu accum=%u gw=%d gb=%d plan=%d slice=%lld",
           (long long)c->m, (long long)c->h, (long long)c->v,
           c->dtype == TT_BF16 ? "bf16" : "fp32", c->bias, c->class_weights, c->upstream,
           c->ignored, c->all_ignored ? "(all)" : "", c->smoothing, c->z_scale,
           c->softcap, (int)c->reduction, (int)c->accumulator, (long long)c->chunk_rows,
           c->budget, c->accumulate, (int)c->grad_w_dtype, (int)c->grad_b_dtype,
           (int)c->chunking, (long long)c->slice_cols);
}

ref_out reference(const flce_case *c, const double *x, const double *w, const double *b,
                  const double *cw, const int64_t *y, const double *gl) {
  const flce_ref_problem p = {
      c->m,         c->h,       c->v,       x,           w, b, cw, y, gl, c->ignore_index,
      c->smoothing, c->z_scale, c->softcap, c->reduction};
  return flce_ref_compute(&p);
}

void ref_free(ref_out *r) {
  flce_ref_free(r);
}

tt *mat(tt_dtype d, int64_t rows, int64_t cols) {
  const int64_t shape[2] = {rows, cols};
  return tt_new(d, 2, shape);
}

tt *vec(tt_dtype d, int64_t n) {
  const int64_t shape[1] = {n};
  return tt_new(d, 1, shape);
}

tt *scalar(void) {
  return tt_new(TT_F32, 0, NULL);
}

void expect_close(const char *what, const char *name, const tt *t, const double *ref,
                  double tol) {
  double *got = tt_get(t);
  const double err = rel_max_err(got, ref, (size_t)tt_logical_numel(t), 1e-6);
  free(got);
  if (!(err <= tol))
    fail_msg("%s (%s): relative max error %.3g > %.3g", what, name, err, tol);
}

void expect_scalar(const char *what, const char *name, const tt *t, double ref,
                   double tol) {
  expect_close(what, name, t, &ref, tol);
}

double loss_tol(const flce_case *c) {
  return c->dtype == TT_BF16 ? 5e-4 : 2e-5;
}

double grad_tol(tt_dtype out_dtype, const flce_case *c) {
  return out_dtype == TT_BF16 || c->dtype == TT_BF16 ? 3e-2 : 5e-5;
}

void case_options(const flce_case *c, osft_flce_options_t *o) {
  assert_ok(OSFT_FLCE_OPTIONS_INIT(o));
  o->ignore_index = c->ignore_index;
  o->label_smoothing = c->smoothing;
  o->z_loss_scale = c->z_scale;
  o->softcap = c->softcap;
  o->reduction = c->reduction;
  o->accumulator = c->accumulator;
  o->chunk_rows = c->chunk_rows;
  o->memory_budget = c->budget;
  o->chunking = c->chunking;
  o->slice_cols = c->slice_cols;
}

void expect_plan(osft_flce_t f, const flce_case *c, const osft_flce_inputs_t *in,
                 const osft_flce_outputs_t *out, const char *name) {
  if (c->chunking == OSFT_FLCE_CHUNKING_AUTO) return;
  osft_flce_plan_t p;
  p.struct_size = sizeof p;
  assert_ok(osft_flce_get_plan(f, in, out, &p));
  if (p.chunking != c->chunking)
    fail_msg("%s: planned chunking %d, not the %d asked for", name, (int)p.chunking,
             (int)c->chunking);
  if (c->chunking != OSFT_FLCE_CHUNKING_VOCAB) return;
  /* the asked-for slices whenever the budget allows */
  const int64_t slices =
      c->slice_cols > 0 ? (c->v + c->slice_cols - 1) / c->slice_cols : 0;
  if (c->slice_cols > 0 && c->budget == 0 &&
      (p.slice_cols != c->slice_cols || p.slices != slices))
    fail_msg("%s: %lld slice(s) of %lld classes, not %lld of %lld", name,
             (long long)p.slices, (long long)p.slice_cols, (long long)slices,
             (long long)c->slice_cols);
  if (p.slices * p.slice_cols < c->v || (p.slices - 1) * p.slice_cols >= c->v)
    fail_msg("%s: %lld slice(s) of %lld classes do not tile V = %lld", name,
             (long long)p.slices, (long long)p.slice_cols, (long long)c->v);
}

osft_flce_t make_flce(osft_context_t ctx, const flce_case *c) {
  osft_flce_options_t o;
  case_options(c, &o);
  osft_flce_t f = NULL;
  assert_ok(osft_flce_create(ctx, &o, &f));
  return f;
}

flce_tensors make_tensors(const flce_case *c) {
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

void free_tensors(flce_tensors *T) {
  tt *all[14] = {T->x,  T->w,  T->b,  T->cw, T->y,   T->gl,   T->loss,
                 T->dx, T->dw, T->db, T->z,  T->acc, T->amax, T->tok};
  for (int i = 0; i < 14; ++i) tt_free(all[i]);
  free(T->targets);
}

DLTensor *dl(tt *t) {
  return t ? &t->t : NULL;
}

void flce_bind(const flce_case *c, flce_tensors *T, osft_flce_inputs_t *in,
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

double *get_or_null(const tt *t) {
  return t ? tt_get(t) : NULL;
}

double *plus_initial(const double *init, const double *ref, int64_t n) {
  double *e = malloc(sizeof(double) * (size_t)(n + 1));
  for (int64_t i = 0; i < n; ++i) e[i] = (init ? init[i] : 0.0) + ref[i];
  return e;
}

void check_argmax(const flce_case *c, const flce_tensors *T, const ref_out *r,
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

osft_status_t run_case_refusing(osft_context_t ctx, const flce_case *c,
                                test_alloc_state *a, long granted, int device) {
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
  flce_bind(c, &T, &in, &out);
  expect_plan(f, c, &in, &out, name);
  tt_snapshot before = {.n = 0}; /* only when allocations are refused */
  if (a != NULL) {
    tt *const outs[8] = {T.loss, T.dx, T.dw, T.db, T.z, T.acc, T.amax, T.tok};
    tt_snapshot_take(&before, outs, 8);
    test_alloc_refuse(a, device, granted);
  }
  const osft_status_t st = osft_flce_compute(f, &in, &out);
  if (a == NULL) {
    assert_ok(st);
  } else if (st != OSFT_STATUS_SUCCESS) {
    if (st != OSFT_STATUS_OUT_OF_MEMORY)
      fail_msg("%s: a refused allocation gave %s, not OUT_OF_MEMORY", name,
               osft_status_string(st));
    tt_snapshot_expect_untouched(&before, name);
  }
  tt_snapshot_release(&before);

  if (st == OSFT_STATUS_SUCCESS) {
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
  return st;
}

void run_case(osft_context_t ctx, const flce_case *c) {
  assert_ok(run_case_refusing(ctx, c, NULL, -1, 0));
}

static void flce_counts_sink(void *user, osft_log_level_t level, const char *message) {
  (void)level;
  flce_counts *k = user;
  const char *p = strstr(message, "flce: counts: ");
  if (p == NULL) return;
  flce_counts n = {0};
  n.held = strstr(p, "(held)") != NULL;
  n.slices = 1;
  const char *sl = strstr(p, "chunk(s) x ");
  if (sl != NULL && sscanf(sl, "chunk(s) x %lld vocabulary slices", &n.slices) != 1)
    return;
  const char *q = strstr(p, "chunk(s)");
  q = q != NULL ? strchr(q, ':') : NULL;
  if (sscanf(p, "flce: counts: %lld", &n.chunks) != 1 || q == NULL ||
      sscanf(q + 1,
             " %lld calls, %lld conversions (%lld elements), %lld V x H passes, %lld "
             "host waits, %lld allocations",
             &n.calls, &n.conversions, &n.converted, &n.vh_passes, &n.waits,
             &n.allocations) != 6)
    return;
  n.lines = k->lines + 1;
  *k = n;
}

flce_counts counted_case(osft_context_t ctx, const flce_case *c) {
  flce_counts k = {0};
  assert_ok(osft_set_log_callback(flce_counts_sink, &k, OSFT_LOG_DEBUG));
  run_case(ctx, c);
  assert_ok(osft_set_log_callback(NULL, NULL, OSFT_LOG_OFF));
  assert_int_equal(k.lines, 1);
  return k;
}
