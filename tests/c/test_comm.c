/* Communicators on one process: the one-rank engine, host callbacks (here
 * standing in for a 3-rank group), statistics, every argument error, the
 * MPI and NCCL entry points where they cannot run (no MPI_Init, no GPU),
 * and, built for CUDA with a GPU present, a one-rank NCCL communicator
 * with a projector on it. Multi-rank behaviour is tested with real MPI
 * processes in tests/mpi. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef OSFT_TEST_CUDA
#include <cuda_runtime.h>
#endif

#include "../mpi/projection_ref.h"
#include "test_fixture.h"
#include "test_tensors.h"
#include "test_util.h"

static tt *vector_of(tt_dtype d, int64_t n, double first) {
  const int64_t shape[1] = {n};
  tt *t = tt_new(d, 1, shape);
  double *v = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
  for (int64_t i = 0; i < n; ++i) v[i] = first + (double)i;
  tt_set(t, v);
  free(v);
  return t;
}

static void expect_values(const tt *t, double first, double scale) {
  double *v = tt_get(t);
  for (int64_t i = 0; i < tt_logical_numel(t); ++i)
    if (v[i] != scale * (first + (double)i))
      fail_msg("element %lld: %g, expected %g", (long long)i, v[i],
               scale * (first + (double)i));
  free(v);
}

/* Host view of memory in the context's space, for callbacks. */
static void to_host(void *dst, const void *src, size_t bytes) {
#ifdef OSFT_TEST_CUDA
  assert_int_equal(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
#else
  memcpy(dst, src, bytes);
#endif
}

static void from_host(void *dst, const void *src, size_t bytes) {
#ifdef OSFT_TEST_CUDA
  assert_int_equal(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), cudaSuccess);
#else
  memcpy(dst, src, bytes);
#endif
}

/* ------------------------------------------------------------- self */

/* One rank: all-reduce leaves the values, all-gather copies, fp32 and
 * bf16. */
static void check_one_rank_collectives(osft_comm_t comm) {
  for (int d = 0; d < 2; ++d) {
    const tt_dtype dt = d ? TT_BF16 : TT_F32;
    tt *buf = vector_of(dt, 9, 1.0);
    assert_ok(osft_comm_allreduce_sum(comm, &buf->t));
    expect_values(buf, 1.0, 1.0);
    tt *send = vector_of(dt, 6, 3.0), *recv = vector_of(dt, 6, 0.0);
    tt_poison(recv);
    const int64_t counts[1] = {6};
    assert_ok(osft_comm_allgather(comm, &send->t, &recv->t, counts, 1));
    expect_values(recv, 3.0, 1.0);
    tt_free(buf), tt_free(send), tt_free(recv);
  }
  assert_ok(osft_comm_barrier(comm));
}

static void test_self(void **state) {
  osft_comm_t comm = NULL;
  assert_ok(osft_comm_create_self(CTX, NULL, &comm));
  int rank = -1, size = -1;
  osft_comm_engine_t engine = OSFT_COMM_ENGINE_MPI;
  assert_ok(osft_comm_get_info(comm, &rank, &size, &engine));
  assert_int_equal(rank, 0);
  assert_int_equal(size, 1);
  assert_int_equal(engine, OSFT_COMM_ENGINE_SELF);
  assert_ok(osft_comm_get_info(comm, NULL, NULL, NULL));
  check_one_rank_collectives(comm);
  osft_comm_stats_t st;
  st.struct_size = sizeof st;
  assert_ok(osft_comm_get_stats(comm, &st));
  assert_int_equal(st.allreduce_calls, 2);
  assert_int_equal(st.allgather_calls, 2);
  assert_int_equal(st.barrier_calls, 1);
  assert_int_equal(st.allreduce_bytes, 9 * 4 + 9 * 2);
  assert_int_equal(st.allgather_bytes, 6 * 4 + 6 * 2);
  assert_int_equal(st.failures, 0);
  assert_ok(osft_comm_reset_stats(comm));
  assert_ok(osft_comm_get_stats(comm, &st));
  assert_int_equal(st.allreduce_calls + st.allgather_calls + st.barrier_calls, 0);
  assert_ok(osft_comm_destroy(comm));
}

