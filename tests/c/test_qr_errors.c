/* Batched QR errors: option struct versioning, every invalid list or
 * power-iteration argument fails with its status and message and writes
 * nothing, and every byte from the context's allocator comes back.
 *
 * Built twice: for the CPU, and with OSFT_TEST_CUDA for a GPU (skipped where
 * none is present). The float64 checks and the list helpers are in
 * qr_testlib.h. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_tensors.h"
#include "test_util.h"

#include "qr_testlib.h"
#include "test_fixture.h"

/* -------------------------------------------------------------- tests */

static void test_options_init(void **state) {
  (void)state;
  osft_qr_options_t o;
  memset(&o, 0x5a, sizeof o);
  assert_ok(OSFT_QR_OPTIONS_INIT(&o));
  assert_int_equal(o.struct_size, sizeof o);
  assert_int_equal(o.method, OSFT_QR_HOUSEHOLDER);
  assert_true(o.orthogonality_threshold == 0.0 && o.rank_tolerance == 0.0);
  assert_int_equal(o.max_concurrency, 0);
  assert_status(osft_qr_options_init(NULL, sizeof o), OSFT_STATUS_INVALID_ARGUMENT);
  assert_status(osft_qr_options_init(&o, 4), OSFT_STATUS_INVALID_STRUCT_SIZE);
  unsigned char big[sizeof o + 16];
  memset(big, 0x5a, sizeof big);
  assert_ok(osft_qr_options_init((osft_qr_options_t *)big, sizeof big));
  for (size_t i = sizeof o; i < sizeof big; ++i) assert_int_equal(big[i], 0);
}

/* ----------------------------------------------------------------- errors */

/* Runs `call`, expects `status` and a message naming `needle`, and checks
 * that no tensor of L (inputs, outputs) and no status changed. */
#define EXPECT_REJECTED(L, st, call, status, needle)                                   \
  do {                                                                                 \
    list_snap s_;                                                                      \
    list_take((L), &s_);                                                               \
    for (int i_ = 0; i_ < (L)->n; ++i_) (st)[i_] = (osft_status_t)-1;                  \
    assert_status((call), (status));                                                   \
    assert_error_mentions(needle);                                                     \
    list_expect_same((L), &s_, needle);                                                \
    for (int i_ = 0; i_ < (L)->n; ++i_) assert_int_equal((st)[i_], (osft_status_t)-1); \
    list_snap_free((L), &s_);                                                          \
  } while (0)

static DLTensor other_device(const DLTensor *t) {
  DLTensor x = *t;
  x.device.device_type = tt_device() == OSFT_DEVICE_CPU ? kDLCUDA : kDLCPU;
  return x;
}

/* A call on three matrices whose arrays a, q, r the cases below change one
 * entry at a time (reset to the list's tensors after each). */
typedef struct {
  osft_context_t ctx;
  list L;
  osft_status_t st[3];
  const DLTensor *a[3];
  DLTensor *q[3], *r[3];
} list_call;

static void list_call_reset(list_call *k) {
  for (int i = 0; i < 3; ++i) {
    k->a[i] = k->L.ap[i];
    k->q[i] = k->L.qp[i];
    k->r[i] = k->L.rp[i];
  }
}

/* The call with the current a, q, r of `k` must fail (EXPECT_REJECTED); then
 * the arrays are reset. */
#define REJECTED(k, opts, qs, status, needle)                                          \
  do {                                                                                 \
    EXPECT_REJECTED(&(k)->L, (k)->st,                                                  \
                    osft_qr_batch((k)->ctx, (opts), 3, (k)->a, (qs), (k)->r, (k)->st), \
                    (status), (needle));                                               \
    list_call_reset(k);                                                                \
  } while (0)

/* A NULL handle or array, a NULL entry, m < n, rank 3, bf16. */
static void list_errors_arguments(list_call *k, osft_qr_options_t o) {
  const DLTensor **a = k->a;
  DLTensor **q = k->q, **r = k->r;
  EXPECT_REJECTED(&k->L, k->st, osft_qr_batch(NULL, &o, 3, a, q, r, k->st),
                  OSFT_STATUS_INVALID_HANDLE, "ctx");
  EXPECT_REJECTED(&k->L, k->st, osft_qr_batch(k->ctx, &o, 3, NULL, q, r, k->st),
                  OSFT_STATUS_INVALID_ARGUMENT, "a: NULL");
  a[1] = NULL;
  REJECTED(k, &o, q, OSFT_STATUS_INVALID_ARGUMENT, "a[1]");
  q[2] = NULL;
  REJECTED(k, &o, q, OSFT_STATUS_INVALID_ARGUMENT, "q[2]");
  /* m < n */
  DLTensor wide = *a[1];
  int64_t wide_shape[2] = {6, 10};
  wide.shape = wide_shape;
  a[1] = &wide;
  REJECTED(k, &o, q, OSFT_STATUS_SHAPE_MISMATCH, "a[1]");
  /* rank 3 */
  DLTensor cube = *a[0];
  int64_t cube_shape[3] = {2, 6, 8};
  cube.ndim = 3;
  cube.shape = cube_shape;
  a[0] = &cube;
  REJECTED(k, &o, q, OSFT_STATUS_SHAPE_MISMATCH, "a[0]");
  /* bf16 */
  DLTensor half = *a[2];
  half.dtype.code = kDLBfloat;
  half.dtype.bits = 16;
  a[2] = &half;
  REJECTED(k, &o, q, OSFT_STATUS_DTYPE_MISMATCH, "a[2]");
}

