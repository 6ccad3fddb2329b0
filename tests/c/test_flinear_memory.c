/* Factorized linear layer memory: every allocation of a first forward or
 * backward, refused in turn (and every one after it), either fails the call
 * with OSFT_STATUS_OUT_OF_MEMORY before anything is written, or is absorbed
 * by a fallback and the call's outputs still match the float64 reference.
 *
 * Built twice: for the CPU, and with OSFT_TEST_CUDA for a GPU (skipped where
 * none is present), where device allocations are refused too. The float64
 * reference and the layer helpers are in flinear_testlib.h. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_tensors.h"
#include "test_util.h"

#include "flinear_testlib.h"
#include "test_fixture.h"

enum { M = 21, N = 14, KIN = 11 };

typedef struct {
  tt_dtype dtype;
  osft_flinear_strategy_t strategy;
  int backward;
} refusal_case;

/* A tt_refused_call (test_tensors.h) of one forward or backward. */
static void refused_call(void *user, osft_context_t ctx, test_alloc_state *a, int device,
                         long granted) {
  const refusal_case *c = user;
  tt *w = mat(c->dtype, N, KIN);
  tt_random(w, -1, 1);
  osft_flinear_t layer = decompose(ctx, w, 0.5, c->strategy);
  ref_layer R = ref_read(layer);
  tt *x = mat(c->dtype, M, KIN), *bias = vec(c->dtype, N);
  tt *g = mat(c->dtype, M, N), *y = mat(c->dtype, M, N), *dx = mat(c->dtype, M, KIN);
  tt *du = mat(TT_F32, N, R.l), *ds = vec(TT_F32, R.l), *dv = mat(TT_F32, R.l, KIN);
  tt *db = vec(TT_F32, N);
  tt_random(x, -1, 1);
  tt_random(bias, -1, 1);
  tt_random(g, -1, 1);
  tt *outs[6] = {y, dx, du, ds, dv, db};
  for (int i = 0; i < 6; ++i) tt_poison(outs[i]);
  tt_snapshot before;
  tt_snapshot_take(&before, outs, 6);
  osft_flinear_grads_t gr = grads_of(dx, du, ds, dv, db);

  test_alloc_refuse(a, device, granted);
  const osft_status_t st = c->backward
                               ? osft_flinear_backward(layer, &x->t, &g->t, &gr)
                               : osft_flinear_forward(layer, &x->t, &bias->t, &y->t);

  if (st != OSFT_STATUS_SUCCESS) {
    assert_int_equal(st, OSFT_STATUS_OUT_OF_MEMORY);
    tt_snapshot_expect_untouched(&before, c->backward ? "backward" : "forward");
  } else {
    const double tol = c->dtype == TT_BF16 ? 3e-2 : 2e-4;
    double *xd = tt_get(x), *bd = tt_get(bias), *gd = tt_get(g);
    if (c->backward) {
      ref_grads rg = ref_backward(&R, xd, gd, M);
      expect_close("grad_x after refusals", dx, rg.dx, tol);
      expect_close("grad_u_low after refusals", du, rg.du, tol);
      expect_close("grad_s_low after refusals", ds, rg.ds, tol);
      expect_close("grad_v_low after refusals", dv, rg.dv, tol);
      expect_close("grad_bias after refusals", db, rg.db, tol);
      ref_grads_free(&rg);
    } else {
      double *yr = ref_forward(&R, xd, bd, M);
      expect_close("y after refusals", y, yr, tol);
      free(yr);
    }
    free(xd);
    free(bd);
    free(gd);
  }
  tt_snapshot_release(&before);
  ref_free(&R);
  tt *all[10] = {w, x, bias, g, y, dx, du, ds, dv, db};
  for (int i = 0; i < 10; ++i) tt_free(all[i]);
  assert_ok(osft_flinear_destroy(layer));
}

static void test_every_refusal_is_clean(void **state) {
  (void)state;
  for (int dt = 0; dt < 2; ++dt)
    for (int st = OSFT_FLINEAR_FACTORIZED; st <= OSFT_FLINEAR_HYBRID; ++st)
      for (int backward = 0; backward < 2; ++backward) {
        refusal_case c = {dt ? TT_F32 : TT_BF16, (osft_flinear_strategy_t)st, backward};
        test_seed("refusals");
        tt_refusal_sweep(refused_call, &c);
      }
}

int main(void) {
  if (!tt_device_present()) return OSFT_TEST_SKIP;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_every_refusal_is_clean),
  };
  return cmocka_run_group_tests_name("flinear_memory", tests, NULL, NULL);
}
