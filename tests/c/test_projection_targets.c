/* Gradient projection targets: sharded layouts over a one-rank
 * communicator, exactly one collective per call, a registered layer read
 * at every call, and rebinding gradients.
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

static void test_sharded_layouts_one_rank(void **state) {
  problem P = ref_problem_make("one rank shards", 18, 22, 5, 7);
  counter calls = {0, OSFT_STATUS_SUCCESS};
  for (int mode = 0; mode < 3; ++mode) {
    osft_comm_t comm = NULL;
    if (mode == 1) assert_ok(osft_comm_create_self(CTX, NULL, &comm));
    if (mode == 2) comm = counting_comm(CTX, &calls);
    for (int vl = 0; vl < 2; ++vl) {
      target_tensors T = make_tensors(&P, TT_F32, TT_F32, 0);
      const int64_t n_sh[1] = {P.n}, r_sh[1] = {P.r}, k_sh[1] = {P.k};
      osft_projection_target_t t = replicated_target(&T, 1, 1, 1);
      t.u_layout = OSFT_SHARD_U_ROWS;
      t.u_shards = n_sh;
      t.n_u_shards = 1;
      t.v_layout = vl ? OSFT_SHARD_V_ROWS : OSFT_SHARD_V_COLS;
      t.v_shards = vl ? r_sh : k_sh;
      t.n_v_shards = 1;
      osft_projector_t proj = new_projector(CTX, comm);
      assert_ok(osft_projector_add_target(proj, &t, NULL));
      double *ru = expected_u(T.uh, T.gu), *rv = expected_v(T.vh, T.gv);
      calls.calls = 0;
      assert_ok(osft_projector_project(proj));
      expect_close("U_ROWS", T.gu, ru, 2e-5);
      expect_close(vl ? "V_ROWS" : "V_COLS", T.gv, rv, 2e-5);
      if (mode == 2) assert_int_equal(calls.calls, 1);
      assert_ok(osft_projector_destroy(proj));
      free(ru);
      free(rv);
      free_tensors(&T);
    }
    assert_ok(osft_comm_destroy(comm));
  }
  ref_problem_free(&P);
}

/* Exactly one collective per project call for any number of targets with
 * reductions, none for replicated-only projectors; setup collectives are
 * counted apart (none with one rank). */
static void test_one_collective_per_call(void **state) {
  counter n = {0, OSFT_STATUS_SUCCESS};
  osft_comm_t comm = counting_comm(CTX, &n);
  const int counts[3] = {1, 7, 24};
  for (int c = 0; c < 3; ++c) {
    for (int replicated = 0; replicated < 2; ++replicated) {
      osft_projector_t proj = new_projector(CTX, comm);
      problem P[24];
      target_tensors T[24];
      for (int i = 0; i < counts[c]; ++i) {
        char seed[32];
        snprintf(seed, sizeof seed, "count %d %d", c, i);
        P[i] = ref_problem_make(seed, 8 + i % 3, 9 + i % 4, 2, 3);
        T[i] = make_tensors(&P[i], TT_F32, TT_F32, 0);
        osft_projection_target_t t = replicated_target(&T[i], 1, 1, 1);
        const int64_t n_sh[1] = {P[i].n}, k_sh[1] = {P[i].k};
        if (!replicated) {
          t.u_layout = OSFT_SHARD_U_ROWS;
          t.u_shards = n_sh;
          t.n_u_shards = 1;
          t.v_layout = i % 2 ? OSFT_SHARD_V_COLS : OSFT_SHARD_REPLICATED;
          t.v_shards = i % 2 ? k_sh : NULL;
          t.n_v_shards = i % 2 ? 1 : 0;
        }
        assert_ok(osft_projector_add_target(proj, &t, NULL));
      }
      assert_ok(osft_projector_prepare(proj));
      osft_projector_info_t info;
      info.struct_size = sizeof info;
      assert_ok(osft_projector_get_info(proj, &info));
      assert_int_equal(info.targets, counts[c]);
      assert_int_equal(info.collectives_per_project, replicated ? 0 : 1);
      assert_int_equal(info.setup_pending, 0);
      n.calls = 0;
      for (int step = 0; step < 3; ++step) assert_ok(osft_projector_project(proj));
      assert_int_equal(n.calls, replicated ? 0 : 3);
      assert_ok(osft_projector_project_params(proj));
      assert_int_equal(n.calls, replicated ? 0 : 4);
      assert_ok(osft_projector_orthogonality(proj, NULL, NULL));
      assert_int_equal(n.calls, replicated ? 1 : 5);
      assert_ok(osft_projector_destroy(proj));
      for (int i = 0; i < counts[c]; ++i) {
        free_tensors(&T[i]);
        ref_problem_free(&P[i]);
      }
    }
  }
  assert_ok(osft_comm_destroy(comm));
}

/* A registered layer: factors read through the layer at every call, so
 * an optimizer's in-place update and a re-decomposition are seen. */
