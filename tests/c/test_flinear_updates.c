/* The dense W that the dense and hybrid strategies rebuild from the
 * trainable factors is kept between calls only while the factors are
 * unchanged: after a write through the factor views (as an optimizer writes)
 * the forward and backward match the float64 reference of the new factors,
 * under every way a layer learns of changes (fingerprints, reported
 * versions, and reported versions alone as on a backend without
 * fingerprints, through a test hook); and while nothing changes, the micro-
 * batches of a gradient accumulation share one rebuild (counted with
 * osft_flinear_get_info).
 *
 * Built twice: for the CPU, and with OSFT_TEST_CUDA for a GPU (skipped where
 * none is present; there fingerprints are absent by themselves). */
#include "flinear_testlib.h"
#include "test_fixture.h"

/* src/capi/flinear_api.cpp (INTERNAL): as on a backend without fingerprints. */
void osfti_flinear_test_disable_fingerprints(osft_flinear_t layer);

enum { N = 20, KIN = 16, M = 11 };

typedef struct {
  osft_flinear_updates_t updates;
  int fingerprints; /* 0: the test hook turns them off */
  osft_flinear_strategy_t strategy;
} mode;

static int keeps_weight(const mode *md) {
  const int fingerprints = md->fingerprints && tt_device() == OSFT_DEVICE_CPU;
  return fingerprints || md->updates == OSFT_FLINEAR_UPDATES_REPORTED;
}

static osft_flinear_t layer_for(osft_context_t ctx, const mode *md) {
  tt *w = mat(TT_F32, N, KIN);
  tt_random(w, -1, 1);
  osft_flinear_options_t o;
  assert_ok(OSFT_FLINEAR_OPTIONS_INIT(&o));
  o.rank_ratio = 0.75;
  o.strategy = md->strategy;
  o.trainable_updates = md->updates;
  osft_flinear_t layer = NULL;
  assert_ok(osft_flinear_create_from_weight(ctx, &w->t, &o, &layer));
  if (!md->fingerprints) osfti_flinear_test_disable_fingerprints(layer);
  tt_free(w);
  return layer;
}

static osft_flinear_info_t info_of(osft_flinear_t layer) {
  osft_flinear_info_t info;
  memset(&info, 0xff, sizeof info);
  info.struct_size = sizeof info;
  assert_ok(osft_flinear_get_info(layer, &info));
  return info;
}

/* The reference of the layer's current factors, read through views taken
 * once (a fresh osft_flinear_get_factor would report a change). */
static ref_layer ref_of(osft_flinear_t layer, const DLTensor *views) {
  ref_layer R;
  assert_ok(osft_flinear_get_dims(layer, &R.n, &R.kin, &R.r, &R.l));
  for (int i = 0; i < 6; ++i) R.f[i] = tt_read_view(&views[i]);
  return R;
}

/* y = forward(x) against the reference of the layer's current factors. */
static void expect_forward(osft_flinear_t layer, const DLTensor *views, tt *x,
                           const char *what) {
  const int64_t m = x->t.shape[0];
  int64_t n;
  assert_ok(osft_flinear_get_dims(layer, &n, NULL, NULL, NULL));
  tt *y = mat(TT_F32, m, n);
  tt_poison(y);
  assert_ok(osft_flinear_forward(layer, &x->t, NULL, &y->t));
  ref_layer R = ref_of(layer, views);
  double *xd = tt_get(x), *yr = ref_forward(&R, xd, NULL, m);
  expect_close(what, y, yr, 2e-4);
  free(xd);
  free(yr);
  ref_free(&R);
  tt_free(y);
}

