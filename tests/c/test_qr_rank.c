/* Batched QR on rank-deficient matrices (osft_qr_options_t.rank_deficient,
 * since 1.4): without the array such a matrix fails alone and its outputs
 * stay untouched; with it, the matrix is factored (Q orthonormal, Q R = A,
 * diag(R) >= 0, checked in float64), written, reported in the array and
 * is not a failure, for every method, fp32 and fp64, in a batch and in
 * power iteration (a singular SOAP-like Kronecker factor); NaN still
 * fails; a call refused before computing writes nothing, the array
 * included.
 *
 * Built twice: for the CPU, and with OSFT_TEST_CUDA for a GPU (skipped where
 * none is present; there the library reruns the rank-deficient jobs with the
 * check off, src/ops/qr_compute.cpp). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_tensors.h"
#include "test_util.h"

#include "qr_testlib.h"
#include "test_fixture.h"

enum { N_RANK = 6 };

/* Entry i of the list: full rank (kappa 10) or rank-deficient by
 * construction (A = B C, B m x k, C k x n, k < n: exactly rank k in float64,
 * and to working precision once rounded). */
static const spec kRankSpecs[N_RANK] = {
    {TT_F32, 64, 64, 0},  {TT_F32, 64, 64, 0}, {TT_F64, 50, 30, 0},
    {TT_F64, 40, 40, 72}, {TT_F32, 90, 33, 0}, {TT_F32, 8, 8, 0},
};
static const int kRank[N_RANK] = {0, 20, 0, 7, 1, 0}; /* 0: full rank */

static void make_low_rank(list *L, int i, int k) {
  const int64_t m = L->s[i].m, n = L->s[i].n;
  double *b = zeros(m * k), *c = zeros((int64_t)k * n);
  for (int64_t e = 0; e < m * k; ++e) b[e] = test_uniform(-1.0, 1.0);
  for (int64_t e = 0; e < (int64_t)k * n; ++e) c[e] = test_uniform(-1.0, 1.0);
  double *a = matmul(b, c, m, k, n);
  tt_set(L->a[i], a);
  L->kappa[i] = 1e30; /* singular: no Gram-Schmidt reference */
  free(a);
  free(b);
  free(c);
}

static void make_rank_list(list *L) {
  int want_r[N_RANK];
  for (int i = 0; i < N_RANK; ++i) want_r[i] = 1; /* R checks diag(R) >= 0 */
  list_make(L, N_RANK, kRankSpecs, NULL, want_r);
  for (int i = 0; i < N_RANK; ++i)
    if (kRank[i] > 0) make_low_rank(L, i, kRank[i]);
}

/* A Q of a singular A (m x n, float64 values of what the call read): R =
 * Q^T A in float64 must be upper triangular up to rounding of A's size,
 * with diag(R) >= 0 up to that rounding; then the checks of expect_qr
 * (orthonormal Q, Q R = A). */
static void expect_singular_qr(const char *what, const double *a, const double *q,
                               int64_t m, int64_t n, tt_dtype d) {
  double *r = zeros(n * n);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j)
      for (int64_t t = 0; t < m; ++t) r[i * n + j] += q[t * n + i] * a[t * n + j];
  double big = 0.0;
  for (int64_t e = 0; e < n * n; ++e) big = fmax(big, fabs(r[e]));
  const double tol = 100.0 * (double)m * eps_of(d) * big;
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < i; ++j) {
      if (fabs(r[i * n + j]) > tol)
        fail_msg("%s: R(%lld,%lld) = %g is not upper triangular", what, (long long)i,
                 (long long)j, r[i * n + j]);
      r[i * n + j] = 0.0;
    }
    if (r[i * n + i] < -tol)
      fail_msg("%s: diag(R)[%lld] = %g < 0", what, (long long)i, r[i * n + i]);
    r[i * n + i] = fmax(r[i * n + i], 0.0); /* rounding below 0, not a sign flip */
  }
  expect_qr(what, a, q, r, m, n, d, 1e30);
  free(r);
}

/* Without the array: each rank-deficient matrix fails alone, its outputs
 * untouched; with it: every matrix is written and the deficient ones are
 * reported, for each method. */
