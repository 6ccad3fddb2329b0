/* Fused linear cross-entropy: the vocabulary plan (tiles of tokens x
 * vocabulary slices, two passes). Which plan the planner takes at which
 * budget, odd tilings against the float64 reference (V not a multiple of
 * the slice, one row, one slice, one class per slice, token tiles and
 * slices together, with every option), the two plans against each other,
 * the scratch within the budget (also below one token row, where only this
 * plan fits), and its counts: grad_W written once per token tile, no V x H
 * accumulator.
 *
 * Built twice: for the CPU, and with OSFT_TEST_CUDA for a GPU (skipped where
 * none is present). Every other FLCE numerics test also runs through this
 * plan (the `_vocab` ctest entries, tests/c/flce_test_plan.h). */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_tensors.h"
#include "test_util.h"

#include "flce_testlib.h"
#include "test_fixture.h"

/* A case through the vocabulary plan with `slice` classes per slice. */
static flce_case vocab_case(int64_t m, int64_t h, int64_t v, tt_dtype dt, int64_t slice) {
  flce_case c = base_case(m, h, v, dt);
  c.chunking = OSFT_FLCE_CHUNKING_VOCAB;
  c.slice_cols = slice;
  return c;
}

/* The plan of a case on its own context (nothing computed). */
static osft_flce_plan_t plan_of(const flce_case *c, osft_status_t expect) {
  test_seed("plan");
  flce_tensors T = make_tensors(c);
  osft_flce_inputs_t in;
  osft_flce_outputs_t out;
  flce_bind(c, &T, &in, &out);
  osft_context_t ctx = tt_context(NULL);
  osft_flce_t f = make_flce(ctx, c);
  osft_flce_plan_t p;
  memset(&p, 0, sizeof p);
  p.struct_size = sizeof p;
  assert_status(osft_flce_get_plan(f, &in, &out, &p), expect);
  assert_ok(osft_flce_destroy(f));
  assert_ok(osft_context_destroy(ctx));
  free_tensors(&T);
  return p;
}

/* The planner's choice. At a budget that holds all M x V logits (one
 * chunk) the token plan; with room for only a few token rows of a large
 * vocabulary (every chunk a read-modify-write of V x H), the vocabulary
 * plan, in tiles of all M rows; a caller may force either, and the plan
 * reports what it took. */
static void test_plan_choice(void **state) {
  (void)state;
  flce_case c = base_case(512, 256, 16000, TT_F32);
  c.chunking = OSFT_FLCE_CHUNKING_AUTO; /* whatever the test run's plan */
  c.slice_cols = 0;
  c.want = WANT_LOSS | WANT_DX | WANT_DW;
  const size_t row = 4 * 16000;
  c.budget = 2 * 512 * row;
  osft_flce_plan_t p = plan_of(&c, OSFT_STATUS_SUCCESS);
  assert_int_equal(p.chunking, OSFT_FLCE_CHUNKING_TOKENS);
  assert_int_equal(p.chunks, 1);
  assert_int_equal(p.slices, 1);
  assert_int_equal(p.slice_cols, 16000);

  /* 8 token rows of logits (64 chunks) */
  c.budget = 8 * row + 16 * 512 + 4096;
  p = plan_of(&c, OSFT_STATUS_SUCCESS);
  assert_int_equal(p.chunking, OSFT_FLCE_CHUNKING_VOCAB);
  assert_true(p.scratch_bytes <= c.budget);
  assert_true(p.slices > 1);
  assert_true(p.slices * p.slice_cols >= 16000 && (p.slices - 1) * p.slice_cols < 16000);
  assert_true(p.chunks * p.chunk_rows >= 512 && (p.chunks - 1) * p.chunk_rows < 512);
  assert_true(p.chunk_rows > 8); /* taller tiles than the 8-row chunks */

  c.chunking = OSFT_FLCE_CHUNKING_TOKENS;
  p = plan_of(&c, OSFT_STATUS_SUCCESS);
  assert_int_equal(p.chunking, OSFT_FLCE_CHUNKING_TOKENS);
  assert_true(p.chunk_rows <= 8 && p.chunks >= 64);
  assert_int_equal(p.slices, 1);

  /* forced at a budget that holds all M x V logits: one slice of all V, one
   * tile (the default budget holds 512 token rows and a tile's records) */
  c.chunking = OSFT_FLCE_CHUNKING_VOCAB;
  c.budget = 2 * 512 * row;
  p = plan_of(&c, OSFT_STATUS_SUCCESS);
  assert_int_equal(p.chunking, OSFT_FLCE_CHUNKING_VOCAB);
  assert_int_equal(p.slices, 1);
  assert_int_equal(p.chunks, 1);
  /* the caller's slice width and token rows */
  c.slice_cols = 1000;
  c.chunk_rows = 100;
  p = plan_of(&c, OSFT_STATUS_SUCCESS);
  assert_int_equal(p.slice_cols, 1000);
  assert_int_equal(p.slices, 16);
  assert_int_equal(p.chunk_rows, 100);
  assert_int_equal(p.chunks, 6);

  /* a budget below one token row: only the vocabulary plan fits */
  c = base_case(64, 32, 5000, TT_F32);
  c.chunking = OSFT_FLCE_CHUNKING_AUTO;
  c.slice_cols = 0;
  c.budget = 4 * 5000 / 2 + 16 * 64 + 4096;
  p = plan_of(&c, OSFT_STATUS_SUCCESS);
  assert_int_equal(p.chunking, OSFT_FLCE_CHUNKING_VOCAB);
  assert_true(p.scratch_bytes <= c.budget);
  c.chunking = OSFT_FLCE_CHUNKING_TOKENS;
  plan_of(&c, OSFT_STATUS_OUT_OF_MEMORY);
  assert_error_mentions("memory_budget");
  /* below one tile of one row and 16 classes: nothing fits */
  c.chunking = OSFT_FLCE_CHUNKING_AUTO;
  c.budget = 16 * 64;
  plan_of(&c, OSFT_STATUS_OUT_OF_MEMORY);
  assert_error_mentions("memory_budget");
}

