/* Tiled MLP shapes: leading dims of any rank, padded rows, more tiles than
 * tokens and zero tokens, partial gradient requests, and the tile-count
 * rules (automatic, fixed size, memory budget, workspace limit).
 *
 * Built twice: for the CPU, and with OSFT_TEST_CUDA for a GPU (skipped where
 * none is present). Helpers (the float64 reference, fixtures, checks) are in
 * mlp_testlib.h; no test may log a warning (tt_setup_quiet). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_tensors.h"
#include "test_util.h"

#include "mlp_testlib.h"
#include "test_fixture.h"

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

int main(void) {
  if (!tt_device_present()) return OSFT_TEST_SKIP;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_shapes_padding_and_edges, tt_setup_quiet,
                                      tt_teardown_quiet),
      cmocka_unit_test_setup_teardown(test_partial_requests, tt_setup_quiet,
                                      tt_teardown_quiet),
      cmocka_unit_test_setup_teardown(test_tile_count, tt_setup_quiet, tt_teardown_quiet),
  };
  return cmocka_run_group_tests_name("mlp_shapes", tests, NULL, NULL);
}