/* -------------------------------------------------------- callbacks */

/* A fake 3-rank group: this process is rank 1; the other ranks hold the
 * same data (all-reduce triples it) and blocks 100 + i, 300 + i. */
typedef struct {
  int allreduce, allgather, barrier, released;
  int64_t last_count;
  osft_status_t fail_with;
} fake_group;

static osft_status_t fake_allreduce(void *user, DLTensor *buf) {
  fake_group *g = user;
  g->allreduce++;
  if (g->fail_with != OSFT_STATUS_SUCCESS) return g->fail_with;
  assert_int_equal(buf->ndim, 1);
  assert_int_equal(buf->device.device_type,
                   tt_device() == OSFT_DEVICE_CUDA ? kDLCUDA : kDLCPU);
  g->last_count = buf->shape[0];
  if (buf->dtype.code != kDLFloat) return OSFT_STATUS_SUCCESS; /* bf16: not summed */
  const size_t bytes = (size_t)buf->shape[0] * sizeof(float);
  float *h = malloc(bytes + 4);
  to_host(h, buf->data, bytes);
  for (int64_t i = 0; i < buf->shape[0]; ++i) h[i] *= 3.0f;
  from_host(buf->data, h, bytes);
  free(h);
  return OSFT_STATUS_SUCCESS;
}

static osft_status_t fake_allgather(void *user, const DLTensor *send, DLTensor *recv,
                                    const int64_t *counts, int64_t n) {
  fake_group *g = user;
  g->allgather++;
  if (g->fail_with != OSFT_STATUS_SUCCESS) return g->fail_with;
  assert_int_equal(n, 3);
  assert_int_equal(send->shape[0], counts[1]);
  assert_int_equal(recv->shape[0], counts[0] + counts[1] + counts[2]);
  const size_t total = (size_t)recv->shape[0];
  float *h = malloc((total + 1) * sizeof(float));
  for (int64_t i = 0; i < counts[0]; ++i) h[i] = 100.0f + (float)i;
  to_host(h + counts[0], send->data, (size_t)counts[1] * sizeof(float));
  for (int64_t i = 0; i < counts[2]; ++i)
    h[counts[0] + counts[1] + i] = 300.0f + (float)i;
  from_host(recv->data, h, total * sizeof(float));
  free(h);
  return OSFT_STATUS_SUCCESS;
}

static void fake_release(void *user) {
  ((fake_group *)user)->released++;
}

static osft_comm_t fake_comm(osft_context_t ctx, fake_group *g) {
  osft_comm_callbacks_t cb;
  assert_ok(OSFT_COMM_CALLBACKS_INIT(&cb));
  assert_int_equal(cb.size, 1);
  cb.user = g;
  cb.rank = 1;
  cb.size = 3;
  cb.allreduce_sum = fake_allreduce;
  cb.allgather = fake_allgather;
  cb.release = fake_release;
  osft_comm_t comm = NULL;
  assert_ok(osft_comm_create_callbacks(ctx, &cb, NULL, &comm));
  return comm;
}

