/* OSFT gradient projection on one rank: raw targets in every dtype mix,
 * padded rows, layer targets, the sharded layouts with one rank, parameter
 * projection, the orthogonality query, the collective count per call, a
 * 200-step Adam loop, and every error (specific status, message naming the
 * argument, nothing written). References are float64 plain loops
 * (tests/mpi/projection_ref.h) on the values as stored. Built for the CPU
 * and, with OSFT_TEST_CUDA, for a GPU (skipped where none is present). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../mpi/projection_ref.h"
#include "test_tensors.h"
#include "test_util.h"

/* ----------------------------------------------------------- problems */

typedef ref_problem problem;

/* A rows x cols tensor holding `values` (rounded to dtype); pad > 0 adds
 * that many elements of padding per row. */
static tt *make_tensor(tt_dtype d, int64_t rows, int64_t cols, const double *values,
                       int64_t pad) {
  const int64_t shape[2] = {rows, cols};
  tt *t = pad > 0 ? tt_new_padded(d, rows, cols, cols + pad) : tt_new(d, 2, shape);
  tt_set(t, values);
  return t;
}

static tt *random_tensor(tt_dtype d, int64_t rows, int64_t cols) {
  const int64_t shape[2] = {rows, cols};
  tt *t = tt_new(d, 2, shape);
  tt_random(t, -1, 1);
  return t;
}

/* A problem's tensors. */
typedef struct {
  tt *uh, *gu, *ul, *vh, *gv, *vl;
} target_tensors;

static target_tensors make_tensors(const problem *P, tt_dtype high, tt_dtype grad,
                                   int64_t pad) {
  target_tensors T;
  T.uh = make_tensor(high, P->n, P->r, P->uh, pad);
  T.gu = make_tensor(grad, P->n, P->l, P->gu, 0);
  T.ul = make_tensor(grad, P->n, P->l, P->ul, pad);
  T.vh = make_tensor(high, P->r, P->k, P->vh, 0);
  T.gv = make_tensor(grad, P->l, P->k, P->gv, pad);
  T.vl = make_tensor(grad, P->l, P->k, P->vl, 0);
  return T;
}

static void free_tensors(target_tensors *T) {
  tt_free(T->uh);
  tt_free(T->gu);
  tt_free(T->ul);
  tt_free(T->vh);
  tt_free(T->gv);
  tt_free(T->vl);
}

/* A target over T: U and V parts as asked, replicated. */
static osft_projection_target_t replicated_target(const target_tensors *T, int with_u,
                                                  int with_v, int with_low) {
  osft_projection_target_t t;
  assert_ok(OSFT_PROJECTION_TARGET_INIT(&t));
  if (with_u) {
    t.u_high = &T->uh->t;
    t.grad_u_low = &T->gu->t;
    if (with_low) t.u_low = &T->ul->t;
  }
  if (with_v) {
    t.v_high = &T->vh->t;
    t.grad_v_low = &T->gv->t;
    if (with_low) t.v_low = &T->vl->t;
  }
  return t;
}

/* The float64 projection of what `x` holds against what `high` holds. */
static double *expected_u(const tt *high, const tt *x) {
  double *h = tt_get(high), *out = tt_get(x);
  ref_project_u(h, high->shape[0], high->shape[1], out, x->shape[1]);
  free(h);
  return out;
}

static double *expected_v(const tt *high, const tt *x) {
  double *h = tt_get(high), *out = tt_get(x);
  ref_project_v(h, high->shape[0], high->shape[1], out, x->shape[0]);
  free(h);
  return out;
}

static void expect_close(const char *what, const tt *t, const double *ref, double tol) {
  double *got = tt_get(t);
  const double err = ref_rel_err(got, ref, tt_logical_numel(t), 1e-6);
  free(got);
  if (!(err <= tol)) fail_msg("%s: relative max error %.3g > %.3g", what, err, tol);
}

static double tol_for(tt_dtype grad) {
  return grad == TT_BF16 ? 1e-2 : 2e-5;
}

static osft_projector_t new_projector(osft_context_t ctx, osft_comm_t comm) {
  osft_projector_t p = NULL;
  assert_ok(osft_projector_create(ctx, comm, NULL, &p));
  return p;
}

static int setup(void **state) {
  *state = tt_context(NULL);
  return 0;
}

static int teardown(void **state) {
  assert_ok(osft_context_destroy((osft_context_t)*state));
  return 0;
}

#define CTX ((osft_context_t)*state)

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

/* With one rank, the sharded layouts hold the whole matrices (shards {N},
 * {r}, {K}): the same projection, through the self communicator, a
 * size-1 callbacks communicator, or no communicator. */
