/*
 * Fused linear cross-entropy: the loss semantics of every option
 * combination (issue 17), against the float64 reference of flce_ref.h
 * (shared with the other flce tests), from the formulas of osftrt/flce.h:
 *
 *   ce_i = (1 - a) w_y (lse - z_y) + (a / V) (lse sum_j w_j - sum_j w_j z_j)
 *   zl_i = lambda lse^2                   (never times a class weight)
 *   MEAN: sum_i ce_i / D + sum_i zl_i / N, D = sum of w_y, N = count, both
 *         over the tokens not ignored; the z_loss output sum_i zl_i / N
 *   SUM:  sum_i (ce_i + zl_i);  NONE: ce_i + zl_i per token
 *
 * (torch.nn.functional.cross_entropy with weight= and label_smoothing= for
 * ce, Liger-Kernel's and PaLM's z-loss averaged over the tokens that count).
 *
 * Every combination of {MEAN, SUM, NONE} x {class weights off, on} x
 * {label smoothing off, on} x {z-loss off, on} x {softcap off, on} x {bias
 * off, on} x {ignore_index -100, a real class}, with 1..M/2 tokens ignored
 * (cycling over the combinations), in fp32 (atol 1e-5, rtol 5e-4 on every
 * output) and in bf16 (bf16 tolerances): the loss, the z_loss output, the
 * per-token loss, grad_x, grad_W and grad_b, all poisoned first. Half the
 * combinations pass an upstream gradient, two thirds run in several chunks.
 * Then the edge cases of the rule: targets whose class weights are all 0
 * (D = 0, N > 0), every token ignored, and the invariance of the MEAN loss
 * and gradients under scaling all class weights (which the old rule, the
 * z-loss over D, breaks).
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flce_ref.h"
#include "flce_test_plan.h"
#include "test_fixture.h"
#include "test_tensors.h"
#include "test_util.h"

enum { M = 24, H = 16, V = 37, REAL_IGNORE = 5, CHUNK = 7 };

static const double kSmoothing = 0.1, kZScale = 0.03, kSoftcap = 3.0;

/* ------------------------------------------------------------ a case */

typedef struct {
  tt_dtype dtype; /* x, W, bias, grad_x, grad_W */
  osft_flce_reduction_t red;
  int cw, smooth, zloss, cap, bias;
  int real_ignore; /* ignore_index a real class (REAL_IGNORE), else -100 */
  int n_ignored;   /* tokens ignored */
  int zero_weight; /* the targets' classes all weigh 0 (D = 0) */
  double cw_scale; /* class weights times this */
  int upstream;    /* pass grad_loss */
  int64_t chunk_rows;
} sem_case;

static void describe(const sem_case *c, char *buf, size_t size) {
  static const char *red[] = {"mean", "sum", "none"};
  snprintf(buf, size,
           "%s %s cw=%d smooth=%d z=%d cap=%d bias=%d ignore=%s n_ign=%d zero_w=%d "
           "cw_scale=%g up=%d chunk=%lld",
           c->dtype == TT_BF16 ? "bf16" : "fp32", red[c->red], c->cw, c->smooth, c->zloss,
           c->cap, c->bias, c->real_ignore ? "class" : "-100", c->n_ignored,
           c->zero_weight, c->cw_scale, c->upstream, (long long)c->chunk_rows);
}

static int64_t ignore_index(const sem_case *c) {
  return c->real_ignore ? REAL_IGNORE : -100;
}

/* ------------------------------------------------------------ problem */

typedef struct {
  double x[M * H], w[V * H], b[V], cw[V], gl[M];
  int64_t y[M];
} problem;

/* Fresh random inputs as the dtype stores them; n_ignored tokens at random
 * positions carry ignore_index, the others a class other than it. */
