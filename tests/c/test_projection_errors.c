/* Gradient projection errors: every invalid registration and call fails
 * with its status and message and writes nothing; every host byte goes
 * through the context's allocator and comes back.
 *
 * Built twice: for the CPU, and with OSFT_TEST_CUDA for a GPU (skipped where
 * none is present). The target helpers are in projection_testlib.h, the
 * float64 projection in tests/mpi/projection_ref.h. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../mpi/projection_ref.h"
#include "test_tensors.h"
#include "test_util.h"

#include "projection_testlib.h"
#include "test_fixture.h"

static tt *random_tensor(tt_dtype d, int64_t rows, int64_t cols) {
  const int64_t shape[2] = {rows, cols};
  tt *t = tt_new(d, 2, shape);
  tt_random(t, -1, 1);
  return t;
}

/* --------------------------------------------------------------- errors */

/* Bytes of every gradient and parameter, to prove a failed call wrote
 * nothing. */
typedef struct {
  void *b[4];
  size_t n[4];
} snapshot;

static snapshot take(const target_tensors *T) {
  snapshot s;
  const tt *w[4] = {T->gu, T->ul, T->gv, T->vl};
  for (int i = 0; i < 4; ++i) s.b[i] = tt_bytes(w[i], &s.n[i]);
  return s;
}

static void expect_unchanged(const target_tensors *T, snapshot *s) {
  snapshot now = take(T);
  for (int i = 0; i < 4; ++i) {
    assert_memory_equal(s->b[i], now.b[i], s->n[i]);
    free(now.b[i]);
    free(s->b[i]);
  }
}

#define EXPECT_ADD_FAILS(proj, target, status, needle)                           \
  do {                                                                           \
    int64_t idx_ = 77;                                                           \
    assert_status(osft_projector_add_target((proj), (target), &idx_), (status)); \
    assert_error_mentions(needle);                                               \
    assert_int_equal(idx_, 77);                                                  \
  } while (0)

/* The cases below register `t` with one field changed; each must fail
 * with its status and message and hand out no index. */

/* Shapes that disagree between a target's pieces. */
static void registration_errors_shapes(osft_projector_t proj, const problem *P,
                                       osft_projection_target_t t) {
  osft_projection_target_t bad;
  tt *wrong_rows = random_tensor(TT_F32, P->n + 1, P->l);
  bad = t;
  bad.grad_u_low = &wrong_rows->t;
  EXPECT_ADD_FAILS(proj, &bad, OSFT_STATUS_SHAPE_MISMATCH, "target->grad_u_low");
  tt *wrong_l = random_tensor(TT_F32, P->l + 1, P->k);
  bad = t;
  bad.v_low = &wrong_l->t;
  EXPECT_ADD_FAILS(proj, &bad, OSFT_STATUS_SHAPE_MISMATCH, "target->v_low");
  tt *wide = random_tensor(TT_F32, P->n, P->n); /* r + l > N */
  bad = t;
  bad.u_high = &wide->t;
  EXPECT_ADD_FAILS(proj, &bad, OSFT_STATUS_SHAPE_MISMATCH, "exceed N");

  tt_free(wrong_rows);
  tt_free(wrong_l);
  tt_free(wide);
}

/* dtype, layout, device. */
static void registration_errors_dtype_layout_device(osft_projector_t proj,
                                                    const problem *P,
                                                    const target_tensors *T,
                                                    osft_projection_target_t t) {
  osft_projection_target_t bad;
  tt *f64 = random_tensor(TT_F64, P->n, P->l);
  bad = t;
  bad.grad_u_low = &f64->t;
  EXPECT_ADD_FAILS(proj, &bad, OSFT_STATUS_DTYPE_MISMATCH, "target->grad_u_low");
  DLTensor strided = T->gv->t;
  int64_t strides[2] = {1, P->l};
  strided.strides = strides;
  bad = t;
  bad.grad_v_low = &strided;
  EXPECT_ADD_FAILS(proj, &bad, OSFT_STATUS_BAD_LAYOUT, "target->grad_v_low");
  DLTensor elsewhere = T->vh->t;
  elsewhere.device.device_type = kDLCUDA;
  elsewhere.device.device_id = 7;
  bad = t;
  bad.v_high = &elsewhere;
  EXPECT_ADD_FAILS(proj, &bad, OSFT_STATUS_DEVICE_MISMATCH, "target->v_high");

  tt_free(f64);
}

