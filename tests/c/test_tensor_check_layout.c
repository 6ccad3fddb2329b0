/* Tensor checks of device and layout: devices against a CPU and a CUDA
 * context, unknown device types, contiguous layouts (NULL, compact,
 * size-1 dims, non-compact, empty), byte offset alignment, row layouts,
 * and the matrix view of a tensor.
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

/* ----------------------------------------------------------- device */

static void test_device_on_cpu_context(void **state) {
  osfti_tensor_spec s = spec_any();
  test_tensor tt;
  make(&tt, g_buf, kDLFloat, 32, kDLCPU, 2, SHAPE(3, 4), NULL);
  assert_ok(CHECK(tt, s));
  make(&tt, g_buf, kDLFloat, 32, kDLCUDAHost, 2, SHAPE(3, 4), NULL);
  assert_ok(CHECK(tt, s));

  /* Values outside DLDeviceType's range (e.g. -1, 99) are left out: the C++
   * side loading them as the enum is undefined behaviour (UBSan flags it). */
  const int bad[] = {kDLCUDA, kDLCUDAManaged, kDLOpenCL, kDLVulkan, kDLMetal, kDLVPI,
                     kDLROCM, kDLROCMHost,    kDLExtDev, 0,         14,       15};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
    make(&tt, g_buf, kDLFloat, 32, bad[i], 2, SHAPE(3, 4), NULL);
    assert_status(CHECK(tt, s), OSFT_STATUS_DEVICE_MISMATCH);
    tt.t.device.device_id = 1;
    assert_status(CHECK(tt, s), OSFT_STATUS_DEVICE_MISMATCH);
  }
  /* The device of an empty tensor is checked all the same. */
  make(&tt, NULL, kDLFloat, 32, kDLCUDA, 2, SHAPE(0, 4), NULL);
  assert_status(CHECK(tt, s), OSFT_STATUS_DEVICE_MISMATCH);
}

static void test_device_on_cuda_context(void **state) {
  (void)state;
  int count = 0;
  assert_ok(osft_device_count(OSFT_DEVICE_CUDA, &count));
  if (count == 0) {
    skip();
    return;
  }
  osft_context_options_t o;
  assert_ok(OSFT_CONTEXT_OPTIONS_INIT(&o));
  o.device_type = OSFT_DEVICE_CUDA;
  o.device_id = 0;
  osft_context_t cuda = NULL;
  assert_ok(osft_context_create(&cuda, &o));
  osfti_tensor_spec s = spec_any();
  test_tensor tt;
  /* Never dereferenced: the check looks only at the descriptor. */
  make(&tt, g_buf, kDLFloat, 32, kDLCUDA, 2, SHAPE(3, 4), NULL);
  assert_ok(osfti_check_tensor(cuda, &tt.t, &s));
  tt.t.device.device_type = kDLCUDAManaged;
  assert_ok(osfti_check_tensor(cuda, &tt.t, &s));
  tt.t.device.device_id = 1; /* another GPU */
  assert_status(osfti_check_tensor(cuda, &tt.t, &s), OSFT_STATUS_DEVICE_MISMATCH);
  tt.t.device.device_type = kDLCUDA;
  assert_status(osfti_check_tensor(cuda, &tt.t, &s), OSFT_STATUS_DEVICE_MISMATCH);
  tt.t.device.device_id = 0;
  tt.t.device.device_type = kDLCPU;
  assert_status(osfti_check_tensor(cuda, &tt.t, &s), OSFT_STATUS_DEVICE_MISMATCH);
  tt.t.device.device_type = kDLCUDAHost;
  assert_status(osfti_check_tensor(cuda, &tt.t, &s), OSFT_STATUS_DEVICE_MISMATCH);
  tt.t.device.device_type = kDLROCM;
  assert_status(osfti_check_tensor(cuda, &tt.t, &s), OSFT_STATUS_DEVICE_MISMATCH);
  assert_ok(osft_context_destroy(cuda));
}

/* ----------------------------------------------- CONTIGUOUS layout */

static void test_contiguous_null_strides(void **state) {
  osfti_tensor_spec s = spec_any();
  test_tensor tt;
  make_f32(&tt, g_buf, 0, NULL, NULL);
  assert_ok(CHECK(tt, s));
  make_f32(&tt, g_buf, 1, SHAPE(7), NULL);
  assert_ok(CHECK(tt, s));
  make_f32(&tt, g_buf, 4, SHAPE(2, 3, 4, 5), NULL);
  assert_ok(CHECK(tt, s));
}

