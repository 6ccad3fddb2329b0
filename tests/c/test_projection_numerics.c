/* Gradient projection numerics: several targets of different shapes, part
 * sets and dtypes in one projector match the float64 projection of the
 * stored values, the orthogonality query reports the float64 products, and
 * Adam with projection keeps the frozen subspace at fp32 round-off for 200
 * steps.
 *
 * Built twice: for the CPU, and with OSFT_TEST_CUDA for a GPU (skipped where
 * none is present). The target helpers are in projection_testlib.h, the
 * float64 projection in tests/mpi/projection_ref.h. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../mpi/projection_ref.h"
#include "test_tensors.h"
#include "test_util.h"

#include "projection_testlib.h"
#include "test_fixture.h"

static double tol_for(tt_dtype grad) {
  return grad == TT_BF16 ? 1e-2 : 2e-5;
}

/* ------------------------------------------------------------- numerics */

/* Several targets of different shapes and part sets in one projector, in
 * every dtype combination, some with padded rows: gradients, then
 * parameters, match the float64 projection of the stored values. */
static void test_project_matches_reference(void **state) {
  const int64_t shapes[4][4] = {
      {24, 16, 6, 5}, {9, 31, 4, 3}, {40, 40, 20, 20}, {7, 12, 1, 6}};
  const tt_dtype combos[4][2] = {
      {TT_F32, TT_F32}, {TT_BF16, TT_BF16}, {TT_F32, TT_BF16}, {TT_BF16, TT_F32}};
  for (int c = 0; c < 4; ++c) {
    problem P[4];
    target_tensors T[4];
    double *ref_gu[4], *ref_gv[4], *ref_ul[4], *ref_vl[4];
    osft_projector_t proj = new_projector(CTX, NULL);
    for (int s = 0; s < 4; ++s) {
      char seed[32];
      snprintf(seed, sizeof seed, "reference %d %d", c, s);
      P[s] =
          ref_problem_make(seed, shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3]);
      ref_problem_perturb(&P[s], 0.1);
      T[s] = make_tensors(&P[s], combos[c][0], combos[c][1], s == 1 ? 3 : 0);
      const osft_projection_target_t t = replicated_target(&T[s], s != 3, s != 0, 1);
      int64_t index = -1;
      assert_ok(osft_projector_add_target(proj, &t, &index));
      assert_int_equal(index, s);
      ref_gu[s] = expected_u(T[s].uh, T[s].gu);
      ref_gv[s] = expected_v(T[s].vh, T[s].gv);
      ref_ul[s] = expected_u(T[s].uh, T[s].ul);
      ref_vl[s] = expected_v(T[s].vh, T[s].vl);
    }
    assert_ok(osft_projector_project(proj));
    for (int s = 0; s < 4; ++s) {
      if (s != 3) expect_close("grad_u_low", T[s].gu, ref_gu[s], tol_for(combos[c][1]));
      if (s != 0) expect_close("grad_v_low", T[s].gv, ref_gv[s], tol_for(combos[c][1]));
    }
    assert_ok(osft_projector_project_params(proj));
    for (int s = 0; s < 4; ++s) {
      if (s != 3) expect_close("u_low", T[s].ul, ref_ul[s], tol_for(combos[c][1]));
      if (s != 0) expect_close("v_low", T[s].vl, ref_vl[s], tol_for(combos[c][1]));
    }
    double mu = -1, mv = -1;
    assert_ok(osft_projector_orthogonality(proj, &mu, &mv));
    const double limit = combos[c][0] == TT_F32 && combos[c][1] == TT_F32 ? 1e-5 : 5e-2;
    if (!(mu <= limit && mv <= limit))
      fail_msg("combo %d: residual after project_params %g, %g", c, mu, mv);
    assert_ok(osft_projector_destroy(proj));
    for (int s = 0; s < 4; ++s) {
      free(ref_gu[s]);
      free(ref_gv[s]);
      free(ref_ul[s]);
      free(ref_vl[s]);
      free_tensors(&T[s]);
      ref_problem_free(&P[s]);
    }
  }
}

