/* Batched QR at the limits of precision: near-singular fp32, NaN, Inf,
 * overflowing column norms and exact rank deficiency fail only their own
 * entries (nothing written), the rest bit-identical to a clean run; the
 * same for the power-iteration step.
 *
 * Built twice: for the CPU, and with OSFT_TEST_CUDA for a GPU (skipped where
 * none is present). The float64 checks and the list helpers are in
 * qr_testlib.h. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_tensors.h"
#include "test_util.h"

#include "qr_testlib.h"
#include "test_fixture.h"

/* fp32 with kappa 1e8 is singular to working precision: reported as
 * rank-deficient by default; with the check off it still gets an
 * orthonormal Q with Q R = A. */
static void test_near_singular_fp32(void **state) {
  test_seed("near_singular");
  const spec s[2] = {{TT_F32, 40, 24, 0}, {TT_F32, 40, 24, 0}};
  const double kappa[2] = {10.0, 1e8};
  list L;
  list_make(&L, 2, s, kappa, NULL);
  osft_status_t st[2];
  osft_qr_options_t o = options(OSFT_QR_HOUSEHOLDER);
  snap q1 = take(L.q[1]);
  assert_status(osft_qr_batch(CTX, &o, 2, L.ap, L.qp, L.rp, st),
                OSFT_STATUS_NUMERICAL_ERROR);
  assert_error_mentions("a[1]");
  assert_error_mentions("rank-deficient");
  assert_int_equal(st[0], OSFT_STATUS_SUCCESS);
  assert_int_equal(st[1], OSFT_STATUS_NUMERICAL_ERROR);
  assert_true(same(&q1, L.q[1]));
  for (int mi = 0; mi < N_QR_METHODS; ++mi) {
    o = options(kMethods[mi]);
    o.rank_tolerance = -1.0;
    assert_ok(osft_qr_batch(CTX, &o, 2, L.ap, L.qp, L.rp, st));
    double *a = tt_get(L.a[1]), *q = tt_get(L.q[1]), *r = tt_get(L.r[1]);
    expect_qr("kappa 1e8 fp32, check off", a, q, r, 40, 24, TT_F32, 1e30);
    free(a);
    free(q);
    free(r);
  }
  free(q1.bytes);
  list_free(&L);
}

/* A NaN in one matrix and an Inf in another: those two fail with their
 * outputs untouched; the rest are bit-identical to a run without them. */
static void test_nonfinite_spares_the_rest(void **state) {
  const spec s[5] = {{TT_F32, 24, 16, 0},
                     {TT_F64, 30, 30, 0},
                     {TT_F32, 17, 9, 20},
                     {TT_F32, 200, 130, 0},
                     {TT_F64, 150, 90, 0}};
  for (int mi = 0; mi < N_QR_METHODS; ++mi)
    for (int in_place = 0; in_place < 2; ++in_place) {
      test_seed("nonfinite");
      list clean, dirty;
      list_make(&clean, 5, s, NULL, NULL);
      test_seed("nonfinite");
      list_make(&dirty, 5, s, NULL, NULL);
      const int bad[2] = {1, 3};
      for (int b = 0; b < 2; ++b) {
        const int i = bad[b];
        double *v = tt_get(dirty.a[i]);
        v[7] = b == 0 ? NAN : -INFINITY;
        tt_set(dirty.a[i], v);
        free(v);
      }
      list_snap before;
      list_take(&dirty, &before);
      const osft_qr_options_t o = options(kMethods[mi]);
      assert_ok(osft_qr_batch(CTX, &o, 5, clean.ap, in_place ? NULL : clean.qp, clean.rp,
                              NULL));
      osft_status_t st[5];
      assert_status(
          osft_qr_batch(CTX, &o, 5, dirty.ap, in_place ? NULL : dirty.qp, dirty.rp, st),
          OSFT_STATUS_NUMERICAL_ERROR);
      assert_error_mentions("a[1]");
      assert_error_mentions("contains NaN or Inf");
      assert_error_mentions("2 of 5");
      for (int i = 0; i < 5; ++i) {
        const int failed = i == 1 || i == 3;
        assert_int_equal(st[i],
                         failed ? OSFT_STATUS_NUMERICAL_ERROR : OSFT_STATUS_SUCCESS);
        if (failed) {
          assert_true(same(&before.a[i], dirty.a[i]));
          assert_true(same(&before.q[i], dirty.q[i]));
          assert_true(same(&before.r[i], dirty.r[i]));
          continue;
        }
        const tt *out = in_place ? dirty.a[i] : dirty.q[i];
        snap want = take(in_place ? clean.a[i] : clean.q[i]), want_r = take(clean.r[i]);
        if (!same(&want, out) || !same(&want_r, dirty.r[i]))
          fail_msg("entry %d is not bit-identical to the clean run", i);
        free(want.bytes);
        free(want_r.bytes);
      }
      list_snap_free(&dirty, &before);
      list_free(&clean);
      list_free(&dirty);
    }
}

