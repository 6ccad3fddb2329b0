/* Batched QR memory: every allocation of a first call, refused in turn (and
 * every one after it), either fails the call with OSFT_STATUS_OUT_OF_MEMORY
 * before anything is written (no Q, no R, no per-matrix status), or is
 * absorbed and every matrix is factored correctly; for the batch and for the
 * power iteration, with both methods.
 *
 * Built twice: for the CPU, and with OSFT_TEST_CUDA for a GPU (skipped where
 * none is present), where device allocations are refused too. Helpers (the
 * float64 checks, lists, snapshots) are in qr_testlib.h. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_tensors.h"
#include "test_util.h"

#include "qr_testlib.h"

enum { UNSET = 0x5a5a };

/* A tt_refused_call (test_tensors.h) of one first osft_qr_batch of the
 * mixed list; user: the method. */
static void refused_batch(void *user, osft_context_t ctx, test_alloc_state *a, int device,
                          long granted) {
  const osft_qr_method_t method = *(const osft_qr_method_t *)user;
  list L;
  list_make(&L, N_MIXED, kMixed, NULL, kWantR);
  list_snap before;
  list_take(&L, &before);
  osft_status_t st[N_MIXED];
  for (int i = 0; i < N_MIXED; ++i) st[i] = (osft_status_t)UNSET;
  const osft_qr_options_t o = options(method);

  test_alloc_refuse(a, device, granted);
  const osft_status_t rc = osft_qr_batch(ctx, &o, (size_t)L.n, L.ap, L.qp, L.rp, st);

  if (rc != OSFT_STATUS_SUCCESS) {
    assert_int_equal(rc, OSFT_STATUS_OUT_OF_MEMORY);
    list_expect_same(&L, &before, "a refused batch");
    for (int i = 0; i < N_MIXED; ++i) assert_int_equal(st[i], UNSET);
  } else {
    for (int i = 0; i < L.n; ++i) {
      assert_int_equal(st[i], OSFT_STATUS_SUCCESS);
      double *av = tt_get(L.a[i]);
      expect_entry(&L, i, L.q[i], av);
      free(av);
    }
  }
  list_snap_free(&L, &before);
  list_free(&L);
}

/* The same for one power iteration step over the pairs (Q in place). */
static void refused_power(void *user, osft_context_t ctx, test_alloc_state *a, int device,
                          long granted) {
  const osft_qr_method_t method = *(const osft_qr_method_t *)user;
  pairs P;
  pairs_make(&P);
  snap before[N_PAIRS];
  double *start_values[N_PAIRS];
  for (int i = 0; i < N_PAIRS; ++i) {
    before[i] = take(P.q[i]);
    start_values[i] = tt_get(P.q[i]);
  }
  osft_status_t st[N_PAIRS];
  for (int i = 0; i < N_PAIRS; ++i) st[i] = (osft_status_t)UNSET;
  const osft_qr_options_t o = options(method);

  test_alloc_refuse(a, device, granted);
  const osft_status_t rc = osft_qr_power_iteration(ctx, &o, N_PAIRS, P.ap, P.qp, 1, st);

  for (int i = 0; i < N_PAIRS; ++i) {
    if (rc != OSFT_STATUS_SUCCESS) {
      assert_int_equal(rc, OSFT_STATUS_OUT_OF_MEMORY);
      assert_true(same(&before[i], P.q[i]));
      assert_int_equal(st[i], UNSET);
    } else {
      assert_int_equal(st[i], OSFT_STATUS_SUCCESS);
      expect_power_steps(&P, i, start_values[i], 1, "after refusals");
    }
    free(before[i].bytes);
    free(start_values[i]);
  }
  pairs_free(&P);
}

static void test_every_refusal_is_clean(void **state) {
  (void)state;
  for (int mi = 0; mi < N_QR_METHODS; ++mi) {
    test_seed("refusals");
    osft_qr_method_t method = kMethods[mi];
    tt_refusal_sweep(refused_batch, &method);
    tt_refusal_sweep(refused_power, &method);
  }
}

int main(void) {
  if (!tt_device_present()) return OSFT_TEST_SKIP;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_every_refusal_is_clean),
  };
  return cmocka_run_group_tests_name("qr_memory", tests, NULL, NULL);
}
