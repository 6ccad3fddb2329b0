/* Fused linear cross-entropy: the CPU's default plan (issue 55). The
 * default budget is the fixed part plus the 1.3.0 default's chunk buffers
 * (room for 512 token rows, or 16 M H bytes), but at most max(8 MiB,
 * 32 x x's bytes): small at small batches too. A call whose grad_weight is
 * overwritten (fp32, compact) and whose M x Vp fp32 logits fit in its
 * V x H floats keeps its logits there (the in-place plan: three GEMMs,
 * grad_W written once per slice, from the last slice to the first), so
 * that its scratch is a few rows of records and one slice's gradient.
 *
 * Plans at the shapes of real models (GPT-2, SmolLM2, Llama-3: planned
 * only, on buffers never touched), the plan's choice and its limits (an
 * accumulated, bf16 or padded grad_weight, too many tokens, a caller's
 * chunk_rows or TOKENS), and the in-place plan's results against the
 * float64 reference with every option, with slices whose grad_W rows
 * would overwrite their own logits (M close to H), a ragged last slice,
 * one slice, one token; and the default plan itself at a shape where it
 * keeps the logits, against the reference. Built for CUDA too
 * (OSFT_TEST_CUDA, skipped without a GPU), where only the default plan's
 * test runs: CUDA keeps the 1.3.0 default (its budget: test_flce_memory). */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_tensors.h"
#include "test_util.h"

#include "flce_testlib.h"
#include "test_fixture.h"

#define MIB ((size_t)1 << 20)

/* The debug line of the last plan ("flce: M = ..."), caught while planning. */
static char plan_line[512];

static void plan_sink(void *user, osft_log_level_t level, const char *message) {
  (void)user;
  (void)level;
  if (strncmp(message, "flce: M = ", 10) == 0)
    snprintf(plan_line, sizeof plan_line, "%s", message);
}

/* Whether the last plan keeps its logits in grad_weight. */
static int plan_keeps(void) {
  return strstr(plan_line, "logits kept in grad_weight") != NULL;
}

#ifndef OSFT_TEST_CUDA /* the plan tests take host tensors; CUDA: the last test */
/* ---- plans on tensors whose data is never read (get_plan reads none) */

typedef struct {
  DLTensor x, w, y, loss, dx, dw;
  int64_t xs[2], ws[2], ys[1];
  void *bufs[5];
} shape_call;

static DLTensor shape_tensor(void *data, DLDataTypeCode code, int bits, int ndim,
                             int64_t *shape) {
  DLTensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.device.device_type = kDLCPU;
  t.ndim = ndim;
  t.dtype.code = (uint8_t)code;
  t.dtype.bits = (uint8_t)bits;
  t.dtype.lanes = 1;
  t.shape = shape;
  return t;
}

/* Distinct allocations (malloc'd, never touched: the pages are not
 * committed) for x, W, targets, grad_x and grad_W of M x H x V, fp32. */
static void shape_call_make(shape_call *s, int64_t m, int64_t h, int64_t v) {
  memset(s, 0, sizeof *s);
  s->xs[0] = s->ys[0] = m;
  s->xs[1] = s->ws[1] = h;
  s->ws[0] = v;
  const size_t bytes[5] = {(size_t)(m * h) * 4, (size_t)(v * h) * 4, (size_t)m * 8,
                           (size_t)(m * h) * 4, (size_t)(v * h) * 4};
  for (int i = 0; i < 5; ++i) {
    s->bufs[i] = malloc(bytes[i]);
    assert_non_null(s->bufs[i]);
  }
  static float loss;
  s->x = shape_tensor(s->bufs[0], kDLFloat, 32, 2, s->xs);
  s->w = shape_tensor(s->bufs[1], kDLFloat, 32, 2, s->ws);
  s->y = shape_tensor(s->bufs[2], kDLInt, 64, 1, s->ys);
  s->dx = shape_tensor(s->bufs[3], kDLFloat, 32, 2, s->xs);
  s->dw = shape_tensor(s->bufs[4], kDLFloat, 32, 2, s->ws);
  s->loss = shape_tensor(&loss, kDLFloat, 32, 0, NULL);
}

static void shape_call_free(shape_call *s) {
  for (int i = 0; i < 5; ++i) free(s->bufs[i]);
}

/* What plan_at() asks for: loss, grad_x and grad_W (default), no grad_W
 * (a frozen head), or the loss alone. */
static enum { PLAN_ALL, PLAN_NO_DW, PLAN_LOSS } plan_outputs = PLAN_ALL;