/* A one-rank all-reduce (the identity) that counts its calls and answers
 * with a chosen status. */
typedef struct {
  int calls;
  osft_status_t answer;
} counter;

static osft_status_t sum_one_rank(void *user, DLTensor *buf) {
  (void)buf;
  counter *c = user;
  c->calls++;
  return c->answer;
}

static osft_status_t gather_one_rank(void *user, const DLTensor *send, DLTensor *recv,
                                     const int64_t *counts, int64_t n) {
  (void)user, (void)send, (void)recv, (void)counts, (void)n;
  fail_msg("no all-gather expected with one rank");
  return OSFT_STATUS_COMM_ERROR;
}

/* A one-rank callbacks communicator over `c`. */
static osft_comm_t counting_comm(osft_context_t ctx, counter *c) {
  osft_comm_callbacks_t cb;
  assert_ok(OSFT_COMM_CALLBACKS_INIT(&cb));
  cb.user = c;
  cb.allreduce_sum = sum_one_rank;
  cb.allgather = gather_one_rank;
  osft_comm_t comm = NULL;
  assert_ok(osft_comm_create_callbacks(ctx, &cb, NULL, &comm));
  return comm;
}

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

/* Adam with per-element scaling leaks into the frozen subspace; projecting
 * the gradients before and the parameters after each step keeps the
 * residual at fp32 round-off for 200 steps. */
static void test_adam_200_steps(void **state) {
  problem P = ref_problem_make("adam", 32, 24, 8, 8);
  target_tensors T = make_tensors(&P, TT_F32, TT_F32, 0);
  osft_projector_t proj = new_projector(CTX, NULL);
  osft_projection_target_t t = replicated_target(&T, 1, 1, 1);
  assert_ok(osft_projector_add_target(proj, &t, NULL));
  tt *params[2] = {T.ul, T.vl}, *grads[2] = {T.gu, T.gv};
  const int64_t sizes[2] = {P.n * P.l, P.l * P.k};
  double *m[2], *v[2];
  for (int i = 0; i < 2; ++i) m[i] = ref_alloc(sizes[i]), v[i] = ref_alloc(sizes[i]);
  ref_rng g = ref_seed("adam steps");
  const double lr = 1e-2, b1 = 0.9, b2 = 0.999, eps = 1e-8;
  double worst = 0;
  for (int step = 1; step <= 200; ++step) {
    for (int i = 0; i < 2; ++i) {
      double *gr = ref_random(&g, sizes[i], -1, 1);
      tt_set(grads[i], gr);
      free(gr);
    }
    assert_ok(osft_projector_project(proj));
    for (int i = 0; i < 2; ++i) {
      double *gr = tt_get(grads[i]), *x = tt_get(params[i]);
      for (int64_t e = 0; e < sizes[i]; ++e) {
        m[i][e] = b1 * m[i][e] + (1 - b1) * gr[e];
        v[i][e] = b2 * v[i][e] + (1 - b2) * gr[e] * gr[e];
        const double mh = m[i][e] / (1 - pow(b1, step)),
                     vh = v[i][e] / (1 - pow(b2, step));
        x[e] -= lr * mh / (sqrt(vh) + eps);
      }
      tt_set(params[i], x);
      free(gr), free(x);
    }
    assert_ok(osft_projector_project_params(proj));
    double mu, mv;
    assert_ok(osft_projector_orthogonality(proj, &mu, &mv));
    worst = fmax(worst, fmax(mu, mv));
  }
  if (!(worst <= 1e-5)) fail_msg("orthogonality residual reached %g", worst);
  for (int i = 0; i < 2; ++i) free(m[i]), free(v[i]);
  assert_ok(osft_projector_destroy(proj));
  free_tensors(&T);
  ref_problem_free(&P);
}

/* --------------------------------------------------------------- errors */

/* Bytes of every gradient and parameter, to prove a failed call wrote
 * nothing. */
typedef struct {
  void *b[4];
  size_t n[4];
} snapshot;

static snapshot take(const target_tensors *T) {
  snapshot s;
  const tt *w[4] = {T->gu, T->ul, T->gv, T->vl};
  for (int i = 0; i < 4; ++i) s.b[i] = tt_bytes(w[i], &s.n[i]);
  return s;
}

static void expect_unchanged(const target_tensors *T, snapshot *s) {
  snapshot now = take(T);
  for (int i = 0; i < 4; ++i) {
    assert_memory_equal(s->b[i], now.b[i], s->n[i]);
    free(now.b[i]);
    free(s->b[i]);
  }
}