static void test_layer_target(void **state) {
  const int64_t shape[2] = {14, 10};
  tt *w = tt_new(TT_F32, 2, shape);
  test_seed("layer target");
  tt_random(w, -1, 1);
  osft_flinear_t layer = NULL;
  assert_ok(osft_flinear_create_from_weight(CTX, &w->t, NULL, &layer));
  int64_t n, k, r, l;
  assert_ok(osft_flinear_get_dims(layer, &n, &k, &r, &l));
  const int64_t gu_shape[2] = {n, l}, gv_shape[2] = {l, k};
  tt *gu = tt_new(TT_F32, 2, gu_shape), *gv = tt_new(TT_F32, 2, gv_shape);
  osft_projector_t proj = new_projector(CTX, NULL);
  int64_t index = -1;
  assert_ok(osft_projector_add_layer(proj, layer, &gu->t, &gv->t, &index));
  assert_int_equal(index, 0);
  DLTensor f[4];
  const osft_flinear_factor_t which[4] = {OSFT_FACTOR_U_HIGH, OSFT_FACTOR_V_HIGH,
                                          OSFT_FACTOR_U_LOW, OSFT_FACTOR_V_LOW};
  for (int round = 0; round < 2; ++round) {
    for (int i = 0; i < 4; ++i)
      assert_ok(osft_flinear_get_factor(layer, which[i], &f[i]));
    tt_random(gu, -1, 1);
    tt_random(gv, -1, 1);
    double *uh = tt_read_view(&f[0]), *vh = tt_read_view(&f[1]);
    double *eu = tt_get(gu), *ev = tt_get(gv);
    ref_project_u(uh, n, r, eu, l);
    ref_project_v(vh, r, k, ev, l);
    assert_ok(osft_projector_project(proj));
    expect_close("layer grad_u_low", gu, eu, 2e-5);
    expect_close("layer grad_v_low", gv, ev, 2e-5);
    /* An optimizer step writes the trainable factors in place. */
    double *ul = tt_read_view(&f[2]), *vl = tt_read_view(&f[3]);
    for (int64_t i = 0; i < n * l; ++i) ul[i] += 0.05 * eu[i] + 0.01;
    for (int64_t i = 0; i < l * k; ++i) vl[i] -= 0.05 * ev[i] + 0.01;
    tt_write_view(&f[2], ul);
    tt_write_view(&f[3], vl);
    double mu, mv;
    assert_ok(osft_projector_orthogonality(proj, &mu, &mv));
    assert_true(mu > 1e-3 && mv > 1e-3);
    assert_ok(osft_projector_project_params(proj));
    assert_ok(osft_projector_orthogonality(proj, &mu, &mv));
    if (!(mu <= 1e-5 && mv <= 1e-5)) fail_msg("layer residual %g, %g", mu, mv);
    free(uh), free(vh), free(eu), free(ev), free(ul), free(vl);
    /* New frozen factors: the next round must project against them. */
    if (round == 0) assert_ok(osft_flinear_redecompose(layer, NULL));
  }
  /* A destroyed layer: the call fails and writes nothing. */
  assert_ok(osft_flinear_destroy(layer));
  size_t bytes = 0;
  void *before = tt_bytes(gu, &bytes);
  assert_status(osft_projector_project(proj), OSFT_STATUS_INVALID_HANDLE);
  assert_error_mentions("target 0");
  void *after = tt_bytes(gu, &bytes);
  assert_memory_equal(before, after, bytes);
  free(before), free(after);
  assert_ok(osft_projector_destroy(proj));
  tt_free(gu), tt_free(gv), tt_free(w);
}

/* Rebinding gradients (a framework that allocates new ones each step). */
static void test_set_grads(void **state) {
  problem P = ref_problem_make("set grads", 12, 15, 3, 4);
  target_tensors T = make_tensors(&P, TT_F32, TT_F32, 0);
  osft_projector_t proj = new_projector(CTX, NULL);
  osft_projection_target_t t = replicated_target(&T, 1, 1, 1);
  assert_ok(osft_projector_add_target(proj, &t, NULL));
  tt *gu2 = make_tensor(TT_BF16, P.n, P.l, P.gu, 2),
     *gv2 = make_tensor(TT_F32, P.l, P.k, P.gv, 0);
  assert_ok(osft_projector_set_grads(proj, 0, &gu2->t, &gv2->t));
  double *ru = expected_u(T.uh, gu2), *rv = expected_v(T.vh, gv2);
  size_t bytes = 0;
  void *old = tt_bytes(T.gu, &bytes);
  assert_ok(osft_projector_project(proj));
  expect_close("rebound grad_u_low", gu2, ru, 1e-2);
  expect_close("rebound grad_v_low", gv2, rv, 2e-5);
  void *now = tt_bytes(T.gu, &bytes);
  assert_memory_equal(old, now, bytes); /* the old gradient is no longer touched */
  /* NULL: no gradient for that part (the trainable factor remains). */
  assert_ok(osft_projector_set_grads(proj, 0, NULL, &gv2->t));
  assert_ok(osft_projector_project(proj));
  free(old), free(now), free(ru), free(rv);
  assert_ok(osft_projector_destroy(proj));
  tt_free(gu2), tt_free(gv2);
  free_tensors(&T);
  ref_problem_free(&P);
}

int main(void) {
  if (!tt_device_present()) return OSFT_TEST_SKIP;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_sharded_layouts_one_rank, tt_setup,
                                      tt_teardown),
      cmocka_unit_test_setup_teardown(test_one_collective_per_call, tt_setup,
                                      tt_teardown),
      cmocka_unit_test_setup_teardown(test_layer_target, tt_setup, tt_teardown),
      cmocka_unit_test_setup_teardown(test_set_grads, tt_setup, tt_teardown),
  };
  return cmocka_run_group_tests_name("projection_targets", tests, NULL, NULL);
}