/* The plan of loss + grad_x + grad_W (accumulate: the accumulate bits) at
 * M x H x V with the handle's options `o` (NULL: the defaults). */
static osft_flce_plan_t plan_at(osft_context_t ctx, int64_t m, int64_t h, int64_t v,
                                const osft_flce_options_t *o, uint32_t accumulate) {
  shape_call s;
  shape_call_make(&s, m, h, v);
  osft_flce_t f = NULL;
  assert_ok(osft_flce_create(ctx, o, &f));
  osft_flce_inputs_t in;
  osft_flce_outputs_t out;
  assert_ok(OSFT_FLCE_INPUTS_INIT(&in));
  assert_ok(OSFT_FLCE_OUTPUTS_INIT(&out));
  in.x = &s.x;
  in.weight = &s.w;
  in.targets = &s.y;
  out.loss = &s.loss;
  out.grad_x = &s.dx;
  out.grad_weight =
      plan_outputs == PLAN_NO_DW || plan_outputs == PLAN_LOSS ? NULL : &s.dw;
  out.grad_x = plan_outputs == PLAN_LOSS ? NULL : &s.dx;
  out.accumulate = accumulate;
  osft_flce_plan_t p;
  assert_ok(OSFT_FLCE_PLAN_INIT(&p));
  plan_line[0] = '\0';
  assert_ok(osft_set_log_callback(plan_sink, NULL, OSFT_LOG_DEBUG));
  assert_ok(osft_flce_get_plan(f, &in, &out, &p));
  assert_ok(osft_set_log_callback(NULL, NULL, OSFT_LOG_OFF));
  assert_ok(osft_flce_destroy(f));
  shape_call_free(&s);
  assert_true(p.scratch_bytes <= p.budget_bytes);
  return p;
}

/* The default's bound: the chunk buffers within max(8 MiB, 32 x x's
 * bytes) beyond the fixed part (16 M bytes of per-token results and a
 * few KiB). */
static size_t default_bound(int64_t m, int64_t h) {
  size_t chunk = 32 * (size_t)m * (size_t)h * 4;
  if (chunk < 8 * MIB) chunk = 8 * MIB;
  return chunk + 16 * (size_t)m + 8192;
}

/* The goal of issue 55 and the models of its grid: GPT-2 (50257 x 768) at
 * 256 tokens keeps its logits (one tile of all M rows, several slices) in
 * at most 8 MiB of scratch, where the 1.3.0 default took the whole 49 MiB
 * logits block; so do SmolLM2 (49152 x 576) up to 512 tokens and Llama-3
 * (128256 x 4096) at 256 (the default prefers the least scratch at a
 * modeled tie: 1 MiB against the 125 MiB block); a whole block within
 * 8 MiB is one token chunk; beyond about H tokens the cost model picks token chunks or
 * the kept rows (in grad_weight, then in scratch), within the bound. */
static void test_default_plans_of_models(void **state) {
  enum { KEPT, ONE_CHUNK, ANY };
  static const int64_t shapes[][4] = {
      /* M, H, V, the plan */
      {256, 768, 50257, KEPT},   {16, 768, 50257, ONE_CHUNK},
      {64, 768, 50257, KEPT},    {512, 768, 50257, KEPT},
      {1024, 768, 50257, ANY},   {4096, 768, 50257, ANY},
      {64, 576, 49152, KEPT},    {512, 576, 49152, KEPT},
      {2048, 576, 49152, ANY},   {16, 4096, 128256, ONE_CHUNK},
      {256, 4096, 128256, KEPT}, {1024, 4096, 128256, ANY},
      {2048, 4096, 128256, ANY}, {1, 768, 50257, ANY},
  };
  for (size_t i = 0; i < sizeof shapes / sizeof *shapes; ++i) {
    const int64_t m = shapes[i][0], h = shapes[i][1], v = shapes[i][2];
    const osft_flce_plan_t p = plan_at(CTX, m, h, v, NULL, 0);
    print_message(
        "M %lld H %lld V %lld: %lld x %lld rows, %lld x %lld classes, %.2f MiB "
        "of scratch (bound %.2f MiB)%s\n",
        (long long)m, (long long)h, (long long)v, (long long)p.chunks,
        (long long)p.chunk_rows, (long long)p.slices, (long long)p.slice_cols,
        (double)p.scratch_bytes / MIB, (double)p.budget_bytes / MIB,
        plan_keeps() ? ", logits kept in grad_weight" : "");
    print_message("  %s\n", plan_line);
    assert_true(p.budget_bytes <= default_bound(m, h));
    assert_true(p.scratch_bytes <= default_bound(m, h));
    if (shapes[i][3] != ANY) assert_int_equal(plan_keeps(), shapes[i][3] == KEPT);
    if (shapes[i][3] == KEPT) {
      assert_int_equal(p.chunking, OSFT_FLCE_CHUNKING_VOCAB);
      assert_int_equal(p.chunks, 1);
      assert_int_equal(p.chunk_rows, m);
      assert_true(p.slices > 1);
      assert_true(p.slices * p.slice_cols >= v && (p.slices - 1) * p.slice_cols < v);
      assert_true(p.scratch_bytes <= 8 * MIB);
    } else if (shapes[i][3] == ONE_CHUNK) {
      assert_int_equal(p.chunking, OSFT_FLCE_CHUNKING_TOKENS);
      assert_int_equal(p.chunks, 1);
    } else {
      assert_true(p.chunks * p.chunk_rows >= m);
    }
  }
  /* the goal row: GPT-2 at 256 tokens, at most 8 MiB (the whole block:
   * 256 x 50272 x 4 bytes, 49.1 MiB) */
  const osft_flce_plan_t g = plan_at(CTX, 256, 768, 50257, NULL, 0);
  assert_true(g.scratch_bytes <= 8 * MIB);
}

