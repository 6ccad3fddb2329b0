/* Fused linear cross-entropy memory: the budget decides the chunk size and
 * bounds what a call takes, and every block goes back to the context's
 * allocator.
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

/* The budget decides the chunk size; what the call takes stays within it.
 * Token chunks (test_flce_vocab.c plans the vocabulary). */
static void test_budget_and_plan(void **state) {
  flce_case c = base_case(100, 8, 50, TT_F32);
  c.want = WANT_LOSS | WANT_DW;
  c.chunking = OSFT_FLCE_CHUNKING_TOKENS;
  test_seed("budget");
  flce_tensors T = make_tensors(&c);
  osft_flce_inputs_t in;
  osft_flce_outputs_t out;
  flce_bind(&c, &T, &in, &out);
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

/* The default budget's plan of M tokens x H x V, fp32 (no accumulator),
 * with the given chunking. */
static osft_flce_plan_t chunked_default_plan(osft_context_t ctx, int64_t m, int64_t h,
                                             int64_t v, osft_flce_chunking_t chunking) {
  flce_case c = base_case(m, h, v, TT_F32);
  c.want = WANT_LOSS | WANT_DX | WANT_DW;
  c.chunking = chunking;
  c.slice_cols = 0;
  flce_tensors T = make_tensors(&c);
  osft_flce_inputs_t in;
  osft_flce_outputs_t out;
  flce_bind(&c, &T, &in, &out);
  osft_flce_t f = make_flce(ctx, &c);
  osft_flce_plan_t p;
  memset(&p, 0, sizeof p);
  p.struct_size = sizeof p;
  assert_ok(osft_flce_get_plan(f, &in, &out, &p));
  assert_true(p.scratch_bytes <= p.budget_bytes);
  assert_ok(osft_flce_destroy(f));
  free_tensors(&T);
  return p;
}

/* The same with token chunks forced. */
static osft_flce_plan_t default_plan(osft_context_t ctx, int64_t m, int64_t h,
                                     int64_t v) {
  return chunked_default_plan(ctx, m, h, v, OSFT_FLCE_CHUNKING_TOKENS);
}

/* The default budget grows no faster than x. On CUDA: chunk logits of at
 * most 4 x x's elements (16 M H bytes), above a floor of 512 token rows:
 * quadrupling the tokens quadruples the chunk buffers, not the whole M x V
 * logits as the former default (the fixed part + 1 GiB) did below 1 GiB.
 * On the CPU (since issue 55) that, but where the logits may stay in
 * grad_weight at most 32 x x's bytes or 8 MiB, whichever is larger
 * (test_flce_default.c covers the plans). */
static void test_default_budget_follows_x(void **state) {
  const int64_t h = 128, v = 8000;
#ifndef OSFT_TEST_CUDA
  const size_t row = 4 * 8000;
  const int64_t ms[3] = {512, 8192, 32768};
  for (int i = 0; i < 3; ++i) {
    const size_t m = (size_t)ms[i];
    size_t former = 16 * m * (size_t)h; /* the 1.3.0 default's */
    if (former < 512 * row) former = 512 * row;
    size_t small = 32 * 4 * m * (size_t)h;
    if (small < ((size_t)8 << 20)) small = (size_t)8 << 20;
    /* automatic chunking (the logits may stay in grad_weight): capped */
    const size_t chunk = small < former ? small : former;
    const osft_flce_plan_t q =
        chunked_default_plan(CTX, ms[i], h, v, OSFT_FLCE_CHUNKING_AUTO);
    assert_true(q.budget_bytes >= chunk);
    assert_true(q.budget_bytes <= chunk + 16 * m + 4096);
    assert_true(q.chunks * q.chunk_rows >= ms[i]);
    /* token chunks forced: the 1.3.0 default's */
    const osft_flce_plan_t t = default_plan(CTX, ms[i], h, v);
    assert_true(t.budget_bytes >= former);
    assert_true(t.budget_bytes <= former + 16 * m + 4096);
    assert_true(t.chunk_rows * row <= t.budget_bytes);
    assert_int_equal(t.chunks, i == 0 ? 1 : (ms[i] + t.chunk_rows - 1) / t.chunk_rows);
  }
  (void)state;
#else
  const size_t row = 4 * 8000, floor = 512 * row;
  /* within the floor: one chunk, whatever x's size */
  osft_flce_plan_t p = default_plan(CTX, 512, h, v);
  assert_int_equal(p.chunks, 1);
  /* above it: 16 M H bytes of chunks (the fixed part is 16 M + small) */
  const osft_flce_plan_t a = default_plan(CTX, 8192, h, v),
                         b = default_plan(CTX, 32768, h, v);
  assert_true(16 * 8192 * (size_t)h > floor);
  for (int i = 0; i < 2; ++i) {
    const osft_flce_plan_t *q = i ? &b : &a;
    const size_t by_x = 16 * (size_t)q->tokens * (size_t)h;
    assert_true(q->budget_bytes >= by_x);
    assert_true(q->budget_bytes <= by_x + 16 * (size_t)q->tokens + 4096);
    assert_true(q->chunks > 1); /* the former default: one chunk of M x V */
    assert_true(q->chunk_rows * row <= q->budget_bytes);
    assert_true((size_t)q->chunks <= (size_t)q->tokens * row / (by_x - row) + 1);
  }
  /* the slope per token: at most 16 H (chunks) + 16 (fixed) bytes */
  assert_true(b.budget_bytes - a.budget_bytes <= (16 * (size_t)h + 16) * (32768 - 8192));
  assert_true(b.budget_bytes < (size_t)32768 * row / 10);
#endif
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
  if (tt_device() == OSFT_DEVICE_CPU) assert_true(a.host_allocs > 0);
  tt_expect_all_returned(&a);
}

/* A refused allocation in the middle of a call, after some outputs were
 * written, must not fail it halfway. On the CPU: the bf16 GEMMs' fp32
 * staging, which grows during the first call with new shapes (the GEMM then
 * computes without staging). On CUDA: the partial sums of grad_bias's
 * reduction over 600 rows (the reduction then runs in one pass). Refusing
 * that last allocation of a first call, every output still matches the
 * float64 reference. */
static void test_refused_staging_still_computes(void **state) {
  (void)state;
  const int cuda = tt_device() != OSFT_DEVICE_CPU;
  flce_case c = base_case(cuda ? 600 : 30, 5, 17, TT_BF16);
  c.bias = 1;
  c.chunk_rows = cuda ? 0 : 8;
  c.grad_b_dtype = TT_BF16;
  c.chunking = OSFT_FLCE_CHUNKING_TOKENS; /* the staging of its bf16 grad_x GEMMs */
  test_alloc_state a;
  osft_context_t ctx = tt_counting_context(&a);
  run_case(ctx, &c);
  /* those of one first call, all granted */
  const long allocs = cuda ? a.device_allocs : a.host_allocs;
  assert_ok(osft_context_destroy(ctx));
  assert_true(allocs > 1);

  ctx = tt_counting_context(&a);
  /* The same sequence (the context's own blocks are counted already): its
   * last allocation is refused. */
  if (cuda)
    a.fail_device_after = allocs - 1 - a.device_allocs;
  else
    a.fail_host_after = allocs - 1 - a.host_allocs;
  run_case(ctx, &c); /* succeeds, checked against float64 */
  assert_true((cuda ? a.device_allocs : a.host_allocs) < allocs);
  assert_ok(osft_context_destroy(ctx));
  tt_expect_all_returned(&a);
}

/* A tt_refused_call (test_tensors.h) of one first compute. */
static void refused_compute(void *user, osft_context_t ctx, test_alloc_state *a,
                            int device, long granted) {
  run_case_refusing(ctx, user, a, granted, device);
}

static void test_every_refusal_is_clean(void **state) {
  (void)state;
  /* m, h, v, chunk rows (0: one chunk, no accumulator) */
  static const int64_t shapes[3][4] = {{30, 5, 17, 8}, {40, 6, 23, 16}, {40, 6, 23, 0}};
  for (int dt = 0; dt < 2; ++dt)
    for (int i = 0; i < 3; ++i) {
      flce_case c =
          base_case(shapes[i][0], shapes[i][1], shapes[i][2], dt ? TT_F32 : TT_BF16);
      c.bias = 1;
      c.chunk_rows = shapes[i][3];
      c.grad_b_dtype = c.dtype;
      c.accumulate = c.chunk_rows ? OSFT_FLCE_ACCUMULATE_GRAD_WEIGHT : 0;
      tt_refusal_sweep(refused_compute, &c);
    }
}

/* Scratch of a call planned on its own context. */
static uint64_t planned_scratch(flce_case *c, flce_tensors *T, int64_t *chunks) {
  osft_flce_inputs_t in;
  osft_flce_outputs_t out;
  flce_bind(c, T, &in, &out);
  osft_context_t ctx = tt_context(NULL);
  osft_flce_t f = make_flce(ctx, c);
  osft_flce_plan_t p;
  p.struct_size = sizeof p;
  assert_ok(osft_flce_get_plan(f, &in, &out, &p));
  assert_ok(osft_flce_destroy(f));
  assert_ok(osft_context_destroy(ctx));
  *chunks = p.chunks;
  return p.scratch_bytes;
}

/* One chunk needs no fp32 gradient accumulator (the backward GEMM sums all
 * rows in fp32 and rounds once): a bf16 grad_weight and grad_bias take the
 * 4 V H + 4 V bytes only when the call runs in several chunks, and the
 * one-chunk results still match the float64 reference, overwritten and
 * accumulated. */
static void test_one_chunk_needs_no_accumulator(void **state) {
  (void)state;
  flce_case c = base_case(64, 24, 40, TT_BF16);
  c.bias = 1;
  c.grad_b_dtype = TT_BF16;
  c.chunking = OSFT_FLCE_CHUNKING_TOKENS;
  test_seed("one chunk");
  flce_tensors T = make_tensors(&c);
  int64_t chunks = 0;
  const uint64_t one = planned_scratch(&c, &T, &chunks);
  assert_int_equal(chunks, 1);
  c.accumulator = OSFT_FLCE_ACCUMULATOR_OUTPUT;
  assert_int_equal(planned_scratch(&c, &T, &chunks), one);
  c.chunk_rows = 32;
  const uint64_t two_out = planned_scratch(&c, &T, &chunks);
  assert_int_equal(chunks, 2);
  c.accumulator = OSFT_FLCE_ACCUMULATOR_FP32;
  const uint64_t two = planned_scratch(&c, &T, &chunks);
  assert_int_equal(chunks, 2);
  assert_true(two >= two_out + 4u * 40u * 24u + 4u * 40u);
  free_tensors(&T);
  c.chunk_rows = 0;
  osft_context_t ctx = tt_context(NULL);
  run_case(ctx, &c);
  c.accumulate = OSFT_FLCE_ACCUMULATE_GRAD_WEIGHT | OSFT_FLCE_ACCUMULATE_GRAD_BIAS;
  run_case(ctx, &c);
  assert_ok(osft_context_destroy(ctx));
}

/* ---- the fixed cost of a chunk, from the "flce: counts:" debug line
 * (flce_counts, counted_case: flce_testlib.h) */

/* A chunk pays no fixed cost beyond its own launches: with bf16 gradients
 * and the fp32 accumulator, where the held gradients take no more scratch
 * than the V x H accumulator, more chunks add no pass over a V x H buffer,
 * no wait, no allocation and no conversion of anything but the chunk's own
 * rows, and grad_W is written once. Numerics are checked throughout
 * (class weights, smoothing, bf16 bias, accumulation included). */
static void test_chunk_overhead(void **state) {
  flce_case c = base_case(32, 256, 40, TT_BF16);
  c.bias = 1;
  c.bias_dtype = TT_BF16;
  c.grad_b_dtype = TT_BF16;
  c.class_weights = 1;
  c.smoothing = 0.1;
  c.chunking = OSFT_FLCE_CHUNKING_TOKENS; /* test_flce_vocab.c counts the other */
  test_seed("chunk overhead");
  c.chunk_rows = 8;
  const flce_counts four = counted_case(CTX, &c);
  c.chunk_rows = 4;
  const flce_counts eight = counted_case(CTX, &c);
  assert_int_equal(four.chunks, 4);
  assert_int_equal(eight.chunks, 8);
  assert_true(four.held && eight.held);
  const long long d = eight.chunks - four.chunks;
  /* logits GEMM, row pass, grad_x GEMM (+ widening x without bf16 GEMMs) */
  assert_true(eight.calls - four.calls <= 4 * d);
  assert_int_equal(eight.vh_passes, four.vh_passes);
  /* grad_W written once (+ reading W and writing its fp32 copy on the CPU) */
  assert_true(eight.vh_passes <= 3);
  assert_int_equal(eight.waits, four.waits);
  assert_true(eight.waits <= 1);
  assert_int_equal(eight.allocations, 1);
  assert_int_equal(four.allocations, 1);
  /* per chunk only x's and grad_x's rows: the same elements in all */
  assert_int_equal(eight.converted, four.converted);
  /* the same, overwriting and accumulating, and in one chunk */
  c.accumulate = OSFT_FLCE_ACCUMULATE_GRAD_WEIGHT | OSFT_FLCE_ACCUMULATE_GRAD_BIAS |
                 OSFT_FLCE_ACCUMULATE_GRAD_X;
  const flce_counts acc = counted_case(CTX, &c);
  assert_true(acc.held);
  assert_true(acc.vh_passes <= 4); /* grad_W read and written once */
  c.accumulate = 0;
  c.chunk_rows = 0;
  const flce_counts one = counted_case(CTX, &c);
  assert_int_equal(one.chunks, 1);
  assert_false(one.held);
  /* reduction NONE with per-token upstream gradients, ignored tokens, fp32 x */
  flce_case n = base_case(24, 128, 20, TT_F32);
  n.chunking = OSFT_FLCE_CHUNKING_TOKENS;
  n.grad_w_dtype = TT_F32;
  n.reduction = OSFT_FLCE_NONE;
  n.upstream = 1;
  n.chunk_rows = 5;
  n.budget = 0;
  counted_case(CTX, &n);
}

int main(void) {
  if (!tt_device_present()) return OSFT_TEST_SKIP;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_budget_and_plan, tt_setup, tt_teardown),
      cmocka_unit_test_setup_teardown(test_default_budget_follows_x, tt_setup,
                                      tt_teardown),
      cmocka_unit_test(test_memory_is_returned),
      cmocka_unit_test(test_refused_staging_still_computes),
      cmocka_unit_test(test_every_refusal_is_clean),
      cmocka_unit_test(test_one_chunk_needs_no_accumulator),
      cmocka_unit_test_setup_teardown(test_chunk_overhead, tt_setup, tt_teardown),
  };
  return cmocka_run_group_tests_name("flce_memory", tests, NULL, NULL);
}