static void test_callbacks(void **state) {
  fake_group g;
  memset(&g, 0, sizeof g);
  osft_comm_t comm = fake_comm(CTX, &g);
  int rank, size;
  osft_comm_engine_t engine;
  assert_ok(osft_comm_get_info(comm, &rank, &size, &engine));
  assert_int_equal(rank, 1);
  assert_int_equal(size, 3);
  assert_int_equal(engine, OSFT_COMM_ENGINE_CALLBACKS);
  tt *buf = vector_of(TT_F32, 7, 2.0);
  assert_ok(osft_comm_allreduce_sum(comm, &buf->t));
  expect_values(buf, 2.0, 3.0);
  assert_int_equal(g.last_count, 7);
  const int64_t counts[3] = {2, 4, 3};
  tt *send = vector_of(TT_F32, 4, 50.0), *recv = vector_of(TT_F32, 9, 0.0);
  tt_poison(recv);
  assert_ok(osft_comm_allgather(comm, &send->t, &recv->t, counts, 3));
  double *r = tt_get(recv);
  const double want[9] = {100, 101, 50, 51, 52, 53, 300, 301, 302};
  for (int i = 0; i < 9; ++i) assert_true(r[i] == want[i]);
  free(r);
  /* No barrier callback: a one-element all-reduce stands in. */
  assert_ok(osft_comm_barrier(comm));
  assert_int_equal(g.allreduce, 2);
  assert_int_equal(g.last_count, 1);
  /* A failing callback: its status (TIMEOUT passes through), then the
   * communicator refuses everything. */
  g.fail_with = OSFT_STATUS_TIMEOUT;
  assert_status(osft_comm_allreduce_sum(comm, &buf->t), OSFT_STATUS_TIMEOUT);
  assert_error_mentions("allreduce_sum callback");
  g.fail_with = OSFT_STATUS_SUCCESS;
  assert_status(osft_comm_barrier(comm), OSFT_STATUS_COMM_ERROR);
  assert_error_mentions("broken");
  osft_comm_stats_t st;
  st.struct_size = sizeof st;
  assert_ok(osft_comm_get_stats(comm, &st));
  assert_int_equal(st.failures, 1);
  assert_int_equal(g.released, 0);
  assert_ok(osft_comm_destroy(comm));
  assert_int_equal(g.released, 1);
  /* Another error status becomes a communication error. */
  memset(&g, 0, sizeof g);
  comm = fake_comm(CTX, &g);
  g.fail_with = OSFT_STATUS_NOT_SUPPORTED;
  assert_status(osft_comm_allgather(comm, &send->t, &recv->t, counts, 3),
                OSFT_STATUS_COMM_ERROR);
  assert_error_mentions("allgather callback returned 12");
  assert_ok(osft_comm_destroy(comm));
  tt_free(buf), tt_free(send), tt_free(recv);
}

/* -------------------------------------------------------- validation */