/* Where the logits are not kept: grad_weight accumulated (its values are
 * the caller's), M x Vp beyond V x H, a caller's chunk_rows below M, a
 * slice_cols not a multiple of 16, or chunking TOKENS; an explicit budget that holds the
 * whole block takes one token chunk (ties go to the token plan), a smaller one keeps
 * them. */
static void test_when_logits_are_kept(void **state) {
  const int64_t m = 256, h = 768, v = 50257;
  osft_flce_options_t o;
  assert_ok(OSFT_FLCE_OPTIONS_INIT(&o));
  plan_at(CTX, m, h, v, &o, 0);
  assert_true(plan_keeps());
  plan_at(CTX, m, h, v, &o, OSFT_FLCE_ACCUMULATE_GRAD_WEIGHT);
  assert_false(plan_keeps());
  plan_at(CTX, m, h, v, &o, OSFT_FLCE_ACCUMULATE_GRAD_X); /* grad_W still overwritten */
  assert_true(plan_keeps());
  /* M Vp <= V H: 47 x 1008 <= 1000 x 48, 48 x 1008 > 1000 x 48: all 47
   * rows kept in grad_weight; of 48, 47 there and one in scratch */
  o.memory_budget = 47 * 1008; /* below the whole block either way */
  osft_flce_plan_t p = plan_at(CTX, 47, 48, 1000, &o, 0);
  assert_true(plan_keeps());
  assert_int_equal(p.chunking, OSFT_FLCE_CHUNKING_VOCAB);
  assert_int_equal(p.chunks, 1);
  p = plan_at(CTX, 48, 48, 1000, &o, 0);
  if (plan_keeps() && p.chunking == OSFT_FLCE_CHUNKING_VOCAB) /* 47 + 1 in scratch */
    assert_int_equal(p.chunks, 1);
  o.memory_budget = 0;
  o.chunk_rows = 128;
  plan_at(CTX, m, h, v, &o, 0);
  assert_false(plan_keeps());
  o.chunk_rows = m; /* all rows in one tile: allowed */
  plan_at(CTX, m, h, v, &o, 0);
  assert_true(plan_keeps());
  o.chunk_rows = 0;
  o.chunking = OSFT_FLCE_CHUNKING_TOKENS; /* the 1.3.0 default: the whole block */
  p = plan_at(CTX, m, h, v, &o, 0);
  assert_false(plan_keeps());
  assert_int_equal(p.chunking, OSFT_FLCE_CHUNKING_TOKENS);
  assert_int_equal(p.chunks, 1);
  o.chunking = OSFT_FLCE_CHUNKING_VOCAB; /* the in-place plan is a vocabulary plan */
  plan_at(CTX, m, h, v, &o, 0);
  assert_true(plan_keeps());
  o.chunking = OSFT_FLCE_CHUNKING_AUTO;
  o.memory_budget = (size_t)1 << 30;
  p = plan_at(CTX, m, h, v, &o, 0);
  assert_false(plan_keeps());
  assert_int_equal(p.chunks, 1);
  assert_int_equal(p.chunking, OSFT_FLCE_CHUNKING_TOKENS);
  o.memory_budget = 16 * MIB;
  p = plan_at(CTX, m, h, v, &o, 0);
  assert_true(plan_keeps());
  /* the caller's slice width, in whole rows of 16 classes */
  o.slice_cols = 1024;
  p = plan_at(CTX, m, h, v, &o, 0);
  assert_true(plan_keeps());
  assert_int_equal(p.slice_cols, 1024);
  assert_int_equal(p.slices, 50);
  o.slice_cols = 1000; /* the tiles lie 16-class rows apart: not kept */
  p = plan_at(CTX, m, h, v, &o, 0);
  assert_false(plan_keeps());
  /* a frozen head (no grad_weight to lend): the 1.3.0 default, the whole
   * block (small token chunks would cost 20%: bench/results); the loss
   * alone: vocabulary slices within the bound (one GEMM either way) */
  assert_ok(OSFT_FLCE_OPTIONS_INIT(&o));
  plan_outputs = PLAN_NO_DW;
  p = plan_at(CTX, m, h, v, &o, 0);
  assert_false(plan_keeps());
  assert_int_equal(p.chunks, 1);
  assert_int_equal(p.chunking, OSFT_FLCE_CHUNKING_TOKENS);
  plan_outputs = PLAN_LOSS;
  p = plan_at(CTX, m, h, v, &o, 0);
  assert_true(p.scratch_bytes <= default_bound(m, h));
  assert_int_equal(p.chunks, 1);
  plan_outputs = PLAN_ALL;
}

