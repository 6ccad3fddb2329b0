/* Batched QR numerics: accuracy over condition numbers for both methods
 * (the Cholesky path against float64 up to kappa 1e7 and on SOAP-like
 * inputs, falling back only where it must), results independent of the
 * number of workers, and the fused power-iteration step against a loop of
 * separate QRs and a float64 power iteration.
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

/* ---------------------------------------------------------- log capture */

typedef struct {
  int fallbacks;
  char last_plan[256];
} log_capture;

static void capture_log(void *user, osft_log_level_t level, const char *message) {
  (void)level;
  log_capture *c = user;
  if (strstr(message, "redone with Householder")) ++c->fallbacks;
  if (strstr(message, "lane(s)"))
    snprintf(c->last_plan, sizeof c->last_plan, "%s", message);
}

static void log_start(log_capture *c) {
  memset(c, 0, sizeof *c);
  assert_ok(osft_set_log_callback(capture_log, c, OSFT_LOG_DEBUG));
}

static void log_stop(void) {
  assert_ok(osft_set_log_callback(NULL, NULL, OSFT_LOG_OFF));
}

/* kappa 1e2..1e12 (fp64), 1e1..1e5 (fp32): both methods meet the same
 * accuracy, and the Cholesky path (shifted CholeskyQR3 in fp64) needs no
 * fall-back for any of them (plain CholeskyQR2 needed one from 1e3 in fp32
 * and from 1e8 in fp64). 200 x 130: on CUDA too big for the batched
 * kernel (which is always Householder). The rank check is off: fp32 at
 * 1e5 is near its default tolerance, and this test is about accuracy. */
static void test_condition_numbers(void **state) {
  const double k64[] = {1e2, 1e4, 1e6, 1e8, 1e10, 1e12};
  const double k32[] = {1e1, 1e2, 1e3, 1e4, 1e5};
  for (int dt = 0; dt < 2; ++dt) {
    const tt_dtype d = dt == 0 ? TT_F64 : TT_F32;
    const int n = dt == 0 ? 6 : 5;
    spec s[6];
    for (int i = 0; i < n; ++i) s[i] = (spec){d, 200, 130, 0};
    for (int mi = 0; mi < 2; ++mi) {
      test_seed("conditioning");
      list L;
      list_make(&L, n, s, dt == 0 ? k64 : k32, NULL);
      osft_qr_options_t o = options(kMethods[mi]);
      o.rank_tolerance = -1.0;
      log_capture cap;
      log_start(&cap);
      const osft_status_t call =
          osft_qr_batch(CTX, &o, (size_t)n, L.ap, L.qp, L.rp, NULL);
      log_stop();
      assert_int_equal(call, OSFT_STATUS_SUCCESS);
      for (int i = 0; i < n; ++i) {
        double *a = tt_get(L.a[i]);
        expect_entry(&L, i, L.q[i], a);
        free(a);
      }
      if (cap.fallbacks != 0)
        fail_msg("%s: %d fall-backs to Householder, expected none",
                 dt == 0 ? "fp64" : "fp32", cap.fallbacks);
      list_free(&L);
    }
  }
}

/* The Cholesky path on fp32 against float64, on fresh random inputs:
 * kappa 1, 1e2, 1e4, 1e5, 1e6, 1e7 (log-spaced singular values) and
 * SOAP's own inputs P Q (soap_like: 1e4, 1e6, 1e7), square as SOAP's are,
 * with R: every Q orthonormal and Q R = A to fp32 tolerance
 * (30 n eps), and none falls back. Beyond what it can do (an fp64 matrix
 * with a zero column, rank check off) it falls back, once, to a valid QR. */