/* Presence of the pieces, and layouts. */
static void registration_errors_presence(osft_projector_t proj,
                                         osft_projection_target_t t) {
  osft_projection_target_t bad;
  bad = t;
  bad.u_high = NULL;
  EXPECT_ADD_FAILS(proj, &bad, OSFT_STATUS_INVALID_ARGUMENT, "target->u_high");
  bad = t;
  bad.grad_v_low = NULL;
  bad.v_low = NULL;
  EXPECT_ADD_FAILS(proj, &bad, OSFT_STATUS_INVALID_ARGUMENT, "target->grad_v_low");
  osft_projection_target_t empty;
  assert_ok(OSFT_PROJECTION_TARGET_INIT(&empty));
  EXPECT_ADD_FAILS(proj, &empty, OSFT_STATUS_INVALID_ARGUMENT, "neither");
  bad = t;
  bad.u_layout = OSFT_SHARD_V_ROWS;
  EXPECT_ADD_FAILS(proj, &bad, OSFT_STATUS_INVALID_ARGUMENT, "target->u_layout");
  bad = t;
  bad.v_layout = (osft_shard_layout_t)42;
  EXPECT_ADD_FAILS(proj, &bad, OSFT_STATUS_INVALID_ARGUMENT, "target->v_layout");
}

/* Shard arrays: count must be the communicator's size (1 here), the
 * entry for this rank its local size, none for REPLICATED. */
static void registration_errors_shards(osft_projector_t proj, const problem *P,
                                       osft_projection_target_t t) {
  osft_projection_target_t bad;
  const int64_t two[2] = {P->n, 0}, off[1] = {P->n - 1}, neg[1] = {-1}, ok_n[1] = {P->n};
  bad = t;
  bad.u_layout = OSFT_SHARD_U_ROWS;
  EXPECT_ADD_FAILS(proj, &bad, OSFT_STATUS_INVALID_ARGUMENT, "target->u_shards");
  bad.u_shards = two;
  bad.n_u_shards = 2;
  EXPECT_ADD_FAILS(proj, &bad, OSFT_STATUS_INVALID_ARGUMENT, "target->n_u_shards");
  bad.u_shards = off;
  bad.n_u_shards = 1;
  EXPECT_ADD_FAILS(proj, &bad, OSFT_STATUS_SHAPE_MISMATCH, "target->u_shards[0]");
  bad.u_shards = neg;
  EXPECT_ADD_FAILS(proj, &bad, OSFT_STATUS_INVALID_ARGUMENT, "negative");
  bad = t;
  bad.v_shards = ok_n;
  bad.n_v_shards = 1;
  EXPECT_ADD_FAILS(proj, &bad, OSFT_STATUS_INVALID_ARGUMENT, "REPLICATED");
}

