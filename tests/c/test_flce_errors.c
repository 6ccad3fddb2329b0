/* Fused linear cross-entropy errors: every invalid call, option and handle
 * fails with its status and message and leaves every output as it was;
 * the vocab-parallel options name their field.
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

/* ---------------------------------------------------------------- errors */

typedef tt_snapshot snapshot;

#define EXPECT_FAIL(call, status, needle)      \
  do {                                         \
    assert_status((call), (status));           \
    assert_error_mentions(needle);             \
    tt_snapshot_expect_untouched(snap, #call); \
  } while (0)

/* A case's tensors with every output set to random values (that a failed
 * call must keep), and their snapshot. */
static flce_tensors error_tensors(const flce_case *c, const char *seed, snapshot *snap) {
  test_seed(seed);
  flce_tensors T = make_tensors(c);
  tt *outs[8] = {T.loss, T.dx, T.dw, T.db, T.z, T.acc, T.amax, T.tok};
  for (int i = 0; i < 8; ++i) tt_random(outs[i], -1, 1);
  tt_snapshot_take(snap, outs, 8);
  return T;
}

/* The failing calls below take their arguments by value: each changes
 * one field of `in` or `out` and puts it back. */

/* Targets out of range: too large, negative (not the ignore index); the
 * message names the first bad token. The targets are valid again after. */
static void call_errors_targets(osft_flce_t f, flce_tensors T, osft_flce_inputs_t in,
                                osft_flce_outputs_t out, const snapshot *snap) {
  /* targets out of range: too large, negative (not the ignore index); the
   * message names the first bad token */
  double *yd = tt_get(T.y);
  const double keep = yd[17];
  yd[17] = 21;
  yd[30] = -1;
  tt_set(T.y, yd);
  EXPECT_FAIL(osft_flce_compute(f, &in, &out), OSFT_STATUS_INDEX_OUT_OF_RANGE,
              "token 17");
  assert_error_mentions("21");
  yd[17] = keep;
  tt_set(T.y, yd);
  EXPECT_FAIL(osft_flce_compute(f, &in, &out), OSFT_STATUS_INDEX_OUT_OF_RANGE,
              "token 30");
  /* also in forward-only mode */
  osft_flce_outputs_t only_loss;
  assert_ok(OSFT_FLCE_OUTPUTS_INIT(&only_loss));
  only_loss.loss = &T.loss->t;
  EXPECT_FAIL(osft_flce_compute(f, &in, &only_loss), OSFT_STATUS_INDEX_OUT_OF_RANGE,
              "targets");
  yd[30] = 3;
  tt_set(T.y, yd);
  free(yd);
}

/* Shapes of every input and output. */
static void call_errors_shapes(osft_flce_t f, flce_tensors T, osft_flce_inputs_t in,
                               osft_flce_outputs_t out, const snapshot *snap) {
  /* shapes */
  tt *w_bad = mat(TT_F32, 21, 7), *y_bad = vec(TT_I64, 39), *b_bad = vec(TT_F32, 22);
  tt *dw_bad = mat(TT_F32, 20, 6), *loss_vec = vec(TT_F32, 40), *gl_bad = vec(TT_F32, 2);
  tt *dx_bad = mat(TT_F32, 41, 6), *w_empty = mat(TT_F32, 0, 6);
  tt_random(w_bad, -1, 1);
  tt_random(b_bad, -1, 1);
  tt_random(gl_bad, -1, 1);
  tt_set(y_bad, (const double[39]){0});
  in.weight = &w_bad->t;
  EXPECT_FAIL(osft_flce_compute(f, &in, &out), OSFT_STATUS_SHAPE_MISMATCH, "in->weight");
  in.weight = &w_empty->t;
  EXPECT_FAIL(osft_flce_compute(f, &in, &out), OSFT_STATUS_SHAPE_MISMATCH, "no classes");
  in.weight = &T.w->t;
  in.targets = &y_bad->t;
  EXPECT_FAIL(osft_flce_compute(f, &in, &out), OSFT_STATUS_SHAPE_MISMATCH, "in->targets");
  in.targets = &T.y->t;
  in.bias = &b_bad->t;
  EXPECT_FAIL(osft_flce_compute(f, &in, &out), OSFT_STATUS_SHAPE_MISMATCH, "in->bias");
  in.bias = &T.b->t;
  in.grad_loss = &gl_bad->t;
  EXPECT_FAIL(osft_flce_compute(f, &in, &out), OSFT_STATUS_SHAPE_MISMATCH,
              "in->grad_loss");
  in.grad_loss = NULL;
  out.grad_weight = &dw_bad->t;
  EXPECT_FAIL(osft_flce_compute(f, &in, &out), OSFT_STATUS_SHAPE_MISMATCH,
              "out->grad_weight");
  out.grad_weight = &T.dw->t;
  out.grad_x = &dx_bad->t;
  EXPECT_FAIL(osft_flce_compute(f, &in, &out), OSFT_STATUS_SHAPE_MISMATCH, "out->grad_x");
  out.grad_x = &T.dx->t;
  out.loss = &loss_vec->t; /* per-token loss, but the reduction is MEAN */
  EXPECT_FAIL(osft_flce_compute(f, &in, &out), OSFT_STATUS_SHAPE_MISMATCH, "out->loss");
  out.loss = &T.loss->t;
  tt *extra[8] = {w_bad, y_bad, b_bad, dw_bad, loss_vec, gl_bad, dx_bad, w_empty};
  for (int i = 0; i < 8; ++i) tt_free(extra[i]);
}

/* dtypes of the inputs and outputs. */
static void call_errors_dtypes(osft_flce_t f, flce_tensors T, osft_flce_inputs_t in,
                               osft_flce_outputs_t out, const snapshot *snap) {
  /* dtypes */
  tt *w_bf = mat(TT_BF16, 21, 6), *y_f = vec(TT_F32, 40),
     *loss64 = tt_new(TT_F64, 0, NULL);
  tt *am_f = vec(TT_F32, 40), *cw64 = vec(TT_F64, 21);
  tt_random(w_bf, -1, 1);
  tt_random(y_f, 0, 5);
  tt_random(cw64, 0, 1);
  in.weight = &w_bf->t;
  EXPECT_FAIL(osft_flce_compute(f, &in, &out), OSFT_STATUS_DTYPE_MISMATCH, "in->weight");
  in.weight = &T.w->t;
  in.targets = &y_f->t;
  EXPECT_FAIL(osft_flce_compute(f, &in, &out), OSFT_STATUS_DTYPE_MISMATCH, "in->targets");
  in.targets = &T.y->t;
  in.class_weight = &cw64->t;
  EXPECT_FAIL(osft_flce_compute(f, &in, &out), OSFT_STATUS_DTYPE_MISMATCH,
              "in->class_weight");
  in.class_weight = NULL;
  out.loss = &loss64->t;
  EXPECT_FAIL(osft_flce_compute(f, &in, &out), OSFT_STATUS_DTYPE_MISMATCH, "out->loss");
  out.loss = &T.loss->t;
  out.argmax = &am_f->t;
  EXPECT_FAIL(osft_flce_compute(f, &in, &out), OSFT_STATUS_DTYPE_MISMATCH, "out->argmax");
  out.argmax = &T.amax->t;
  tt *extra[5] = {w_bf, y_f, loss64, am_f, cw64};
  for (int i = 0; i < 5; ++i) tt_free(extra[i]);
}

/* A tensor on the other device, a transposed weight, outputs over inputs,
 * parameters or each other. */
static void call_errors_device_layout_aliasing(osft_flce_t f, flce_tensors T,
                                               osft_flce_inputs_t in,
                                               osft_flce_outputs_t out,
                                               const snapshot *snap) {
  /* device, layout, aliasing */
  DLTensor other = T.x->t;
  other.device.device_type = tt_device() == OSFT_DEVICE_CPU ? kDLCUDA : kDLCPU;
  in.x = &other;
  EXPECT_FAIL(osft_flce_compute(f, &in, &out), OSFT_STATUS_DEVICE_MISMATCH, "in->x");
  in.x = &T.x->t;
  DLTensor wt = T.w->t; /* transposed strides */
  int64_t ws[2] = {1, 21};
  wt.strides = ws;
  in.weight = &wt;
  EXPECT_FAIL(osft_flce_compute(f, &in, &out), OSFT_STATUS_BAD_LAYOUT, "in->weight");
  in.weight = &T.w->t;
  out.grad_x = &T.x->t; /* overwriting the input */
  EXPECT_FAIL(osft_flce_compute(f, &in, &out), OSFT_STATUS_ALIASING, "out->grad_x");
  out.grad_x = &T.dx->t;
  DLTensor dw_over_w = T.w->t; /* a gradient over its parameter */
  out.grad_weight = &dw_over_w;
  EXPECT_FAIL(osft_flce_compute(f, &in, &out), OSFT_STATUS_ALIASING, "out->grad_weight");
  out.grad_weight = &T.dw->t;
  DLTensor z_over_acc = T.acc->t;
  out.z_loss = &z_over_acc;
  EXPECT_FAIL(osft_flce_compute(f, &in, &out), OSFT_STATUS_ALIASING, "out->z_loss");
  out.z_loss = &T.z->t;
}

/* Structs, NULLs, unknown bits, a NULL handle, and a budget below one row. */
static void call_errors_structs(osft_context_t ctx, osft_flce_t f, flce_tensors T,
                                osft_flce_inputs_t in, osft_flce_outputs_t out,
                                const snapshot *snap) {
  /* structs, NULLs, bits */
  const uint32_t accumulate = out.accumulate;
  EXPECT_FAIL(osft_flce_compute(f, NULL, &out), OSFT_STATUS_INVALID_ARGUMENT, "in");
  EXPECT_FAIL(osft_flce_compute(f, &in, NULL), OSFT_STATUS_INVALID_ARGUMENT, "out");
  in.x = NULL;
  EXPECT_FAIL(osft_flce_compute(f, &in, &out), OSFT_STATUS_INVALID_ARGUMENT, "in->x");
  in.x = &T.x->t;
  in.targets = NULL;
  EXPECT_FAIL(osft_flce_compute(f, &in, &out), OSFT_STATUS_INVALID_ARGUMENT,
              "in->targets");
  in.targets = &T.y->t;
  in.struct_size = 3;
  EXPECT_FAIL(osft_flce_compute(f, &in, &out), OSFT_STATUS_INVALID_STRUCT_SIZE, "in");
  in.struct_size = sizeof in;
  out.accumulate = 1u << 5;
  EXPECT_FAIL(osft_flce_compute(f, &in, &out), OSFT_STATUS_INVALID_ARGUMENT,
              "accumulate");
  out.accumulate = accumulate;
  osft_flce_outputs_t none;
  assert_ok(OSFT_FLCE_OUTPUTS_INIT(&none));
  EXPECT_FAIL(osft_flce_compute(f, &in, &none), OSFT_STATUS_INVALID_ARGUMENT,
              "no output");
  EXPECT_FAIL(osft_flce_compute(NULL, &in, &out), OSFT_STATUS_INVALID_HANDLE, "flce");

  /* a budget below one row */
  osft_flce_options_t o;
  assert_ok(OSFT_FLCE_OPTIONS_INIT(&o));
  o.memory_budget = 1000;
  osft_flce_t tiny = NULL;
  assert_ok(osft_flce_create(ctx, &o, &tiny));
  EXPECT_FAIL(osft_flce_compute(tiny, &in, &out), OSFT_STATUS_OUT_OF_MEMORY,
              "memory_budget");
  assert_ok(osft_flce_destroy(tiny));
}

/* Every failing call fails with its status and message and leaves every
 * output bit-identical; the same arguments then work. */
static void test_call_errors_write_nothing(void **state) {
  flce_case c = base_case(40, 6, 21, TT_F32);
  c.bias = 1;
  c.accumulate = OSFT_FLCE_ACCUMULATE_ALL;
  c.chunk_rows = 16;
  snapshot snap_, *snap = &snap_;
  flce_tensors T = error_tensors(&c, "errors", snap);
  tt *outs[8] = {T.loss, T.dx, T.dw, T.db, T.z, T.acc, T.amax, T.tok};
  osft_flce_t f = make_flce(CTX, &c);
  osft_flce_inputs_t in;
  osft_flce_outputs_t out;
  flce_bind(&c, &T, &in, &out);

  call_errors_targets(f, T, in, out, snap);
  call_errors_shapes(f, T, in, out, snap);
  call_errors_dtypes(f, T, in, out, snap);
  call_errors_device_layout_aliasing(f, T, in, out, snap);
  call_errors_structs(CTX, f, T, in, out, snap);

  /* the same arguments work */
  assert_ok(osft_flce_compute(f, &in, &out));
  tt_snapshot_release(snap);
  tt_snapshot_take(snap, outs, 8);
  assert_ok(osft_flce_destroy(f));
  EXPECT_FAIL(osft_flce_compute(f, &in, &out), OSFT_STATUS_INVALID_HANDLE, "flce");
  tt_snapshot_release(snap);
  free_tensors(&T);
}

static void test_options_and_handles(void **state) {
  osft_flce_options_t o;
  assert_ok(OSFT_FLCE_OPTIONS_INIT(&o));
  assert_int_equal(o.ignore_index, -100);
  assert_int_equal(o.reduction, OSFT_FLCE_MEAN);
  assert_true(o.label_smoothing == 0.0 && o.softcap == 0.0 && o.memory_budget == 0);
  osft_flce_t f = (osft_flce_t)(uintptr_t)0x5e5e;
  const double smooth[3] = {-0.1, 1.5, NAN};
  for (int i = 0; i < 3; ++i) {
    assert_ok(OSFT_FLCE_OPTIONS_INIT(&o));
    o.label_smoothing = smooth[i];
    assert_status(osft_flce_create(CTX, &o, &f), OSFT_STATUS_INVALID_ARGUMENT);
    assert_error_mentions("label_smoothing");
  }
  const double caps[3] = {-1.0, INFINITY, NAN};
  for (int i = 0; i < 3; ++i) {
    assert_ok(OSFT_FLCE_OPTIONS_INIT(&o));
    o.softcap = caps[i];
    assert_status(osft_flce_create(CTX, &o, &f), OSFT_STATUS_INVALID_ARGUMENT);
    assert_error_mentions("softcap");
  }
  assert_ok(OSFT_FLCE_OPTIONS_INIT(&o));
  o.z_loss_scale = -1e-4;
  assert_status(osft_flce_create(CTX, &o, &f), OSFT_STATUS_INVALID_ARGUMENT);
  assert_error_mentions("z_loss_scale");
  assert_ok(OSFT_FLCE_OPTIONS_INIT(&o));
  o.reduction = (osft_flce_reduction_t)7;
  assert_status(osft_flce_create(CTX, &o, &f), OSFT_STATUS_INVALID_ARGUMENT);
  assert_error_mentions("reduction");
  assert_ok(OSFT_FLCE_OPTIONS_INIT(&o));
  o.accumulator = (osft_flce_accumulator_t)-1;
  assert_status(osft_flce_create(CTX, &o, &f), OSFT_STATUS_INVALID_ARGUMENT);
  assert_error_mentions("accumulator");
  assert_ok(OSFT_FLCE_OPTIONS_INIT(&o));
  o.chunk_rows = -3;
  assert_status(osft_flce_create(CTX, &o, &f), OSFT_STATUS_INVALID_ARGUMENT);
  assert_error_mentions("chunk_rows");
  assert_ok(OSFT_FLCE_OPTIONS_INIT(&o));
  assert_int_equal(o.chunking, OSFT_FLCE_CHUNKING_AUTO); /* the defaults */
  assert_int_equal(o.slice_cols, 0);
  o.chunking = (osft_flce_chunking_t)3;
  assert_status(osft_flce_create(CTX, &o, &f), OSFT_STATUS_INVALID_ARGUMENT);
  assert_error_mentions("chunking");
  o.chunking = (osft_flce_chunking_t)-1;
  assert_status(osft_flce_create(CTX, &o, &f), OSFT_STATUS_INVALID_ARGUMENT);
  assert_error_mentions("chunking");
  assert_ok(OSFT_FLCE_OPTIONS_INIT(&o));
  o.slice_cols = -16;
  assert_status(osft_flce_create(CTX, &o, &f), OSFT_STATUS_INVALID_ARGUMENT);
  assert_error_mentions("slice_cols");
  assert_ok(OSFT_FLCE_OPTIONS_INIT(&o));
  o.struct_size = 5;
  assert_status(osft_flce_create(CTX, &o, &f), OSFT_STATUS_INVALID_STRUCT_SIZE);
  assert_status(osft_flce_create(NULL, NULL, &f), OSFT_STATUS_INVALID_HANDLE);
  assert_status(osft_flce_create(CTX, NULL, NULL), OSFT_STATUS_INVALID_ARGUMENT);
  assert_ptr_equal(f, (osft_flce_t)(uintptr_t)0x5e5e);
  assert_status(OSFT_FLCE_OPTIONS_INIT((osft_flce_options_t *)NULL),
                OSFT_STATUS_INVALID_ARGUMENT);

  /* get_options gives back what was set */
  assert_ok(OSFT_FLCE_OPTIONS_INIT(&o));
  o.ignore_index = 3;
  o.softcap = 30.0;
  o.reduction = OSFT_FLCE_SUM;
  o.memory_budget = 12345;
  o.chunking = OSFT_FLCE_CHUNKING_VOCAB;
  o.slice_cols = 48;
  assert_ok(osft_flce_create(CTX, &o, &f));
  osft_flce_options_t back;
  back.struct_size = sizeof back;
  assert_ok(osft_flce_get_options(f, &back));
  assert_memory_equal(&back, &o, sizeof o);
  /* a context with a live handle refuses to go */
  osft_context_t ctx2 = tt_context(NULL);
  osft_flce_t f2 = NULL;
  assert_ok(osft_flce_create(ctx2, NULL, &f2));
  assert_status(osft_context_destroy(ctx2), OSFT_STATUS_INVALID_ARGUMENT);
  assert_ok(osft_flce_destroy(f2));
  assert_ok(osft_context_destroy(ctx2));
  assert_ok(osft_flce_destroy(f));
  assert_status(osft_flce_destroy(f), OSFT_STATUS_INVALID_HANDLE);
  assert_status(osft_flce_get_options(f, &back), OSFT_STATUS_INVALID_HANDLE);
  assert_ok(osft_flce_destroy(NULL));
}

/* The vocab-parallel options: each error names its field, and a failed
 * create or call leaves everything as it was. */
static void test_vocab_options_errors(void **state) {
  osft_comm_t comm = NULL, dead = NULL, foreign = NULL;
  assert_ok(osft_comm_create_self(CTX, NULL, &comm));
  assert_ok(osft_comm_create_self(CTX, NULL, &dead));
  osft_context_t ctx2 = tt_context(NULL);
  assert_ok(osft_comm_create_self(ctx2, NULL, &foreign));
  /* destroyed last: a handle created after it could reuse its address */
  assert_ok(osft_comm_destroy(dead));
  osft_flce_t const sentinel = (osft_flce_t)(uintptr_t)0x5e5e;
  osft_flce_t f = sentinel;
  osft_flce_options_t o;

  assert_ok(OSFT_FLCE_OPTIONS_INIT(&o));
  assert_null(o.comm);
  assert_true(o.vocab_offset == 0 && o.vocab_size_global == 0);
  o.vocab_offset = 5; /* without a comm */
  assert_status(osft_flce_create(CTX, &o, &f), OSFT_STATUS_INVALID_ARGUMENT);
  assert_error_mentions("vocab_offset");
  assert_ok(OSFT_FLCE_OPTIONS_INIT(&o));
  o.vocab_size_global = 100; /* without a comm */
  assert_status(osft_flce_create(CTX, &o, &f), OSFT_STATUS_INVALID_ARGUMENT);
  assert_error_mentions("vocab_size_global");
  assert_ok(OSFT_FLCE_OPTIONS_INIT(&o));
  o.comm = comm;
  o.vocab_offset = 3; /* one rank holds the whole vocabulary */
  o.vocab_size_global = 20;
  assert_status(osft_flce_create(CTX, &o, &f), OSFT_STATUS_INVALID_ARGUMENT);
  assert_error_mentions("vocab_offset");
  o.vocab_offset = -1;
  assert_status(osft_flce_create(CTX, &o, &f), OSFT_STATUS_INVALID_ARGUMENT);
  assert_error_mentions("vocab_offset");
  o.vocab_offset = 0;
  o.vocab_size_global = -4;
  assert_status(osft_flce_create(CTX, &o, &f), OSFT_STATUS_INVALID_ARGUMENT);
  assert_error_mentions("vocab_size_global");
  o.vocab_size_global = 0;
  o.comm = foreign;
  assert_status(osft_flce_create(CTX, &o, &f), OSFT_STATUS_INVALID_ARGUMENT);
  assert_error_mentions("opts->comm");
  o.comm = dead;
  assert_status(osft_flce_create(CTX, &o, &f), OSFT_STATUS_INVALID_HANDLE);
  assert_error_mentions("opts->comm");
  assert_ptr_equal(f, sentinel);

  /* vocab_size_global other than in->weight's rows: the call fails, writing
   * nothing */
  flce_case c = base_case(20, 5, 13, TT_F32);
  c.accumulate = OSFT_FLCE_ACCUMULATE_ALL;
  c.bias = 1;
  snapshot snap_, *snap = &snap_;
  flce_tensors T = error_tensors(&c, "vocab option errors", snap);
  case_options(&c, &o);
  o.comm = comm;
  o.vocab_size_global = 14;
  assert_ok(osft_flce_create(CTX, &o, &f));
  osft_flce_inputs_t in;
  osft_flce_outputs_t out;
  flce_bind(&c, &T, &in, &out);
  EXPECT_FAIL(osft_flce_compute(f, &in, &out), OSFT_STATUS_SHAPE_MISMATCH,
              "vocab_size_global");
  osft_flce_options_t back;
  back.struct_size = sizeof back;
  assert_ok(osft_flce_get_options(f, &back));
  assert_ptr_equal(back.comm, comm);
  assert_int_equal(back.vocab_size_global, 14);
  assert_ok(osft_flce_destroy(f));
  tt_snapshot_release(snap);
  free_tensors(&T);

  /* an older caller's struct (up to chunk_rows) is accepted: no comm */
  assert_ok(OSFT_FLCE_OPTIONS_INIT(&o));
  o.struct_size = offsetof(osft_flce_options_t, chunk_rows) + sizeof o.chunk_rows;
  f = NULL;
  assert_ok(osft_flce_create(CTX, &o, &f));
  assert_ok(osft_flce_get_options(f, &back));
  assert_null(back.comm);
  assert_ok(osft_flce_destroy(f));

  assert_ok(osft_comm_destroy(foreign));
  assert_ok(osft_context_destroy(ctx2));
  assert_ok(osft_comm_destroy(comm));
}

int main(void) {
  if (!tt_device_present()) return OSFT_TEST_SKIP;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_call_errors_write_nothing, tt_setup,
                                      tt_teardown),
      cmocka_unit_test_setup_teardown(test_options_and_handles, tt_setup, tt_teardown),
      cmocka_unit_test_setup_teardown(test_vocab_options_errors, tt_setup, tt_teardown),
  };
  return cmocka_run_group_tests_name("flce_errors", tests, NULL, NULL);
}