/* q of another dtype or shape, r of another shape, another device,
 * column-major strides. */
static void list_errors_outputs_device_layout(list_call *k, osft_qr_options_t o) {
  const DLTensor **a = k->a;
  DLTensor **q = k->q, **r = k->r;
  /* q of another dtype, of another shape; r of another shape */
  tt *q64 = new_mat(TT_F64, 12, 8, 0), *q_bad = new_mat(TT_F32, 10, 5, 0);
  tt *r_bad = new_mat(TT_F32, 5, 6, 0);
  q[0] = &q64->t;
  REJECTED(k, &o, q, OSFT_STATUS_DTYPE_MISMATCH, "q[0]");
  q[1] = &q_bad->t;
  REJECTED(k, &o, q, OSFT_STATUS_SHAPE_MISMATCH, "q[1]");
  r[2] = &r_bad->t;
  REJECTED(k, &o, q, OSFT_STATUS_SHAPE_MISMATCH, "r[2]");
  /* another device */
  DLTensor elsewhere = other_device(a[2]);
  a[2] = &elsewhere;
  REJECTED(k, &o, q, OSFT_STATUS_DEVICE_MISMATCH, "a[2]");
  DLTensor q_elsewhere = other_device(q[1]);
  q[1] = &q_elsewhere;
  REJECTED(k, &o, q, OSFT_STATUS_DEVICE_MISMATCH, "q[1]");
  /* column-major strides */
  DLTensor colmajor = *a[0];
  int64_t cm_strides[2] = {1, 12};
  colmajor.strides = cm_strides;
  a[0] = &colmajor;
  REJECTED(k, &o, q, OSFT_STATUS_BAD_LAYOUT, "a[0]");
  tt_free(q64);
  tt_free(q_bad);
  tt_free(r_bad);
}

/* Two outputs on the same memory; an output over another's input; an
 * output shifted one row against its own input; r over q; the same matrix
 * twice in place. */
static void list_errors_aliasing(list_call *k, osft_qr_options_t o) {
  const DLTensor **a = k->a;
  DLTensor **q = k->q, **r = k->r;
  q[2] = q[1];
  REJECTED(k, &o, q, OSFT_STATUS_ALIASING, "q[1]");
  DLTensor over_a2 = *k->L.ap[2];
  q[1] = &over_a2;
  REJECTED(k, &o, q, OSFT_STATUS_ALIASING, "a[2]");
  DLTensor shifted = *k->L.ap[0];
  shifted.byte_offset += 8 * sizeof(float);
  q[0] = &shifted;
  REJECTED(k, &o, q, OSFT_STATUS_ALIASING, "q[0]");
  DLTensor r_over_q = *q[0];
  int64_t r_shape[2] = {8, 8};
  r_over_q.shape = r_shape;
  r[0] = &r_over_q;
  REJECTED(k, &o, q, OSFT_STATUS_ALIASING, "r[0]");
  a[2] = a[1]; /* in place: the same matrix twice is two writes to it */
  REJECTED(k, &o, NULL, OSFT_STATUS_ALIASING, "a[1]");
}

/* Options: struct size, method, thresholds, concurrency. */
static void list_errors_options(list_call *k, osft_qr_options_t o) {
  DLTensor **q = k->q;
  osft_qr_options_t bad = o;
  bad.struct_size = 4;
  REJECTED(k, &bad, q, OSFT_STATUS_INVALID_STRUCT_SIZE, "opts");
  bad = o;
  memset(&bad.method, 0x7f, sizeof bad.method);
  REJECTED(k, &bad, q, OSFT_STATUS_INVALID_ARGUMENT, "opts->method");
  bad = o;
  bad.orthogonality_threshold = -1.0;
  REJECTED(k, &bad, q, OSFT_STATUS_INVALID_ARGUMENT, "opts->orthogonality_threshold");
  bad = o;
  bad.rank_tolerance = NAN;
  REJECTED(k, &bad, q, OSFT_STATUS_INVALID_ARGUMENT, "opts->rank_tolerance");
  bad = o;
  bad.max_concurrency = -2;
  REJECTED(k, &bad, q, OSFT_STATUS_INVALID_ARGUMENT, "opts->max_concurrency");
}

#undef REJECTED

/* Every invalid call fails with its status and message, and no tensor and
 * no status changes. */
