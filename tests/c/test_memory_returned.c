/* The batched QR, the gradient projection and the communicators return
 * every block they take, host and device, with the size it was taken with:
 * each test runs on a context whose memory goes through a counting
 * allocator (on a GPU: a counting host pair and a counting cudaMalloc
 * device pair, tt_counting_context) and checks the books after the context
 * is destroyed, along with the results against a float64 reference. Built
 * with OSFT_TEST_CUDA (test_memory_returned_cuda) every test runs a second
 * time on a context whose stream is a non-blocking stream of the test's own
 * (which the legacy default stream does not order), synchronizing the
 * context before reading results; those runs are skipped on the CPU, which
 * has no streams. */
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

typedef struct {
  test_alloc_state a;
  osft_context_t ctx;
  void *stream; /* the test's own stream, or NULL */
} counted_ctx;

/* A counting context; with own_stream, on a non-blocking stream the test
 * creates (skips the test on the CPU). */
static void open_ctx(counted_ctx *c, int own_stream) {
  c->stream = NULL;
  if (own_stream) {
#ifdef OSFT_TEST_CUDA
    cudaStream_t s = NULL;
    assert_int_equal(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    c->stream = s;
#else
    skip(); /* a CPU context has no stream */
#endif
  }
  c->ctx = tt_counting_context(&c->a);
  if (c->stream != NULL) {
    assert_ok(osft_context_set_stream(c->ctx, c->stream));
    void *got = NULL;
    assert_ok(osft_context_get_stream(c->ctx, &got));
    assert_ptr_equal(got, c->stream);
  }
}

/* Results are read with plain copies on the legacy default stream, which a
 * non-blocking stream is not ordered with: wait for the context first. */
static void settle(const counted_ctx *c) {
  assert_ok(osft_context_synchronize(c->ctx));
}

/* Destroys the context and checks that every block came back; `what` the
 * test had taken some (the counting pairs were really in use). */
static void close_ctx(counted_ctx *c, int expect_device_blocks) {
  assert_ok(osft_context_destroy(c->ctx));
  assert_true(c->a.host_allocs > 0);
  if (expect_device_blocks && tt_device() == OSFT_DEVICE_CUDA)
    assert_true(c->a.device_allocs > 0);
  tt_expect_all_returned(&c->a);
#ifdef OSFT_TEST_CUDA
  if (c->stream != NULL) cudaStreamDestroy((cudaStream_t)c->stream);
#endif
}

static tt *mat(tt_dtype d, int64_t rows, int64_t cols) {
  const int64_t shape[2] = {rows, cols};
  return tt_new(d, 2, shape);
}

/* ------------------------------------------------------------ QR */

/* ||Q R - A|| / ||A|| and ||Q^T Q - I|| (max norms), R upper triangular
 * with diag(R) >= 0. */
static void expect_qr(const char *what, const double *a, const double *q, const double *r,
                      int64_t m, int64_t n, double tol) {
  double amax = 0, err = 0, orth = 0;
  for (int64_t i = 0; i < m * n; ++i) amax = fmax(amax, fabs(a[i]));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t t = 0; t <= j; ++t) s += q[i * n + t] * r[t * n + j];
      err = fmax(err, fabs(s - a[i * n + j]));
    }
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t t = 0; t < m; ++t) s += q[t * n + i] * q[t * n + j];
      orth = fmax(orth, fabs(s - (i == j ? 1.0 : 0.0)));
      if (i > j && r[i * n + j] != 0.0)
        fail_msg("%s: R[%lld][%lld] != 0", what, (long long)i, (long long)j);
    }
  for (int64_t i = 0; i < n; ++i)
    if (!(r[i * n + i] >= 0.0)) fail_msg("%s: diag(R)[%lld] < 0", what, (long long)i);
  if (!(err <= tol * amax) || !(orth <= tol))
    fail_msg("%s: |QR - A| = %.3g (|A| %.3g), |Q^T Q - I| = %.3g, tolerance %.3g", what,
             err, amax, orth, tol);
}