static void test_batch_reports_rank_deficient(void **state) {
  for (int mi = 0; mi < N_QR_METHODS; ++mi) {
    test_seed("qr_rank_batch");
    list L;
    make_rank_list(&L);
    list_snap before;
    list_take(&L, &before);
    osft_status_t st[N_RANK];
    osft_qr_options_t o = options(kMethods[mi]);
    assert_int_equal(osft_qr_batch(CTX, &o, N_RANK, L.ap, L.qp, L.rp, st),
                     OSFT_STATUS_NUMERICAL_ERROR);
    for (int i = 0; i < N_RANK; ++i) {
      assert_int_equal(st[i],
                       kRank[i] > 0 ? OSFT_STATUS_NUMERICAL_ERROR : OSFT_STATUS_SUCCESS);
      if (kRank[i] > 0 && (!same(&before.q[i], L.q[i]) || !same(&before.r[i], L.r[i])))
        fail_msg("method %d: entry %d failed but its outputs changed", (int)kMethods[mi],
                 i);
    }
    list_snap_free(&L, &before);

    int deficient[N_RANK];
    for (int i = 0; i < N_RANK; ++i) deficient[i] = -7;
    o.rank_deficient = deficient;
    assert_int_equal(osft_qr_batch(CTX, &o, N_RANK, L.ap, L.qp, L.rp, st),
                     OSFT_STATUS_SUCCESS);
    for (int i = 0; i < N_RANK; ++i) {
      assert_int_equal(st[i], OSFT_STATUS_SUCCESS);
      if (deficient[i] != (kRank[i] > 0))
        fail_msg("method %d: entry %d (rank %d) reported %d", (int)kMethods[mi], i,
                 kRank[i], deficient[i]);
      double *a = tt_get(L.a[i]);
      expect_entry(&L, i, L.q[i], a);
      free(a);
    }
    list_free(&L);
  }
}

/* NaN still fails (reported 0, outputs untouched) beside a rank-deficient
 * matrix that is written; an in-place call works the same. */
static void test_nan_still_fails(void **state) {
  test_seed("qr_rank_nan");
  list L;
  make_rank_list(&L);
  double *a0 = tt_get(L.a[0]);
  a0[5] = NAN;
  tt_set(L.a[0], a0);
  free(a0);
  list_snap before;
  list_take(&L, &before);
  osft_status_t st[N_RANK];
  int deficient[N_RANK];
  for (int i = 0; i < N_RANK; ++i) deficient[i] = -7;
  osft_qr_options_t o = options(OSFT_QR_HOUSEHOLDER);
  o.rank_deficient = deficient;
  assert_int_equal(osft_qr_batch(CTX, &o, N_RANK, L.ap, L.qp, L.rp, st),
                   OSFT_STATUS_NUMERICAL_ERROR);
  assert_int_equal(st[0], OSFT_STATUS_NUMERICAL_ERROR);
  assert_int_equal(deficient[0], 0);
  assert_true(same(&before.q[0], L.q[0]) && same(&before.r[0], L.r[0]));
  for (int i = 1; i < N_RANK; ++i) {
    assert_int_equal(st[i], OSFT_STATUS_SUCCESS);
    assert_int_equal(deficient[i], kRank[i] > 0);
    double *a = tt_get(L.a[i]);
    expect_entry(&L, i, L.q[i], a);
    free(a);
  }
  list_snap_free(&L, &before);
  /* in place: Q over A for the rank-1 entry */
  double *a4 = tt_get(L.a[4]);
  osft_status_t one;
  int flag = -7;
  o.rank_deficient = &flag;
  assert_int_equal(osft_qr_batch(CTX, &o, 1, &L.ap[4], NULL, NULL, &one),
                   OSFT_STATUS_SUCCESS);
  assert_int_equal(flag, 1);
  double *q = tt_get(L.a[4]);
  expect_singular_qr("in place, rank 1", a4, q, 90, 33, TT_F32);
  free(q);
  free(a4);
  list_free(&L);
}

/* A call refused before computing (a shape error) writes nothing: not the
 * outputs, not the statuses, not the array. */
