/* Gradient projection: the update's arithmetic (osft_projector_options_t
 * arithmetic) and the batching of same-shaped targets.
 *
 *   - fp32 gradients against bf16 frozen factors show each arithmetic
 *     apart: EXACT and FP32 match the float64 projection of the stored
 *     values, BF16 matches the float64 projection with C rounded to bf16
 *     (and not the exact one), AUTO is EXACT for fp32 storage.
 *   - bf16 storage: over Adam steps, BF16 and AUTO keep the frozen
 *     subspace within 2x of the exact update's residual (the claim behind
 *     AUTO's default; bench/results/projection_orthogonality.md).
 *   - batching: targets of one shape share one GEMM call per step
 *     (osft_projector_info_t last_*), with results that match float64 in
 *     any batch size a workspace limit leaves; no host wait, one
 *     collective.
 *   - a bad arithmetic value is refused and names the field.
 *
 * Built twice: for the CPU, and with OSFT_TEST_CUDA for a GPU (skipped
 * where none is present). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../mpi/projection_ref.h"
#include "test_tensors.h"
#include "test_util.h"

#include "projection_testlib.h"
#include "test_fixture.h"

static osft_projector_t projector_with(osft_context_t ctx, osft_comm_t comm,
                                       int arithmetic) {
  osft_projector_options_t o;
  assert_ok(OSFT_PROJECTOR_OPTIONS_INIT(&o));
  o.arithmetic = arithmetic;
  osft_projector_t p = NULL;
  assert_ok(osft_projector_create(ctx, comm, &o, &p));
  return p;
}

static double round_bf16(double v) {
  return tt_round(TT_BF16, v);
}

static double max_diff(const double *a, const double *b, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; ++i) m = fmax(m, fabs(a[i] - b[i]));
  return m;
}

/* One arithmetic on fp32 gradients against bf16 frozen factors: the
 * result's distance to the exact and to the bf16-C projection. */
static void check_fp32_storage(osft_context_t ctx, int arithmetic, int want_bf16_c) {
  problem P = ref_problem_make("arith fp32", 48, 40, 12, 10);
  target_tensors T = make_tensors(&P, TT_BF16, TT_F32, 0);
  osft_projector_t proj = projector_with(ctx, NULL, arithmetic);
  const osft_projection_target_t t = replicated_target(&T, 1, 1, 0);
  assert_ok(osft_projector_add_target(proj, &t, NULL));
  double *uh = tt_get(T.uh), *vh = tt_get(T.vh);
  double *exact[2] = {tt_get(T.gu), tt_get(T.gv)},
         *bf16c[2] = {tt_get(T.gu), tt_get(T.gv)};
  ref_project_u(uh, P.n, P.r, exact[0], P.l);
  ref_project_v(vh, P.r, P.k, exact[1], P.l);
  ref_project_u_rounded(uh, P.n, P.r, bf16c[0], P.l, round_bf16);
  ref_project_v_rounded(vh, P.r, P.k, bf16c[1], P.l, round_bf16);
  tt_poison(T.gu), tt_poison(T.gv);
  tt_set(T.gu, P.gu), tt_set(T.gv, P.gv);
  assert_ok(osft_projector_project(proj));
  const tt *got_t[2] = {T.gu, T.gv};
  const int64_t sizes[2] = {P.n * P.l, P.l * P.k};
  for (int part = 0; part < 2; ++part) {
    double *got = tt_get(got_t[part]);
    /* What rounding C to bf16 moves (8 bits); fp32 round-off and the split's
     * 16 bits of C are far below it. */
    const double apart = max_diff(exact[part], bf16c[part], sizes[part]);
    const double to_exact = max_diff(got, exact[part], sizes[part]);
    const double to_bf16c = max_diff(got, bf16c[part], sizes[part]);
    assert_true(apart > 1e-4);
    if (want_bf16_c ? !(to_bf16c <= 0.1 * apart && to_exact >= 0.5 * apart)
                    : !(to_exact <= 0.01 * apart))
      fail_msg(
          "arithmetic %d, %s part: %.3g from the exact projection, %.3g from the "
          "bf16-C one (they are %.3g apart)",
          arithmetic, part ? "V" : "U", to_exact, to_bf16c, apart);
    free(got);
  }
  free(uh), free(vh);
  for (int i = 0; i < 2; ++i) free(exact[i]), free(bf16c[i]);
  assert_ok(osft_projector_destroy(proj));
  free_tensors(&T);
  ref_problem_free(&P);
}