enum { QR_N = 4 };

static void run_qr(int own_stream) {
  counted_ctx c;
  open_ctx(&c, own_stream);
  test_seed(own_stream ? "qr own stream" : "qr");
  /* Small matrices (the batched kernel on a GPU) and large ones (lanes). */
  const int64_t m[QR_N] = {20, 33, 260, 400};
  const int64_t n[QR_N] = {6, 33, 48, 80};
  const tt_dtype d[QR_N] = {TT_F32, TT_F64, TT_F32, TT_F64};
  tt *a[QR_N], *q[QR_N], *r[QR_N], *q0[QR_N], *sq[QR_N];
  const DLTensor *ap[QR_N], *sqp[QR_N];
  DLTensor *qp[QR_N], *rp[QR_N], *q0p[QR_N];
  osft_status_t st[QR_N];
  for (int i = 0; i < QR_N; ++i) {
    a[i] = mat(d[i], m[i], n[i]), q[i] = mat(d[i], m[i], n[i]);
    r[i] = mat(d[i], n[i], n[i]), q0[i] = mat(d[i], m[i], n[i]);
    sq[i] = mat(d[i], m[i], m[i]);
    tt_random(a[i], -1.0, 1.0), tt_random(q0[i], -1.0, 1.0);
    tt_random(sq[i], -1.0, 1.0);
    tt_poison(q[i]), tt_poison(r[i]);
    ap[i] = &a[i]->t, qp[i] = &q[i]->t, rp[i] = &r[i]->t;
    sqp[i] = &sq[i]->t, q0p[i] = &q0[i]->t;
  }
  for (int method = 0; method < 2; ++method) {
    osft_qr_options_t o;
    assert_ok(OSFT_QR_OPTIONS_INIT(&o));
    o.method = method == 0 ? OSFT_QR_HOUSEHOLDER : OSFT_QR_CHOLESKY_QR2;
    assert_ok(osft_qr_batch(c.ctx, &o, QR_N, ap, qp, rp, st));
    settle(&c);
    for (int i = 0; i < QR_N; ++i) {
      assert_int_equal(st[i], OSFT_STATUS_SUCCESS);
      double *av = tt_get(a[i]), *qv = tt_get(q[i]), *rv = tt_get(r[i]);
      char what[64];
      snprintf(what, sizeof what, "qr method %d, matrix %d", method, i);
      expect_qr(what, av, qv, rv, m[i], n[i], d[i] == TT_F32 ? 2e-4 : 1e-11);
      free(av), free(qv), free(rv);
    }
  }
  /* Power iteration: Q stays orthonormal (the product's Q factor). */
  assert_ok(osft_qr_power_iteration(c.ctx, NULL, QR_N, sqp, q0p, 2, st));
  settle(&c);
  for (int i = 0; i < QR_N; ++i) {
    assert_int_equal(st[i], OSFT_STATUS_SUCCESS);
    double *qv = tt_get(q0[i]);
    double orth = 0;
    for (int64_t x = 0; x < n[i]; ++x)
      for (int64_t y = 0; y < n[i]; ++y) {
        double s = 0;
        for (int64_t t = 0; t < m[i]; ++t) s += qv[t * n[i] + x] * qv[t * n[i] + y];
        orth = fmax(orth, fabs(s - (x == y ? 1.0 : 0.0)));
      }
    if (!(orth <= (d[i] == TT_F32 ? 2e-4 : 1e-11)))
      fail_msg("power iteration pair %d: |Q^T Q - I| = %.3g", i, orth);
    free(qv);
  }
  for (int i = 0; i < QR_N; ++i)
    tt_free(a[i]), tt_free(q[i]), tt_free(r[i]), tt_free(q0[i]), tt_free(sq[i]);
  close_ctx(&c, 1);
}

static void test_qr_returns_every_block(void **state) {
  (void)state;
  run_qr(0);
}