static void test_refused_call_writes_nothing(void **state) {
  test_seed("qr_rank_refused");
  list L;
  make_rank_list(&L);
  tt *wrong = new_mat(TT_F32, 64, 63, 0);
  tt_poison(wrong);
  L.qp[1] = &wrong->t;
  list_snap before;
  list_take(&L, &before);
  osft_status_t st[N_RANK];
  int deficient[N_RANK];
  for (int i = 0; i < N_RANK; ++i) {
    st[i] = (osft_status_t)99;
    deficient[i] = -7;
  }
  osft_qr_options_t o = options(OSFT_QR_HOUSEHOLDER);
  o.rank_deficient = deficient;
  assert_int_equal(osft_qr_batch(CTX, &o, N_RANK, L.ap, L.qp, L.rp, st),
                   OSFT_STATUS_SHAPE_MISMATCH);
  for (int i = 0; i < N_RANK; ++i) {
    assert_int_equal(st[i], 99);
    assert_int_equal(deficient[i], -7);
  }
  list_expect_same(&L, &before, "refused call");
  list_snap_free(&L, &before);
  L.qp[1] = &L.q[1]->t;
  tt_free(wrong);
  list_free(&L);
}

/* Power iteration with a singular SOAP-like factor: A = U diag(lambda) U^T
 * with only `rank` nonzero eigenvalues and Q0 of more columns than that, so
 * A Q0 is rank-deficient. With the array the pair is reported and its Q is a
 * valid QR of A Q0 (orthonormal, R = Q^T A Q0 upper triangular with
 * diag(R) >= 0, Q R = A Q0), for each method; without it the pair fails
 * and Q0 stays. */
static void test_power_iteration_singular_factor(void **state) {
  enum { M = 48, NQ = 48, RANK = 20 };
  for (int mi = 0; mi < N_QR_METHODS; ++mi) {
    for (int dt = 0; dt < 2; ++dt) {
      const tt_dtype d = dt == 0 ? TT_F32 : TT_F64;
      test_seed("qr_rank_power");
      double *u = random_orthonormal(M, M);
      double *ul = zeros(M * M);
      for (int64_t i = 0; i < M; ++i)
        for (int64_t k = 0; k < RANK; ++k) ul[i * M + k] = u[i * M + k] * pow(2.0, -k);
      double *a = zeros(M * M);
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < M; ++j)
          for (int64_t k = 0; k < RANK; ++k) a[i * M + j] += ul[i * M + k] * u[j * M + k];
      double *q0 = random_orthonormal(M, NQ);
      tt *ta = new_mat(d, M, M, 0), *tq = new_mat(d, M, NQ, 0);
      tt_set(ta, a);
      tt_set(tq, q0);
      double *start = tt_get(tq), *a_r = tt_get(ta); /* as rounded to d */
      const DLTensor *ap[1] = {&ta->t};
      DLTensor *qp[1] = {&tq->t};
      osft_status_t st;
      osft_qr_options_t o = options(kMethods[mi]);
      snap before = take(tq);
      assert_int_equal(osft_qr_power_iteration(CTX, &o, 1, ap, qp, 1, &st),
                       OSFT_STATUS_NUMERICAL_ERROR);
      assert_true(same(&before, tq));
      free(before.bytes);
      int flag = -7;
      o.rank_deficient = &flag;
      assert_int_equal(osft_qr_power_iteration(CTX, &o, 1, ap, qp, 1, &st),
                       OSFT_STATUS_SUCCESS);
      assert_int_equal(st, OSFT_STATUS_SUCCESS);
      assert_int_equal(flag, 1);
      double *p = matmul(a_r, start, M, M, NQ), *q = tt_get(tq);
      char what[64];
      snprintf(what, sizeof what, "power iteration, method %d, %s", (int)kMethods[mi],
               dt == 0 ? "f32" : "f64");
      expect_singular_qr(what, p, q, M, NQ, d);
      free(p);
      free(q);
      free(start);
      free(a_r);
      free(u);
      free(ul);
      free(a);
      free(q0);
      tt_free(ta);
      tt_free(tq);
    }
  }
}

int main(void) {
  if (!tt_device_present()) return OSFT_TEST_SKIP;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_batch_reports_rank_deficient, tt_setup,
                                      tt_teardown),
      cmocka_unit_test_setup_teardown(test_nan_still_fails, tt_setup, tt_teardown),
      cmocka_unit_test_setup_teardown(test_refused_call_writes_nothing, tt_setup,
                                      tt_teardown),
      cmocka_unit_test_setup_teardown(test_power_iteration_singular_factor, tt_setup,
                                      tt_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