static void test_fp32_storage(void **state) {
  check_fp32_storage(CTX, OSFT_PROJECTION_ARITHMETIC_AUTO, 0);
  check_fp32_storage(CTX, OSFT_PROJECTION_ARITHMETIC_EXACT, 0);
  check_fp32_storage(CTX, OSFT_PROJECTION_ARITHMETIC_FP32, 0);
  check_fp32_storage(CTX, OSFT_PROJECTION_ARITHMETIC_BF16, 1);
}

/* The worst orthogonality residual over `steps` Adam steps with bf16
 * storage (moments in float64, the factor rounded to bf16 when stored),
 * gradients and parameters projected in `arithmetic`; the same seed gives
 * every arithmetic the same gradients. */
static double adam_residual(osft_context_t ctx, int arithmetic, int steps) {
  problem P = ref_problem_make("arith adam", 64, 48, 16, 16);
  target_tensors T = make_tensors(&P, TT_BF16, TT_BF16, 0);
  osft_projector_t proj = projector_with(ctx, NULL, arithmetic);
  const osft_projection_target_t t = replicated_target(&T, 1, 1, 1);
  assert_ok(osft_projector_add_target(proj, &t, NULL));
  adam_run run = adam_start(&P, "arith adam steps");
  assert_ok(osft_projector_project_params(proj)); /* start in the complement */
  double worst = 0;
  for (int step = 1; step <= steps; ++step)
    worst = fmax(worst, adam_step(&run, proj, &T, 1e-3));
  adam_free(&run);
  assert_ok(osft_projector_destroy(proj));
  free_tensors(&T);
  ref_problem_free(&P);
  return worst;
}

/* bf16 storage keeps 8 mantissa bits: C's precision in the update buys no
 * orthogonality, so the cheaper arithmetics stay within 2x of the exact
 * one; all stay at bf16 level. */
static void test_bf16_storage_orthogonality(void **state) {
  const int steps = 60;
  const double exact = adam_residual(CTX, OSFT_PROJECTION_ARITHMETIC_EXACT, steps);
  const int others[3] = {OSFT_PROJECTION_ARITHMETIC_AUTO, OSFT_PROJECTION_ARITHMETIC_BF16,
                         OSFT_PROJECTION_ARITHMETIC_FP32};
  for (int i = 0; i < 3; ++i) {
    const double got = adam_residual(CTX, others[i], steps);
    print_message("arithmetic %d: worst residual %.3g over %d steps (exact: %.3g)\n",
                  others[i], got, steps, exact);
    if (!(got <= 2 * exact && got <= 2e-2))
      fail_msg("arithmetic %d: residual %.3g over %d steps; the exact update's %.3g",
               others[i], got, steps, exact);
  }
  assert_true(exact > 0 && exact <= 2e-2);
}

/* n targets: `same` of one shape, the rest of others; fp32 factors (every
 * backend's arithmetic is then fp32: counts do not depend on the engine). */
enum { kTargets = 6, kSame = 4 };

/* GEMM calls for `gemms` GEMMs that batch into `batched` calls: CUDA issues
 * a batch as one cublasGemmBatchedEx; the CPU engines have no batched GEMM
 * and take the parts one by one (same grouping, same results). */
static int64_t calls_for(int64_t batched, int64_t gemms) {
#ifdef OSFT_TEST_CUDA
  (void)gemms;
  return batched;
#else
  (void)batched;
  return gemms;
#endif
}

typedef struct {
  problem P[kTargets];
  target_tensors T[kTargets];
  double *ref[kTargets][2];
} batch_case;