/* The query reports max |U_high^T U_low| and |V_low V_high^T| exactly as
 * the float64 products of the stored values. */
static void test_orthogonality_query(void **state) {
  problem A = ref_problem_make("orth a", 20, 14, 5, 4),
          B = ref_problem_make("orth b", 11, 30, 3, 6);
  ref_problem_perturb(&A, 0.3);
  ref_problem_perturb(&B, 0.2);
  target_tensors TA = make_tensors(&A, TT_F32, TT_F32, 0);
  target_tensors TB = make_tensors(&B, TT_F32, TT_F32, 0);
  osft_projector_t proj = new_projector(CTX, NULL);
  osft_projection_target_t ta = replicated_target(&TA, 1, 1, 1);
  osft_projection_target_t tb = replicated_target(&TB, 1, 1, 1);
  assert_ok(osft_projector_add_target(proj, &ta, NULL));
  assert_ok(osft_projector_add_target(proj, &tb, NULL));
  double *ua = tt_get(TA.uh), *la = tt_get(TA.ul), *vha = tt_get(TA.vh),
         *vla = tt_get(TA.vl);
  double *ub = tt_get(TB.uh), *lb = tt_get(TB.ul), *vhb = tt_get(TB.vh),
         *vlb = tt_get(TB.vl);
  const double want_u =
      fmax(ref_max_u(ua, A.n, A.r, la, A.l), ref_max_u(ub, B.n, B.r, lb, B.l));
  const double want_v =
      fmax(ref_max_v(vha, A.r, A.k, vla, A.l), ref_max_v(vhb, B.r, B.k, vlb, B.l));
  double mu = -1, mv = -1;
  assert_ok(osft_projector_orthogonality(proj, &mu, &mv));
  assert_true(fabs(mu - want_u) <= 1e-5 * want_u);
  assert_true(fabs(mv - want_v) <= 1e-5 * want_v);
  assert_true(want_u > 1e-2 && want_v > 1e-2);
  assert_ok(osft_projector_orthogonality(proj, NULL, NULL));
  free(ua), free(la), free(vha), free(vla), free(ub), free(lb), free(vhb), free(vlb);
  assert_ok(osft_projector_destroy(proj));
  free_tensors(&TA);
  free_tensors(&TB);
  ref_problem_free(&A);
  ref_problem_free(&B);
}

/* Adam with per-element scaling leaks into the frozen subspace; projecting
 * the gradients before and the parameters after each step keeps the
 * residual at fp32 round-off for 200 steps. */
static void test_adam_200_steps(void **state) {
  problem P = ref_problem_make("adam", 32, 24, 8, 8);
  target_tensors T = make_tensors(&P, TT_F32, TT_F32, 0);
  osft_projector_t proj = new_projector(CTX, NULL);
  osft_projection_target_t t = replicated_target(&T, 1, 1, 1);
  assert_ok(osft_projector_add_target(proj, &t, NULL));
  adam_run run = adam_start(&P, "adam steps");
  double worst = 0;
  for (int step = 1; step <= 200; ++step)
    worst = fmax(worst, adam_step(&run, proj, &T, 1e-2));
  if (!(worst <= 1e-5)) fail_msg("orthogonality residual reached %g", worst);
  adam_free(&run);
  assert_ok(osft_projector_destroy(proj));
  free_tensors(&T);
  ref_problem_free(&P);
}

int main(void) {
  if (!tt_device_present()) return OSFT_TEST_SKIP;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_project_matches_reference, tt_setup,
                                      tt_teardown),
      cmocka_unit_test_setup_teardown(test_orthogonality_query, tt_setup, tt_teardown),
      cmocka_unit_test_setup_teardown(test_adam_200_steps, tt_setup, tt_teardown),
  };
  return cmocka_run_group_tests_name("projection_numerics", tests, NULL, NULL);
}
