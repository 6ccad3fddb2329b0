/* Factorized linear layer errors: every invalid creation, factor access and
 * call fails with its status and message and writes nothing; layers return
 * all their memory, and a layer whose context is gone says so.
 *
 * Built twice: for the CPU, and with OSFT_TEST_CUDA for a GPU (skipped where
 * none is present). The float64 reference and the layer helpers are in
 * flinear_testlib.h. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_tensors.h"
#include "test_util.h"

#include "flinear_testlib.h"
#include "test_fixture.h"

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

/* forward: wrong K, wrong N, y leading dims, dtype mix, bias size,
 * aliasing, device, layout. */
static void forward_errors(osft_flinear_t layer, const tt *x, tt *y) {
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
  tt *rest[6] = {xk, yn, ym, xb, x64, bias};
  for (int i = 0; i < 6; ++i) tt_free(rest[i]);
}

/* backward: struct size, wrong grad shapes/dtypes, unknown accumulate bits,
 * aliasing between outputs; every output stays bit-identical. */
static void backward_errors(osft_flinear_t layer, tt *x, const tt *g) {
  tt *yn = mat(TT_F32, 5, 9); /* a grad_out of the wrong width */
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
  osft_flinear_grads_t gr = grads_of(dx, du, ds, dv, NULL);
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
  tt *rest[3] = {yn, bad, bfg};
  for (int i = 0; i < 3; ++i) tt_free(rest[i]);
  for (int i = 0; i < 4; ++i) tt_free(outs[i]);
}

/* merge into a wrong shape; queries with invalid arguments. */
static void query_errors(osft_flinear_t layer) {
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
  tt_free(wm);
}

/* Every failing call leaves every output bit-identical. */
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
  forward_errors(layer, x, y);
  expect_untouched(y, y0, ysize);
  backward_errors(layer, x, g);
  query_errors(layer);
  /* a destroyed layer */
  assert_ok(osft_flinear_destroy(layer));
  assert_status(osft_flinear_forward(layer, &x->t, NULL, &y->t),
                OSFT_STATUS_INVALID_HANDLE);
  assert_status(osft_flinear_destroy(layer), OSFT_STATUS_INVALID_HANDLE);
  assert_ok(osft_flinear_destroy(NULL));
  expect_untouched(y, y0, ysize);
  free(y0);
  tt *rest[4] = {w, x, y, g};
  for (int i = 0; i < 4; ++i) tt_free(rest[i]);
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
  tt_expect_all_returned(&a);
  tt_free(w);
  tt_free(x);
  tt_free(y);
}

int main(void) {
  if (!tt_device_present()) return OSFT_TEST_SKIP;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_creation_errors, tt_setup, tt_teardown),
      cmocka_unit_test_setup_teardown(test_factor_errors, tt_setup, tt_teardown),
      cmocka_unit_test_setup_teardown(test_call_errors_write_nothing, tt_setup,
                                      tt_teardown),
      cmocka_unit_test(test_memory_is_returned),
  };
  return cmocka_run_group_tests_name("flinear_errors", tests, NULL, NULL);
}