#define EXPECT_ADD_FAILS(proj, target, status, needle)                           \
  do {                                                                           \
    int64_t idx_ = 77;                                                           \
    assert_status(osft_projector_add_target((proj), (target), &idx_), (status)); \
    assert_error_mentions(needle);                                               \
    assert_int_equal(idx_, 77);                                                  \
  } while (0)

static void test_registration_errors(void **state) {
  problem P = ref_problem_make("errors", 10, 12, 3, 4);
  target_tensors T = make_tensors(&P, TT_F32, TT_F32, 0);
  osft_projector_t proj = new_projector(CTX, NULL);
  snapshot s = take(&T);
  osft_projection_target_t t = replicated_target(&T, 1, 1, 1);

  assert_status(osft_projector_add_target(NULL, &t, NULL), OSFT_STATUS_INVALID_HANDLE);
  assert_status(osft_projector_add_target(proj, NULL, NULL),
                OSFT_STATUS_INVALID_ARGUMENT);
  assert_error_mentions("target");
  osft_projection_target_t bad = t;
  bad.struct_size = 8;
  EXPECT_ADD_FAILS(proj, &bad, OSFT_STATUS_INVALID_STRUCT_SIZE, "target->struct_size");

  /* Shapes that disagree between a target's pieces. */
  tt *wrong_rows = random_tensor(TT_F32, P.n + 1, P.l);
  bad = t;
  bad.grad_u_low = &wrong_rows->t;
  EXPECT_ADD_FAILS(proj, &bad, OSFT_STATUS_SHAPE_MISMATCH, "target->grad_u_low");
  tt *wrong_l = random_tensor(TT_F32, P.l + 1, P.k);
  bad = t;
  bad.v_low = &wrong_l->t;
  EXPECT_ADD_FAILS(proj, &bad, OSFT_STATUS_SHAPE_MISMATCH, "target->v_low");
  tt *wide = random_tensor(TT_F32, P.n, P.n); /* r + l > N */
  bad = t;
  bad.u_high = &wide->t;
  EXPECT_ADD_FAILS(proj, &bad, OSFT_STATUS_SHAPE_MISMATCH, "exceed N");

  /* dtype, layout, device. */
  tt *f64 = random_tensor(TT_F64, P.n, P.l);
  bad = t;
  bad.grad_u_low = &f64->t;
  EXPECT_ADD_FAILS(proj, &bad, OSFT_STATUS_DTYPE_MISMATCH, "target->grad_u_low");
  DLTensor strided = T.gv->t;
  int64_t strides[2] = {1, P.l};
  strided.strides = strides;
  bad = t;
  bad.grad_v_low = &strided;
  EXPECT_ADD_FAILS(proj, &bad, OSFT_STATUS_BAD_LAYOUT, "target->grad_v_low");
  DLTensor elsewhere = T.vh->t;
  elsewhere.device.device_type = kDLCUDA;
  elsewhere.device.device_id = 7;
  bad = t;
  bad.v_high = &elsewhere;
  EXPECT_ADD_FAILS(proj, &bad, OSFT_STATUS_DEVICE_MISMATCH, "target->v_high");

  /* Presence and layouts. */
  bad = t;
  bad.u_high = NULL;
  EXPECT_ADD_FAILS(proj, &bad, OSFT_STATUS_INVALID_ARGUMENT, "target->u_high");
  bad = t;
  bad.grad_v_low = NULL;
  bad.v_low = NULL;
  EXPECT_ADD_FAILS(proj, &bad, OSFT_STATUS_INVALID_ARGUMENT, "target->grad_v_low");
  osft_projection_target_t empty;
  assert_ok(OSFT_PROJECTION_TARGET_INIT(&empty));
  EXPECT_ADD_FAILS(proj, &empty, OSFT_STATUS_INVALID_ARGUMENT, "neither");
  bad = t;
  bad.u_layout = OSFT_SHARD_V_ROWS;
  EXPECT_ADD_FAILS(proj, &bad, OSFT_STATUS_INVALID_ARGUMENT, "target->u_layout");
  bad = t;
  bad.v_layout = (osft_shard_layout_t)42;
  EXPECT_ADD_FAILS(proj, &bad, OSFT_STATUS_INVALID_ARGUMENT, "target->v_layout");

  /* Shard arrays: count must be the communicator's size (1 here), the
   * entry for this rank its local size, none for REPLICATED. */
  const int64_t two[2] = {P.n, 0}, off[1] = {P.n - 1}, neg[1] = {-1}, ok_n[1] = {P.n};
  bad = t;
  bad.u_layout = OSFT_SHARD_U_ROWS;
  EXPECT_ADD_FAILS(proj, &bad, OSFT_STATUS_INVALID_ARGUMENT, "target->u_shards");
  bad.u_shards = two;
  bad.n_u_shards = 2;
  EXPECT_ADD_FAILS(proj, &bad, OSFT_STATUS_INVALID_ARGUMENT, "target->n_u_shards");
  bad.u_shards = off;
  bad.n_u_shards = 1;
  EXPECT_ADD_FAILS(proj, &bad, OSFT_STATUS_SHAPE_MISMATCH, "target->u_shards[0]");
  bad.u_shards = neg;
  EXPECT_ADD_FAILS(proj, &bad, OSFT_STATUS_INVALID_ARGUMENT, "negative");
  bad = t;
  bad.v_shards = ok_n;
  bad.n_v_shards = 1;
  EXPECT_ADD_FAILS(proj, &bad, OSFT_STATUS_INVALID_ARGUMENT, "REPLICATED");

  /* Aliasing: within a target, and against an earlier target. */
  bad = t;
  bad.u_low = &T.gu->t;
  EXPECT_ADD_FAILS(proj, &bad, OSFT_STATUS_ALIASING, "target->grad_u_low");
  assert_ok(osft_projector_add_target(proj, &t, NULL));
  osft_projection_target_t again = replicated_target(&T, 1, 0, 0);
  EXPECT_ADD_FAILS(proj, &again, OSFT_STATUS_ALIASING, "of target 0");

  /* set_grads */
  assert_status(osft_projector_set_grads(proj, 1, NULL, NULL),
                OSFT_STATUS_INVALID_ARGUMENT);
  assert_error_mentions("index");
  assert_status(osft_projector_set_grads(proj, 0, &wrong_rows->t, NULL),
                OSFT_STATUS_SHAPE_MISMATCH);
  assert_error_mentions("grad_u_low");
  assert_status(osft_projector_set_grads(proj, 0, &T.ul->t, NULL), OSFT_STATUS_ALIASING);

  osft_projector_info_t info;
  info.struct_size = sizeof info;
  assert_ok(osft_projector_get_info(proj, &info));
  assert_int_equal(info.targets, 1);
  expect_unchanged(&T, &s);
  assert_ok(osft_projector_destroy(proj));
  tt_free(wrong_rows), tt_free(wrong_l), tt_free(wide), tt_free(f64);
  free_tensors(&T);
  ref_problem_free(&P);
}

