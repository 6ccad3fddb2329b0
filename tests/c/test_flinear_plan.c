/* The OSFT layer's cost model (src/ops/flinear_plan.cpp) for any device,
 * without one: which strategy it picks for the shapes whose two forms were
 * timed. On an H200 (bench/results/flinear_h200.csv, bf16, 8192 tokens,
 * rank ratio 0.5) the factorized form took 2.27, 0.47, 4.49 and 4.81 ms
 * for 4096x4096, 1024x4096, 14336x4096 and 4096x14336, the dense-rebuild
 * form 7.21, 0.87, 10.1 and 10.3 ms while its rebuild and factor-gradient
 * GEMMs were fp32 (about 18x slower there than bf16 ones); they now take
 * bf16 operands on CUDA with bf16 factors (not yet timed on a GPU), and on
 * CUDA the model also counts the element-wise passes' bytes. Pure logic:
 * runs without a GPU. */
#include "test_tensors.h"
#include "test_util.h"

/* src/ops/flinear_ops.h (tests may not include src/ops/). */
int osfti_flinear_plan_choice(int cuda, int allow_tf32, int native_bf16, int kept,
                              int64_t n, int64_t kin, int64_t r, int64_t l,
                              int factor_bf16, int compute_bf16, int64_t tokens,
                              int backward, unsigned want, size_t workspace_limit);

enum { WANT_X = 1, WANT_U = 2, WANT_S = 4, WANT_V = 8, WANT_BIAS = 16, WANT_ALL = 31 };

typedef struct {
  int64_t n, kin;
} plan_shape_t;

/* The H200 run's shapes (Llama-3.1-8B's projections). */
static const plan_shape_t kLlama[4] = {
    {4096, 4096}, {1024, 4096}, {14336, 4096}, {4096, 14336}};

/* A CUDA layer (no fingerprints: the rebuilt W is not kept), bf16 factors
 * and activations, rank ratio 0.5. */
static int cuda_bf16(plan_shape_t s, int64_t tokens, int backward, int tf32) {
  const int64_t k = s.n < s.kin ? s.n : s.kin;
  return osfti_flinear_plan_choice(1, tf32, 1, 0, s.n, s.kin, k / 2, k - k / 2, 1, 1,
                                   tokens, backward, WANT_ALL, 0);
}

static void test_cuda_bf16_rebuilds_where_it_pays(void **state) {
  (void)state;
  /* 8192 tokens. 4096^2: the dense form's bf16 GEMMs (forward 344 GFLOP
   * with the rebuild, backward 825) against the factorized form's 550 and
   * 962, plus 369 / 738 MB of passes over W (the rebuild; G's split)
   * against 134 / 201 MB over the M x k intermediates: dense, the forward
   * clearly (436 against 583 GFLOP-equivalents), the backward by a hair
   * (1009 against 1012). The other three stay factorized, as measured:
   * 1024x4096 by a few percent; 14336x4096 and 4096x14336 by their 58.7
   * M-entry W, whose passes (~1.3 GB a forward) cost about the flops the
   * dense forward saves. */
  for (int backward = 0; backward < 2; ++backward) {
    assert_int_equal(cuda_bf16(kLlama[0], 8192, backward, 0), OSFT_FLINEAR_DENSE);
    for (int i = 1; i < 4; ++i)
      assert_int_equal(cuda_bf16(kLlama[i], 8192, backward, 0), OSFT_FLINEAR_FACTORIZED);
  }
}