static void test_collective_errors(void **state) {
  fake_group g;
  memset(&g, 0, sizeof g);
  osft_comm_t comm = fake_comm(CTX, &g);
  tt *buf = vector_of(TT_F32, 6, 1.0), *f64 = vector_of(TT_F64, 6, 1.0);
  assert_status(osft_comm_allreduce_sum(NULL, &buf->t), OSFT_STATUS_INVALID_HANDLE);
  assert_status(osft_comm_allreduce_sum(comm, NULL), OSFT_STATUS_INVALID_ARGUMENT);
  assert_error_mentions("buf");
  assert_status(osft_comm_allreduce_sum(comm, &f64->t), OSFT_STATUS_DTYPE_MISMATCH);
  assert_error_mentions("buf");
  const int64_t m_shape[2] = {2, 3};
  tt *m = tt_new(TT_F32, 2, m_shape);
  DLTensor strided = m->t;
  int64_t strides[2] = {1, 2};
  strided.strides = strides;
  assert_status(osft_comm_allreduce_sum(comm, &strided), OSFT_STATUS_BAD_LAYOUT);
  DLTensor away = buf->t;
  away.device.device_type = kDLCUDA;
  away.device.device_id = 9;
  assert_status(osft_comm_allreduce_sum(comm, &away), OSFT_STATUS_DEVICE_MISMATCH);

  const int64_t counts[3] = {2, 4, 3}, neg[3] = {2, -4, 3}, short_send[3] = {2, 5, 3};
  tt *send = vector_of(TT_F32, 4, 0.0), *recv = vector_of(TT_F32, 9, 0.0);
  tt *recv16 = vector_of(TT_BF16, 9, 0.0), *small = vector_of(TT_F32, 8, 0.0);
  size_t bytes = 0;
  void *before = tt_bytes(recv, &bytes);
  assert_status(osft_comm_allgather(comm, &send->t, &recv->t, NULL, 3),
                OSFT_STATUS_INVALID_ARGUMENT);
  assert_error_mentions("counts");
  assert_status(osft_comm_allgather(comm, &send->t, &recv->t, counts, 2),
                OSFT_STATUS_INVALID_ARGUMENT);
  assert_error_mentions("n_counts");
  assert_status(osft_comm_allgather(comm, &send->t, &recv->t, neg, 3),
                OSFT_STATUS_INVALID_ARGUMENT);
  assert_error_mentions("counts[1]");
  assert_status(osft_comm_allgather(comm, &send->t, &recv->t, short_send, 3),
                OSFT_STATUS_SHAPE_MISMATCH);
  assert_error_mentions("send");
  assert_status(osft_comm_allgather(comm, &send->t, &small->t, counts, 3),
                OSFT_STATUS_SHAPE_MISMATCH);
  assert_error_mentions("recv");
  assert_status(osft_comm_allgather(comm, &send->t, &recv16->t, counts, 3),
                OSFT_STATUS_DTYPE_MISMATCH);
  DLTensor inside = recv->t;
  int64_t four[1] = {4};
  inside.shape = four;
  assert_status(osft_comm_allgather(comm, &inside, &recv->t, counts, 3),
                OSFT_STATUS_ALIASING);
  void *after = tt_bytes(recv, &bytes);
  assert_memory_equal(before, after, bytes);
  assert_int_equal(g.allgather + g.allreduce, 0); /* nothing reached the engine */
  free(before), free(after);
  tt_free(buf), tt_free(f64), tt_free(m), tt_free(send), tt_free(recv), tt_free(recv16),
      tt_free(small);
  assert_ok(osft_comm_destroy(comm));
}

static osft_status_t never(void *user, DLTensor *buf) {
  (void)user, (void)buf;
  return OSFT_STATUS_SUCCESS;
}