static void test_list_errors_write_nothing(void **state) {
  test_seed("errors");
  const spec s[3] = {{TT_F32, 12, 8, 0}, {TT_F32, 10, 6, 0}, {TT_F32, 10, 6, 0}};
  list_call k;
  k.ctx = CTX;
  list_make(&k.L, 3, s, NULL, NULL);
  const osft_qr_options_t o = options(OSFT_QR_HOUSEHOLDER);
  list_call_reset(&k);
  list_errors_arguments(&k, o);
  list_errors_outputs_device_layout(&k, o);
  list_errors_aliasing(&k, o);
  list_errors_options(&k, o);
  /* count 0 needs no arrays; then a valid call works */
  assert_ok(osft_qr_batch(CTX, NULL, 0, NULL, NULL, NULL, NULL));
  assert_ok(osft_qr_batch(CTX, NULL, 3, k.a, k.q, k.r, k.st));
  list_free(&k.L);
}

static void test_power_iteration_errors(void **state) {
  test_seed("power_errors");
  const spec s[3] = {{TT_F32, 8, 8, 0}, {TT_F32, 8, 8, 0}, {TT_F64, 6, 6, 0}};
  list L; /* a: the square factors; q: starting Qs (made from a below) */
  list_make(&L, 3, s, NULL, NULL);
  for (int i = 0; i < 3; ++i) {
    double *v = tt_get(L.a[i]);
    tt_set(L.q[i], v);
    free(v);
  }
  osft_status_t st[3];
  const osft_qr_options_t o = options(OSFT_QR_HOUSEHOLDER);
  EXPECT_REJECTED(&L, st, osft_qr_power_iteration(CTX, &o, 3, L.ap, L.qp, 0, st),
                  OSFT_STATUS_INVALID_ARGUMENT, "iterations");
  EXPECT_REJECTED(&L, st, osft_qr_power_iteration(CTX, &o, 3, L.ap, NULL, 1, st),
                  OSFT_STATUS_INVALID_ARGUMENT, "q: NULL");
  tt *rect = new_mat(TT_F32, 8, 5, 0), *tall = new_mat(TT_F64, 7, 6, 0);
  tt_random(rect, -1, 1);
  const DLTensor *a[3] = {L.ap[0], &rect->t, L.ap[2]};
  EXPECT_REJECTED(&L, st, osft_qr_power_iteration(CTX, &o, 3, a, L.qp, 1, st),
                  OSFT_STATUS_SHAPE_MISMATCH, "a[1]");
  DLTensor *q[3] = {L.qp[0], L.qp[1], &tall->t};
  EXPECT_REJECTED(&L, st, osft_qr_power_iteration(CTX, &o, 3, L.ap, q, 1, st),
                  OSFT_STATUS_SHAPE_MISMATCH, "q[2]");
  DLTensor q_over_a = *L.ap[0];
  q[2] = L.qp[2];
  q[1] = &q_over_a; /* Q_1 over A_0 */
  EXPECT_REJECTED(&L, st, osft_qr_power_iteration(CTX, &o, 3, L.ap, q, 1, st),
                  OSFT_STATUS_ALIASING, "a[0]");
  assert_ok(osft_qr_power_iteration(CTX, &o, 3, L.ap, L.qp, 1, st));
  tt_free(rect);
  tt_free(tall);
  list_free(&L);
}

/* Every byte from the context's allocator comes back, failures included. */
static void test_memory_is_returned(void **state) {
  (void)state;
  test_alloc_state st;
  osft_context_t ctx = tt_counting_context(&st); /* host and device counted */
  test_seed("memory");
  list L;
  list_make(&L, 4, kMixed, NULL, kWantR);
  double *v = tt_get(L.a[2]);
  v[0] = NAN;
  tt_set(L.a[2], v);
  free(v);
  for (int mi = 0; mi < N_QR_METHODS; ++mi) {
    const osft_qr_options_t qo = options(kMethods[mi]);
    assert_status(osft_qr_batch(ctx, &qo, 4, L.ap, L.qp, L.rp, NULL),
                  OSFT_STATUS_NUMERICAL_ERROR);
  }
  assert_ok(osft_context_destroy(ctx));
  assert_true(st.host_allocs > 0);
  if (tt_device() == OSFT_DEVICE_CUDA) assert_true(st.device_allocs > 0);
  tt_expect_all_returned(&st);
  list_free(&L);
}

int main(void) {
  if (!tt_device_present()) return OSFT_TEST_SKIP;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_options_init),
      cmocka_unit_test_setup_teardown(test_list_errors_write_nothing, tt_setup,
                                      tt_teardown),
      cmocka_unit_test_setup_teardown(test_power_iteration_errors, tt_setup, tt_teardown),
      cmocka_unit_test(test_memory_is_returned),
  };
  return cmocka_run_group_tests_name("qr_errors", tests, NULL, NULL);
}
