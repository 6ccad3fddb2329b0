/* Tensor checks of dtypes: every supported dtype, float and int masks,
 * unsupported dtypes and lanes, same-dtype checks, and the dtype helpers
 * (from DLPack, size and name, mask names).
 *
 * The osfti_* checks record their message as a pending error (it becomes
 * osft_last_error() only at a public boundary), so these tests assert the
 * status codes, not the message text. One CPU context serves the whole
 * group (tt_setup as the group fixture); the helpers are in
 * tensor_check_testlib.h. */
#include <limits.h>
#include <stdint.h>
#include <string.h>

#include "core/tensor_check.h"
#include "test_util.h"

#include "tensor_check_testlib.h"
#include "test_fixture.h"

/* DLPack dtypes the library does not compute with. */
static const DLDataType k_unsupported[] = {
    {kDLUInt, 8, 1},     {kDLUInt, 16, 1},     {kDLUInt, 32, 1},
    {kDLUInt, 64, 1},    {kDLInt, 8, 1},       {kDLInt, 16, 1},
    {kDLInt, 1, 1},      {kDLFloat, 8, 1},     {kDLFloat, 128, 1},
    {kDLFloat, 0, 1},    {kDLBfloat, 32, 1},   {kDLBfloat, 8, 1},
    {kDLComplex, 64, 1}, {kDLComplex, 128, 1}, {kDLOpaqueHandle, 64, 1},
    {99, 32, 1},
};

#define N_UNSUPPORTED (sizeof k_unsupported / sizeof k_unsupported[0])

/* ------------------------------------------------------------ dtype */

static void test_dtype_each_supported(void **state) {
  for (size_t i = 0; i < N_DTYPES; ++i) {
    const dtype_case *c = &k_dtypes[i];
    test_tensor tt;
    make(&tt, g_buf, c->code, c->bits, kDLCPU, 2, SHAPE(3, 4), NULL);
    osfti_tensor_spec s = spec_any();

    s.dtypes = (unsigned)c->dtype; /* exactly this one */
    assert_ok(CHECK(tt, s));
    s.dtypes = ALL_DTYPES; /* among others */
    assert_ok(CHECK(tt, s));
    s.dtypes = ALL_DTYPES & ~(unsigned)c->dtype; /* every other one */
    assert_status(CHECK(tt, s), OSFT_STATUS_DTYPE_MISMATCH);
    s.dtypes = 0; /* nothing */
    assert_status(CHECK(tt, s), OSFT_STATUS_DTYPE_MISMATCH);
  }
}

static void test_dtype_float_vs_int_masks(void **state) {
  osfti_tensor_spec s = spec_any();
  test_tensor tt;
  for (size_t i = 0; i < N_DTYPES; ++i) {
    const dtype_case *c = &k_dtypes[i];
    const int is_float = (c->dtype & OSFTI_FLOATS) != 0;
    make(&tt, g_buf, c->code, c->bits, kDLCPU, 1, SHAPE(5), NULL);
    s.dtypes = OSFTI_FLOATS;
    assert_status(CHECK(tt, s),
                  is_float ? OSFT_STATUS_SUCCESS : OSFT_STATUS_DTYPE_MISMATCH);
    s.dtypes = OSFTI_INTS;
    assert_status(CHECK(tt, s),
                  is_float ? OSFT_STATUS_DTYPE_MISMATCH : OSFT_STATUS_SUCCESS);
  }
}

static void test_dtype_unsupported_rejected(void **state) {
  osfti_tensor_spec s = spec_any();
  s.dtypes = ~0u; /* even a mask with every bit set */
  for (size_t i = 0; i < N_UNSUPPORTED; ++i) {
    test_tensor tt;
    make_f32(&tt, g_buf, 1, SHAPE(4), NULL);
    tt.t.dtype = k_unsupported[i];
    assert_status(CHECK(tt, s), OSFT_STATUS_DTYPE_MISMATCH);
  }
}

static void test_dtype_lanes_rejected(void **state) {
  osfti_tensor_spec s = spec_any();
  const uint16_t lanes[] = {0, 2, 4, 8, 65535};
  for (size_t d = 0; d < N_DTYPES; ++d) {
    for (size_t i = 0; i < sizeof lanes / sizeof lanes[0]; ++i) {
      test_tensor tt;
      make(&tt, g_buf, k_dtypes[d].code, k_dtypes[d].bits, kDLCPU, 1, SHAPE(4), NULL);
      tt.t.dtype.lanes = lanes[i];
      assert_status(CHECK(tt, s), OSFT_STATUS_DTYPE_MISMATCH);
    }
  }
}

/* ----------------------------------------------------- same dtype */

