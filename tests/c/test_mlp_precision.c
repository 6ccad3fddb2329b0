/* Tiled MLP in bf16: every variant with bf16 weights and activations and
 * fp32 or bf16 gradients, and bf16 gradients summed over many tiles rounded
 * once (within half a bf16 ulp of the float64 sum).
 *
 * Built twice: for the CPU, and with OSFT_TEST_CUDA for a GPU (skipped where
 * none is present). Helpers (the float64 reference, fixtures, checks) are in
 * mlp_testlib.h; no test may log a warning (tt_setup_quiet). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_tensors.h"
#include "test_util.h"

#include "mlp_testlib.h"
#include "test_fixture.h"

/* bf16 activations and weights; weight/bias gradients in fp32 and in bf16
 * (several tiles: summed in an fp32 accumulator, rounded once). */
static void test_every_variant_bf16(void **state) {
  for (int v = 0; v < N_VARIANTS; ++v)
    for (int gd = 0; gd < 2; ++gd) {
      test_seed("variants bf16");
      cfg c = base_cfg(kVariants[v], TT_BF16);
      c.bias = 1;
      c.gdtype = gd ? TT_BF16 : TT_F32;
      fixture *f = fx_new(CTX, c);
      const int64_t lead[2] = {3, 9};
      const int64_t tiles[3] = {1, 2, 7};
      for (int t = 0; t < 3; ++t) {
        char label[96];
        snprintf(label, sizeof label, "bf16 variant %d grads %s tiles %lld",
                 (int)kVariants[v], gd ? "bf16" : "fp32", (long long)tiles[t]);
        check_pass(f, 3, lead, tiles[t], 0, label);
      }
      fx_free(f);
    }
}

/* |got - ref| within half a bf16 ulp of ref (plus fp32 noise): a bf16
 * gradient summed over many tiles is rounded once, not once per tile. */
static void expect_rounded_once(const char *what, const tt *t, const double *ref) {
  double *got = tt_get(t);
  const int64_t n = tt_logical_numel(t);
  double scale = 0;
  for (int64_t i = 0; i < n; ++i) scale = fmax(scale, fabs(ref[i]));
  for (int64_t i = 0; i < n; ++i) {
    const double a = fabs(ref[i]);
    const double ulp = a > 0 ? ldexp(1.0, ilogb(a) - 7) : 0.0;
    if (fabs(got[i] - ref[i]) > 0.5 * ulp + 1e-5 * scale)
      fail_msg("%s[%lld]: %.9g vs %.9g: more than half a bf16 ulp (%.3g)", what,
               (long long)i, got[i], ref[i], ulp);
  }
  free(got);
}

/* fp32 activations (exact intermediates), bf16 gradients and bf16 factors,
 * 16 tiles: each gradient is within half a bf16 ulp of the float64 sum,
 * overwriting and accumulating. Per-tile rounding would drift further. */
static void test_bf16_gradients_rounded_once(void **state) {
  test_seed("rounded once");
  cfg c = base_cfg(OSFT_MLP_SWIGLU, TT_F32);
  c.bias = 1;
  c.gdtype = TT_BF16;
  c.layers = 1 << UP;
  c.fdtype = TT_BF16;
  fixture *f = fx_new(CTX, c);
  const int64_t m = 64;
  const int64_t lead[1] = {m};
  tt *x = activations(f, 2, lead), *gy = activations(f, 2, lead);
  double *xd = tt_get(x), *gyd = tt_get(gy);
  ref_out o = ref_run(&f->R, xd, gyd, m);
  double *fr[3];
  ref_factor_grads(&f->L[UP], o.dw[UP], fr);
  grads G;
  grads_new(f, x, &G);
  for (int acc = 0; acc < 2; ++acc) {
    double *prior[4] = {NULL};
    tt *checked[4] = {G.dw[GATE], G.dw[DOWN], G.db[DOWN], G.df[UP][2]};
    const double *refs[4] = {o.dw[GATE], o.dw[DOWN], o.db[DOWN], fr[2]};
    for (int i = 0; i < 4; ++i) {
      if (acc) {
        tt_random(checked[i], -1, 1);
        prior[i] = tt_get(checked[i]);
      } else {
        tt_poison(checked[i]);
      }
    }
    G.g.accumulate = acc ? OSFT_MLP_ACCUMULATE_ALL : 0;
    G.fg[UP].accumulate = acc ? OSFT_FLINEAR_ACCUMULATE_ALL : 0;
    assert_ok(osft_mlp_backward(f->mlp, &x->t, &gy->t, &G.g, 16));
    static const char *const names[4] = {"grad_gate", "grad_down", "grad_down_bias",
                                         "up layer grad_v_low"};
    for (int i = 0; i < 4; ++i) {
      double *e = plus(refs[i], prior[i], tt_logical_numel(checked[i]));
      expect_rounded_once(names[i], checked[i], e);
      free(e);
      free(prior[i]);
    }
  }
  for (int q = 0; q < 3; ++q) free(fr[q]);
  ref_out_free(&o);
  free(xd);
  free(gyd);
  grads_free(&G);
  tt_free(x);
  tt_free(gy);
  fx_free(f);
}

int main(void) {
  if (!tt_device_present()) return OSFT_TEST_SKIP;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_every_variant_bf16, tt_setup_quiet,
                                      tt_teardown_quiet),
      cmocka_unit_test_setup_teardown(test_bf16_gradients_rounded_once, tt_setup_quiet,
                                      tt_teardown_quiet),
  };
  return cmocka_run_group_tests_name("mlp_precision", tests, NULL, NULL);
}
