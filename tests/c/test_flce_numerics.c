/* Fused linear cross-entropy numerics: the float64 reference against its
 * own finite differences, every option alone and all together under each
 * reduction, accumulation onto existing gradients, the forward-only call,
 * and a one-rank communicator giving the single-rank bits.
 *
 * Built twice: for the CPU, and with OSFT_TEST_CUDA for a GPU (skipped where
 * none is present). The float64 reference and the case helpers are in
 * flce_testlib.h. */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_tensors.h"
#include "test_util.h"

#include "flce_testlib.h"
#include "test_fixture.h"

/* -------------------------------------------------------------- numerics */

/* The reference itself: its gradient is the derivative of its loss (central
 * differences through x, W and the bias), with every feature on. */
static void test_reference_is_consistent(void **state) {
  (void)state;
  test_seed("reference");
  flce_case c = base_case(6, 4, 9, TT_F32);
  c.smoothing = 0.2;
  c.z_scale = 0.05;
  c.softcap = 1.3;
  c.class_weights = 1;
  c.bias = 1;
  double x[24], w[36], b[9], cw[9];
  int64_t y[6] = {3, -100, 0, 8, 5, 3};
  for (int i = 0; i < 24; ++i) x[i] = test_uniform(-1, 1);
  for (int i = 0; i < 36; ++i) w[i] = test_uniform(-1, 1);
  for (int i = 0; i < 9; ++i) {
    b[i] = test_uniform(-1, 1);
    cw[i] = test_uniform(0.2, 2);
  }
  for (int red = OSFT_FLCE_MEAN; red <= OSFT_FLCE_SUM; ++red) {
    c.reduction = (osft_flce_reduction_t)red;
    ref_out r = reference(&c, x, w, b, cw, y, NULL);
    double *params[3] = {x, w, b};
    double *grads[3] = {r.dx, r.dw, r.db};
    const int counts[3] = {24, 36, 9};
    for (int p = 0; p < 3; ++p)
      for (int k = 0; k < counts[p]; k += 5) {
        const double keep = params[p][k], step = 1e-6;
        params[p][k] = keep + step;
        ref_out up = reference(&c, x, w, b, cw, y, NULL);
        params[p][k] = keep - step;
        ref_out down = reference(&c, x, w, b, cw, y, NULL);
        params[p][k] = keep;
        const double fd = (up.loss - down.loss) / (2 * step);
        if (fabs(fd - grads[p][k]) > 1e-6 * (1 + fabs(fd)))
          fail_msg("reference gradient %d[%d]: %.9g vs finite difference %.9g", p, k,
                   grads[p][k], fd);
        ref_free(&up);
        ref_free(&down);
      }
    ref_free(&r);
  }
}

/* Every option alone, then all together, under each reduction. */
static void test_each_feature_and_all(void **state) {
  for (int red = 0; red < 3; ++red)
    for (int feature = 0; feature < 7; ++feature)
      for (int d = 0; d < 2; ++d) {
        flce_case c = base_case(61, 12, 37, d ? TT_BF16 : TT_F32);
        c.reduction = (osft_flce_reduction_t)red;
        c.chunk_rows = 16;
        const int all = feature == 6;
        if (feature == 0 || all) c.smoothing = 0.1;
        if (feature == 1 || all) c.z_scale = 0.02;
        if (feature == 2 || all) c.softcap = 1.5;
        if (feature == 3 || all) c.class_weights = 1;
        if (feature == 4 || all) c.ignore_index = 5; /* a class index, ignored */
        if (feature == 5 || all) c.upstream = 1;
        if (all) c.bias = 1;
        run_case(CTX, &c);
      }
  /* label smoothing 1 (uniform targets) is allowed */
  flce_case c = base_case(20, 6, 11, TT_F32);
  c.smoothing = 1.0;
  run_case(CTX, &c);
}

/* Gradients accumulate onto non-zero values, in fp32 and in bf16 with both
 * accumulators, and fp32 gradients of bf16 inputs. */
static void test_accumulate(void **state) {
  for (int d = 0; d < 2; ++d)
    for (int acc = 0; acc < 2; ++acc)
      for (int gw = 0; gw < 2; ++gw) {
        flce_case c = base_case(70, 9, 41, d ? TT_BF16 : TT_F32);
        c.bias = 1;
        c.chunk_rows = 32;
        c.accumulator = (osft_flce_accumulator_t)acc;
        c.grad_w_dtype = gw ? c.dtype : TT_F32;
        c.grad_b_dtype = gw ? c.dtype : TT_F32;
        c.accumulate = OSFT_FLCE_ACCUMULATE_ALL;
        run_case(CTX, &c);
        c.accumulate = OSFT_FLCE_ACCUMULATE_GRAD_WEIGHT;
        c.reduction = OSFT_FLCE_SUM;
        run_case(CTX, &c);
      }
}

/* Forward-only: no gradient output, the same loss as a full call, less
 * scratch (no gradient accumulator). */