static void test_contiguous_explicit_compact_strides(void **state) {
  osfti_tensor_spec s = spec_any();
  test_tensor tt;
  make_f32(&tt, g_buf, 1, SHAPE(7), SHAPE(1));
  assert_ok(CHECK(tt, s));
  make_f32(&tt, g_buf, 2, SHAPE(3, 4), SHAPE(4, 1));
  assert_ok(CHECK(tt, s));
  make_f32(&tt, g_buf, 4, SHAPE(2, 3, 4, 5), SHAPE(60, 20, 5, 1));
  assert_ok(CHECK(tt, s));
}

static void test_contiguous_size1_dims_any_stride(void **state) {
  osfti_tensor_spec s = spec_any();
  test_tensor tt;
  make_f32(&tt, g_buf, 2, SHAPE(1, 4), SHAPE(999, 1));
  assert_ok(CHECK(tt, s));
  make_f32(&tt, g_buf, 2, SHAPE(3, 1), SHAPE(1, 0));
  assert_ok(CHECK(tt, s));
  make_f32(&tt, g_buf, 2, SHAPE(3, 1), SHAPE(1, 42));
  assert_ok(CHECK(tt, s));
  make_f32(&tt, g_buf, 3, SHAPE(3, 1, 4), SHAPE(4, -7, 1));
  assert_ok(CHECK(tt, s));
  make_f32(&tt, g_buf, 1, SHAPE(1), SHAPE(5));
  assert_ok(CHECK(tt, s));
  make_f32(&tt, g_buf, 4, SHAPE(1, 2, 1, 3), SHAPE(0, 3, 100, 1));
  assert_ok(CHECK(tt, s));
}

static void test_contiguous_rejects_noncompact(void **state) {
  osfti_tensor_spec s = spec_any();
  test_tensor tt;
  make_f32(&tt, g_buf, 2, SHAPE(3, 4), SHAPE(1, 3)); /* transposed */
  assert_status(CHECK(tt, s), OSFT_STATUS_BAD_LAYOUT);
  make_f32(&tt, g_buf, 2, SHAPE(3, 4), SHAPE(6, 1)); /* padded rows */
  assert_status(CHECK(tt, s), OSFT_STATUS_BAD_LAYOUT);
  make_f32(&tt, g_buf, 2, SHAPE(3, 4), SHAPE(-4, 1)); /* negative row stride */
  assert_status(CHECK(tt, s), OSFT_STATUS_BAD_LAYOUT);
  make_f32(&tt, g_buf + 8, 1, SHAPE(4), SHAPE(-1)); /* reversed */
  assert_status(CHECK(tt, s), OSFT_STATUS_BAD_LAYOUT);
  make_f32(&tt, g_buf, 2, SHAPE(3, 4), SHAPE(0, 1)); /* broadcast rows */
  assert_status(CHECK(tt, s), OSFT_STATUS_BAD_LAYOUT);
  make_f32(&tt, g_buf, 1, SHAPE(4), SHAPE(0)); /* broadcast */
  assert_status(CHECK(tt, s), OSFT_STATUS_BAD_LAYOUT);
  make_f32(&tt, g_buf, 1, SHAPE(4), SHAPE(2)); /* every other element */
  assert_status(CHECK(tt, s), OSFT_STATUS_BAD_LAYOUT);
  make_f32(&tt, g_buf, 2, SHAPE(3, 4), SHAPE(8, 2));
  assert_status(CHECK(tt, s), OSFT_STATUS_BAD_LAYOUT);
  make_f32(&tt, g_buf, 3, SHAPE(2, 3, 4), SHAPE(16, 4, 1)); /* gap between */
  assert_status(CHECK(tt, s), OSFT_STATUS_BAD_LAYOUT);
  make_f32(&tt, g_buf, 3, SHAPE(2, 3, 4), SHAPE(4, 8, 1)); /* permuted */
  assert_status(CHECK(tt, s), OSFT_STATUS_BAD_LAYOUT);
}

static void test_contiguous_empty_any_strides(void **state) {
  /* Nothing is read from an empty tensor: its strides do not matter. */
  osfti_tensor_spec s = spec_any();
  test_tensor tt;
  make_f32(&tt, g_buf, 2, SHAPE(0, 4), SHAPE(1, 3));
  assert_ok(CHECK(tt, s));
  make_f32(&tt, g_buf, 2, SHAPE(3, 0), SHAPE(-5, 0));
  assert_ok(CHECK(tt, s));
}