/* Every invalid registration fails and writes nothing; then set_grads. */
static void test_registration_errors(void **state) {
  problem P = ref_problem_make("errors", 10, 12, 3, 4);
  target_tensors T = make_tensors(&P, TT_F32, TT_F32, 0);
  osft_projector_t proj = new_projector(CTX, NULL);
  snapshot s = take(&T);
  osft_projection_target_t t = replicated_target(&T, 1, 1, 1);

  assert_status(osft_projector_add_target(NULL, &t, NULL), OSFT_STATUS_INVALID_HANDLE);
  assert_status(osft_projector_add_target(proj, NULL, NULL),
                OSFT_STATUS_INVALID_ARGUMENT);
  assert_error_mentions("target");
  osft_projection_target_t bad = t;
  bad.struct_size = 8;
  EXPECT_ADD_FAILS(proj, &bad, OSFT_STATUS_INVALID_STRUCT_SIZE, "target->struct_size");

  registration_errors_shapes(proj, &P, t);
  registration_errors_dtype_layout_device(proj, &P, &T, t);
  registration_errors_presence(proj, t);
  registration_errors_shards(proj, &P, t);

  /* Aliasing: within a target, and against an earlier target. */
  bad = t;
  bad.u_low = &T.gu->t;
  EXPECT_ADD_FAILS(proj, &bad, OSFT_STATUS_ALIASING, "target->grad_u_low");
  assert_ok(osft_projector_add_target(proj, &t, NULL));
  osft_projection_target_t again = replicated_target(&T, 1, 0, 0);
  EXPECT_ADD_FAILS(proj, &again, OSFT_STATUS_ALIASING, "of target 0");

  /* set_grads */
  tt *wrong_rows = random_tensor(TT_F32, P.n + 1, P.l);
  assert_status(osft_projector_set_grads(proj, 1, NULL, NULL),
                OSFT_STATUS_INVALID_ARGUMENT);
  assert_error_mentions("index");
  assert_status(osft_projector_set_grads(proj, 0, &wrong_rows->t, NULL),
                OSFT_STATUS_SHAPE_MISMATCH);
  assert_error_mentions("grad_u_low");
  assert_status(osft_projector_set_grads(proj, 0, &T.ul->t, NULL), OSFT_STATUS_ALIASING);

  osft_projector_info_t info;
  info.struct_size = sizeof info;
  assert_ok(osft_projector_get_info(proj, &info));
  assert_int_equal(info.targets, 1);
  expect_unchanged(&T, &s);
  assert_ok(osft_projector_destroy(proj));
  tt_free(wrong_rows);
  free_tensors(&T);
  ref_problem_free(&P);
}

