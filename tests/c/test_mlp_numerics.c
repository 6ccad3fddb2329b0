/* Tiled MLP numerics: forward and backward over tiles against the untiled
 * float64 reference, for every variant with and without biases, accumulation,
 * factorized (OSFT) projections, the sum-over-tiles property of the weight
 * gradients, and large pre-activations.
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

/* ---------------------------------------------------------------- tests */

/* Every variant, biases off and on, fp32: tile counts 1, 2, 7 and the
 * automatic rule on a batch of two sequences of 15 tokens (30 rows: 7 tiles
 * of 4 or 5 tokens do not divide it). */
static void test_every_variant_fp32(void **state) {
  for (int v = 0; v < N_VARIANTS; ++v)
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
  /* every layer forced to each strategy (the MLP reserves each one's
   * scratch up front: a layer growing the workspace would log a warning,
   * which fails this quiet test) */
  const osft_flinear_strategy_t forced[3] = {OSFT_FLINEAR_FACTORIZED, OSFT_FLINEAR_DENSE,
                                             OSFT_FLINEAR_HYBRID};
  for (int st = 0; st < 3; ++st)
    for (int ad = 0; ad < 2; ++ad) {
      test_seed("layers forced");
      cfg c = base_cfg(OSFT_MLP_SWIGLU, ad ? TT_BF16 : TT_F32);
      c.layers = 7;
      c.fdtype = c.dtype;
      fixture *f = fx_new(CTX, c);
      for (int p = 0; p < 3; ++p)
        assert_ok(osft_flinear_set_strategy(f->layer[p], forced[st]));
      const int64_t lead[1] = {9};
      char label[96];
      snprintf(label, sizeof label, "layers forced to strategy %d, %s", (int)forced[st],
               ad ? "bf16" : "fp32");
      check_pass(f, 2, lead, 1, 0, label);
      check_pass(f, 2, lead, 3, 0, label);
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

/* Pre-activations of a few units (where gelu_tanh's polynomial matters)
 * and large ones (|z| well beyond 10: saturated, finite, exact). */
static void test_large_inputs(void **state) {
  for (int v = 0; v < 2 * N_VARIANTS; ++v) {
    const double scale = v < N_VARIANTS ? 6.0 : 60.0;
    test_seed("large");
    cfg c = base_cfg(kVariants[v % N_VARIANTS], TT_F32);
    fixture *f = fx_new(CTX, c);
    const int64_t m = 6;
    const int64_t lead[1] = {m};
    tt *x = activations(f, 2, lead), *gy = activations(f, 2, lead);
    double *xd = tt_get(x);
    for (int64_t i = 0; i < m * c.H; ++i) xd[i] *= scale;
    tt_set(x, xd);
    free(xd);
    char label[64];
    snprintf(label, sizeof label, "inputs x%g, variant %d", scale,
             (int)kVariants[v % N_VARIANTS]);
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

/* The MLP over options with a budget of `budget` bytes (TILING_BUDGET). */
static void use_budget(osft_context_t ctx, fixture *f, size_t budget) {
  assert_ok(osft_mlp_destroy(f->mlp));
  osft_mlp_options_t o;
  assert_ok(OSFT_MLP_OPTIONS_INIT(&o));
  o.dtype = dl_dtype(f->c.dtype);
  o.tiling = OSFT_MLP_TILING_BUDGET;
  o.memory_budget = budget;
  assert_ok(create_mlp(ctx, f, &o));
}

static uint64_t in_use(osft_context_t ctx) {
  osft_memory_stats_t st;
  memset(&st, 0, sizeof st);
  st.struct_size = sizeof st;
  assert_ok(osft_context_get_memory_stats(ctx, &st));
  return tt_device() == OSFT_DEVICE_CPU ? st.host_in_use : st.device_in_use;
}

/* Forward on x, backward on bx (x itself, another buffer, or x changed in
 * place), gradients against the reference of bx. */
static void forward_then_backward(fixture *f, tt *x, tt *bx, int64_t m, int64_t tiles,
                                  const char *label) {
  tt *gy = activations(f, 2, (int64_t[1]){m}), *y = tt_new(f->c.dtype, 2, x->shape);
  assert_ok(osft_mlp_forward(f->mlp, &x->t, &y->t, tiles));
  if (bx == x && tt_device() == OSFT_DEVICE_CPU) { /* x changed in place */
    double *xd = tt_get(x);
    xd[0] += 0.5;
    tt_set(x, xd);
    free(xd);
  }
  double *xd = tt_get(bx), *gyd = tt_get(gy);
  ref_out o = ref_run(&f->R, xd, gyd, m);
  grads G;
  grads_new(f, bx, &G);
  tt *slot[SLOTS];
  grad_slots(&G, slot);
  for (int i = 0; i < SLOTS; ++i)
    if (slot[i]) tt_poison(slot[i]);
  assert_ok(osft_mlp_backward(f->mlp, &bx->t, &gy->t, &G.g, tiles));
  expect_grads(f, &G, &o, NULL, label);
  grads_free(&G);
  ref_out_free(&o);
  free(xd);
  free(gyd);
  tt_free(gy);
  tt_free(y);
}

/* A budget that holds every tile's intermediates: the plan reports no
 * recompute, the forward keeps G and U (the context's memory in use grows
 * by the reported bytes until the backward frees them), and the gradients
 * match the reference; a backward on another x, or (CPU) on x changed in
 * place, recomputes and matches too. Below that budget: recompute. */
static void test_budget_holding_every_tile_drops_the_recompute(void **state) {
  const struct {
    osft_mlp_variant_t v;
    int layers;
    tt_dtype d;
  } cases[4] = {{OSFT_MLP_SWIGLU, 0, TT_F32},
                {OSFT_MLP_SWIGLU, 7, TT_F32},
                {OSFT_MLP_GELU_TANH, 0, TT_F32},
                {OSFT_MLP_SWIGLU, 1 << UP, TT_BF16}};
  for (int ci = 0; ci < 4; ++ci) {
    test_seed("kept forward");
    cfg c = base_cfg(cases[ci].v, cases[ci].d);
    c.bias = 1;
    c.layers = cases[ci].layers;
    c.fdtype = cases[ci].d;
    fixture *f = fx_new(CTX, c);
    const int64_t m = 29;
    const size_t e = cases[ci].d == TT_BF16 ? 2 : 4;
    const size_t kept = (size_t)(m * c.I) * e * (variant_gated(c.variant) ? 2 : 1);
    use_budget(CTX, f, (size_t)1 << 26);
    osft_mlp_plan_t plan;
    memset(&plan, 0xff, sizeof plan);
    plan.struct_size = sizeof plan;
    assert_ok(osft_mlp_get_plan(f->mlp, m, 0, &plan));
    assert_int_equal(plan.recompute, 0);
    assert_int_equal(plan.kept_bytes, kept);
    assert_int_equal(plan.num_tiles, 1);
    char label[96];
    for (int64_t tiles = 0; tiles <= 3; tiles += 3) {
      snprintf(label, sizeof label, "kept, case %d, tiles %lld", ci, (long long)tiles);
      check_pass(f, 2, (int64_t[1]){m}, tiles, 0, label);
      /* the forward keeps exactly what the plan says, the backward frees it */
      tt *x = activations(f, 2, (int64_t[1]){m}), *y = tt_new(c.dtype, 2, x->shape);
      const uint64_t base = in_use(CTX);
      assert_ok(osft_mlp_forward(f->mlp, &x->t, &y->t, tiles));
      assert_int_equal(in_use(CTX) - base >= kept, 1);
      tt_free(y);
      snprintf(label, sizeof label, "kept, other x, case %d", ci);
      tt *x2 = activations(f, 2, (int64_t[1]){m});
      forward_then_backward(f, x, x2, m, tiles, label);
      snprintf(label, sizeof label, "kept, x changed in place, case %d", ci);
      forward_then_backward(f, x, x, m, tiles, label);
      tt_free(x);
      tt_free(x2);
    }
    /* a budget below every tile's intermediates: recompute, nothing kept */
    use_budget(CTX, f, kept / 4);
    assert_ok(osft_mlp_get_plan(f->mlp, m, 0, &plan));
    assert_int_equal(plan.recompute, 1);
    assert_int_equal(plan.kept_bytes, 0);
    check_pass(f, 2, (int64_t[1]){m}, 0, 0, "budget below every tile");
    fx_free(f);
  }
  /* refusals */
  test_seed("plan refusals");
  fixture *f = fx_new(CTX, base_cfg(OSFT_MLP_SWIGLU, TT_F32));
  osft_mlp_plan_t plan;
  plan.struct_size = 8;
  assert_status(osft_mlp_get_plan(f->mlp, 4, 0, &plan), OSFT_STATUS_INVALID_STRUCT_SIZE);
  plan.struct_size = sizeof plan;
  assert_status(osft_mlp_get_plan(f->mlp, -1, 0, &plan), OSFT_STATUS_INVALID_ARGUMENT);
  assert_status(osft_mlp_get_plan(f->mlp, 4, -1, &plan), OSFT_STATUS_INVALID_ARGUMENT);
  assert_status(osft_mlp_get_plan(f->mlp, 4, 0, NULL), OSFT_STATUS_INVALID_ARGUMENT);
  assert_ok(osft_mlp_get_plan(f->mlp, 4, 0, &plan));
  assert_int_equal(plan.recompute, 1); /* AUTO tiling: never kept */
  fx_free(f);
}

int main(void) {
  if (!tt_device_present()) return OSFT_TEST_SKIP;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_every_variant_fp32, tt_setup_quiet,
                                      tt_teardown_quiet),
      cmocka_unit_test_setup_teardown(test_accumulate, tt_setup_quiet, tt_teardown_quiet),
      cmocka_unit_test_setup_teardown(test_layer_projections, tt_setup_quiet,
                                      tt_teardown_quiet),
      cmocka_unit_test_setup_teardown(test_gradients_are_the_sum_over_tiles,
                                      tt_setup_quiet, tt_teardown_quiet),
      cmocka_unit_test_setup_teardown(test_budget_holding_every_tile_drops_the_recompute,
                                      tt_setup_quiet, tt_teardown_quiet),
      cmocka_unit_test_setup_teardown(test_large_inputs, tt_setup_quiet,
                                      tt_teardown_quiet),
  };
  return cmocka_run_group_tests_name("mlp_numerics", tests, NULL, NULL);
}
