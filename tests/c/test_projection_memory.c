/* Gradient projection memory: every allocation of a first projection (of
 * the gradients, or of the parameters), refused in turn (and every one
 * after it), either fails the call with OSFT_STATUS_OUT_OF_MEMORY before any
 * target is changed, or is absorbed and every target matches the float64
 * projection. A projection that stopped halfway would leave some layers
 * projected and others not.
 *
 * Built twice: for the CPU, and with OSFT_TEST_CUDA for a GPU (skipped where
 * none is present), where device allocations are refused too. The target
 * helpers are in projection_testlib.h, the float64 projection in
 * tests/mpi/projection_ref.h. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../mpi/projection_ref.h"
#include "test_tensors.h"
#include "test_util.h"

#include "projection_testlib.h"
#include "test_fixture.h"

enum { TARGETS = 3 };

static const int64_t kShapes[TARGETS][4] = {
    {24, 16, 6, 5}, {9, 31, 4, 3}, {20, 20, 8, 8}};

typedef struct {
  tt_dtype dtype;
  int params; /* project_params, else project */
} refusal_case;

/* A tt_refused_call (test_tensors.h) of one first projection. */
static void refused_projection(void *user, osft_context_t ctx, test_alloc_state *a,
                               int device, long granted) {
  const tt_dtype dtype = ((const refusal_case *)user)->dtype;
  const int params = ((const refusal_case *)user)->params;
  osft_projector_t proj = new_projector(ctx, NULL);
  problem P[TARGETS];
  target_tensors T[TARGETS];
  double *ref[TARGETS][2];
  tt *x[TARGETS][2]; /* what the call projects in place */
  for (int s = 0; s < TARGETS; ++s) {
    char seed[32];
    snprintf(seed, sizeof seed, "refusals %d %d", params, s);
    P[s] = ref_problem_make(seed, kShapes[s][0], kShapes[s][1], kShapes[s][2],
                            kShapes[s][3]);
    ref_problem_perturb(&P[s], 0.1);
    T[s] = make_tensors(&P[s], dtype, dtype, s == 1 ? 3 : 0);
    const osft_projection_target_t t = replicated_target(&T[s], 1, 1, 1);
    assert_ok(osft_projector_add_target(proj, &t, NULL));
    x[s][0] = params ? T[s].ul : T[s].gu;
    x[s][1] = params ? T[s].vl : T[s].gv;
    ref[s][0] = expected_u(T[s].uh, x[s][0]);
    ref[s][1] = expected_v(T[s].vh, x[s][1]);
  }
  assert_ok(osft_projector_prepare(proj));
  tt_snapshot before;
  tt_snapshot_take(&before, &x[0][0], 2 * TARGETS);

  test_alloc_refuse(a, device, granted);
  const osft_status_t st =
      params ? osft_projector_project_params(proj) : osft_projector_project(proj);

  if (st != OSFT_STATUS_SUCCESS) {
    assert_int_equal(st, OSFT_STATUS_OUT_OF_MEMORY);
    tt_snapshot_expect_untouched(&before, params ? "project_params" : "project");
  }
  tt_snapshot_release(&before);
  const double tol = dtype == TT_BF16 ? 1e-2 : 2e-5;
  for (int s = 0; s < TARGETS; ++s)
    for (int i = 0; i < 2; ++i) {
      if (st == OSFT_STATUS_SUCCESS)
        expect_close(i ? "V part after refusals" : "U part after refusals", x[s][i],
                     ref[s][i], tol);
      free(ref[s][i]);
    }
  assert_ok(osft_projector_destroy(proj));
  for (int s = 0; s < TARGETS; ++s) {
    free_tensors(&T[s]);
    ref_problem_free(&P[s]);
  }
}

static void test_every_refusal_is_clean(void **state) {
  (void)state;
  for (int dt = 0; dt < 2; ++dt)
    for (int params = 0; params < 2; ++params) {
      refusal_case c = {dt ? TT_F32 : TT_BF16, params};
      tt_refusal_sweep(refused_projection, &c);
    }
}

int main(void) {
  if (!tt_device_present()) return OSFT_TEST_SKIP;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_every_refusal_is_clean),
  };
  return cmocka_run_group_tests_name("projection_memory", tests, NULL, NULL);
}