static void make_problem(const sem_case *c, problem *p) {
  for (int i = 0; i < M * H; ++i) p->x[i] = tt_round(c->dtype, test_uniform(-1, 1));
  for (int i = 0; i < V * H; ++i) p->w[i] = tt_round(c->dtype, test_uniform(-1.5, 1.5));
  for (int j = 0; j < V; ++j) {
    p->b[j] = tt_round(c->dtype, test_uniform(-1, 1));
    p->cw[j] = (double)(float)(c->cw_scale * test_uniform(0.1, 3.0));
  }
  for (int i = 0; i < M; ++i) p->gl[i] = (double)(float)test_uniform(0.5, 1.5);
  int ignored[M] = {0};
  for (int k = 0; k < c->n_ignored;) {
    const int i = (int)test_uniform(0, M) % M;
    if (!ignored[i]) {
      ignored[i] = 1;
      ++k;
    }
  }
  for (int i = 0; i < M; ++i) {
    if (ignored[i]) {
      p->y[i] = ignore_index(c);
      continue;
    }
    int64_t t;
    do t = (int64_t)test_uniform(0, V) % V;
    while (t == REAL_IGNORE);
    p->y[i] = t;
  }
  if (c->zero_weight) /* D = 0: every target's class weighs 0 */
    for (int i = 0; i < M; ++i)
      if (p->y[i] != ignore_index(c)) p->cw[p->y[i]] = 0.0;
}

/* ------------------------------------------------------------ reference */

/* The float64 reference of flce_ref.h on this case's switches (the scalar
 * upstream gradient is 0.7, as the call passes it). */
static flce_ref compute_reference(const sem_case *c, const problem *p) {
  static const double seven = 0.7;
  const flce_ref_problem q = {.m = M,
                              .h = H,
                              .v = V,
                              .x = p->x,
                              .w = p->w,
                              .bias = c->bias ? p->b : NULL,
                              .class_weight = c->cw ? p->cw : NULL,
                              .targets = p->y,
                              .grad_loss = !c->upstream               ? NULL
                                           : c->red == OSFT_FLCE_NONE ? p->gl
                                                                      : &seven,
                              .ignore_index = ignore_index(c),
                              .label_smoothing = c->smooth ? kSmoothing : 0.0,
                              .z_loss_scale = c->zloss ? kZScale : 0.0,
                              .softcap = c->cap ? kSoftcap : 0.0,
                              .reduction = c->red};
  return flce_ref_compute(&q);
}

/* ------------------------------------------------------------ checks */

/* Failures are counted, and the first ones printed, so that one run shows
 * every combination that is off; each test fails at its end if any was. */
static int g_failures;

static void failure(const char *fmt, ...) {
  if (g_failures++ >= 25) return;
  va_list ap;
  va_start(ap, fmt);
  vprintf(fmt, ap);
  va_end(ap);
  printf("\n");
}

static void expect_no_failures(void) {
  const int n = g_failures;
  g_failures = 0;
  if (n > 0) fail_msg("%d check(s) failed (the first are printed above)", n);
}

/* |got - ref| <= atol + rtol |ref| for every element (NaN fails). */
static void expect_allclose(const char *what, const char *name, const tt *t,
                            const double *ref, double atol, double rtol) {
  double *got = tt_get(t);
  const int64_t n = tt_logical_numel(t);
  int64_t worst = -1;
  double worst_excess = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const double err = fabs(got[i] - ref[i]), bound = atol + rtol * fabs(ref[i]);
    if (!(err <= bound) && (worst < 0 || !(err - bound <= worst_excess))) {
      worst = i;
      worst_excess = err - bound;
    }
  }
  if (worst >= 0)
    failure("FAIL %s (%s): element %lld is %.9g, reference %.9g (atol %g, rtol %g)", what,
            name, (long long)worst, got[worst], ref[worst], atol, rtol);
  free(got);
}

static double max_abs(const double *v, int64_t n) {
  double m = 0.0;
  for (int64_t i = 0; i < n; ++i) m = fabs(v[i]) > m ? fabs(v[i]) : m;
  return m;
}

/* bf16 gradients: on the CPU the gradient g is fp32 and only the outputs
 * are rounded to bf16; on CUDA g itself is bf16 before the backward GEMMs,
 * which adds a rounding per term of their sums. */
#ifdef OSFT_TEST_CUDA
static const double kBf16GradAtol = 2e-2;
#else
static const double kBf16GradAtol = 1e-2;
#endif

/* fp32: atol 1e-5, rtol 5e-4 everywhere. bf16: the loss outputs are fp32
 * from fp32 logits of the stored bf16 inputs (tight); the gradients are
 * bf16: kBf16GradAtol of the largest element plus 1% of the element. */