/* Handles, options, and failures during a call: nothing is written. */
static void test_call_errors(void **state) {
  problem P = ref_problem_make("call errors", 10, 9, 2, 3);
  target_tensors T = make_tensors(&P, TT_F32, TT_F32, 0);
  osft_projector_t proj = NULL;
  assert_status(osft_projector_create(NULL, NULL, NULL, &proj),
                OSFT_STATUS_INVALID_HANDLE);
  assert_status(osft_projector_create(CTX, NULL, NULL, NULL),
                OSFT_STATUS_INVALID_ARGUMENT);
  osft_projector_options_t o;
  assert_ok(OSFT_PROJECTOR_OPTIONS_INIT(&o));
  assert_int_equal(o.check_consistency, 1);
  o.check_consistency = 5;
  assert_status(osft_projector_create(CTX, NULL, &o, &proj),
                OSFT_STATUS_INVALID_ARGUMENT);
  assert_error_mentions("opts->check_consistency");
  assert_null(proj);
  assert_status(osft_projector_options_init(&o, 3), OSFT_STATUS_INVALID_STRUCT_SIZE);
  assert_status(osft_projector_project(NULL), OSFT_STATUS_INVALID_HANDLE);
  assert_ok(osft_projector_destroy(NULL));

  /* A communicator of another context. */
  osft_context_t other = tt_context(NULL);
  osft_comm_t foreign = NULL;
  assert_ok(osft_comm_create_self(other, NULL, &foreign));
  assert_status(osft_projector_create(CTX, foreign, NULL, &proj),
                OSFT_STATUS_INVALID_ARGUMENT);
  assert_error_mentions("comm");
  assert_ok(osft_comm_destroy(foreign));
  assert_ok(osft_context_destroy(other));

  /* The orthogonality query needs every trainable factor. */
  proj = new_projector(CTX, NULL);
  osft_projection_target_t t = replicated_target(&T, 1, 1, 0);
  assert_ok(osft_projector_add_target(proj, &t, NULL));
  double mu = 123;
  assert_status(osft_projector_orthogonality(proj, &mu, NULL),
                OSFT_STATUS_INVALID_ARGUMENT);
  assert_error_mentions("u_low");
  assert_true(mu == 123);
  assert_ok(osft_projector_project_params(proj)); /* no factors: nothing to do */
  assert_ok(osft_projector_destroy(proj));
  assert_status(osft_projector_destroy(proj), OSFT_STATUS_INVALID_HANDLE);

  /* A collective that fails: no gradient changes, the communicator is
   * broken afterwards, and a projector keeps it from being destroyed. */
  counter failing = {0, OSFT_STATUS_TIMEOUT};
  osft_comm_t comm = counting_comm(CTX, &failing);
  proj = new_projector(CTX, comm);
  const int64_t n_sh[1] = {P.n};
  t = replicated_target(&T, 1, 1, 1);
  t.u_layout = OSFT_SHARD_U_ROWS;
  t.u_shards = n_sh;
  t.n_u_shards = 1;
  assert_ok(osft_projector_add_target(proj, &t, NULL));
  snapshot s = take(&T);
  assert_status(osft_projector_project(proj), OSFT_STATUS_TIMEOUT);
  assert_error_mentions("allreduce_sum callback");
  assert_status(osft_projector_project_params(proj), OSFT_STATUS_COMM_ERROR);
  assert_error_mentions("broken");
  assert_int_equal(failing.calls, 1);
  expect_unchanged(&T, &s);
  assert_status(osft_comm_destroy(comm), OSFT_STATUS_INVALID_ARGUMENT);
  assert_error_mentions("projector");
  assert_status(osft_context_destroy(CTX), OSFT_STATUS_INVALID_ARGUMENT);
  assert_ok(osft_projector_destroy(proj));
  assert_ok(osft_comm_destroy(comm));
  free_tensors(&T);
  ref_problem_free(&P);
}

/* Every host and device byte goes through the context's allocator (on a
 * GPU a counting cudaMalloc pair) and comes back with its size. */
static void test_memory_is_returned(void **state) {
  (void)state;
  test_alloc_state a;
  osft_context_t ctx = tt_counting_context(&a);
  problem P = ref_problem_make("memory", 16, 12, 4, 4);
  target_tensors T = make_tensors(&P, TT_BF16, TT_BF16, 0);
  osft_comm_t comm = NULL;
  assert_ok(osft_comm_create_self(ctx, NULL, &comm));
  osft_projector_t proj = new_projector(ctx, comm);
  osft_projection_target_t t = replicated_target(&T, 1, 1, 1);
  const int64_t k_sh[1] = {P.k};
  t.v_layout = OSFT_SHARD_V_COLS;
  t.v_shards = k_sh;
  t.n_v_shards = 1;
  assert_ok(osft_projector_add_target(proj, &t, NULL));
  assert_ok(osft_projector_project(proj));
  assert_ok(osft_projector_orthogonality(proj, NULL, NULL));
  assert_true(a.host_allocs > 0);
  if (tt_device() == OSFT_DEVICE_CUDA) assert_true(a.device_allocs > 0);
  assert_ok(osft_projector_destroy(proj));
  assert_ok(osft_comm_destroy(comm));
  assert_ok(osft_context_destroy(ctx));
  tt_expect_all_returned(&a);
  free_tensors(&T);
  ref_problem_free(&P);
}

int main(void) {
  if (!tt_device_present()) return OSFT_TEST_SKIP;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_registration_errors, tt_setup, tt_teardown),
      cmocka_unit_test_setup_teardown(test_call_errors, tt_setup, tt_teardown),
      cmocka_unit_test(test_memory_is_returned),
  };
  return cmocka_run_group_tests_name("projection_errors", tests, NULL, NULL);
}
