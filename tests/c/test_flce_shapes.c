/* Fused linear cross-entropy shapes: odd shapes, chunk sizes that do not
 * divide the rows, fp32 and bf16, every target ignored, no tokens, leading
 * dims, padded rows and a 1-D x.
 *
 * Built twice: for the CPU, and with OSFT_TEST_CUDA for a GPU (skipped where
 * none is present). The float64 reference and the case helpers are in
 * flce_testlib.h. */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_tensors.h"
#include "test_util.h"

#include "flce_testlib.h"
#include "test_fixture.h"

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
  osft_flce_options_t o;
  assert_ok(OSFT_FLCE_OPTIONS_INIT(&o));
  flce_test_plan_options(&o, v);
  osft_flce_t f = NULL;
  assert_ok(osft_flce_create(CTX, &o, &f));
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

int main(void) {
  if (!tt_device_present()) return OSFT_TEST_SKIP;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_shapes_chunks_reductions, tt_setup,
                                      tt_teardown),
      cmocka_unit_test_setup_teardown(test_all_ignored_and_empty, tt_setup, tt_teardown),
      cmocka_unit_test_setup_teardown(test_leading_dims_and_padding, tt_setup,
                                      tt_teardown),
  };
  return cmocka_run_group_tests_name("flce_shapes", tests, NULL, NULL);
}