static void test_qr_own_stream(void **state) {
  (void)state;
  run_qr(1);
}

/* ------------------------------------------------------------ projection */

static tt *from_values(tt_dtype d, int64_t rows, int64_t cols, const double *v) {
  tt *t = mat(d, rows, cols);
  tt_set(t, v);
  return t;
}

static void expect_close(const char *what, const tt *t, const double *ref, double tol) {
  double *got = tt_get(t);
  const double err = ref_rel_err(got, ref, tt_logical_numel(t), 1e-6);
  free(got);
  if (!(err <= tol)) fail_msg("%s: relative max error %.3g > %.3g", what, err, tol);
}

static osft_status_t sum_one_rank(void *user, DLTensor *buf) {
  (void)buf;
  ++*(int *)user;
  return OSFT_STATUS_SUCCESS;
}

static osft_status_t gather_one_rank(void *user, const DLTensor *send, DLTensor *recv,
                                     const int64_t *counts, int64_t n) {
  (void)user, (void)send, (void)recv, (void)counts, (void)n;
  return OSFT_STATUS_COMM_ERROR; /* one rank: never called */
}

static void run_projection(int own_stream, int callbacks) {
  counted_ctx c;
  open_ctx(&c, own_stream);
  ref_problem P = ref_problem_make("projection returns", 36, 30, 10, 7);
  ref_problem_perturb(&P, 0.3);
  tt *uh = from_values(TT_F32, P.n, P.r, P.uh), *gu = from_values(TT_F32, P.n, P.l, P.gu);
  tt *ul = from_values(TT_F32, P.n, P.l, P.ul), *vh = from_values(TT_F32, P.r, P.k, P.vh);
  tt *gv = from_values(TT_F32, P.l, P.k, P.gv), *vl = from_values(TT_F32, P.l, P.k, P.vl);
  osft_comm_t comm = NULL;
  int reduced = 0;
  if (callbacks) {
    osft_comm_callbacks_t cb;
    assert_ok(OSFT_COMM_CALLBACKS_INIT(&cb));
    cb.user = &reduced;
    cb.allreduce_sum = sum_one_rank;
    cb.allgather = gather_one_rank;
    assert_ok(osft_comm_create_callbacks(c.ctx, &cb, NULL, &comm));
  } else {
    assert_ok(osft_comm_create_self(c.ctx, NULL, &comm));
  }
  osft_projector_t proj = NULL;
  assert_ok(osft_projector_create(c.ctx, comm, NULL, &proj));
  osft_projection_target_t t;
  assert_ok(OSFT_PROJECTION_TARGET_INIT(&t));
  t.u_high = &uh->t, t.grad_u_low = &gu->t, t.u_low = &ul->t;
  t.v_high = &vh->t, t.grad_v_low = &gv->t, t.v_low = &vl->t;
  /* Sharded over one rank: the parts whose coefficients are all-reduced. */
  const int64_t n_sh[1] = {P.n}, k_sh[1] = {P.k};
  t.u_layout = OSFT_SHARD_U_ROWS, t.u_shards = n_sh, t.n_u_shards = 1;
  t.v_layout = OSFT_SHARD_V_COLS, t.v_shards = k_sh, t.n_v_shards = 1;
  assert_ok(osft_projector_add_target(proj, &t, NULL));
  double *eu = malloc(sizeof(double) * (size_t)(P.n * P.l));
  double *ev = malloc(sizeof(double) * (size_t)(P.l * P.k));
  memcpy(eu, P.gu, sizeof(double) * (size_t)(P.n * P.l));
  memcpy(ev, P.gv, sizeof(double) * (size_t)(P.l * P.k));
  ref_project_u(P.uh, P.n, P.r, eu, P.l);
  ref_project_v(P.vh, P.r, P.k, ev, P.l);
  const double want_u = ref_max_u(P.uh, P.n, P.r, P.ul, P.l);
  const double want_v = ref_max_v(P.vh, P.r, P.k, P.vl, P.l);
  double max_u = -1, max_v = -1;
  assert_ok(osft_projector_orthogonality(proj, &max_u, &max_v));
  assert_true(fabs(max_u - want_u) <= 1e-4 * fmax(1.0, want_u));
  assert_true(fabs(max_v - want_v) <= 1e-4 * fmax(1.0, want_v));
  assert_ok(osft_projector_project(proj));
  assert_ok(osft_projector_project_params(proj));
  settle(&c);
  expect_close("projected grad_u_low", gu, eu, 2e-5);
  expect_close("projected grad_v_low", gv, ev, 2e-5);
  assert_ok(osft_projector_orthogonality(proj, &max_u, &max_v));
  assert_true(max_u <= 1e-5 && max_v <= 1e-5);
  if (callbacks) assert_true(reduced >= 3);
  assert_ok(osft_projector_destroy(proj));
  assert_ok(osft_comm_destroy(comm));
  free(eu), free(ev);
  tt_free(uh), tt_free(gu), tt_free(ul), tt_free(vh), tt_free(gv), tt_free(vl);
  ref_problem_free(&P);
  close_ctx(&c, 1);
}

