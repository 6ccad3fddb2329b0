/* FLCE's device_target_check option (1.1.0) and osft_flce_check_targets():
 *   - with valid targets every output is bit-identical to the default mode,
 *     and the loss matches a float64 reference;
 *   - an out-of-range target does not fail the call: the loss and that
 *     token's token_loss are NaN, every other output is bit-identical to a
 *     default-mode call in which those tokens are ignored, and
 *     osft_flce_check_targets() then reports the first such call, token and
 *     target once (OSFT_STATUS_INDEX_OUT_OF_RANGE), and is clear after;
 *   - the default mode is unchanged: the call fails writing nothing, and
 *     osft_flce_check_targets() has nothing to say.
 * The CPU honours the option with the same semantics; built with
 * OSFT_TEST_CUDA (test_flce_device_check_cuda) the same runs on a GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flce_testlib.h"
#include "test_fixture.h"
#include "test_tensors.h"
#include "test_util.h"

enum { M = 40, H = 12, V = 30 };

typedef struct {
  tt *x, *w, *y;
  tt *loss, *gx, *gw, *gb, *z, *acc, *argmax, *tok;
} tensors;

static void make(tensors *T) {
  T->x = mat(TT_F32, M, H), T->w = mat(TT_F32, V, H), T->y = vec(TT_I64, M);
  tt_random(T->x, -1.0, 1.0), tt_random(T->w, -0.5, 0.5);
  T->loss = scalar(), T->z = scalar(), T->acc = scalar();
  T->gx = mat(TT_F32, M, H), T->gw = mat(TT_F32, V, H), T->gb = vec(TT_F32, V);
  T->argmax = vec(TT_I64, M), T->tok = vec(TT_F32, M);
}

static tt **outputs(tensors *T, int *n) {
  static tt *o[8];
  o[0] = T->loss, o[1] = T->gx, o[2] = T->gw, o[3] = T->gb;
  o[4] = T->z, o[5] = T->acc, o[6] = T->argmax, o[7] = T->tok;
  *n = 8;
  return o;
}

static void release(tensors *T) {
  int n;
  tt **o = outputs(T, &n);
  for (int i = 0; i < n; ++i) tt_free(o[i]);
  tt_free(T->x), tt_free(T->w), tt_free(T->y);
}

static void set_targets(tensors *T, const int64_t *y) {
  double d[M];
  for (int i = 0; i < M; ++i) d[i] = (double)y[i];
  tt_set(T->y, d);
}

static void valid_targets(int64_t *y) {
  for (int i = 0; i < M; ++i) y[i] = i % 11 == 3 ? -100 : (i * 7) % V;
}

static osft_flce_t new_flce(osft_context_t ctx, int device_check) {
  osft_flce_options_t o;
  assert_ok(OSFT_FLCE_OPTIONS_INIT(&o));
  assert_int_equal(o.device_target_check, 0); /* the default */
  o.device_target_check = device_check;
  o.z_loss_scale = 1e-3;
  o.label_smoothing = 0.05;
  o.chunk_rows = 16;
  flce_test_plan_options(&o, V);
  osft_flce_t f = NULL;
  assert_ok(osft_flce_create(ctx, &o, &f));
  osft_flce_options_t back;
  back.struct_size = sizeof back;
  assert_ok(osft_flce_get_options(f, &back));
  assert_int_equal(back.device_target_check, device_check);
  return f;
}

static osft_status_t compute(osft_flce_t f, tensors *T) {
  int n;
  tt **o = outputs(T, &n);
  for (int i = 0; i < n; ++i) tt_poison(o[i]);
  osft_flce_inputs_t in;
  assert_ok(OSFT_FLCE_INPUTS_INIT(&in));
  in.x = &T->x->t, in.weight = &T->w->t, in.targets = &T->y->t;
  osft_flce_outputs_t out;
  assert_ok(OSFT_FLCE_OUTPUTS_INIT(&out));
  out.loss = &T->loss->t, out.grad_x = &T->gx->t, out.grad_weight = &T->gw->t;
  out.grad_bias = &T->gb->t, out.z_loss = &T->z->t, out.accuracy = &T->acc->t;
  out.argmax = &T->argmax->t, out.token_loss = &T->tok->t;
  return osft_flce_compute(f, &in, &out);
}

/* Raw bytes of every output, for bit-identity. */
typedef struct {
  void *b[8];
  size_t n[8];
} snapshot;

static snapshot take(tensors *T) {
  snapshot s;
  int n;
  tt **o = outputs(T, &n);
  for (int i = 0; i < n; ++i) s.b[i] = tt_bytes(o[i], &s.n[i]);
  return s;
}

static void drop(snapshot *s) {
  for (int i = 0; i < 8; ++i) free(s->b[i]);
}

static const char *kNames[8] = {"loss",   "grad_x",   "grad_weight", "grad_bias",
                                "z_loss", "accuracy", "argmax",      "token_loss"};

static void test_valid_targets_as_default(void **state) {
  osft_context_t ctx = CTX;
  test_seed("device check valid");
  tensors T;
  make(&T);
  int64_t y[M];
  valid_targets(y);
  set_targets(&T, y);
  osft_flce_t plain = new_flce(ctx, 0), checked = new_flce(ctx, 1);
  assert_ok(compute(plain, &T));
  assert_ok(osft_context_synchronize(ctx));
  snapshot a = take(&T);
  assert_ok(compute(checked, &T));
  assert_ok(osft_flce_check_targets(checked));
  snapshot b = take(&T);
  for (int i = 0; i < 8; ++i)
    if (a.n[i] != b.n[i] || memcmp(a.b[i], b.b[i], a.n[i]) != 0)
      fail_msg("%s differs between the default and device_target_check", kNames[i]);
  /* and the loss is right */
  flce_case c = base_case(M, H, V, TT_F32);
  c.z_scale = 1e-3;
  c.smoothing = 0.05;
  double *x = tt_get(T.x), *w = tt_get(T.w);
  ref_out r = reference(&c, x, w, NULL, NULL, y, NULL);
  expect_scalar("valid targets", "loss", T.loss, r.loss, 1e-5);
  ref_free(&r);
  free(x), free(w);
  drop(&a), drop(&b);
  assert_ok(osft_flce_destroy(plain));
  assert_ok(osft_flce_destroy(checked));
  release(&T);
}