static void test_cholesky_path(void **state) {
  enum { N_CHOL = 10 };
  const double kappa[N_CHOL] = {1, 1e2, 1e4, 1e5, 1e6, 1e7, 1e4, 1e6, 1e7, 1};
  const int want_r[N_CHOL] = {1, 1, 1, 1, 1, 1, 1, 0, 1, 1};
  spec s[N_CHOL];
  for (int i = 0; i < N_CHOL; ++i) s[i] = (spec){TT_F32, 160, 160, 0};
  s[3] = (spec){TT_F32, 200, 120, 0};
  s[N_CHOL - 1] = (spec){TT_F64, 64, 40, 0};
  test_seed("cholesky_path");
  list L;
  list_make(&L, N_CHOL, s, kappa, want_r);
  for (int i = 6; i < 9; ++i) {
    double *a = soap_like(s[i].m, kappa[i]);
    tt_set(L.a[i], a);
    free(a);
  }
  double *z = tt_get(L.a[N_CHOL - 1]);
  for (int64_t r = 0; r < 64; ++r) z[r * 40 + 7] = 0.0; /* a zero column */
  tt_set(L.a[N_CHOL - 1], z);
  free(z);
  L.kappa[N_CHOL - 1] = 1e30; /* singular: no reference to compare with */
  osft_qr_options_t o = options(OSFT_QR_CHOLESKY_QR2);
  o.rank_tolerance = -1.0;
  log_capture cap;
  log_start(&cap);
  const osft_status_t call = osft_qr_batch(CTX, &o, N_CHOL, L.ap, L.qp, L.rp, NULL);
  log_stop();
  assert_int_equal(call, OSFT_STATUS_SUCCESS);
  for (int i = 0; i < N_CHOL; ++i) {
    double *a = tt_get(L.a[i]);
    expect_entry(&L, i, L.q[i], a);
    free(a);
  }
  /* Only the singular matrix may fall back; the shift can also carry it
   * through the Cholesky passes (CUDA does), and its result is checked. */
  if (cap.fallbacks > 1)
    fail_msg("%d fall-backs to Householder, expected at most 1 (the singular matrix)",
             cap.fallbacks);
  list_free(&L);
}

/* Results do not depend on the number of workers (bitwise from 2 workers
 * on, where every QR runs single-threaded), and a workspace limit makes
 * the call use fewer workers instead of failing. */
static void test_concurrency_and_workspace_limit(void **state) {
  (void)state;
  /* On CUDA too big for the batched kernel: all on streams. */
  const int64_t big = tt_device() == OSFT_DEVICE_CUDA ? 180 : 0;
  spec s[12];
  for (int i = 0; i < 12; ++i)
    s[i] = (spec){i % 3 == 0 ? TT_F64 : TT_F32, big + 20 + 7 * i, big + 10 + 3 * i, 0};
  snap ref[12];
  size_t workspace_two = 0;
  const int workers[3] = {2, 5, 1};
  for (int w = 0; w < 3; ++w) {
    test_seed("concurrency");
    list L;
    list_make(&L, 12, s, NULL, NULL);
    osft_context_t ctx = tt_context(NULL);
    osft_qr_options_t o = options(OSFT_QR_HOUSEHOLDER);
    o.max_concurrency = workers[w];
    assert_ok(osft_qr_batch(ctx, &o, 12, L.ap, L.qp, L.rp, NULL));
    if (w == 0) assert_ok(osft_context_get_workspace_size(ctx, &workspace_two));
    for (int i = 0; i < 12; ++i) {
      if (w == 0) {
        ref[i] = take(L.q[i]);
      } else if (w == 1 || tt_device() == OSFT_DEVICE_CUDA) {
        assert_true(same(&ref[i], L.q[i]));
      } else {
        double *a = tt_get(L.a[i]);
        expect_entry(&L, i, L.q[i], a);
        free(a);
      }
    }
    assert_ok(osft_context_destroy(ctx));
    list_free(&L);
  }
  /* Two workers' scratch does not fit: one worker runs everything. */
  test_seed("concurrency");
  list L;
  list_make(&L, 12, s, NULL, NULL);
  osft_context_options_t co;
  assert_ok(OSFT_CONTEXT_OPTIONS_INIT(&co));
  co.workspace_limit = workspace_two - 1;
  osft_context_t ctx = tt_context(&co);
  osft_qr_options_t o = options(OSFT_QR_HOUSEHOLDER);
  o.max_concurrency = 2;
  log_capture cap;
  log_start(&cap);
  const osft_status_t status = osft_qr_batch(ctx, &o, 12, L.ap, L.qp, L.rp, NULL);
  log_stop();
  assert_int_equal(status, OSFT_STATUS_SUCCESS);
  if (!strstr(cap.last_plan, "on 1 lane(s)")) fail_msg("plan: %s", cap.last_plan);
  for (int i = 0; i < 12; ++i) {
    double *a = tt_get(L.a[i]);
    expect_entry(&L, i, L.q[i], a);
    free(a);
    free(ref[i].bytes);
  }
  assert_ok(osft_context_destroy(ctx));
  /* Not even one worker fits: out of memory, nothing written. */
  co.workspace_limit = 4096;
  ctx = tt_context(&co);
  for (int i = 0; i < 12; ++i) tt_poison(L.q[i]);
  list_snap before;
  list_take(&L, &before);
  osft_status_t st[12];
  for (int i = 0; i < 12; ++i) st[i] = (osft_status_t)-1;
  assert_status(osft_qr_batch(ctx, &o, 12, L.ap, L.qp, L.rp, st),
                OSFT_STATUS_OUT_OF_MEMORY);
  list_expect_same(&L, &before, "out of memory");
  for (int i = 0; i < 12; ++i) assert_int_equal(st[i], (osft_status_t)-1);
  list_snap_free(&L, &before);
  assert_ok(osft_context_destroy(ctx));
  list_free(&L);
}