/* grad_x and the factor gradients against the current factors' reference. */
static void expect_backward(osft_flinear_t layer, const DLTensor *views, tt *x,
                            const char *what) {
  int64_t l;
  assert_ok(osft_flinear_get_dims(layer, NULL, NULL, NULL, &l));
  tt *g = mat(TT_F32, M, N), *dx = mat(TT_F32, M, KIN), *du = mat(TT_F32, N, l);
  tt *ds = vec(TT_F32, l), *dv = mat(TT_F32, l, KIN);
  tt_random(g, -1, 1);
  tt *outs[4] = {dx, du, ds, dv};
  for (int i = 0; i < 4; ++i) tt_poison(outs[i]);
  osft_flinear_grads_t gr = grads_of(dx, du, ds, dv, NULL);
  assert_ok(osft_flinear_backward(layer, &x->t, &g->t, &gr));
  ref_layer R = ref_of(layer, views);
  double *xd = tt_get(x), *gd = tt_get(g);
  ref_grads ref = ref_backward(&R, xd, gd, M);
  const double *refs[4] = {ref.dx, ref.du, ref.ds, ref.dv};
  for (int i = 0; i < 4; ++i) expect_close(what, outs[i], refs[i], 2e-4);
  ref_grads_free(&ref);
  ref_free(&R);
  free(xd);
  free(gd);
  for (int i = 0; i < 4; ++i) tt_free(outs[i]);
  tt_free(g);
}

/* An optimizer-like step on one trainable factor, written through a view
 * taken earlier (`view`), without reporting it. */
static void step_through(const DLTensor *view, double scale) {
  double *vals = tt_read_view(view);
  const int64_t cnt = view->ndim == 2 ? view->shape[0] * view->shape[1] : view->shape[0];
  for (int64_t e = 0; e < cnt; ++e) vals[e] += test_uniform(-scale, scale);
  tt_write_view(view, vals);
  free(vals);
}

static void run_mode(osft_context_t ctx, const mode *md) {
  char name[120];
  snprintf(name, sizeof name, "updates=%d fingerprints=%d strategy=%d", (int)md->updates,
           md->fingerprints, (int)md->strategy);
  test_seed(name);
  osft_flinear_t layer = layer_for(ctx, md);
  /* the views an optimizer (and the reference) holds, taken once up front */
  DLTensor all[6];
  for (int f = 0; f < 6; ++f)
    assert_ok(osft_flinear_get_factor(layer, (osft_flinear_factor_t)f, &all[f]));
  const DLTensor *views = all + OSFT_FACTOR_U_LOW;
  tt *x = mat(TT_F32, M, KIN);
  tt_random(x, -1, 1);
  const int kept = keeps_weight(md);

  /* one optimizer step = 4 micro-batches of forward + backward */
  for (int step = 0; step < 3; ++step) {
    const uint64_t before = info_of(layer).rebuilds;
    for (int micro = 0; micro < 4; ++micro) {
      char what[200];
      snprintf(what, sizeof what, "%s step %d micro %d forward", name, step, micro);
      expect_forward(layer, all, x, what);
      snprintf(what, sizeof what, "%s step %d micro %d backward", name, step, micro);
      expect_backward(layer, all, x, what);
    }
    const osft_flinear_info_t info = info_of(layer);
    /* kept: one rebuild per optimizer step; else one per call that
     * needs W (forward and grad_x of each micro-batch) */
    assert_int_equal(info.rebuilds - before, kept ? 1 : 8);
    assert_int_equal(info.weight_kept, kept);
    assert_int_equal(info.frozen_builds, 1);
    /* the optimizer step, through the views taken before */
    for (int f = 0; f < 3; ++f) step_through(&views[f], 0.05);
    if (md->updates == OSFT_FLINEAR_UPDATES_REPORTED) {
      const uint64_t v = info_of(layer).trainable_version;
      assert_ok(osft_flinear_mark_updated(layer));
      assert_int_equal(info_of(layer).trainable_version, v + 1);
    }
  }
  /* one element of S_low changed by one ulp-ish step, taken as a fresh
   * view (which reports the change where reports are used) */
  DLTensor s_low;
  assert_ok(osft_flinear_get_factor(layer, OSFT_FACTOR_S_LOW, &s_low));
  double *s = tt_read_view(&s_low);
  s[0] += 0.5;
  tt_write_view(&s_low, s);
  free(s);
  expect_forward(layer, all, x, "after one S_low element changed");
  /* refresh drops the kept W and the frozen cache */
  assert_ok(osft_flinear_refresh(layer));
  assert_int_equal(info_of(layer).weight_kept, 0);
  expect_forward(layer, all, x, "after refresh");
  assert_int_equal(info_of(layer).frozen_builds, 2);
  tt_free(x);
  assert_ok(osft_flinear_destroy(layer));
}

