/* Factorized linear layer shapes: several leading dims, padded rows,
 * mixed precision, caller-owned factors, and the strategy the cost model
 * chooses.
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

/* ------------------------------------------------- caller-owned factors */

/* The shapes of the caller-owned factors below: r + l < min(n, kin), which
 * is allowed. */
enum { CF_N = 10, CF_KIN = 7, CF_R = 3, CF_L = 3 };

/* One U (n x 6), one V^T (6 x kin), one S in `all` (u, s, v); the high and
 * low factors are views into them. */
static void caller_fused_views(DLTensor views[6], tt *all[3]) {
  const int64_t n = CF_N, kin = CF_KIN, r = CF_R, l = CF_L;
  tt *u_all = mat(TT_F32, n, r + l);
  tt *v_all = mat(TT_F32, r + l, kin);
  tt *s_all = vec(TT_F32, r + l);
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
  all[0] = u_all;
  all[1] = s_all;
  all[2] = v_all;
}

/* Six separate tensors in `all` (padded rows too), viewed whole. */
static void caller_separate_tensors(DLTensor views[6], tt *all[6]) {
  const int64_t n = CF_N, kin = CF_KIN, r = CF_R, l = CF_L;
  tt *uh = tt_new_padded(TT_F32, n, r, r + 2); /* padded rows too */
  tt *ul = mat(TT_F32, n, l);
  tt *vh = mat(TT_F32, r, kin);
  tt *vl = tt_new_padded(TT_F32, l, kin, kin + 3);
  tt *sh = vec(TT_F32, r);
  tt *sl = vec(TT_F32, l);
  tt *each[6] = {uh, sh, vh, ul, sl, vl};
  for (int i = 0; i < 6; ++i) {
    tt_random(each[i], i % 3 == 1 ? 0.5 : -1, i % 3 == 1 ? 2 : 1);
    views[i] = each[i]->t;
  }
  for (int i = 0; i < 6; ++i) all[i] = each[i];
}

/* Under each strategy: forward and backward of the layer over caller
 * factors against the float64 reference R of them. */
static void check_caller_layer(osft_flinear_t layer, const ref_layer *R) {
  const int64_t n = CF_N, kin = CF_KIN, l = CF_L;
  for (int st = OSFT_FLINEAR_FACTORIZED; st <= OSFT_FLINEAR_HYBRID; ++st) {
    assert_ok(osft_flinear_set_strategy(layer, (osft_flinear_strategy_t)st));
    tt *x = mat(TT_F32, 5, kin), *y = mat(TT_F32, 5, n), *g = mat(TT_F32, 5, n);
    tt *dx = mat(TT_F32, 5, kin), *du = mat(TT_F32, n, l), *ds = vec(TT_F32, l);
    tt *dv = mat(TT_F32, l, kin);
    tt_random(x, -1, 1);
    tt_random(g, -1, 1);
    tt_poison(y);
    assert_ok(osft_flinear_forward(layer, &x->t, NULL, &y->t));
    double *xd = tt_get(x), *gd = tt_get(g), *yr = ref_forward(R, xd, NULL, 5);
    expect_close("caller factors forward", y, yr, 2e-4);
    osft_flinear_grads_t gr = grads_of(dx, du, ds, dv, NULL);
    tt_poison(dx);
    tt_poison(du);
    tt_poison(ds);
    tt_poison(dv);
    assert_ok(osft_flinear_backward(layer, &x->t, &g->t, &gr));
    ref_grads rg = ref_backward(R, xd, gd, 5);
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
}

static void caller_factors_case(osft_context_t ctx, int fused) {
  test_seed(fused ? "caller fused" : "caller separate");
  tt *all[6] = {NULL};
  DLTensor views[6];
  if (fused)
    caller_fused_views(views, all);
  else
    caller_separate_tensors(views, all);
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
  assert_int_equal(R.r, CF_R);
  assert_int_equal(R.l, CF_L);
  check_caller_layer(layer, &R);
  ref_free(&R);
  assert_ok(osft_flinear_destroy(layer));
  for (int i = 0; i < 6; ++i) tt_free(all[i]);
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
  assert_ok(osft_flinear_set_strategy(layer, OSFT_FLINEAR_HYBRID));
  assert_ok(osft_flinear_choose_strategy(layer, 100000, OSFT_FLINEAR_BACKWARD, &s));
  assert_int_equal(s, OSFT_FLINEAR_HYBRID);
  assert_ok(osft_flinear_destroy(layer));
  /* frozen ratio 0.9 (l = 6 of 64): the backward's factor gradients from
   * the factors (hybrid), the forward dense */
  layer = decompose(CTX, w, 0.9, OSFT_FLINEAR_AUTO);
  assert_ok(osft_flinear_choose_strategy(layer, 100000, OSFT_FLINEAR_BACKWARD, &s));
  assert_int_equal(s, OSFT_FLINEAR_HYBRID);
  assert_ok(osft_flinear_choose_strategy(layer, 100000, OSFT_FLINEAR_FORWARD, &s));
  assert_int_equal(s, OSFT_FLINEAR_DENSE);
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

int main(void) {
  if (!tt_device_present()) return OSFT_TEST_SKIP;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_leading_dims_padding_mixed, tt_setup,
                                      tt_teardown),
      cmocka_unit_test_setup_teardown(test_caller_owned_factors, tt_setup, tt_teardown),
      cmocka_unit_test_setup_teardown(test_strategy_choice, tt_setup, tt_teardown),
  };
  return cmocka_run_group_tests_name("flinear_shapes", tests, NULL, NULL);
}