static void expect_output(const sem_case *c, const char *what, const char *name,
                          const tt *t, const double *ref, int gradient) {
  if (c->dtype == TT_F32) {
    expect_allclose(what, name, t, ref, 1e-5, 5e-4);
  } else if (!gradient) {
    expect_allclose(what, name, t, ref, 1e-4, 1e-4);
  } else {
    const double scale = max_abs(ref, tt_logical_numel(t));
    expect_allclose(what, name, t, ref, kBf16GradAtol * scale + 1e-7, 1e-2);
  }
}

/* ------------------------------------------------------------ one call */

static tt *new_tensor(tt_dtype d, int ndim, int64_t d0, int64_t d1) {
  const int64_t shape[2] = {d0, d1};
  return tt_new(d, ndim, shape);
}

/* Runs one case and checks every output; returns the outputs (loss, z,
 * dx, dw, db as doubles, malloc'ed) when `keep` is given. */
typedef struct {
  double *loss, *z, *dx, *dw, *db;
} kept;

static void run_case(osft_context_t ctx, const sem_case *c, kept *keep) {
  char name[256];
  describe(c, name, sizeof name);
  problem p;
  make_problem(c, &p);
  flce_ref r = compute_reference(c, &p);

  osft_flce_options_t o;
  assert_ok(OSFT_FLCE_OPTIONS_INIT(&o));
  o.ignore_index = ignore_index(c);
  o.label_smoothing = c->smooth ? kSmoothing : 0.0;
  o.z_loss_scale = c->zloss ? kZScale : 0.0;
  o.softcap = c->cap ? kSoftcap : 0.0;
  o.reduction = c->red;
  o.chunk_rows = c->chunk_rows;
  flce_test_plan_options(&o, V);
  osft_flce_t f;
  assert_ok(osft_flce_create(ctx, &o, &f));

  const int per_token = c->red == OSFT_FLCE_NONE;
  tt *x = new_tensor(c->dtype, 2, M, H), *w = new_tensor(c->dtype, 2, V, H);
  tt *y = new_tensor(TT_I64, 1, M, 0);
  tt *b = c->bias ? new_tensor(c->dtype, 1, V, 0) : NULL;
  tt *cw = c->cw ? new_tensor(TT_F32, 1, V, 0) : NULL;
  tt *gl = NULL;
  tt_set(x, p.x);
  tt_set(w, p.w);
  double yd[M];
  for (int i = 0; i < M; ++i) yd[i] = (double)p.y[i];
  tt_set(y, yd);
  if (b != NULL) tt_set(b, p.b);
  if (cw != NULL) tt_set(cw, p.cw);
  if (c->upstream) {
    if (per_token) {
      gl = new_tensor(TT_F32, 1, M, 0);
      tt_set(gl, p.gl);
    } else {
      const double seven = 0.7;
      gl = new_tensor(TT_F32, 0, 0, 0);
      tt_set(gl, &seven);
    }
  }
  tt *loss = per_token ? new_tensor(TT_F32, 1, M, 0) : new_tensor(TT_F32, 0, 0, 0);
  tt *z = per_token ? new_tensor(TT_F32, 1, M, 0) : new_tensor(TT_F32, 0, 0, 0);
  tt *tok = new_tensor(TT_F32, 1, M, 0);
  tt *dx = new_tensor(c->dtype, 2, M, H), *dw = new_tensor(c->dtype, 2, V, H);
  tt *db = c->bias ? new_tensor(c->dtype, 1, V, 0) : NULL;
  tt *outs[] = {loss, z, tok, dx, dw, db};
  for (size_t i = 0; i < sizeof outs / sizeof outs[0]; ++i)
    if (outs[i] != NULL) tt_poison(outs[i]);

  osft_flce_inputs_t in;
  assert_ok(OSFT_FLCE_INPUTS_INIT(&in));
  in.x = &x->t;
  in.weight = &w->t;
  in.targets = &y->t;
  in.bias = b != NULL ? &b->t : NULL;
  in.class_weight = cw != NULL ? &cw->t : NULL;
  in.grad_loss = gl != NULL ? &gl->t : NULL;
  osft_flce_outputs_t out;
  assert_ok(OSFT_FLCE_OUTPUTS_INIT(&out));
  out.loss = &loss->t;
  out.z_loss = &z->t;
  out.token_loss = &tok->t;
  out.grad_x = &dx->t;
  out.grad_weight = &dw->t;
  out.grad_bias = db != NULL ? &db->t : NULL;
  const osft_status_t st = osft_flce_compute(f, &in, &out);
  if (st != OSFT_STATUS_SUCCESS) {
    failure("FAIL compute (%s): %s: %s", name, osft_status_string(st), osft_last_error());
  } else {
    expect_output(c, "loss", name, loss, per_token ? r.tok : &r.loss, 0);
    expect_output(c, "z_loss", name, z, per_token ? r.ztok : &r.z, 0);
    expect_output(c, "token_loss", name, tok, r.tok, 0);
    expect_output(c, "grad_x", name, dx, r.dx, 1);
    expect_output(c, "grad_weight", name, dw, r.dw, 1);
    if (db != NULL) expect_output(c, "grad_bias", name, db, r.db, 1);
    if (keep != NULL) {
      keep->loss = tt_get(loss);
      keep->z = tt_get(z);
      keep->dx = tt_get(dx);
      keep->dw = tt_get(dw);
      keep->db = db != NULL ? tt_get(db) : NULL;
    }
  }
  assert_ok(osft_flce_destroy(f));
  flce_ref_free(&r);
  tt *all[] = {x, w, y, b, cw, gl, loss, z, tok, dx, dw, db};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i)
    if (all[i] != NULL) tt_free(all[i]);
}