static void test_byte_offset_alignment(void **state) {
  osfti_tensor_spec s = spec_any();
  test_tensor tt;
  for (size_t d = 0; d < N_DTYPES; ++d) {
    const dtype_case *c = &k_dtypes[d];
    for (uint64_t off = 0; off <= 16; ++off) {
      make(&tt, g_buf, c->code, c->bits, kDLCPU, 2, SHAPE(3, 4), NULL);
      tt.t.byte_offset = off;
      assert_status(CHECK(tt, s),
                    off % c->size == 0 ? OSFT_STATUS_SUCCESS : OSFT_STATUS_BAD_LAYOUT);
    }
  }
  /* Alignment is of data + byte_offset, not of each alone. */
  char *bytes = (char *)g_buf;
  make_f32(&tt, bytes + 2, 1, SHAPE(4), NULL);
  assert_status(CHECK(tt, s), OSFT_STATUS_BAD_LAYOUT);
  tt.t.byte_offset = 2;
  assert_ok(CHECK(tt, s));
  tt.t.byte_offset = 6;
  assert_ok(CHECK(tt, s));
  tt.t.byte_offset = 4;
  assert_status(CHECK(tt, s), OSFT_STATUS_BAD_LAYOUT);
  /* Same rule with padded rows. */
  s.layout = OSFTI_LAYOUT_ROWS;
  make_f32(&tt, g_buf, 2, SHAPE(3, 4), SHAPE(6, 1));
  tt.t.byte_offset = 2;
  assert_status(CHECK(tt, s), OSFT_STATUS_BAD_LAYOUT);
  tt.t.byte_offset = 8;
  assert_ok(CHECK(tt, s));
}

/* ----------------------------------------------------- ROWS layout */

static void test_rows_accepts(void **state) {
  osfti_tensor_spec s = spec_rows();
  test_tensor tt;
  make_f32(&tt, g_buf, 2, SHAPE(3, 4), NULL); /* compact */
  assert_ok(CHECK(tt, s));
  make_f32(&tt, g_buf, 2, SHAPE(3, 4), SHAPE(4, 1));
  assert_ok(CHECK(tt, s));
  make_f32(&tt, g_buf, 2, SHAPE(3, 4), SHAPE(6, 1)); /* padded rows */
  assert_ok(CHECK(tt, s));
  make_f32(&tt, g_buf, 3, SHAPE(2, 3, 4), SHAPE(18, 6, 1)); /* collapsible */
  assert_ok(CHECK(tt, s));
  make_f32(&tt, g_buf, 4, SHAPE(2, 2, 3, 4), SHAPE(36, 18, 6, 1));
  assert_ok(CHECK(tt, s));
  make_f32(&tt, g_buf, 3, SHAPE(2, 1, 4), SHAPE(5, 77, 1)); /* size-1 dim */
  assert_ok(CHECK(tt, s));
  make_f32(&tt, g_buf, 2, SHAPE(1, 4), SHAPE(0, 1)); /* one row */
  assert_ok(CHECK(tt, s));
  make_f32(&tt, g_buf, 2, SHAPE(3, 1), SHAPE(1, 9)); /* one column */
  assert_ok(CHECK(tt, s));
  make_f32(&tt, g_buf, 2, SHAPE(3, 1), SHAPE(5, 9));
  assert_ok(CHECK(tt, s));
  make_f32(&tt, g_buf, 1, SHAPE(4), SHAPE(1));
  assert_ok(CHECK(tt, s));
  make_f32(&tt, g_buf, 0, NULL, NULL);
  assert_ok(CHECK(tt, s));
}

