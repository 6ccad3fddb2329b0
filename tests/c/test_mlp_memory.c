/* Tiled MLP memory: a tiled call holds one tile's intermediates, a workspace
 * limit below a layer's scratch fails before anything is written, and every
 * byte taken from the context's allocator comes back.
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

/* Every byte is returned (an MLP with a layer keeps its tile buffers in the
 * context's outer workspace, which osft_context_release_workspace frees),
 * and nothing else is kept between calls; a context with a live MLP refuses
 * to go. */
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
  tt_expect_all_returned(&a);
}

typedef struct {
  cfg c;
  int pass; /* 0 forward, 1 backward */
} refusal_case;

/* A tt_refused_call (test_tensors.h) of one first forward or backward,
 * accumulating into random gradients. */
static void refused_pass(void *user, osft_context_t ctx, test_alloc_state *a, int device,
                         long granted) {
  const cfg c = ((const refusal_case *)user)->c;
  const int pass = ((const refusal_case *)user)->pass;
  fixture *f = fx_new(ctx, c);
  for (int p = 0; p < 3; ++p)
    if (is_layer(f, p))
      assert_ok(osft_flinear_set_strategy(f->layer[p], OSFT_FLINEAR_FACTORIZED));
  const int64_t lead[1] = {24};
  tt *x = activations(f, 2, lead), *gy = activations(f, 2, lead);
  tt *y = tt_new(c.dtype, 2, x->shape);
  grads G;
  grads_new(f, x, &G);
  G.g.accumulate = OSFT_MLP_ACCUMULATE_ALL;
  for (int p = 0; p < 3; ++p) G.fg[p].accumulate = OSFT_FLINEAR_ACCUMULATE_ALL;
  snapshot snap;
  snapshot_take(&snap, y, &G);
  double *prior[SLOTS] = {NULL};
  tt *slot[SLOTS];
  grad_slots(&G, slot);
  for (int i = 0; i < SLOTS; ++i) prior[i] = slot[i] ? tt_get(slot[i]) : NULL;
  double *xd = tt_get(x), *gyd = tt_get(gy);
  ref_out o = ref_run(&f->R, xd, gyd, 24);

  test_alloc_refuse(a, device, granted);
  const osft_status_t st = pass == 0 ? osft_mlp_forward(f->mlp, &x->t, &y->t, 3)
                                     : osft_mlp_backward(f->mlp, &x->t, &gy->t, &G.g, 3);
  if (st != OSFT_STATUS_SUCCESS) {
    assert_int_equal(st, OSFT_STATUS_OUT_OF_MEMORY);
    snapshot_expect_untouched(&snap);
  } else {
    tt_snapshot_release(&snap);
    if (pass == 0)
      expect_close("y after refusals", y, o.y, tol_for(c.dtype));
    else
      expect_grads(f, &G, &o, prior, "gradients after refusals");
  }
  for (int i = 0; i < SLOTS; ++i) free(prior[i]);
  ref_out_free(&o);
  free(xd);
  free(gyd);
  grads_free(&G);
  tt_free(x);
  tt_free(gy);
  tt_free(y);
  fx_free(f);
}

/* Every allocation of a first call refused in turn (and all after it). */
static void test_every_refusal_is_clean(void **state) {
  (void)state;
  cfg cs[2] = {base_cfg(OSFT_MLP_SWIGLU, TT_BF16), base_cfg(OSFT_MLP_SWIGLU, TT_F32)};
  cs[0].layers = 1 << UP;
  cs[0].fdtype = TT_BF16;
  cs[0].gdtype = TT_BF16;
  cs[0].bias = 1;
  cs[1].layers = (1 << GATE) | (1 << DOWN);
  for (int i = 0; i < 2; ++i) {
    test_seed(i ? "refusals fp32" : "refusals bf16");
    for (int pass = 0; pass < 2; ++pass) {
      refusal_case rc = {cs[i], pass};
      tt_refusal_sweep(refused_pass, &rc);
    }
  }
}

int main(void) {
  if (!tt_device_present()) return OSFT_TEST_SKIP;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_memory_is_one_tile, tt_setup_quiet,
                                      tt_teardown_quiet),
      cmocka_unit_test(test_workspace_limit_fails_before_writing),
      cmocka_unit_test(test_memory_is_returned),
      cmocka_unit_test(test_every_refusal_is_clean),
  };
  return cmocka_run_group_tests_name("mlp_memory", tests, NULL, NULL);
}