static void test_bad_target_is_nan_and_sticky(void **state) {
  osft_context_t ctx = CTX;
  test_seed("device check bad");
  tensors T;
  make(&T);
  int64_t y[M];
  valid_targets(y);
  /* The same call with the bad tokens ignored, in the default mode. */
  y[5] = -100, y[9] = -100;
  set_targets(&T, y);
  osft_flce_t plain = new_flce(ctx, 0), checked = new_flce(ctx, 1);
  assert_ok(compute(plain, &T));
  assert_ok(osft_context_synchronize(ctx));
  snapshot ignored = take(&T);
  double *tok_ignored = tt_get(T.tok);
  /* A good call first, then two bad ones: the record keeps the first. */
  valid_targets(y);
  set_targets(&T, y);
  assert_ok(compute(checked, &T));
  y[5] = V + 3, y[9] = -7;
  set_targets(&T, y);
  assert_ok(compute(checked, &T)); /* succeeds: nothing waited for the check */
  assert_ok(osft_context_synchronize(ctx));
  double *loss = tt_get(T.loss), *tok = tt_get(T.tok);
  assert_true(isnan(loss[0]));
  for (int i = 0; i < M; ++i) {
    if (i == 5 || i == 9)
      assert_true(isnan(tok[i]));
    else if (!(tok[i] == tok_ignored[i]))
      fail_msg("token_loss[%d] = %g, %g with the bad tokens ignored", i, tok[i],
               tok_ignored[i]);
  }
  snapshot bad = take(&T);
  for (int i = 1; i < 7; ++i) /* every output but loss and token_loss */
    if (bad.n[i] != ignored.n[i] || memcmp(bad.b[i], ignored.b[i], bad.n[i]) != 0)
      fail_msg("%s differs from the call with the bad tokens ignored", kNames[i]);
  y[5] = 2 * V; /* a third call, also bad: not the one reported */
  set_targets(&T, y);
  assert_ok(compute(checked, &T));
  assert_status(osft_flce_check_targets(checked), OSFT_STATUS_INDEX_OUT_OF_RANGE);
  assert_error_mentions("osft_flce_check_targets");
  assert_error_mentions("call 2 of 3");
  assert_error_mentions("token 5");
  char value[32];
  snprintf(value, sizeof value, "target %d", V + 3);
  assert_error_mentions(value);
  /* Reported once: clear afterwards, until a new bad call. */
  assert_ok(osft_flce_check_targets(checked));
  valid_targets(y);
  set_targets(&T, y);
  assert_ok(compute(checked, &T));
  assert_ok(osft_flce_check_targets(checked));
  free(loss), free(tok), free(tok_ignored);
  drop(&ignored), drop(&bad);
  assert_ok(osft_flce_destroy(plain));
  assert_ok(osft_flce_destroy(checked));
  release(&T);
}

static void test_default_unchanged(void **state) {
  osft_context_t ctx = CTX;
  test_seed("device check default");
  tensors T;
  make(&T);
  int64_t y[M];
  valid_targets(y);
  y[17] = V;
  set_targets(&T, y);
  osft_flce_t plain = new_flce(ctx, 0);
  int n;
  tt **o = outputs(&T, &n);
  for (int i = 0; i < n; ++i) tt_poison(o[i]);
  snapshot before = take(&T);
  osft_flce_inputs_t in;
  assert_ok(OSFT_FLCE_INPUTS_INIT(&in));
  in.x = &T.x->t, in.weight = &T.w->t, in.targets = &T.y->t;
  osft_flce_outputs_t out;
  assert_ok(OSFT_FLCE_OUTPUTS_INIT(&out));
  out.loss = &T.loss->t, out.grad_x = &T.gx->t, out.token_loss = &T.tok->t;
  assert_status(osft_flce_compute(plain, &in, &out), OSFT_STATUS_INDEX_OUT_OF_RANGE);
  assert_error_mentions("token 17");
  snapshot after = take(&T);
  for (int i = 0; i < 8; ++i)
    if (memcmp(before.b[i], after.b[i], before.n[i]) != 0)
      fail_msg("%s was written by a failed call", kNames[i]);
  assert_ok(osft_flce_check_targets(plain)); /* no record in the default mode */
  assert_status(osft_flce_check_targets(NULL), OSFT_STATUS_INVALID_HANDLE);
  drop(&before), drop(&after);
  assert_ok(osft_flce_destroy(plain));
  release(&T);
}

int main(void) {
  if (!tt_device_present()) return OSFT_TEST_SKIP;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_valid_targets_as_default, tt_setup,
                                      tt_teardown),
      cmocka_unit_test_setup_teardown(test_bad_target_is_nan_and_sticky, tt_setup,
                                      tt_teardown),
      cmocka_unit_test_setup_teardown(test_default_unchanged, tt_setup, tt_teardown),
  };
  return cmocka_run_group_tests_name("flce_device_check", tests, NULL, NULL);
}