static void test_projection_returns_every_block(void **state) {
  (void)state;
  run_projection(0, 0);
  run_projection(0, 1);
}

static void test_projection_own_stream(void **state) {
  (void)state;
  run_projection(1, 0);
  run_projection(1, 1);
}

/* ------------------------------------------------------------ comm */

static void run_comm(int own_stream) {
  counted_ctx c;
  open_ctx(&c, own_stream);
  test_seed(own_stream ? "comm own stream" : "comm");
  osft_comm_t comm = NULL;
  assert_ok(osft_comm_create_self(c.ctx, NULL, &comm));
  const int64_t n8[1] = {8}, n5[1] = {5};
  for (int bf = 0; bf < 2; ++bf) {
    const tt_dtype d = bf ? TT_BF16 : TT_F32;
    tt *buf = tt_new(d, 1, n8), *send = tt_new(d, 1, n5), *recv = tt_new(d, 1, n5);
    tt_random(buf, -1.0, 1.0), tt_random(send, -1.0, 1.0);
    tt_poison(recv);
    double *before = tt_get(buf), *sent = tt_get(send);
    assert_ok(osft_comm_allreduce_sum(comm, &buf->t));
    const int64_t counts[1] = {5};
    assert_ok(osft_comm_allgather(comm, &send->t, &recv->t, counts, 1));
    assert_ok(osft_comm_barrier(comm));
    settle(&c);
    double *after = tt_get(buf), *got = tt_get(recv);
    for (int i = 0; i < 8; ++i) assert_true(after[i] == before[i]); /* sum of one */
    for (int i = 0; i < 5; ++i) assert_true(got[i] == sent[i]);
    free(before), free(sent), free(after), free(got);
    tt_free(buf), tt_free(send), tt_free(recv);
  }
  osft_comm_stats_t s;
  memset(&s, 0, sizeof s);
  s.struct_size = sizeof s;
  assert_ok(osft_comm_get_stats(comm, &s));
  assert_ok(osft_comm_destroy(comm));
  close_ctx(&c, 0);
}

static void test_comm_returns_every_block(void **state) {
  (void)state;
  run_comm(0);
}

static void test_comm_own_stream(void **state) {
  (void)state;
  run_comm(1);
}

int main(void) {
  if (!tt_device_present()) return OSFT_TEST_SKIP;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_qr_returns_every_block),
      cmocka_unit_test(test_qr_own_stream),
      cmocka_unit_test(test_projection_returns_every_block),
      cmocka_unit_test(test_projection_own_stream),
      cmocka_unit_test(test_comm_returns_every_block),
      cmocka_unit_test(test_comm_own_stream),
  };
  return cmocka_run_group_tests_name("memory_returned", tests, NULL, NULL);
}