static void test_kept_weight_follows_the_factors(void **state) {
  const osft_flinear_updates_t updates[2] = {OSFT_FLINEAR_UPDATES_DETECTED,
                                             OSFT_FLINEAR_UPDATES_REPORTED};
  const osft_flinear_strategy_t strategies[2] = {OSFT_FLINEAR_DENSE, OSFT_FLINEAR_HYBRID};
  for (int u = 0; u < 2; ++u)
    for (int fp = 0; fp < 2; ++fp)
      for (int st = 0; st < 2; ++st) {
        const mode md = {updates[u], fp, strategies[st]};
        run_mode(CTX, &md);
      }
}

/* Random caller-owned factors of an n x kin layer (high rank r, low rank
 * l) in f[6] (U, S, V^T high, then low; the caller frees them), and the
 * struct that lends them to osft_flinear_create_from_factors. */
static osft_flinear_factors_t caller_factors(int64_t n, int64_t kin, int64_t r, int64_t l,
                                             tt *f[6]) {
  const int64_t shapes[6][2] = {{n, r}, {r, 1}, {r, kin}, {n, l}, {l, 1}, {l, kin}};
  for (int i = 0; i < 6; ++i) {
    f[i] = shapes[i][1] == 1 ? vec(TT_F32, shapes[i][0])
                             : mat(TT_F32, shapes[i][0], shapes[i][1]);
    tt_random(f[i], -1, 1);
  }
  osft_flinear_factors_t fs;
  assert_ok(OSFT_FLINEAR_FACTORS_INIT(&fs));
  fs.u_high = &f[0]->t;
  fs.s_high = &f[1]->t;
  fs.v_high = &f[2]->t;
  fs.u_low = &f[3]->t;
  fs.s_low = &f[4]->t;
  fs.v_low = &f[5]->t;
  return fs;
}

/* Caller-owned factors (a framework's parameters): the caller writes its
 * own memory and reports the step; the forward follows. */
static void test_caller_factors_reported(void **state) {
  test_seed("caller reported");
  const int64_t r = 12, l = 4;
  tt *f[6];
  osft_flinear_factors_t fs = caller_factors(N, KIN, r, l, f);
  for (int fp = 0; fp < 2; ++fp) {
    osft_flinear_options_t o;
    assert_ok(OSFT_FLINEAR_OPTIONS_INIT(&o));
    o.strategy = OSFT_FLINEAR_DENSE;
    o.trainable_updates = OSFT_FLINEAR_UPDATES_REPORTED;
    osft_flinear_t layer;
    assert_ok(osft_flinear_create_from_factors(CTX, &fs, &o, &layer));
    if (!fp) osfti_flinear_test_disable_fingerprints(layer);
    tt *x = mat(TT_F32, M, KIN);
    tt_random(x, -1, 1);
    DLTensor all[6];
    for (int i = 0; i < 6; ++i) all[i] = f[i]->t;
    for (int step = 0; step < 3; ++step) {
      expect_forward(layer, all, x, "caller factors, reported");
      expect_forward(layer, all, x, "caller factors, reported (kept W)");
      for (int i = 3; i < 6; ++i) step_through(&f[i]->t, 0.1);
      assert_ok(osft_flinear_mark_updated(layer));
    }
    assert_int_equal(info_of(layer).rebuilds, 3);
    tt_free(x);
    assert_ok(osft_flinear_destroy(layer));
  }
  for (int i = 0; i < 6; ++i) tt_free(f[i]);
}

/* Nothing reported: one element of U_low or V_low changed anywhere (the
 * first, one in each thread's share of the rows, the last, a row's odd
 * last element) is seen by the fingerprint of a layer large enough that
 * the fingerprint is split over threads; on a device without fingerprints
 * W is rebuilt at every call. Either way the forward follows. */