static void test_create_errors(void **state) {
  osft_comm_t comm = NULL;
  assert_status(osft_comm_create_self(NULL, NULL, &comm), OSFT_STATUS_INVALID_HANDLE);
  assert_status(osft_comm_create_self(CTX, NULL, NULL), OSFT_STATUS_INVALID_ARGUMENT);
  osft_comm_options_t o;
  assert_ok(OSFT_COMM_OPTIONS_INIT(&o));
  assert_true(o.timeout_seconds == 300.0);
  const double bad_timeouts[3] = {0.0, -1.0, NAN};
  for (int i = 0; i < 3; ++i) {
    o.timeout_seconds = bad_timeouts[i];
    assert_status(osft_comm_create_self(CTX, &o, &comm), OSFT_STATUS_INVALID_ARGUMENT);
    assert_error_mentions("opts->timeout_seconds");
    assert_null(comm);
  }
  o.timeout_seconds = INFINITY;
  assert_ok(osft_comm_create_self(CTX, &o, &comm));
  /* A context with a live communicator cannot be destroyed. */
  assert_status(osft_context_destroy(CTX), OSFT_STATUS_INVALID_ARGUMENT);
  assert_ok(osft_comm_destroy(comm));
  assert_status(osft_comm_destroy(comm), OSFT_STATUS_INVALID_HANDLE);
  assert_ok(osft_comm_destroy(NULL));
  comm = NULL;
  o.struct_size = 4;
  assert_status(osft_comm_create_self(CTX, &o, &comm), OSFT_STATUS_INVALID_STRUCT_SIZE);
  assert_status(osft_comm_options_init(&o, 2), OSFT_STATUS_INVALID_STRUCT_SIZE);
  assert_status(osft_comm_options_init(NULL, sizeof o), OSFT_STATUS_INVALID_ARGUMENT);

  /* Callbacks: required functions, rank and size. */
  osft_comm_callbacks_t cb;
  assert_ok(OSFT_COMM_CALLBACKS_INIT(&cb));
  assert_status(osft_comm_create_callbacks(CTX, &cb, NULL, &comm),
                OSFT_STATUS_INVALID_ARGUMENT);
  assert_error_mentions("callbacks->allreduce_sum");
  cb.allreduce_sum = never;
  assert_status(osft_comm_create_callbacks(CTX, &cb, NULL, &comm),
                OSFT_STATUS_INVALID_ARGUMENT);
  assert_error_mentions("callbacks->allgather");
  cb.allgather = fake_allgather;
  cb.size = 0;
  assert_status(osft_comm_create_callbacks(CTX, &cb, NULL, &comm),
                OSFT_STATUS_INVALID_ARGUMENT);
  assert_error_mentions("callbacks->size");
  cb.size = 3;
  cb.rank = 3;
  assert_status(osft_comm_create_callbacks(CTX, &cb, NULL, &comm),
                OSFT_STATUS_INVALID_ARGUMENT);
  assert_error_mentions("callbacks->rank");
  assert_status(osft_comm_create_callbacks(CTX, NULL, NULL, &comm),
                OSFT_STATUS_INVALID_ARGUMENT);
  assert_null(comm);

  /* MPI without MPI_Init (or without MPI, or on a GPU context). */
  const osft_status_t mpi_expect =
      !osft_has_feature(OSFT_FEATURE_MPI) || tt_device() == OSFT_DEVICE_CUDA
          ? OSFT_STATUS_NOT_SUPPORTED
          : OSFT_STATUS_INVALID_ARGUMENT;
  assert_status(osft_comm_create_mpi(CTX, 0, NULL, &comm), mpi_expect);
  if (mpi_expect == OSFT_STATUS_INVALID_ARGUMENT)
    assert_error_mentions("not initialized");
  assert_null(comm);

  /* NCCL: needs a CUDA context and NCCL. */
  assert_status(osft_comm_nccl_unique_id(NULL), OSFT_STATUS_INVALID_ARGUMENT);
  assert_status(osft_comm_create_nccl_from_id(CTX, NULL, 1, 0, NULL, &comm),
                OSFT_STATUS_INVALID_ARGUMENT);
  if (tt_device() == OSFT_DEVICE_CPU) {
    osft_nccl_unique_id_t id;
    memset(&id, 0, sizeof id);
    assert_status(osft_comm_create_nccl_from_id(CTX, &id, 1, 0, NULL, &comm),
                  OSFT_STATUS_NOT_SUPPORTED);
    assert_status(osft_comm_create_nccl(CTX, &id, NULL, &comm),
                  OSFT_STATUS_NOT_SUPPORTED);
  }
  if (!osft_has_feature(OSFT_FEATURE_NCCL)) {
    osft_nccl_unique_id_t id;
    assert_status(osft_comm_nccl_unique_id(&id), OSFT_STATUS_NOT_SUPPORTED);
    assert_error_mentions("NCCL");
  }
  assert_null(comm);

  osft_comm_stats_t st;
  assert_ok(osft_comm_create_self(CTX, NULL, &comm));
  st.struct_size = 8;
  assert_status(osft_comm_get_stats(comm, &st), OSFT_STATUS_INVALID_STRUCT_SIZE);
  assert_status(osft_comm_get_stats(comm, NULL), OSFT_STATUS_INVALID_ARGUMENT);
  assert_ok(osft_comm_destroy(comm));
}

/* ----------------------------------------------------- NCCL, one rank */