static void batch_case_make(batch_case *b) {
  const int64_t shapes[3][4] = {{40, 24, 8, 8}, {16, 36, 6, 4}, {30, 30, 10, 12}};
  for (int s = 0; s < kTargets; ++s) {
    const int64_t *sh = shapes[s < kSame ? 0 : s - kSame + 1];
    char seed[32];
    snprintf(seed, sizeof seed, "batch %d", s);
    b->P[s] = ref_problem_make(seed, sh[0], sh[1], sh[2], sh[3]);
    b->T[s] = make_tensors(&b->P[s], TT_F32, TT_F32, 0);
    b->ref[s][0] = expected_u(b->T[s].uh, b->T[s].gu);
    b->ref[s][1] = expected_v(b->T[s].vh, b->T[s].gv);
  }
}

static void batch_case_check(batch_case *b) {
  for (int s = 0; s < kTargets; ++s) {
    expect_close("grad_u_low", b->T[s].gu, b->ref[s][0], 2e-5);
    expect_close("grad_v_low", b->T[s].gv, b->ref[s][1], 2e-5);
  }
}

static void batch_case_reset(batch_case *b) {
  for (int s = 0; s < kTargets; ++s) {
    tt_poison(b->T[s].gu), tt_poison(b->T[s].gv);
    tt_set(b->T[s].gu, b->P[s].gu), tt_set(b->T[s].gv, b->P[s].gv);
  }
}

static void batch_case_free(batch_case *b) {
  for (int s = 0; s < kTargets; ++s) {
    free(b->ref[s][0]), free(b->ref[s][1]);
    free_tensors(&b->T[s]);
    ref_problem_free(&b->P[s]);
  }
}

static osft_projector_info_t info_of(osft_projector_t p) {
  osft_projector_info_t info;
  memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  assert_ok(osft_projector_get_info(p, &info));
  return info;
}

/* Local (replicated) parts: per kind (side and shape) one coefficient and
 * one update GEMM call, whatever the number of targets of that kind. */
static void test_batched_gemm_calls(void **state) {
  batch_case b;
  batch_case_make(&b);
  osft_projector_t proj = new_projector(CTX, NULL);
  for (int s = 0; s < kTargets; ++s) {
    const osft_projection_target_t t = replicated_target(&b.T[s], 1, 1, 0);
    assert_ok(osft_projector_add_target(proj, &t, NULL));
  }
  osft_projector_info_t info = info_of(proj);
  assert_int_equal(info.last_gemms, 0);
  assert_int_equal(info.last_gemm_calls, 0);
  batch_case_reset(&b);
  assert_ok(osft_projector_project(proj));
  batch_case_check(&b);
  info = info_of(proj);
  /* 12 parts, 2 GEMMs each; kinds: U and V of 3 shapes = 6, 2 calls each */
  assert_int_equal(info.last_gemms, 2 * 2 * kTargets);
  assert_int_equal(info.last_gemm_calls, calls_for(2 * 2 * 3, 2 * 2 * kTargets));
  assert_int_equal(info.last_elementwise_calls, 0);
  assert_int_equal(info.last_collectives, 0);
  assert_int_equal(info.last_host_waits, 0);
  assert_ok(osft_projector_destroy(proj));
  batch_case_free(&b);
}

/* Reduced (U_ROWS) parts through a counting one-rank communicator: one
 * collective per call for all of them, their coefficient GEMMs batched
 * before it and their updates after it. */