/* ---- the in-place plan against the float64 reference */

/* Runs `c` (which must keep its logits) and checks every output. */
static void run_kept(osft_context_t ctx, const flce_case *c) {
  plan_line[0] = '\0';
  assert_ok(osft_set_log_callback(plan_sink, NULL, OSFT_LOG_DEBUG));
  run_case(ctx, c);
  assert_ok(osft_set_log_callback(NULL, NULL, OSFT_LOG_OFF));
  if (!plan_keeps()) {
    char d[512];
    describe(c, d, sizeof d);
    fail_msg("%s: the plan does not keep the logits (%s)", d, plan_line);
  }
}

/* Every option and reduction, the cases the slices meet: M close to H
 * (every slice's grad_W rows over its own logits: staged in scratch), M
 * far below H (only the first), a ragged last slice, one slice of all V,
 * 16 classes per slice, one token, three rows beyond grad_weight's 47 kept
 * in scratch; outputs poisoned first (run_case). */
static void test_in_place_numerics(void **state) {
  /* m, h, v, slice cols */
  static const int64_t shapes[][4] = {
      {47, 48, 1000, 96}, {9, 64, 301, 32},   {40, 48, 3001, 256}, {1, 8, 77, 16},
      {20, 40, 40, 16},   {30, 40, 500, 500}, {50, 48, 1000, 96}};
  for (size_t s = 0; s < sizeof shapes / sizeof *shapes; ++s)
    for (int red = 0; red < 3; ++red)
      for (int opt = 0; opt < 2; ++opt) {
        flce_case c = base_case(shapes[s][0], shapes[s][1], shapes[s][2], TT_F32);
        c.chunking = OSFT_FLCE_CHUNKING_VOCAB;
        c.slice_cols = shapes[s][3];
        c.reduction = (osft_flce_reduction_t)red;
        c.want = WANT_ALL;
        c.accumulate = OSFT_FLCE_ACCUMULATE_GRAD_X | OSFT_FLCE_ACCUMULATE_GRAD_BIAS;
        if (opt) {
          c.bias = 1;
          c.class_weights = 1;
          c.smoothing = 0.1;
          c.z_scale = 1e-3;
          c.softcap = 15.0;
          c.upstream = 1;
        } else {
          c.accumulate = 0;
          c.target_dtype = TT_I32;
        }
        run_kept(CTX, &c);
      }
  /* every target ignored: gradients of zero, written */
  flce_case c = base_case(40, 48, 1000, TT_F32);
  c.chunking = OSFT_FLCE_CHUNKING_VOCAB;
  c.slice_cols = 64;
  c.all_ignored = 1;
  run_kept(CTX, &c);
  /* the automatic plan under a budget below the whole block keeps them too */
  c = base_case(40, 48, 3001, TT_F32);
  c.chunking = OSFT_FLCE_CHUNKING_AUTO;
  c.slice_cols = 0;
  c.budget = 40 * 3008 * 4 / 4;
  run_kept(CTX, &c);
}

