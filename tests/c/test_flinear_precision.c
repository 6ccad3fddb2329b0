/* Factorized linear layer precision: bf16 factors and activations with
 * fp32 factor gradients (master gradients).
 *
 * Built twice: for the CPU, and with OSFT_TEST_CUDA for a GPU (skipped where
 * none is present). The float64 reference and the layer helpers are in
 * flinear_testlib.h. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_tensors.h"
#include "test_util.h"

#include "flinear_testlib.h"
#include "test_fixture.h"

/* bf16 factors and activations with fp32 factor gradients (master grads). */
static void test_fp32_grads_for_bf16_factors(void **state) {
  test_seed("fp32 grads");
  tt *w = mat(TT_BF16, 12, 9);
  tt_random(w, -1, 1);
  osft_flinear_t layer = decompose(CTX, w, 0.5, OSFT_FLINEAR_AUTO);
  ref_layer R = ref_read(layer);
  tt *x = mat(TT_BF16, 20, 9), *g = mat(TT_BF16, 20, 12);
  tt *du = mat(TT_F32, 12, R.l), *ds = vec(TT_F32, R.l), *dv = mat(TT_F32, R.l, 9);
  tt_random(x, -1, 1);
  tt_random(g, -1, 1);
  tt *outs[3] = {du, ds, dv};
  for (int i = 0; i < 3; ++i) tt_poison(outs[i]);
  osft_flinear_grads_t gr = grads_of(NULL, du, ds, dv, NULL);
  for (int st = OSFT_FLINEAR_FACTORIZED; st <= OSFT_FLINEAR_HYBRID; ++st) {
    assert_ok(osft_flinear_set_strategy(layer, (osft_flinear_strategy_t)st));
    assert_ok(osft_flinear_backward(layer, &x->t, &g->t, &gr));
    double *xd = tt_get(x), *gd = tt_get(g);
    ref_grads rg = ref_backward(&R, xd, gd, 20);
    expect_close("fp32 dU of bf16 factors", du, rg.du, 3e-2);
    expect_close("fp32 dS of bf16 factors", ds, rg.ds, 3e-2);
    expect_close("fp32 dV of bf16 factors", dv, rg.dv, 3e-2);
    ref_grads_free(&rg);
    free(xd);
    free(gd);
  }
  ref_free(&R);
  tt *all[6] = {w, x, g, du, ds, dv};
  for (int i = 0; i < 6; ++i) tt_free(all[i]);
  assert_ok(osft_flinear_destroy(layer));
}

int main(void) {
  if (!tt_device_present()) return OSFT_TEST_SKIP;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_fp32_grads_for_bf16_factors, tt_setup,
                                      tt_teardown),
  };
  return cmocka_run_group_tests_name("flinear_precision", tests, NULL, NULL);
}