/* Finite input whose column norms overflow fp32: that matrix fails as
 * "overflowed", with nothing written. */
static void test_overflow_is_reported(void **state) {
  test_seed("overflow");
  const spec s[2] = {{TT_F32, 8, 4, 0}, {TT_F32, 8, 4, 0}};
  list L;
  list_make(&L, 2, s, NULL, NULL);
  double v[32];
  for (int i = 0; i < 32; ++i) v[i] = (test_uniform(0, 1) < 0.5 ? -3e38 : 3e38);
  tt_set(L.a[1], v);
  for (int mi = 0; mi < N_QR_METHODS; ++mi) {
    list_snap before;
    list_take(&L, &before);
    const osft_qr_options_t o = options(kMethods[mi]);
    osft_status_t st[2];
    assert_status(osft_qr_batch(CTX, &o, 2, L.ap, L.qp, L.rp, st),
                  OSFT_STATUS_NUMERICAL_ERROR);
    assert_error_mentions("a[1]: the factorization overflowed");
    assert_int_equal(st[0], OSFT_STATUS_SUCCESS);
    assert_int_equal(st[1], OSFT_STATUS_NUMERICAL_ERROR);
    assert_true(same(&before.q[1], L.q[1]) && same(&before.r[1], L.r[1]));
    list_snap_free(&L, &before);
  }
  list_free(&L);
}

/* Exactly rank-deficient matrices (a zero column, two equal columns, all
 * zero): their own error; with the check off, an orthonormal Q, Q R = A. */
static void test_rank_deficient(void **state) {
  test_seed("rank");
  const spec s[4] = {
      {TT_F64, 20, 8, 0}, {TT_F64, 20, 8, 0}, {TT_F32, 200, 130, 0}, {TT_F32, 6, 6, 0}};
  list L;
  list_make(&L, 4, s, NULL, NULL);
  double *v = tt_get(L.a[1]);
  for (int64_t i = 0; i < 20; ++i) v[i * 8 + 3] = 0.0; /* a zero column */
  tt_set(L.a[1], v);
  free(v);
  v = tt_get(L.a[2]);
  for (int64_t i = 0; i < 200; ++i) v[i * 130 + 5] = v[i * 130 + 2]; /* equal columns */
  tt_set(L.a[2], v);
  free(v);
  v = zeros(36);
  tt_set(L.a[3], v);
  free(v);
  for (int mi = 0; mi < N_QR_METHODS; ++mi) {
    list_snap before;
    list_take(&L, &before);
    osft_qr_options_t o = options(kMethods[mi]);
    osft_status_t st[4];
    assert_status(osft_qr_batch(CTX, &o, 4, L.ap, L.qp, L.rp, st),
                  OSFT_STATUS_NUMERICAL_ERROR);
    assert_error_mentions("a[1]");
    assert_error_mentions("rank-deficient");
    assert_error_mentions("3 of 4");
    assert_int_equal(st[0], OSFT_STATUS_SUCCESS);
    for (int i = 1; i < 4; ++i) {
      assert_int_equal(st[i], OSFT_STATUS_NUMERICAL_ERROR);
      assert_true(same(&before.q[i], L.q[i]) && same(&before.r[i], L.r[i]));
    }
    double *a = tt_get(L.a[0]);
    expect_entry(&L, 0, L.q[0], a);
    free(a);
    o.rank_tolerance = -1.0;
    assert_ok(osft_qr_batch(CTX, &o, 3, L.ap, L.qp, L.rp, st));
    for (int i = 1; i < 3; ++i) {
      double *ai = tt_get(L.a[i]), *q = tt_get(L.q[i]), *r = tt_get(L.r[i]);
      expect_qr("rank-deficient, check off", ai, q, r, L.s[i].m, L.s[i].n, L.s[i].dtype,
                1e30);
      free(ai);
      free(q);
      free(r);
    }
    list_snap_free(&L, &before);
  }
  list_free(&L);
}