static void test_cuda_bf16_token_count_decides(void **state) {
  (void)state;
  /* Few tokens: the rebuild (2 N K l flops and its passes, per call: CUDA
   * keeps no W between calls) outweighs what the dense GEMMs save, for
   * every shape. Many: it is paid once against GEMMs that grow with M, and
   * the dense form (half the flops at rank ratio 0.5) wins both passes of
   * the square and the narrow layer. */
  for (int i = 0; i < 4; ++i)
    for (int64_t m = 1; m <= 4096; m *= 8)
      for (int backward = 0; backward < 2; ++backward)
        assert_int_equal(cuda_bf16(kLlama[i], m, backward, 0), OSFT_FLINEAR_FACTORIZED);
  for (int i = 0; i < 2; ++i)
    for (int backward = 0; backward < 2; ++backward)
      assert_int_equal(cuda_bf16(kLlama[i], 1 << 15, backward, 0), OSFT_FLINEAR_DENSE);
}

static void test_cpu_counts_flops_alike(void **state) {
  (void)state;
  /* On the CPU a flop is a flop: with many tokens the dense form (half the
   * GEMM flops at rank ratio 0.5) wins, with few the factorized one. */
  const plan_shape_t sq = {2048, 2048};
  for (int backward = 0; backward < 2; ++backward) {
    assert_int_equal(osfti_flinear_plan_choice(0, 0, 0, 1, sq.n, sq.kin, 1024, 1024, 0, 0,
                                               4096, backward, WANT_ALL, 0),
                     OSFT_FLINEAR_DENSE);
    assert_int_equal(osfti_flinear_plan_choice(0, 0, 0, 1, sq.n, sq.kin, 1024, 1024, 0, 0,
                                               16, backward, WANT_ALL, 0),
                     OSFT_FLINEAR_FACTORIZED);
  }
  /* bf16 on the CPU: unchanged, flops decide too. */
  assert_int_equal(osfti_flinear_plan_choice(0, 0, 0, 1, sq.n, sq.kin, 1024, 1024, 1, 1,
                                             4096, 0, WANT_ALL, 0),
                   OSFT_FLINEAR_DENSE);
}

static int cpu_square(int native_bf16, int factor_bf16, int compute_bf16, int backward) {
  return osfti_flinear_plan_choice(0, 0, native_bf16, 1, 2048, 2048, 1024, 1024,
                                   factor_bf16, compute_bf16, 4096, backward, WANT_ALL,
                                   0);
}

static void test_cpu_native_bf16_weighs_fp32_gemms(void **state) {
  (void)state;
  /* oneMKL on AMX (native bf16 GEMMs, about 4x its fp32 rate on an Intel
   * Xeon Emerald Rapids): with fp32 factors and bf16 activations the dense
   * form's backward keeps 17 GFLOP of fp32 GEMMs (P and Q) beside 69 of
   * bf16 ones, 69 + 4 x 17 > the factorized form's 120 GFLOP of bf16 ones,
   * where flop for flop (weight 1) it won at 86. */
  assert_int_equal(cpu_square(1, 0, 1, 1), OSFT_FLINEAR_FACTORIZED);
  /* An engine that widens bf16 (OpenBLAS): flop for flop, as before. */
  assert_int_equal(cpu_square(0, 0, 1, 1), OSFT_FLINEAR_DENSE);
  /* bf16 factors too: the dense form's rebuild, P and Q run on bf16
   * operands there, so every GEMM counts alike and it wins both passes. */
  for (int backward = 0; backward < 2; ++backward) {
    assert_int_equal(cpu_square(1, 1, 1, backward), OSFT_FLINEAR_DENSE);
    /* fp32 activations: every GEMM fp32 on either engine. */
    assert_int_equal(cpu_square(1, 0, 0, backward), cpu_square(0, 0, 0, backward));
  }
}

static int cuda_fp32(plan_shape_t s, int64_t tokens, int backward, int tf32) {
  const int64_t k = s.n < s.kin ? s.n : s.kin;
  return osfti_flinear_plan_choice(1, tf32, 1, 0, s.n, s.kin, k / 2, k / 2, 0, 0, tokens,
                                   backward, WANT_ALL, 0);
}