static void free_kept(kept *k) {
  free(k->loss);
  free(k->z);
  free(k->dx);
  free(k->dw);
  free(k->db);
}

/* ------------------------------------------------------------ the grid */

static int parity(unsigned v) {
  int p = 0;
  for (; v != 0; v >>= 1) p ^= (int)(v & 1u);
  return p;
}

/* All 64 combinations of the six switches under one reduction and dtype. */
static void run_grid(osft_context_t ctx, tt_dtype dtype, osft_flce_reduction_t red) {
  for (unsigned mask = 0; mask < 64; ++mask) {
    sem_case c;
    memset(&c, 0, sizeof c);
    c.dtype = dtype;
    c.red = red;
    c.cw = (mask >> 0) & 1;
    c.smooth = (mask >> 1) & 1;
    c.zloss = (mask >> 2) & 1;
    c.cap = (mask >> 3) & 1;
    c.bias = (mask >> 4) & 1;
    c.real_ignore = (mask >> 5) & 1;
    const unsigned idx = mask + 64u * (unsigned)red;
    c.n_ignored = 1 + (int)(idx % (M / 2)); /* 1 .. M/2 */
    c.cw_scale = 1.0;
    c.upstream = parity(mask);
    c.chunk_rows = idx % 3 == 0 ? 0 : CHUNK;
    run_case(ctx, &c, NULL);
  }
  expect_no_failures();
}