/* The fused call equals a loop of separate QRs of A Q (products formed
 * here and rounded to the dtype), and a float64 power iteration. */
static void test_power_iteration_matches_loop(void **state) {
  const int iters = 3;
  for (int mi = 0; mi < 2; ++mi) {
    test_seed("power");
    pairs fused, loop;
    pairs_make(&fused);
    test_seed("power");
    pairs_make(&loop);
    double *start[N_PAIRS];
    for (int i = 0; i < N_PAIRS; ++i) start[i] = tt_get(fused.q[i]);
    const osft_qr_options_t o = options(kMethods[mi]);
    osft_status_t st[N_PAIRS];
    assert_ok(osft_qr_power_iteration(CTX, &o, N_PAIRS, fused.ap, fused.qp, iters, st));
    for (int it = 0; it < iters; ++it) {
      tt *prod[N_PAIRS];
      const DLTensor *pp[N_PAIRS];
      for (int i = 0; i < N_PAIRS; ++i) {
        const pair_spec *s = &kPairs[i];
        double *a = tt_get(loop.a[i]), *q = tt_get(loop.q[i]);
        double *p = matmul(a, q, s->m, s->m, s->n);
        prod[i] = new_mat(s->dtype, s->m, s->n, 0);
        tt_set(prod[i], p);
        pp[i] = &prod[i]->t;
        free(a);
        free(q);
        free(p);
      }
      assert_ok(osft_qr_batch(CTX, &o, N_PAIRS, pp, loop.qp, NULL, NULL));
      for (int i = 0; i < N_PAIRS; ++i) tt_free(prod[i]);
    }
    for (int i = 0; i < N_PAIRS; ++i) {
      const pair_spec *s = &kPairs[i];
      assert_int_equal(st[i], OSFT_STATUS_SUCCESS);
      double *got = tt_get(fused.q[i]), *want = tt_get(loop.q[i]);
      const double err = rel_max_err(got, want, (size_t)(s->m * s->n), 1.0);
      if (!(err <= pair_tol(i)))
        fail_msg("pair %d: fused vs loop %.3g > %.3g", i, err, pair_tol(i));
      /* float64 power iteration from the same start */
      expect_power_steps(&fused, i, start[i], iters, "fused");
      free(start[i]);
      free(got);
      free(want);
    }
    pairs_free(&fused);
    pairs_free(&loop);
  }
}

int main(void) {
  if (!tt_device_present()) return OSFT_TEST_SKIP;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_condition_numbers, tt_setup, tt_teardown),
      cmocka_unit_test_setup_teardown(test_cholesky_path, tt_setup, tt_teardown),
      cmocka_unit_test(test_concurrency_and_workspace_limit),
      cmocka_unit_test_setup_teardown(test_power_iteration_matches_loop, tt_setup,
                                      tt_teardown),
  };
  return cmocka_run_group_tests_name("qr_numerics", tests, NULL, NULL);
}