static void test_forward_only(void **state) {
  for (int d = 0; d < 2; ++d) {
    flce_case c = base_case(45, 10, 29, d ? TT_BF16 : TT_F32);
    c.bias = 1;
    c.softcap = 3.0;
    c.chunk_rows = 20;
    c.want = WANT_LOSS | WANT_Z | WANT_EXTRA;
    run_case(CTX, &c); /* checks the loss against the reference */

    test_seed("forward only");
    c.want = WANT_ALL;
    c.grad_w_dtype = c.dtype;
    flce_tensors T = make_tensors(&c);
    osft_flce_t f = make_flce(CTX, &c);
    osft_flce_inputs_t in;
    osft_flce_outputs_t full, fwd;
    flce_bind(&c, &T, &in, &full);
    assert_ok(osft_flce_compute(f, &in, &full));
    size_t bytes;
    void *loss_full = tt_bytes(T.loss, &bytes);
    assert_ok(OSFT_FLCE_OUTPUTS_INIT(&fwd));
    fwd.loss = &T.loss->t;
    tt_poison(T.loss);
    assert_ok(osft_flce_compute(f, &in, &fwd));
    size_t bytes2;
    void *loss_fwd = tt_bytes(T.loss, &bytes2);
    assert_memory_equal(loss_full, loss_fwd, bytes);
    osft_flce_plan_t pf, pw;
    pf.struct_size = pw.struct_size = sizeof pf;
    assert_ok(osft_flce_get_plan(f, &in, &full, &pf));
    assert_ok(osft_flce_get_plan(f, &in, &fwd, &pw));
    /* no fp32 accumulator for the bf16 grad_weight */
    assert_true(pw.scratch_bytes + (d ? 4 * 29 * 10 : 0) <= pf.scratch_bytes);
    assert_int_equal(pw.chunks, 3);
    free(loss_full);
    free(loss_fwd);
    assert_ok(osft_flce_destroy(f));
    free_tensors(&T);
  }
}

/* ------------------------------------------------- one-rank vocab parallel */

/* A case's outputs after one call through `f` on fresh tensors from the
 * case's seed (so two runs start from the same inputs and initial
 * gradients), as raw bytes. */
static void run_bytes(osft_flce_t f, const flce_case *c, void *bytes[8], size_t size[8]) {
  test_seed("one-rank comm");
  flce_tensors T = make_tensors(c);
  osft_flce_inputs_t in;
  osft_flce_outputs_t out;
  flce_bind(c, &T, &in, &out);
  assert_ok(osft_flce_compute(f, &in, &out));
  tt *outs[8] = {T.loss, T.dx, T.dw, T.db, T.z, T.acc, T.amax, T.tok};
  for (int i = 0; i < 8; ++i) bytes[i] = outs[i] ? tt_bytes(outs[i], &size[i]) : NULL;
  free_tensors(&T);
}

/* A one-rank communicator takes the single-rank path: every output is
 * bit-identical to a call without one, with vocab_size_global 0 or V. */
static void test_one_rank_comm_is_single_rank(void **state) {
  osft_comm_t comm = NULL;
  assert_ok(osft_comm_create_self(CTX, NULL, &comm));
  const osft_flce_reduction_t reds[2] = {OSFT_FLCE_MEAN, OSFT_FLCE_NONE};
  for (int r = 0; r < 2; ++r) {
    flce_case c = base_case(37, 19, 123, TT_F32);
    c.bias = 1;
    c.class_weights = 1;
    c.smoothing = 0.1;
    c.z_scale = 1e-3;
    c.softcap = 20.0;
    c.chunk_rows = 16;
    c.reduction = reds[r];
    c.accumulate = OSFT_FLCE_ACCUMULATE_ALL;
    void *plain[8], *shared[8];
    size_t plain_size[8], shared_size[8];
    osft_flce_t f = make_flce(CTX, &c);
    run_bytes(f, &c, plain, plain_size);
    assert_ok(osft_flce_destroy(f));
    for (int64_t global = 0; global <= c.v; global += c.v) {
      osft_flce_options_t o;
      case_options(&c, &o);
      o.comm = comm;
      o.vocab_size_global = global;
      assert_ok(osft_flce_create(CTX, &o, &f));
      /* the handle holds the communicator in use */
      assert_status(osft_comm_destroy(comm), OSFT_STATUS_INVALID_ARGUMENT);
      run_bytes(f, &c, shared, shared_size);
      assert_ok(osft_flce_destroy(f));
      for (int i = 0; i < 8; ++i) {
        assert_int_equal(plain_size[i], shared_size[i]);
        if (plain[i] != NULL && memcmp(plain[i], shared[i], plain_size[i]) != 0)
          fail_msg("output %d differs with a one-rank comm (reduction %d, global %lld)",
                   i, (int)c.reduction, (long long)global);
        free(shared[i]);
      }
    }
    for (int i = 0; i < 8; ++i) free(plain[i]);
  }
  assert_ok(osft_comm_destroy(comm));
}

int main(void) {
  if (!tt_device_present()) return OSFT_TEST_SKIP;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_reference_is_consistent),
      cmocka_unit_test_setup_teardown(test_each_feature_and_all, tt_setup, tt_teardown),
      cmocka_unit_test_setup_teardown(test_accumulate, tt_setup, tt_teardown),
      cmocka_unit_test_setup_teardown(test_forward_only, tt_setup, tt_teardown),
      cmocka_unit_test_setup_teardown(test_one_rank_comm_is_single_rank, tt_setup,
                                      tt_teardown),
  };
  return cmocka_run_group_tests_name("flce_numerics", tests, NULL, NULL);
}