static void test_one_unreported_element_changed_anywhere_is_seen(void **state) {
  test_seed("one element anywhere");
  enum { BN = 700, BK = 401, BR = 200 };
  const int64_t bl = BK - BR; /* U_low 700 x 201: two threads' worth of rows */
  tt *f[6];
  osft_flinear_factors_t fs = caller_factors(BN, BK, BR, bl, f);
  osft_flinear_options_t o;
  assert_ok(OSFT_FLINEAR_OPTIONS_INIT(&o));
  o.strategy = OSFT_FLINEAR_DENSE; /* the kept W is what a missed change leaves stale */
  osft_flinear_t layer;
  assert_ok(osft_flinear_create_from_factors(CTX, &fs, &o, &layer));
  tt *x = mat(TT_F32, 4, BK);
  tt_random(x, -1, 1);
  DLTensor all[6];
  for (int i = 0; i < 6; ++i) all[i] = f[i]->t;
  expect_forward(layer, all, x, "before any change");
  const struct {
    int factor;
    int64_t index;
  } at[] = {{3, 0},      {3, (BN / 2 + 3) * bl + 7}, {3, BN * bl - 1},
            {5, BK - 1}, {5, bl * BK - 1},           {5, 57 * BK + 200}};
  for (size_t c = 0; c < sizeof at / sizeof at[0]; ++c) {
    double *v = tt_read_view(&f[at[c].factor]->t);
    v[at[c].index] += 0.25;
    tt_write_view(&f[at[c].factor]->t, v);
    free(v);
    char what[96];
    snprintf(what, sizeof what, "after factor %d element %lld changed, unreported",
             at[c].factor, (long long)at[c].index);
    expect_forward(layer, all, x, what);
  }
  if (tt_device() == OSFT_DEVICE_CPU) assert_int_equal(info_of(layer).weight_kept, 1);
  tt_free(x);
  assert_ok(osft_flinear_destroy(layer));
  for (int i = 0; i < 6; ++i) tt_free(f[i]);
}

/* The layer's bytes beside its workspace: what it keeps between calls. */
static uint64_t kept_bytes(osft_context_t ctx) {
  osft_memory_stats_t st;
  assert_ok(OSFT_MEMORY_STATS_INIT(&st));
  assert_ok(osft_context_get_memory_stats(ctx, &st));
  const uint64_t in_use =
      tt_device() == OSFT_DEVICE_CPU ? st.host_in_use : st.device_in_use;
  return in_use - st.workspace_bytes;
}

/* A kept W whose trainable part is small (2*l*(N+K) <= N*K) follows each
 * change of the factors by the change of its low product, over a snapshot of
 * that product's operands instead of a cached frozen product: the forward
 * matches the reference of the current factors over more updates than there
 * are between two full builds (64), the layer keeps N*K + l*(N+K) values
 * instead of 2*N*K (a larger trainable part: 2*N*K), and the frozen product
 * is computed once per full build. */