/* Handles, options, and failures during a call: nothing is written. */
static void test_call_errors(void **state) {
  problem P = ref_problem_make("call errors", 10, 9, 2, 3);
  target_tensors T = make_tensors(&P, TT_F32, TT_F32, 0);
  osft_projector_t proj = NULL;
  assert_status(osft_projector_create(NULL, NULL, NULL, &proj),
                OSFT_STATUS_INVALID_HANDLE);
  assert_status(osft_projector_create(CTX, NULL, NULL, NULL),
                OSFT_STATUS_INVALID_ARGUMENT);
  osft_projector_options_t o;
  assert_ok(OSFT_PROJECTOR_OPTIONS_INIT(&o));
  assert_int_equal(o.check_consistency, 1);
  o.check_consistency = 5;
  assert_status(osft_projector_create(CTX, NULL, &o, &proj),
                OSFT_STATUS_INVALID_ARGUMENT);
  assert_error_mentions("opts->check_consistency");
  assert_null(proj);
  assert_status(osft_projector_options_init(&o, 3), OSFT_STATUS_INVALID_STRUCT_SIZE);
  assert_status(osft_projector_project(NULL), OSFT_STATUS_INVALID_HANDLE);
  assert_ok(osft_projector_destroy(NULL));

  /* A communicator of another context. */
  osft_context_t other = tt_context(NULL);
  osft_comm_t foreign = NULL;
  assert_ok(osft_comm_create_self(other, NULL, &foreign));
  assert_status(osft_projector_create(CTX, foreign, NULL, &proj),
                OSFT_STATUS_INVALID_ARGUMENT);
  assert_error_mentions("comm");
  assert_ok(osft_comm_destroy(foreign));
  assert_ok(osft_context_destroy(other));

  /* The orthogonality query needs every trainable factor. */
  proj = new_projector(CTX, NULL);
  osft_projection_target_t t = replicated_target(&T, 1, 1, 0);
  assert_ok(osft_projector_add_target(proj, &t, NULL));
  double mu = 123;
  assert_status(osft_projector_orthogonality(proj, &mu, NULL),
                OSFT_STATUS_INVALID_ARGUMENT);
  assert_error_mentions("u_low");
  assert_true(mu == 123);
  assert_ok(osft_projector_project_params(proj)); /* no factors: nothing to do */
  assert_ok(osft_projector_destroy(proj));
  assert_status(osft_projector_destroy(proj), OSFT_STATUS_INVALID_HANDLE);

  /* A collective that fails: no gradient changes, the communicator is
   * broken afterwards, and a projector keeps it from being destroyed. */
  counter failing = {0, OSFT_STATUS_TIMEOUT};
  osft_comm_t comm = counting_comm(CTX, &failing);
  proj = new_projector(CTX, comm);
  const int64_t n_sh[1] = {P.n};
  t = replicated_target(&T, 1, 1, 1);
  t.u_layout = OSFT_SHARD_U_ROWS;
  t.u_shards = n_sh;
  t.n_u_shards = 1;
  assert_ok(osft_projector_add_target(proj, &t, NULL));
  snapshot s = take(&T);
  assert_status(osft_projector_project(proj), OSFT_STATUS_TIMEOUT);
  assert_error_mentions("allreduce_sum callback");
  assert_status(osft_projector_project_params(proj), OSFT_STATUS_COMM_ERROR);
  assert_error_mentions("broken");
  assert_int_equal(failing.calls, 1);
  expect_unchanged(&T, &s);
  assert_status(osft_comm_destroy(comm), OSFT_STATUS_INVALID_ARGUMENT);
  assert_error_mentions("projector");
  assert_status(osft_context_destroy(CTX), OSFT_STATUS_INVALID_ARGUMENT);
  assert_ok(osft_projector_destroy(proj));
  assert_ok(osft_comm_destroy(comm));
  free_tensors(&T);
  ref_problem_free(&P);
}