static void test_same_dtype(void **state) {
  (void)state;
  test_tensor a, b;
  for (size_t i = 0; i < N_DTYPES; ++i) {
    for (size_t j = 0; j < N_DTYPES; ++j) {
      make(&a, g_buf, k_dtypes[i].code, k_dtypes[i].bits, kDLCPU, 1, SHAPE(4), NULL);
      make(&b, g_other, k_dtypes[j].code, k_dtypes[j].bits, kDLCPU, 2, SHAPE(2, 3), NULL);
      assert_status(osfti_check_same_dtype("a", &a.t, "b", &b.t),
                    i == j ? OSFT_STATUS_SUCCESS : OSFT_STATUS_DTYPE_MISMATCH);
    }
  }
  /* A supported dtype against an unsupported one (lanes 2). */
  make_f32(&a, g_buf, 1, SHAPE(4), NULL);
  make_f32(&b, g_buf, 1, SHAPE(4), NULL);
  b.t.dtype.lanes = 2;
  assert_status(osfti_check_same_dtype("a", &a.t, "b", &b.t), OSFT_STATUS_DTYPE_MISMATCH);
}

/* ---------------------------------------------------------- dtype.h */

static void test_dtype_from_dl(void **state) {
  (void)state;
  for (size_t i = 0; i < N_DTYPES; ++i) {
    const DLDataType dt = {k_dtypes[i].code, k_dtypes[i].bits, 1};
    assert_int_equal(osfti_dtype_from_dl(dt), k_dtypes[i].dtype);
    DLDataType vec = dt;
    vec.lanes = 2;
    assert_int_equal(osfti_dtype_from_dl(vec), OSFTI_DTYPE_INVALID);
    vec.lanes = 0;
    assert_int_equal(osfti_dtype_from_dl(vec), OSFTI_DTYPE_INVALID);
  }
  for (size_t i = 0; i < N_UNSUPPORTED; ++i)
    assert_int_equal(osfti_dtype_from_dl(k_unsupported[i]), OSFTI_DTYPE_INVALID);
}

static void test_dtype_size_and_name(void **state) {
  (void)state;
  for (size_t i = 0; i < N_DTYPES; ++i) {
    assert_int_equal(osfti_dtype_size(k_dtypes[i].dtype), k_dtypes[i].size);
    assert_string_equal(osfti_dtype_name(k_dtypes[i].dtype), k_dtypes[i].name);
  }
  const osfti_dtype_t invalid[] = {OSFTI_DTYPE_INVALID, (osfti_dtype_t)(OSFTI_I64 << 1),
                                   (osfti_dtype_t)(OSFTI_F32 | OSFTI_F64),
                                   (osfti_dtype_t)OSFTI_FLOATS, (osfti_dtype_t)-1};
  for (size_t i = 0; i < sizeof invalid / sizeof invalid[0]; ++i) {
    assert_int_equal(osfti_dtype_size(invalid[i]), 0);
    assert_string_equal(osfti_dtype_name(invalid[i]), "invalid");
  }
}

static void test_dtype_mask_names(void **state) {
  (void)state;
  char buf[128];
  osfti_dtype_mask_names(OSFTI_F32 | OSFTI_BF16, buf, sizeof buf);
  assert_string_equal(buf, "float32 or bfloat16");
  osfti_dtype_mask_names(OSFTI_I64, buf, sizeof buf);
  assert_string_equal(buf, "int64");
  osfti_dtype_mask_names(OSFTI_FLOATS | OSFTI_INTS, buf, sizeof buf);
  assert_string_equal(buf, "float32 or float64 or float16 or bfloat16 or int32 or int64");
  osfti_dtype_mask_names(0, buf, sizeof buf);
  assert_string_equal(buf, "");
  /* Truncation stays inside the buffer and NUL-terminated. */
  memset(buf, 'x', sizeof buf);
  osfti_dtype_mask_names(OSFTI_FLOATS, buf, 10);
  assert_true(memchr(buf, '\0', 10) != NULL);
  assert_int_equal(buf[10], 'x');
  memset(buf, 'x', sizeof buf);
  osfti_dtype_mask_names(OSFTI_F32, buf, 1);
  assert_int_equal(buf[0], '\0');
  assert_int_equal(buf[1], 'x');
  osfti_dtype_mask_names(OSFTI_F32, buf, 0); /* writes nothing */
  assert_int_equal(buf[0], '\0');
  assert_int_equal(buf[1], 'x');
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_dtype_each_supported),
      cmocka_unit_test(test_dtype_float_vs_int_masks),
      cmocka_unit_test(test_dtype_unsupported_rejected),
      cmocka_unit_test(test_dtype_lanes_rejected),
      cmocka_unit_test(test_same_dtype),
      cmocka_unit_test(test_dtype_from_dl),
      cmocka_unit_test(test_dtype_size_and_name),
      cmocka_unit_test(test_dtype_mask_names),
  };
  return cmocka_run_group_tests_name("tensor_check_dtypes", tests, tt_setup, tt_teardown);
}