static void test_cuda_fp32_counts_flops_alike(void **state) {
  (void)state;
  /* fp32 activations on CUDA: every GEMM of both forms is fp32 (TF32 or
   * not, alike), so TF32 changes nothing, and with few tokens the choice
   * is the CPU's (flops alone, no kept W), where the factorized form's
   * fewer flops leave the passes nothing to decide. */
  for (int i = 0; i < 4; ++i) {
    const plan_shape_t s = kLlama[i];
    const int64_t k = s.n < s.kin ? s.n : s.kin;
    for (int backward = 0; backward < 2; ++backward) {
      for (int64_t m = 16; m <= (1 << 15); m *= 8)
        assert_int_equal(cuda_fp32(s, m, backward, 1), cuda_fp32(s, m, backward, 0));
      assert_int_equal(cuda_fp32(s, 16, backward, 0),
                       osfti_flinear_plan_choice(0, 0, 0, 0, s.n, s.kin, k / 2, k / 2, 0,
                                                 0, 16, backward, WANT_ALL, 0));
    }
  }
}

/* fp32 factors (FSDP2's mixed precision keeps them) with bf16 activations
 * on CUDA: the dense form's rebuild, P and Q stay fp32 GEMMs. */
static int cuda_fp32_factors(plan_shape_t s, int64_t tokens, int backward, int tf32) {
  const int64_t k = s.n < s.kin ? s.n : s.kin;
  return osfti_flinear_plan_choice(1, tf32, 1, 0, s.n, s.kin, k / 2, k - k / 2, 0, 1,
                                   tokens, backward, WANT_ALL, 0);
}

static void test_cuda_tf32_makes_the_rebuild_cheaper(void **state) {
  (void)state;
  /* With TF32 the fp32 GEMMs run at half the bf16 rate: the square layer's
   * forward at many tokens goes dense (275 GFLOP bf16 + 69 GFLOP fp32 x 2
   * < 550 GFLOP factorized), while the backward (its rebuild again, then P
   * and Q) stays factorized; without TF32 (16x) both stay factorized. */
  assert_int_equal(cuda_fp32_factors(kLlama[0], 8192, 0, 1), OSFT_FLINEAR_DENSE);
  assert_int_equal(cuda_fp32_factors(kLlama[0], 8192, 1, 1), OSFT_FLINEAR_FACTORIZED);
  assert_int_equal(cuda_fp32_factors(kLlama[0], 8192, 0, 0), OSFT_FLINEAR_FACTORIZED);
  assert_int_equal(cuda_fp32_factors(kLlama[0], 8192, 1, 0), OSFT_FLINEAR_FACTORIZED);
}

static void test_workspace_limit_rules_out_dense(void **state) {
  (void)state;
  assert_int_equal(osfti_flinear_plan_choice(0, 0, 0, 0, 2048, 2048, 1024, 1024, 0, 0,
                                             4096, 1, WANT_ALL, 1u << 20),
                   OSFT_FLINEAR_FACTORIZED);
}

static void test_public_report_matches(void **state) {
  (void)state;
  /* osft_flinear_choose_strategy on a layer of the device under test (the
   * CUDA twin: a GPU, where one is present) agrees with the model for that
   * device: fp32 factors there, so the report's compute dtype is fp32. */
  if (!tt_device_present()) return;
  osft_context_t ctx = tt_context(NULL);
  const int64_t shape[2] = {64, 48};
  tt *w = tt_new(TT_F32, 2, shape);
  tt_random(w, -0.5, 0.5);
  osft_flinear_options_t o;
  assert_ok(OSFT_FLINEAR_OPTIONS_INIT(&o));
  o.rank_ratio = 0.5;
  osft_flinear_t layer;
  assert_ok(osft_flinear_create_from_weight(ctx, &w->t, &o, &layer));
  const int cuda = tt_device() == OSFT_DEVICE_CUDA;
  for (int64_t m = 1; m <= 65536; m *= 16)
    for (int backward = 0; backward < 2; ++backward) {
      osft_flinear_strategy_t s;
      assert_ok(osft_flinear_choose_strategy(
          layer, m, backward ? OSFT_FLINEAR_BACKWARD : OSFT_FLINEAR_FORWARD, &s));
      assert_int_equal(
          s, osfti_flinear_plan_choice(cuda, 0, cuda, !cuda, shape[0], shape[1], 24, 24,
                                       0, 0, m, backward, WANT_ALL, 0));
    }
  osft_flinear_destroy(layer);
  osft_context_destroy(ctx);
  tt_free(w);
}

