/* Batched QR shapes: mixed shapes and dtypes out of place (padded rows, R
 * for some entries; on CUDA both the batched kernel and cuSOLVER), matrices
 * without columns, and in place giving the out-of-place bits.
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

static void test_mixed_shapes_out_of_place(void **state) {
  for (int mi = 0; mi < N_QR_METHODS; ++mi) {
    test_seed("mixed");
    list L;
    list_make(&L, N_MIXED, kMixed, NULL, kWantR);
    list_snap before;
    list_take(&L, &before);
    osft_status_t st[N_MIXED];
    const osft_qr_options_t o = options(kMethods[mi]);
    assert_ok(osft_qr_batch(CTX, &o, (size_t)L.n, L.ap, L.qp, L.rp, st));
    for (int i = 0; i < L.n; ++i) {
      assert_int_equal(st[i], OSFT_STATUS_SUCCESS);
      assert_true(same(&before.a[i], L.a[i])); /* inputs are read only */
      double *a = tt_get(L.a[i]);
      expect_entry(&L, i, L.q[i], a);
      free(a);
    }
    list_snap_free(&L, &before);
    list_free(&L);
  }
}

/* Matrices without columns (4 x 0, 0 x 0) need nothing and succeed. */
static void test_empty_matrices(void **state) {
  test_seed("empty");
  const int64_t s40[2] = {4, 0}, s00[2] = {0, 0};
  tt *e1 = tt_new(TT_F32, 2, s40), *e2 = tt_new(TT_F64, 2, s00);
  const spec one = {TT_F32, 6, 4, 0};
  list L;
  list_make(&L, 1, &one, NULL, NULL);
  const DLTensor *a[3] = {&e1->t, L.ap[0], &e2->t};
  DLTensor *q[3] = {&e1->t, L.qp[0], &e2->t};
  osft_status_t st[3] = {(osft_status_t)-1, (osft_status_t)-1, (osft_status_t)-1};
  DLTensor *r[3] = {NULL, L.rp[0], NULL};
  assert_ok(osft_qr_batch(CTX, NULL, 3, a, q, r, st));
  for (int i = 0; i < 3; ++i) assert_int_equal(st[i], OSFT_STATUS_SUCCESS);
  double *v = tt_get(L.a[0]);
  expect_entry(&L, 0, L.q[0], v);
  free(v);
  tt_free(e1);
  tt_free(e2);
  list_free(&L);
}

/* In place (q == NULL, and q[i] == a[i]) gives the out-of-place bits. */
static void test_in_place(void **state) {
  for (int mi = 0; mi < N_QR_METHODS; ++mi) {
    for (int variant = 0; variant < 2; ++variant) {
      test_seed("in_place");
      list L;
      list_make(&L, N_MIXED, kMixed, NULL, kWantR);
      const osft_qr_options_t o = options(kMethods[mi]);
      assert_ok(osft_qr_batch(CTX, &o, (size_t)L.n, L.ap, L.qp, L.rp, NULL));
      double *inputs[N_MIXED];
      snap q_out[N_MIXED], r_out[N_MIXED];
      for (int i = 0; i < L.n; ++i) {
        inputs[i] = tt_get(L.a[i]);
        q_out[i] = take(L.q[i]);
        r_out[i] = take(L.r[i]);
        if (L.r[i]) tt_poison(L.r[i]);
      }
      DLTensor *self[N_MIXED];
      for (int i = 0; i < L.n; ++i) self[i] = &L.a[i]->t;
      assert_ok(osft_qr_batch(CTX, &o, (size_t)L.n, L.ap, variant == 0 ? NULL : self,
                              L.rp, NULL));
      for (int i = 0; i < L.n; ++i) {
        expect_entry(&L, i, L.a[i], inputs[i]);
        double *via_a = tt_get(L.a[i]), *via_q = tt_get(L.q[i]);
        for (int64_t e = 0; e < L.s[i].m * L.s[i].n; ++e)
          if (memcmp(&via_a[e], &via_q[e], sizeof(double)) != 0)
            fail_msg("in place differs from out of place: entry %d element %lld", i,
                     (long long)e);
        assert_true(same(&r_out[i], L.r[i]));
        free(via_a);
        free(via_q);
        free(inputs[i]);
        free(q_out[i].bytes);
        free(r_out[i].bytes);
      }
      list_free(&L);
    }
  }
}

int main(void) {
  if (!tt_device_present()) return OSFT_TEST_SKIP;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_mixed_shapes_out_of_place, tt_setup,
                                      tt_teardown),
      cmocka_unit_test_setup_teardown(test_empty_matrices, tt_setup, tt_teardown),
      cmocka_unit_test_setup_teardown(test_in_place, tt_setup, tt_teardown),
  };
  return cmocka_run_group_tests_name("qr_shapes", tests, NULL, NULL);
}