#define GRID_TEST(fn, dtype, red) \
  static void fn(void **state) {  \
    test_seed(#fn);               \
    run_grid(CTX, dtype, red);    \
  }

GRID_TEST(test_grid_fp32_mean, TT_F32, OSFT_FLCE_MEAN)
GRID_TEST(test_grid_fp32_sum, TT_F32, OSFT_FLCE_SUM)
GRID_TEST(test_grid_fp32_none, TT_F32, OSFT_FLCE_NONE)
GRID_TEST(test_grid_bf16_mean, TT_BF16, OSFT_FLCE_MEAN)
GRID_TEST(test_grid_bf16_sum, TT_BF16, OSFT_FLCE_SUM)
GRID_TEST(test_grid_bf16_none, TT_BF16, OSFT_FLCE_NONE)

/* ------------------------------------------------------------ edge cases */

static sem_case all_on(tt_dtype dtype, osft_flce_reduction_t red) {
  sem_case c;
  memset(&c, 0, sizeof c);
  c.dtype = dtype;
  c.red = red;
  c.cw = c.smooth = c.zloss = c.cap = c.bias = 1;
  c.n_ignored = 3;
  c.cw_scale = 1.0;
  c.chunk_rows = CHUNK;
  return c;
}

/* Every target's class weighs 0: D = 0 while N > 0. MEAN then keeps the
 * z-loss part (over N) and defines the cross-entropy part as 0 (not NaN);
 * SUM and NONE keep the smoothing term of the weighted classes. */
static void test_zero_weight_targets(void **state) {
  test_seed("test_zero_weight_targets");
  for (int red = 0; red < 3; ++red)
    for (int smooth = 0; smooth < 2; ++smooth)
      for (int real = 0; real < 2; ++real) {
        sem_case c = all_on(TT_F32, (osft_flce_reduction_t)red);
        c.smooth = smooth;
        c.real_ignore = real;
        c.zero_weight = 1;
        c.upstream = smooth;
        run_case(CTX, &c, NULL);
      }
  expect_no_failures();
}

/* Every token ignored: all outputs 0 (not NaN), under every reduction. */
static void test_all_ignored(void **state) {
  test_seed("test_all_ignored");
  for (int dt = 0; dt < 2; ++dt)
    for (int red = 0; red < 3; ++red)
      for (int real = 0; real < 2; ++real) {
        sem_case c = all_on(dt ? TT_BF16 : TT_F32, (osft_flce_reduction_t)red);
        c.real_ignore = real;
        c.n_ignored = M;
        run_case(CTX, &c, NULL);
      }
  expect_no_failures();
}

/* MEAN is invariant under scaling every class weight: the cross-entropy
 * part is a weighted mean (D scales along), the z-loss part does not see
 * the weights. The old rule (z-loss over D) fails this by the scale. */
static void test_weight_scale_invariance(void **state) {
  static const double scales[] = {0.05, 8.0};
  for (int real = 0; real < 2; ++real) {
    kept base = {0};
    sem_case c = all_on(TT_F32, OSFT_FLCE_MEAN);
    c.real_ignore = real;
    test_seed("test_weight_scale_invariance");
    run_case(CTX, &c, &base);
    expect_no_failures();
    for (size_t s = 0; s < sizeof scales / sizeof scales[0]; ++s) {
      kept other = {0};
      c.cw_scale = scales[s];
      test_seed("test_weight_scale_invariance"); /* the same inputs */
      run_case(CTX, &c, &other);
      expect_no_failures();
      char name[64];
      snprintf(name, sizeof name, "weights x %g vs x 1, ignore %s", scales[s],
               real ? "class" : "-100");
      /* the library against itself: fp32 rounding of the scaled weights */
      double diff = fabs(other.loss[0] - base.loss[0]) / fabs(base.loss[0]);
      diff = fmax(diff, fabs(other.z[0] - base.z[0]) / fabs(base.z[0]));
      diff = fmax(diff, rel_max_err(other.dx, base.dx, M * H, 1e-6));
      diff = fmax(diff, rel_max_err(other.dw, base.dw, V * H, 1e-6));
      diff = fmax(diff, rel_max_err(other.db, base.db, V, 1e-6));
      if (!(diff <= 1e-4)) fail_msg("%s: relative difference %.3g > 1e-4", name, diff);
      free_kept(&other);
    }
    free_kept(&base);
  }
}

int main(void) {
  if (!tt_device_present()) return OSFT_TEST_SKIP;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_grid_fp32_mean, tt_setup, tt_teardown),
      cmocka_unit_test_setup_teardown(test_grid_fp32_sum, tt_setup, tt_teardown),
      cmocka_unit_test_setup_teardown(test_grid_fp32_none, tt_setup, tt_teardown),
      cmocka_unit_test_setup_teardown(test_grid_bf16_mean, tt_setup, tt_teardown),
      cmocka_unit_test_setup_teardown(test_grid_bf16_sum, tt_setup, tt_teardown),
      cmocka_unit_test_setup_teardown(test_grid_bf16_none, tt_setup, tt_teardown),
      cmocka_unit_test_setup_teardown(test_zero_weight_targets, tt_setup, tt_teardown),
      cmocka_unit_test_setup_teardown(test_all_ignored, tt_setup, tt_teardown),
      cmocka_unit_test_setup_teardown(test_weight_scale_invariance, tt_setup,
                                      tt_teardown),
  };
  return cmocka_run_group_tests_name("flce_semantics", tests, NULL, NULL);
}