/* More rows than grad_weight holds logits for (211 x 3008 > 3000 x 192):
 * the first 191 rows kept in grad_weight, the next 17 in scratch, the other
 * 3 in a token chunk that adds to grad_W (and grad_b, grad_x's rows);
 * every option, each reduction. The shape is one where the cost model
 * prefers this plan under either engine's balance (OpenBLAS 8, oneMKL 16
 * flops per byte): at 120 x 96 oneMKL's takes the two-pass plan. */
static void test_kept_then_chunks(void **state) {
  for (int red = 0; red < 3; ++red)
    for (int opt = 0; opt < 2; ++opt) {
      flce_case c = base_case(211, 192, 3000, TT_F32);
      c.chunking = OSFT_FLCE_CHUNKING_AUTO;
      c.slice_cols = 0;
      c.reduction = (osft_flce_reduction_t)red;
      c.budget = 1000000;
      if (opt) {
        c.bias = 1;
        c.class_weights = 1;
        c.smoothing = 0.05;
        c.z_scale = 1e-3;
        c.softcap = 20.0;
        c.upstream = 1;
        c.accumulate = OSFT_FLCE_ACCUMULATE_GRAD_X | OSFT_FLCE_ACCUMULATE_GRAD_BIAS;
      }
      run_kept(CTX, &c);
      assert_non_null(
          strstr(plan_line, "2 chunk(s) of 208 rows (the first 191 + 17 rows"));
    }
}

#endif

/* The default plan itself (no budget, no plan options) at a shape where the
 * CPU's keeps the logits: the whole block (64 x 40000 x 4 bytes) is above
 * 8 MiB, the logits fit in grad_weight (64 <= 96); against the reference.
 * CUDA keeps the 1.3.0 default (room for 512 token rows: one chunk here). */
static void test_default_matches_reference(void **state) {
  flce_case c = base_case(64, 96, 40000, TT_F32);
  c.chunking = OSFT_FLCE_CHUNKING_AUTO;
  c.slice_cols = 0;
  c.want = WANT_LOSS | WANT_DX | WANT_DW | WANT_DB;
  c.bias = 1;
  plan_line[0] = '\0';
  assert_ok(osft_set_log_callback(plan_sink, NULL, OSFT_LOG_DEBUG));
  run_case(CTX, &c);
  assert_ok(osft_set_log_callback(NULL, NULL, OSFT_LOG_OFF));
  assert_non_null(strstr(plan_line, "flce: M = 64"));
#ifdef OSFT_TEST_CUDA
  assert_false(plan_keeps());
  assert_non_null(strstr(plan_line, "1 chunk(s) of 64 rows,"));
#else
  assert_true(plan_keeps());
#endif
}

#ifndef OSFT_TEST_CUDA
/* A tt_refused_call (test_tensors.h) of one first compute. */
static void refused_compute(void *user, osft_context_t ctx, test_alloc_state *a,
                            int device, long granted) {
  run_case_refusing(ctx, user, a, granted, device);
}

/* Every allocation of a first call refused in turn: the in-place plan
 * fails cleanly (nothing written) or absorbs it with correct outputs. */
static void test_in_place_refusals(void **state) {
  (void)state;
  flce_case c = base_case(40, 48, 1000, TT_F32);
  c.chunking = OSFT_FLCE_CHUNKING_VOCAB;
  c.slice_cols = 96;
  c.bias = 1;
  tt_refusal_sweep(refused_compute, &c);
  /* kept in grad_weight and scratch, then a token chunk */
  flce_case d = base_case(120, 96, 3000, TT_F32);
  d.chunking = OSFT_FLCE_CHUNKING_AUTO;
  d.slice_cols = 0;
  d.budget = 500000;
  tt_refusal_sweep(refused_compute, &d);
}

#endif

int main(void) {
  if (!tt_device_present()) return OSFT_TEST_SKIP;
#ifdef OSFT_TEST_CUDA
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_default_matches_reference, tt_setup,
                                      tt_teardown),
  };
#else
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_default_plans_of_models, tt_setup,
                                      tt_teardown),
      cmocka_unit_test_setup_teardown(test_when_logits_are_kept, tt_setup, tt_teardown),
      cmocka_unit_test_setup_teardown(test_in_place_numerics, tt_setup, tt_teardown),
      cmocka_unit_test_setup_teardown(test_kept_then_chunks, tt_setup, tt_teardown),
      cmocka_unit_test_setup_teardown(test_default_matches_reference, tt_setup,
                                      tt_teardown),
      cmocka_unit_test(test_in_place_refusals),
  };
#endif
  return cmocka_run_group_tests(tests, NULL, NULL);
}