/* Odd tilings with every option, fp32 and bf16, each reduction: V not a
 * multiple of the slice, one class per slice, one slice of all V, one
 * row, token tiles and slices together (also accumulating into existing
 * gradients, bf16 gradients with either accumulator). */
static void test_odd_tilings(void **state) {
  /* m, h, v, slice cols, chunk rows */
  static const int64_t shapes[6][5] = {{61, 12, 37, 16, 0}, {9, 5, 5, 1, 0},
                                       {23, 7, 40, 40, 0},  {1, 6, 29, 8, 0},
                                       {70, 9, 41, 13, 32}, {33, 16, 100, 64, 8}};
  for (int s = 0; s < 6; ++s)
    for (int d = 0; d < 2; ++d)
      for (int red = 0; red < 3; ++red) {
        flce_case c = vocab_case(shapes[s][0], shapes[s][1], shapes[s][2],
                                 d ? TT_BF16 : TT_F32, shapes[s][3]);
        c.chunk_rows = shapes[s][4];
        c.reduction = (osft_flce_reduction_t)red;
        c.bias = 1;
        c.bias_dtype = d && s % 2 ? TT_BF16 : TT_F32;
        c.class_weights = s % 2;
        c.smoothing = 0.1;
        c.z_scale = 0.01;
        c.softcap = s % 3 == 0 ? 2.0 : 0.0;
        c.upstream = red != 1;
        c.ignored = s == 3 ? 0.0 : 0.2;
        c.grad_b_dtype = c.dtype;
        c.accumulate = red == 1 ? OSFT_FLCE_ACCUMULATE_ALL : 0;
        c.accumulator = (osft_flce_accumulator_t)(s % 2);
        c.target_dtype = s % 2 ? TT_I32 : TT_I64;
        run_case(CTX, &c);
      }
}

/* The outputs of one call through `chunking` on fresh tensors from the same
 * seed, as doubles (loss, z, token loss, dx, dw, db). */
static void outputs_of(osft_context_t ctx, const flce_case *c,
                       osft_flce_chunking_t chunking, double *out[6]) {
  flce_case k = *c;
  k.chunking = chunking;
  test_seed("both plans");
  flce_tensors T = make_tensors(&k);
  osft_flce_t f = make_flce(ctx, &k);
  osft_flce_inputs_t in;
  osft_flce_outputs_t o;
  flce_bind(&k, &T, &in, &o);
  expect_plan(f, &k, &in, &o, "both plans");
  assert_ok(osft_flce_compute(f, &in, &o));
  tt *const t[6] = {T.loss, T.z, T.tok, T.dx, T.dw, T.db};
  for (int i = 0; i < 6; ++i) out[i] = tt_get(t[i]);
  assert_ok(osft_flce_destroy(f));
  free_tensors(&T);
}

/* The two plans give the same numbers up to fp32 rounding (the vocabulary
 * plan combines the row statistics per slice, in fp32): far closer to each
 * other than either is to the float64 reference's tolerance. */
static void test_plans_agree(void **state) {
  for (int red = 0; red < 3; ++red) {
    flce_case c = vocab_case(50, 24, 301, TT_F32, 64);
    c.reduction = (osft_flce_reduction_t)red;
    c.bias = 1;
    c.class_weights = 1;
    c.smoothing = 0.05;
    c.z_scale = 1e-3;
    c.softcap = 15.0;
    c.chunk_rows = red == 2 ? 16 : 0;
    double *tok[6], *voc[6];
    outputs_of(CTX, &c, OSFT_FLCE_CHUNKING_TOKENS, tok);
    outputs_of(CTX, &c, OSFT_FLCE_CHUNKING_VOCAB, voc);
    const int per_token = red == OSFT_FLCE_NONE;
    const int64_t n[6] = {per_token ? c.m : 1, per_token ? c.m : 1, c.m,
                          c.m * c.h,           c.v * c.h,           c.v};
    static const char *names[6] = {"loss",   "z_loss",      "token_loss",
                                   "grad_x", "grad_weight", "grad_bias"};
    for (int i = 0; i < 6; ++i) {
      const double err = rel_max_err(voc[i], tok[i], (size_t)n[i], 1e-6);
      if (!(err <= 2e-6))
        fail_msg("%s (reduction %d): the plans differ by %.3g", names[i], red, err);
      free(tok[i]);
      free(voc[i]);
    }
  }
}