static void test_rows_rejects(void **state) {
  osfti_tensor_spec s = spec_rows();
  test_tensor tt;
  /* Leading dims that do not collapse into one row stride. */
  make_f32(&tt, g_buf, 3, SHAPE(2, 3, 4), SHAPE(20, 6, 1));
  assert_status(CHECK(tt, s), OSFT_STATUS_BAD_LAYOUT);
  make_f32(&tt, g_buf, 3, SHAPE(2, 3, 4), SHAPE(6, 12, 1)); /* permuted */
  assert_status(CHECK(tt, s), OSFT_STATUS_BAD_LAYOUT);
  /* A last-dim stride other than 1. */
  make_f32(&tt, g_buf, 2, SHAPE(3, 4), SHAPE(8, 2));
  assert_status(CHECK(tt, s), OSFT_STATUS_BAD_LAYOUT);
  make_f32(&tt, g_buf, 2, SHAPE(3, 4), SHAPE(1, 3)); /* transposed */
  assert_status(CHECK(tt, s), OSFT_STATUS_BAD_LAYOUT);
  make_f32(&tt, g_buf, 1, SHAPE(4), SHAPE(2));
  assert_status(CHECK(tt, s), OSFT_STATUS_BAD_LAYOUT);
  make_f32(&tt, g_buf + 8, 1, SHAPE(4), SHAPE(-1));
  assert_status(CHECK(tt, s), OSFT_STATUS_BAD_LAYOUT);
  /* A row stride below the row length: overlapping rows. */
  make_f32(&tt, g_buf, 2, SHAPE(3, 4), SHAPE(3, 1));
  assert_status(CHECK(tt, s), OSFT_STATUS_BAD_LAYOUT);
  make_f32(&tt, g_buf, 2, SHAPE(3, 4), SHAPE(1, 1));
  assert_status(CHECK(tt, s), OSFT_STATUS_BAD_LAYOUT);
  make_f32(&tt, g_buf, 3, SHAPE(2, 3, 4), SHAPE(9, 3, 1));
  assert_status(CHECK(tt, s), OSFT_STATUS_BAD_LAYOUT);
  /* Zero and negative row strides. */
  make_f32(&tt, g_buf, 2, SHAPE(3, 4), SHAPE(0, 1));
  assert_status(CHECK(tt, s), OSFT_STATUS_BAD_LAYOUT);
  make_f32(&tt, g_buf, 2, SHAPE(3, 1), SHAPE(0, 1));
  assert_status(CHECK(tt, s), OSFT_STATUS_BAD_LAYOUT);
  /* A negative outer stride under a positive inner one. (A negative stride as
   * the innermost leading one: test_rows_rejects_negative_row_stride.) */
  make_f32(&tt, g_buf + 64, 3, SHAPE(2, 3, 4), SHAPE(-100, 6, 1));
  assert_status(CHECK(tt, s), OSFT_STATUS_BAD_LAYOUT);
}

/* Negative, zero or overflowing row strides never pass as padded rows (a
 * kernel given a positive `ld` for them would read past the last row). */
static void test_rows_rejects_negative_row_stride(void **state) {
  (void)state;
  osfti_tensor_spec s = spec_rows();
  test_tensor tt;
  make_f32(&tt, g_buf + 64, 2, SHAPE(3, 4), SHAPE(-6, 1));
  assert_status(CHECK(tt, s), OSFT_STATUS_BAD_LAYOUT);
  make_f32(&tt, g_buf + 64, 2, SHAPE(3, 4), SHAPE(-1, 1));
  assert_status(CHECK(tt, s), OSFT_STATUS_BAD_LAYOUT);
  make_f32(&tt, g_buf + 64, 3, SHAPE(2, 3, 4), SHAPE(-12, -4, 1));
  assert_status(CHECK(tt, s), OSFT_STATUS_BAD_LAYOUT);
  make_f32(&tt, g_buf + 64, 3, SHAPE(2, 3, 4), SHAPE(100, -5, 1));
  assert_status(CHECK(tt, s), OSFT_STATUS_BAD_LAYOUT);
  make_f32(&tt, g_buf + 64, 3, SHAPE(2, 3, 4), SHAPE(12, -1, 1));
  assert_status(CHECK(tt, s), OSFT_STATUS_BAD_LAYOUT);
  make_f32(&tt, g_buf + 64, 3, SHAPE(2, 3, 4), SHAPE(1, (int64_t)1 << 62, 1));
  assert_status(CHECK(tt, s), OSFT_STATUS_BAD_LAYOUT);
}

/* A C caller may put any int in device_type; it is a mismatch, not UB. */
static void test_unknown_device_type_values(void **state) {
  (void)state;
  osfti_tensor_spec s = spec_rows();
  test_tensor tt;
  make_f32(&tt, g_buf, 2, SHAPE(3, 4), NULL);
  const int bogus[] = {-1, 0, 99, 1 << 20};
  for (size_t i = 0; i < sizeof bogus / sizeof bogus[0]; ++i) {
    memcpy(&tt.t.device.device_type, &bogus[i], sizeof(int));
    assert_status(CHECK(tt, s), OSFT_STATUS_DEVICE_MISMATCH);
  }
}

/* ----------------------------------------------------- as_matrix */

static void assert_matrix(const test_tensor *tt, int64_t rows, int64_t cols, int64_t ld) {
  const osfti_matrix m = osfti_as_matrix(&tt->t);
  assert_int_equal(m.rows, rows);
  assert_int_equal(m.cols, cols);
  assert_int_equal(m.ld, ld);
  assert_ptr_equal(m.data, (char *)tt->t.data + tt->t.byte_offset);
}