#ifndef OSFT_TEST_CUDA
/* Every host byte goes through the context's allocator and comes back. */
static void test_memory_is_returned(void **state) {
  (void)state;
  test_alloc_state a;
  test_alloc_reset(&a);
  osft_allocator_t cb;
  test_alloc_callbacks(&cb, &a, 0);
  osft_context_options_t o;
  assert_ok(OSFT_CONTEXT_OPTIONS_INIT(&o));
  o.allocator = &cb;
  osft_context_t ctx = tt_context(&o);
  problem P = ref_problem_make("memory", 16, 12, 4, 4);
  target_tensors T = make_tensors(&P, TT_BF16, TT_BF16, 0);
  osft_comm_t comm = NULL;
  assert_ok(osft_comm_create_self(ctx, NULL, &comm));
  osft_projector_t proj = new_projector(ctx, comm);
  osft_projection_target_t t = replicated_target(&T, 1, 1, 1);
  const int64_t k_sh[1] = {P.k};
  t.v_layout = OSFT_SHARD_V_COLS;
  t.v_shards = k_sh;
  t.n_v_shards = 1;
  assert_ok(osft_projector_add_target(proj, &t, NULL));
  assert_ok(osft_projector_project(proj));
  assert_ok(osft_projector_orthogonality(proj, NULL, NULL));
  assert_true(a.host_allocs > 0);
  assert_ok(osft_projector_destroy(proj));
  assert_ok(osft_comm_destroy(comm));
  assert_ok(osft_context_destroy(ctx));
  assert_int_equal(a.host_allocs, a.host_frees);
  assert_int_equal(a.host_bytes_live, 0);
  assert_int_equal(a.size_mismatch, 0);
  free_tensors(&T);
  ref_problem_free(&P);
}
#endif

int main(void) {
  if (!tt_device_present()) return OSFT_TEST_SKIP;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_project_matches_reference, setup, teardown),
      cmocka_unit_test_setup_teardown(test_orthogonality_query, setup, teardown),
      cmocka_unit_test_setup_teardown(test_sharded_layouts_one_rank, setup, teardown),
      cmocka_unit_test_setup_teardown(test_one_collective_per_call, setup, teardown),
      cmocka_unit_test_setup_teardown(test_layer_target, setup, teardown),
      cmocka_unit_test_setup_teardown(test_set_grads, setup, teardown),
      cmocka_unit_test_setup_teardown(test_adam_200_steps, setup, teardown),
      cmocka_unit_test_setup_teardown(test_registration_errors, setup, teardown),
      cmocka_unit_test_setup_teardown(test_call_errors, setup, teardown),
#ifndef OSFT_TEST_CUDA
      cmocka_unit_test(test_memory_is_returned),
#endif
  };
  return cmocka_run_group_tests_name("projection", tests, NULL, NULL);
}
