/* Batched QR of matrices whose entries are far from 1: fp64 scaled by
 * 1e-170 (every square underflows) and 1e155 (every square overflows), fp32
 * by 1e-30 and 1e30. Q of s A is Q of A and R is s times A's R, so each
 * result is judged, like every other QR test, against the float64
 * reference of the unscaled matrix. Both sizes run: a small one (CUDA: the
 * batched shared-memory kernel) and a large one (CUDA: cuSOLVER lanes), with
 * Householder and with CholeskyQR2 (which may fall back). */
#include <stdlib.h>

#include "qr_testlib.h"
#include "test_fixture.h"

typedef struct {
  tt_dtype dtype;
  double scale;
} scaling;

static const scaling kScalings[] = {
    {TT_F64, 1e-170}, {TT_F64, 1e155}, {TT_F32, 1e-30}, {TT_F32, 1e30}};

/* Scales entry i's input in place; returns the input that was factored,
 * divided by the scale (what the unscaled reference is computed from). */
static double *scale_input(list *L, int i, double scale) {
  double *a = tt_get(L->a[i]);
  const int64_t n = L->s[i].m * L->s[i].n;
  for (int64_t k = 0; k < n; ++k) a[k] *= scale;
  tt_set(L->a[i], a);
  free(a);
  a = tt_get(L->a[i]);
  for (int64_t k = 0; k < n; ++k) a[k] /= scale;
  return a;
}

static void expect_scaled_entry(const list *L, int i, const double *a, double scale,
                                const char *what) {
  double *q = tt_get(L->q[i]), *r = tt_get(L->r[i]);
  const int64_t n = L->s[i].n;
  for (int64_t k = 0; k < n * n; ++k) r[k] /= scale;
  expect_qr(what, a, q, r, L->s[i].m, n, L->s[i].dtype, L->kappa[i]);
  free(q);
  free(r);
}

static void test_scaled_matrices(void **state) {
  const int want_r[2] = {1, 1};
  const double kappa[2] = {10.0, 10.0};
  for (size_t c = 0; c < sizeof kScalings / sizeof kScalings[0]; ++c) {
    const scaling sc = kScalings[c];
    const spec s[2] = {{sc.dtype, 24, 16, 0}, {sc.dtype, 140, 100, 0}};
    for (int mi = 0; mi < N_QR_METHODS; ++mi) {
      test_seed("scaled QR");
      list L;
      list_make(&L, 2, s, kappa, want_r);
      double *a[2] = {scale_input(&L, 0, sc.scale), scale_input(&L, 1, sc.scale)};
      osft_qr_options_t o = options(kMethods[mi]);
      osft_status_t st[2] = {OSFT_STATUS_INTERNAL_ERROR, OSFT_STATUS_INTERNAL_ERROR};
      assert_ok(osft_qr_batch(CTX, &o, 2, L.ap, L.qp, L.rp, st));
      for (int i = 0; i < 2; ++i) {
        char what[96];
        snprintf(what, sizeof what, "%s %lldx%lld scaled by %g, %s",
                 sc.dtype == TT_F64 ? "f64" : "f32", (long long)s[i].m, (long long)s[i].n,
                 sc.scale, mi == 0 ? "Householder" : "CholeskyQR2");
        if (st[i] != OSFT_STATUS_SUCCESS)
          fail_msg("%s: per-matrix status %s (%s)", what, osft_status_string(st[i]),
                   osft_last_error());
        expect_scaled_entry(&L, i, a[i], sc.scale, what);
        free(a[i]);
      }
      list_free(&L);
    }
  }
}

int main(void) {
  if (!tt_device_present()) return OSFT_TEST_SKIP;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_scaled_matrices, tt_setup, tt_teardown),
  };
  return cmocka_run_group_tests_name("qr_scaling", tests, NULL, NULL);
}