static void test_batched_reduced_parts(void **state) {
  batch_case b;
  batch_case_make(&b);
  counter c = {0, OSFT_STATUS_SUCCESS};
  osft_comm_t comm = counting_comm(CTX, &c);
  osft_projector_t proj = new_projector(CTX, comm);
  int64_t shards[kTargets][1];
  for (int s = 0; s < kTargets; ++s) {
    osft_projection_target_t t = replicated_target(&b.T[s], 1, 1, 0);
    shards[s][0] = b.P[s].n;
    t.u_layout = OSFT_SHARD_U_ROWS;
    t.u_shards = shards[s];
    t.n_u_shards = 1;
    assert_ok(osft_projector_add_target(proj, &t, NULL));
  }
  batch_case_reset(&b);
  assert_ok(osft_projector_project(proj));
  batch_case_check(&b);
  const osft_projector_info_t info = info_of(proj);
  assert_int_equal(c.calls, 1);
  assert_int_equal(info.last_collectives, 1);
  assert_int_equal(info.last_gemms, 2 * 2 * kTargets);
  assert_int_equal(info.last_gemm_calls, calls_for(2 * 2 * 3, 2 * 2 * kTargets));
  assert_int_equal(info.last_host_waits, 0);
  assert_ok(osft_projector_destroy(proj));
  assert_ok(osft_comm_destroy(comm));
  batch_case_free(&b);
}

/* A workspace limit splits the batches (more calls); the results stay. */
static void test_batches_under_workspace_limit(void **state) {
  (void)state;
  batch_case b;
  batch_case_make(&b);
  osft_context_options_t o;
  assert_ok(OSFT_CONTEXT_OPTIONS_INIT(&o));
  /* Two of the four same-shaped targets' coefficient slots (8 x 8 fp32,
   * 256-byte aligned) per batch: limit/2 = 512 bytes. */
  o.workspace_limit = 1024;
  osft_context_t ctx = tt_context(&o);
  osft_projector_t proj = new_projector(ctx, NULL);
  for (int s = 0; s < kTargets; ++s) {
    const osft_projection_target_t t = replicated_target(&b.T[s], 1, 1, 0);
    assert_ok(osft_projector_add_target(proj, &t, NULL));
  }
  batch_case_reset(&b);
  osft_status_t st = osft_projector_project(proj);
  if (st == OSFT_STATUS_OUT_OF_MEMORY) {
    /* A backend whose own scratch does not fit 1 KiB: nothing to show. */
    print_message("SKIPPED: 1 KiB of workspace is too little on this device\n");
  } else {
    assert_ok(st);
    batch_case_check(&b);
    const osft_projector_info_t info = info_of(proj);
    assert_int_equal(info.last_gemms, 2 * 2 * kTargets);
    const int64_t unlimited = calls_for(2 * 2 * 3, 2 * 2 * kTargets);
    if (unlimited < 2 * 2 * kTargets) assert_true(info.last_gemm_calls > unlimited);
  }
  assert_ok(osft_projector_destroy(proj));
  assert_ok(osft_context_destroy(ctx));
  batch_case_free(&b);
}

static void test_bad_arithmetic(void **state) {
  osft_projector_options_t o;
  assert_ok(OSFT_PROJECTOR_OPTIONS_INIT(&o));
  assert_int_equal(o.arithmetic, OSFT_PROJECTION_ARITHMETIC_AUTO);
  const int bad[3] = {-1, 4, 1000};
  for (int i = 0; i < 3; ++i) {
    o.arithmetic = bad[i];
    osft_projector_t p = (osft_projector_t)0x1;
    assert_int_equal(osft_projector_create(CTX, NULL, &o, &p),
                     OSFT_STATUS_INVALID_ARGUMENT);
    assert_true(strstr(osft_last_error(), "arithmetic") != NULL);
    assert_ptr_equal(p, (osft_projector_t)0x1);
  }
}

int main(void) {
  if (!tt_device_present()) return OSFT_TEST_SKIP;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_fp32_storage, tt_setup, tt_teardown),
      cmocka_unit_test_setup_teardown(test_bf16_storage_orthogonality, tt_setup,
                                      tt_teardown),
      cmocka_unit_test_setup_teardown(test_batched_gemm_calls, tt_setup, tt_teardown),
      cmocka_unit_test_setup_teardown(test_batched_reduced_parts, tt_setup, tt_teardown),
      cmocka_unit_test(test_batches_under_workspace_limit),
      cmocka_unit_test_setup_teardown(test_bad_arithmetic, tt_setup, tt_teardown),
  };
  return cmocka_run_group_tests_name("projection_arithmetic", tests, NULL, NULL);
}