/* Budget-driven tiles: what the call takes stays within the budget, is what
 * the plan said, and the results match the reference; fp32 and bf16 (a
 * bf16 grad_x summed over the slices in fp32 scratch). */
static void test_scratch_within_budget(void **state) {
  (void)state;
  for (int d = 0; d < 2; ++d) {
    /* bf16 adds x widened, grad_x's fp32 sum and W's slice widened */
    const size_t budgets[3] = {(d ? 40 : 16) * 1024, (d ? 64 : 24) * 1024, 96 * 1024};
    for (int b = 0; b < 3; ++b) {
      flce_case c = vocab_case(96, 20, 700, d ? TT_BF16 : TT_F32, 0);
      c.budget = budgets[b];
      c.bias = 1;
      c.grad_b_dtype = c.dtype;
      test_seed("budget");
      flce_tensors T = make_tensors(&c);
      osft_flce_inputs_t in;
      osft_flce_outputs_t out;
      flce_bind(&c, &T, &in, &out);
      osft_context_t ctx = tt_context(NULL);
      osft_flce_t f = make_flce(ctx, &c);
      osft_flce_plan_t p;
      p.struct_size = sizeof p;
      assert_ok(osft_flce_get_plan(f, &in, &out, &p));
      assert_int_equal(p.chunking, OSFT_FLCE_CHUNKING_VOCAB);
      assert_true(p.slices > 1);
      assert_true(p.scratch_bytes <= budgets[b]);
      assert_ok(osft_flce_compute(f, &in, &out));
      osft_memory_stats_t st;
      st.struct_size = sizeof st;
      assert_ok(osft_context_get_memory_stats(ctx, &st));
      assert_int_equal(st.workspace_bytes, p.scratch_bytes);
      assert_ok(osft_flce_destroy(f));
      run_case(ctx, &c); /* the same plan, against the float64 reference */
      assert_ok(osft_context_destroy(ctx));
      free_tensors(&T);
    }
  }
}

/* What the plan costs, counted: with one token tile grad_W is written once
 * (one V x H pass, no accumulator, W never copied whole), per slice a fixed
 * number of calls (pass 1: GEMM, records, merge; pass 2: GEMM but for the
 * reused last slice, row pass, the grad_x, grad_W GEMMs and the grad_b
 * sum), one wait at most, one allocation; with several token tiles one
 * more read-modify-write of grad_W per tile. */
static void test_counts(void **state) {
  flce_case c = vocab_case(40, 32, 90, TT_F32, 20);
  c.bias = 1;
  c.grad_w_dtype = TT_F32;
  c.grad_b_dtype = TT_F32;
  const flce_counts one = counted_case(CTX, &c);
  assert_int_equal(one.chunks, 1);
  assert_int_equal(one.slices, 5);
  assert_int_equal(one.vh_passes, 1);
  assert_true(one.waits <= 1);
  assert_int_equal(one.allocations, 1);
  assert_int_equal(one.conversions, 0);
  /* prepare, finalize + per slice 3 + 5, less the reused slice's GEMM and the
   * first slice's merge */
  assert_int_equal(one.calls, 2 + 5 * 8 - 2);
  c.chunk_rows = 10;
  const flce_counts four = counted_case(CTX, &c);
  assert_int_equal(four.chunks, 4);
  assert_int_equal(four.vh_passes, 2 * 4 - 1);
  assert_int_equal(four.calls, 2 + 4 * (5 * 8 - 2));
  assert_int_equal(four.allocations, 1);
  /* bf16 x, W and gradients: W widened slice by slice where the GEMMs take
   * no bf16 (never all of W at once), grad_x summed over the slices in fp32 */
  c = vocab_case(40, 32, 90, TT_BF16, 20);
  c.chunk_rows = 0;
  const flce_counts b16 = counted_case(CTX, &c);
  assert_int_equal(b16.slices, 5);
  assert_int_equal(b16.allocations, 1);
  assert_true(b16.waits <= 1);
}

int main(void) {
  if (!tt_device_present()) return OSFT_TEST_SKIP;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_plan_choice),
      cmocka_unit_test_setup_teardown(test_odd_tilings, tt_setup, tt_teardown),
      cmocka_unit_test_setup_teardown(test_plans_agree, tt_setup, tt_teardown),
      cmocka_unit_test(test_scratch_within_budget),
      cmocka_unit_test_setup_teardown(test_counts, tt_setup, tt_teardown),
  };
  return cmocka_run_group_tests_name("flce_vocab", tests, NULL, NULL);
}