/* A NaN in one A, an Inf in another, an all-zero A (rank-deficient
 * product): those pairs fail with Q untouched, the others are
 * bit-identical to a clean run. */
static void test_power_iteration_failures(void **state) {
  for (int mi = 0; mi < N_QR_METHODS; ++mi) {
    test_seed("power_fail");
    pairs clean, dirty;
    pairs_make(&clean);
    test_seed("power_fail");
    pairs_make(&dirty);
    double *v = tt_get(dirty.a[1]);
    v[5] = NAN;
    tt_set(dirty.a[1], v);
    free(v);
    v = zeros(32 * 32);
    tt_set(dirty.a[3], v);
    free(v);
    v = tt_get(dirty.a[6]);
    v[100] = INFINITY;
    tt_set(dirty.a[6], v);
    free(v);
    snap before[N_PAIRS];
    for (int i = 0; i < N_PAIRS; ++i) before[i] = take(dirty.q[i]);
    const osft_qr_options_t o = options(kMethods[mi]);
    assert_ok(osft_qr_power_iteration(CTX, &o, N_PAIRS, clean.ap, clean.qp, 2, NULL));
    osft_status_t st[N_PAIRS];
    assert_status(osft_qr_power_iteration(CTX, &o, N_PAIRS, dirty.ap, dirty.qp, 2, st),
                  OSFT_STATUS_NUMERICAL_ERROR);
    assert_error_mentions("pair 1");
    assert_error_mentions("contains NaN or Inf");
    for (int i = 0; i < N_PAIRS; ++i) {
      const int failed = i == 1 || i == 3 || i == 6;
      assert_int_equal(st[i], failed ? OSFT_STATUS_NUMERICAL_ERROR : OSFT_STATUS_SUCCESS);
      if (failed) {
        assert_true(same(&before[i], dirty.q[i]));
      } else {
        snap want = take(clean.q[i]);
        assert_true(same(&want, dirty.q[i]));
        free(want.bytes);
      }
      free(before[i].bytes);
    }
    pairs_free(&clean);
    pairs_free(&dirty);
  }
}

int main(void) {
  if (!tt_device_present()) return OSFT_TEST_SKIP;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_near_singular_fp32, tt_setup, tt_teardown),
      cmocka_unit_test_setup_teardown(test_nonfinite_spares_the_rest, tt_setup,
                                      tt_teardown),
      cmocka_unit_test_setup_teardown(test_overflow_is_reported, tt_setup, tt_teardown),
      cmocka_unit_test_setup_teardown(test_rank_deficient, tt_setup, tt_teardown),
      cmocka_unit_test_setup_teardown(test_power_iteration_failures, tt_setup,
                                      tt_teardown),
  };
  return cmocka_run_group_tests_name("qr_precision", tests, NULL, NULL);
}