static void test_kept_weight_updated_in_place(void **state) {
  test_seed("updated in place");
  enum { STEPS = 70 };
  const int64_t ranks[2][2] = {{12, 4}, {4, 12}}; /* {r, l}: in place, rebuilt */
  for (int fp = 0; fp < 2; ++fp)
    for (int c = 0; c < 2; ++c) {
      const int64_t r = ranks[c][0], l = ranks[c][1];
      tt *f[6];
      osft_flinear_factors_t fs = caller_factors(N, KIN, r, l, f);
      osft_flinear_options_t o;
      assert_ok(OSFT_FLINEAR_OPTIONS_INIT(&o));
      o.strategy = OSFT_FLINEAR_DENSE;
      /* either keeps W: fingerprints (on the CPU) or reports */
      const int detected = fp && tt_device() == OSFT_DEVICE_CPU;
      o.trainable_updates =
          detected ? OSFT_FLINEAR_UPDATES_DETECTED : OSFT_FLINEAR_UPDATES_REPORTED;
      const uint64_t before = kept_bytes(CTX);
      osft_flinear_t layer;
      assert_ok(osft_flinear_create_from_factors(CTX, &fs, &o, &layer));
      if (!fp) osfti_flinear_test_disable_fingerprints(layer);
      const uint64_t created = kept_bytes(CTX);
      tt *x = mat(TT_F32, M, KIN);
      tt_random(x, -1, 1);
      DLTensor all[6];
      for (int i = 0; i < 6; ++i) all[i] = f[i]->t;
      for (int step = 0; step < STEPS; ++step) {
        char what[96];
        snprintf(what, sizeof what, "r=%lld l=%lld, fingerprints %d, after %d updates",
                 (long long)r, (long long)l, fp, step);
        expect_forward(layer, all, x, what);
        for (int i = 3; i < 6; ++i) step_through(&f[i]->t, 0.1);
        if (!detected) assert_ok(osft_flinear_mark_updated(layer));
      }
      const osft_flinear_info_t info = info_of(layer);
      assert_int_equal(info.rebuilds, STEPS);
      /* in place: built in full at the first call and after 64 updates */
      assert_int_equal(info.frozen_builds, c == 0 ? 2 : 1);
      const uint64_t held = kept_bytes(CTX) - created;
      assert_int_equal(held,
                       (c == 0 ? N * KIN + l * (N + KIN) : 2 * N * KIN) * sizeof(float));
      /* a merge builds W in full into its weight: from the frozen factors in
       * place, from the cache otherwise */
      tt *merged = mat(TT_F32, N, KIN);
      assert_ok(osft_flinear_merge(layer, &merged->t));
      assert_int_equal(info_of(layer).frozen_builds, c == 0 ? 3 : 1);
      tt_free(merged);
      tt_free(x);
      assert_ok(osft_flinear_destroy(layer));
      assert_int_equal(kept_bytes(CTX), before);
      for (int i = 0; i < 6; ++i) tt_free(f[i]);
    }
}

static void test_info_and_options_refusals(void **state) {
  tt *w = mat(TT_F32, N, KIN);
  tt_random(w, -1, 1);
  osft_flinear_t layer = decompose(CTX, w, 0.5, OSFT_FLINEAR_AUTO);
  assert_status(osft_flinear_get_info(layer, NULL), OSFT_STATUS_INVALID_ARGUMENT);
  osft_flinear_info_t info;
  info.struct_size = 8;
  assert_status(osft_flinear_get_info(layer, &info), OSFT_STATUS_INVALID_STRUCT_SIZE);
  assert_status(osft_flinear_get_info(NULL, &info), OSFT_STATUS_INVALID_HANDLE);
  assert_status(osft_flinear_mark_updated(NULL), OSFT_STATUS_INVALID_HANDLE);
  osft_flinear_options_t o;
  assert_ok(OSFT_FLINEAR_OPTIONS_INIT(&o));
  assert_int_equal(o.trainable_updates, OSFT_FLINEAR_UPDATES_DETECTED);
  o.trainable_updates = (osft_flinear_updates_t)2;
  osft_flinear_t other = (osft_flinear_t)0x1;
  assert_status(osft_flinear_create_from_weight(CTX, &w->t, &o, &other),
                OSFT_STATUS_INVALID_ARGUMENT);
  assert_true(other == (osft_flinear_t)0x1);
  tt_free(w);
  assert_ok(osft_flinear_destroy(layer));
}

int main(void) {
  if (!tt_device_present()) return OSFT_TEST_SKIP;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_kept_weight_follows_the_factors, tt_setup,
                                      tt_teardown),
      cmocka_unit_test_setup_teardown(test_caller_factors_reported, tt_setup,
                                      tt_teardown),
      cmocka_unit_test_setup_teardown(
          test_one_unreported_element_changed_anywhere_is_seen, tt_setup, tt_teardown),
      cmocka_unit_test_setup_teardown(test_kept_weight_updated_in_place, tt_setup,
                                      tt_teardown),
      cmocka_unit_test_setup_teardown(test_info_and_options_refusals, tt_setup,
                                      tt_teardown),
  };
  return cmocka_run_group_tests_name("flinear_updates", tests, NULL, NULL);
}