/* The hybrid form (dense forward and grad_x, factor gradients from the
 * factors) against the dense one on a square layer, flop for flop (CPU,
 * fp32, W kept): its backward costs 2MK^2 + 8MKl against 4MK^2 + 4K^2 l,
 * so it wins once l < 2MK / (8M - 4K): K/4 (a frozen ratio above 0.75)
 * for M >> K, 1365 of 4096 (0.67) at M = 2K = 8192; never in the forward
 * (the same dense GEMM), never for few tokens (the factorized form). */
static int cpu_ratio(int64_t k, int64_t l, int64_t tokens, int backward, unsigned want) {
  return osfti_flinear_plan_choice(0, 0, 0, 1, k, k, k - l, l, 0, 0, tokens, backward,
                                   want, 0);
}

static void test_hybrid_above_three_quarters_frozen(void **state) {
  (void)state;
  const int64_t k = 4096, m = 8192;
  assert_int_equal(cpu_ratio(k, k / 2, m, 1, WANT_ALL), OSFT_FLINEAR_DENSE); /* 0.5 */
  assert_int_equal(cpu_ratio(k, 1400, m, 1, WANT_ALL), OSFT_FLINEAR_DENSE);  /* 0.66 */
  assert_int_equal(cpu_ratio(k, 1330, m, 1, WANT_ALL), OSFT_FLINEAR_HYBRID); /* 0.68 */
  /* M >> K: the threshold tends to K/4 */
  assert_int_equal(cpu_ratio(k, 1070, 1 << 20, 1, WANT_ALL), OSFT_FLINEAR_DENSE);
  assert_int_equal(cpu_ratio(k, 1000, 1 << 20, 1, WANT_ALL), OSFT_FLINEAR_HYBRID);
  assert_int_equal(cpu_ratio(k, k / 10, m, 1, WANT_ALL), OSFT_FLINEAR_HYBRID); /* 0.9 */
  /* the forward is the dense one's: reported as dense */
  assert_int_equal(cpu_ratio(k, k / 10, m, 0, WANT_ALL), OSFT_FLINEAR_DENSE);
  /* few tokens: the factorized form */
  assert_int_equal(cpu_ratio(k, k / 10, 16, 1, WANT_ALL), OSFT_FLINEAR_FACTORIZED);
  /* only grad_x wanted: no factor gradients to save on, dense (kept W) */
  assert_int_equal(cpu_ratio(k, k / 10, m, 1, WANT_X), OSFT_FLINEAR_DENSE);
  /* a CUDA layer with bf16 factors at a frozen ratio of 0.9: hybrid too */
  const int64_t l = 410;
  assert_int_equal(
      osfti_flinear_plan_choice(1, 0, 1, 0, k, k, k - l, l, 1, 1, m, 1, WANT_ALL, 0),
      OSFT_FLINEAR_HYBRID);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cuda_bf16_rebuilds_where_it_pays),
      cmocka_unit_test(test_cuda_bf16_token_count_decides),
      cmocka_unit_test(test_cpu_counts_flops_alike),
      cmocka_unit_test(test_cpu_native_bf16_weighs_fp32_gemms),
      cmocka_unit_test(test_cuda_fp32_counts_flops_alike),
      cmocka_unit_test(test_cuda_tf32_makes_the_rebuild_cheaper),
      cmocka_unit_test(test_workspace_limit_rules_out_dense),
      cmocka_unit_test(test_public_report_matches),
      cmocka_unit_test(test_hybrid_above_three_quarters_frozen),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