static void test_as_matrix(void **state) {
  (void)state;
  test_tensor tt;
  make_f32(&tt, g_buf, 0, NULL, NULL); /* scalar: 1 x 1 */
  assert_matrix(&tt, 1, 1, 1);
  make_f32(&tt, g_buf, 1, SHAPE(7), NULL); /* one row */
  assert_matrix(&tt, 1, 7, 7);
  make_f32(&tt, g_buf, 1, SHAPE(7), SHAPE(1));
  assert_matrix(&tt, 1, 7, 7);
  make_f32(&tt, g_buf, 2, SHAPE(3, 4), NULL);
  assert_matrix(&tt, 3, 4, 4);
  make_f32(&tt, g_buf, 2, SHAPE(3, 4), SHAPE(4, 1));
  assert_matrix(&tt, 3, 4, 4);
  make_f32(&tt, g_buf, 3, SHAPE(2, 3, 4), NULL);
  assert_matrix(&tt, 6, 4, 4);
  make_f32(&tt, g_buf, 4, SHAPE(2, 3, 4, 5), NULL);
  assert_matrix(&tt, 24, 5, 5);
  make_f32(&tt, g_buf, 2, SHAPE(3, 4), SHAPE(6, 1)); /* padded */
  assert_matrix(&tt, 3, 4, 6);
  make_f32(&tt, g_buf, 3, SHAPE(2, 3, 4), SHAPE(18, 6, 1));
  assert_matrix(&tt, 6, 4, 6);
  /* Size-1 dims: their strides are ignored. */
  make_f32(&tt, g_buf, 2, SHAPE(1, 4), SHAPE(999, 1));
  assert_matrix(&tt, 1, 4, 4);
  make_f32(&tt, g_buf, 3, SHAPE(1, 3, 4), SHAPE(50, 6, 1));
  assert_matrix(&tt, 3, 4, 6);
  make_f32(&tt, g_buf, 3, SHAPE(3, 1, 4), SHAPE(6, 77, 1));
  assert_matrix(&tt, 3, 4, 6);
  make_f32(&tt, g_buf, 2, SHAPE(3, 1), NULL);
  assert_matrix(&tt, 3, 1, 1);
  make_f32(&tt, g_buf, 2, SHAPE(3, 1), SHAPE(1, 5));
  assert_matrix(&tt, 3, 1, 1);
  make_f32(&tt, g_buf, 2, SHAPE(3, 1), SHAPE(5, 5));
  assert_matrix(&tt, 3, 1, 5);
  /* Empty tensors keep their row and column counts. */
  make_f32(&tt, g_buf, 2, SHAPE(0, 4), NULL);
  assert_matrix(&tt, 0, 4, 4);
  make_f32(&tt, g_buf, 2, SHAPE(3, 0), NULL);
  assert_matrix(&tt, 3, 0, 0);
  make_f32(&tt, g_buf, 3, SHAPE(2, 3, 0), NULL);
  assert_matrix(&tt, 6, 0, 0);
}

static void test_as_matrix_data_and_dtype(void **state) {
  (void)state;
  for (size_t d = 0; d < N_DTYPES; ++d) {
    const dtype_case *c = &k_dtypes[d];
    test_tensor tt;
    make(&tt, g_buf, c->code, c->bits, kDLCPU, 2, SHAPE(3, 4), SHAPE(5, 1));
    tt.t.byte_offset = 3 * c->size;
    const osfti_matrix m = osfti_as_matrix(&tt.t);
    assert_ptr_equal(m.data, (char *)g_buf + 3 * c->size);
    assert_int_equal(m.dtype, c->dtype);
    assert_int_equal(m.rows, 3);
    assert_int_equal(m.cols, 4);
    assert_int_equal(m.ld, 5);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_device_on_cpu_context),
      cmocka_unit_test(test_device_on_cuda_context),
      cmocka_unit_test(test_contiguous_null_strides),
      cmocka_unit_test(test_contiguous_explicit_compact_strides),
      cmocka_unit_test(test_contiguous_size1_dims_any_stride),
      cmocka_unit_test(test_contiguous_rejects_noncompact),
      cmocka_unit_test(test_contiguous_empty_any_strides),
      cmocka_unit_test(test_byte_offset_alignment),
      cmocka_unit_test(test_rows_accepts),
      cmocka_unit_test(test_rows_rejects),
      cmocka_unit_test(test_rows_rejects_negative_row_stride),
      cmocka_unit_test(test_unknown_device_type_values),
      cmocka_unit_test(test_as_matrix),
      cmocka_unit_test(test_as_matrix_data_and_dtype),
  };
  return cmocka_run_group_tests_name("tensor_check_layout", tests, tt_setup, tt_teardown);
}