#ifdef OSFT_TEST_CUDA
static void test_nccl_one_rank(void **state) {
  if (!osft_has_feature(OSFT_FEATURE_NCCL)) {
    printf("NCCL not compiled in: skipping the NCCL engine\n");
    skip(); /* reported as skipped, not passed */
  }
  osft_nccl_unique_id_t id;
  assert_ok(osft_comm_nccl_unique_id(&id));
  osft_comm_options_t o;
  assert_ok(OSFT_COMM_OPTIONS_INIT(&o));
  o.timeout_seconds = 60;
  osft_comm_t comm = NULL;
  assert_status(osft_comm_create_nccl_from_id(CTX, &id, 1, 1, &o, &comm),
                OSFT_STATUS_INVALID_ARGUMENT);
  assert_error_mentions("rank");
  assert_status(osft_comm_create_nccl(CTX, NULL, &o, &comm),
                OSFT_STATUS_INVALID_ARGUMENT);
  assert_ok(osft_comm_create_nccl_from_id(CTX, &id, 1, 0, &o, &comm));
  int rank, size;
  osft_comm_engine_t engine;
  assert_ok(osft_comm_get_info(comm, &rank, &size, &engine));
  assert_int_equal(engine, OSFT_COMM_ENGINE_NCCL);
  assert_int_equal(size, 1);
  check_one_rank_collectives(comm);
  /* A projector on the NCCL communicator: U_ROWS and V_COLS of one rank. */
  ref_problem P = ref_problem_make("nccl projector", 20, 18, 5, 6);
  const int64_t su[2] = {P.n, P.r}, sg[2] = {P.n, P.l}, sv[2] = {P.r, P.k},
                sgv[2] = {P.l, P.k};
  tt *uh = tt_new(TT_F32, 2, su), *gu = tt_new(TT_F32, 2, sg),
     *vh = tt_new(TT_F32, 2, sv), *gv = tt_new(TT_F32, 2, sgv);
  tt_set(uh, P.uh), tt_set(gu, P.gu), tt_set(vh, P.vh), tt_set(gv, P.gv);
  const int64_t n_sh[1] = {P.n}, k_sh[1] = {P.k};
  osft_projection_target_t t;
  assert_ok(OSFT_PROJECTION_TARGET_INIT(&t));
  t.u_high = &uh->t;
  t.grad_u_low = &gu->t;
  t.u_layout = OSFT_SHARD_U_ROWS;
  t.u_shards = n_sh;
  t.n_u_shards = 1;
  t.v_high = &vh->t;
  t.grad_v_low = &gv->t;
  t.v_layout = OSFT_SHARD_V_COLS;
  t.v_shards = k_sh;
  t.n_v_shards = 1;
  osft_projector_t proj = NULL;
  assert_ok(osft_projector_create(CTX, comm, NULL, &proj));
  assert_ok(osft_projector_add_target(proj, &t, NULL));
  double *eu = tt_get(gu), *ev = tt_get(gv), *h_u = tt_get(uh), *h_v = tt_get(vh);
  ref_project_u(h_u, P.n, P.r, eu, P.l);
  ref_project_v(h_v, P.r, P.k, ev, P.l);
  assert_ok(osft_projector_project(proj));
  double *got_u = tt_get(gu), *got_v = tt_get(gv);
  assert_true(ref_rel_err(got_u, eu, P.n * P.l, 1e-6) <= 2e-5);
  assert_true(ref_rel_err(got_v, ev, P.l * P.k, 1e-6) <= 2e-5);
  free(eu), free(ev), free(h_u), free(h_v), free(got_u), free(got_v);
  assert_ok(osft_projector_destroy(proj));
  tt_free(uh), tt_free(gu), tt_free(vh), tt_free(gv);
  ref_problem_free(&P);
  assert_ok(osft_comm_destroy(comm));
}
#endif

int main(void) {
  if (!tt_device_present()) return OSFT_TEST_SKIP;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_self, tt_setup, tt_teardown),
      cmocka_unit_test_setup_teardown(test_callbacks, tt_setup, tt_teardown),
      cmocka_unit_test_setup_teardown(test_collective_errors, tt_setup, tt_teardown),
      cmocka_unit_test_setup_teardown(test_create_errors, tt_setup, tt_teardown),
#ifdef OSFT_TEST_CUDA
      cmocka_unit_test_setup_teardown(test_nccl_one_rank, tt_setup, tt_teardown),
#endif
  };
  return cmocka_run_group_tests_name("comm", tests, NULL, NULL);
}
