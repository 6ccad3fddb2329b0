/* Tensor checks of presence and shape: NULL tensors (required, optional),
 * rank ranges, exact and scalar ranks, invalid ndim, NULL shape, trailing
 * dims, negative dims, overflowing element counts and byte sizes, NULL
 * data, and numel.
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

/* ------------------------------------------------------ NULL tensor */

static void test_null_tensor_required(void **state) {
  osfti_tensor_spec s = spec_any();
  assert_status(osfti_check_tensor(ctx_of(state), NULL, &s),
                OSFT_STATUS_INVALID_ARGUMENT);
}

static void test_null_tensor_optional(void **state) {
  osfti_tensor_spec s = spec_any();
  s.optional = 1;
  assert_ok(osfti_check_tensor(ctx_of(state), NULL, &s));
  /* Optional only means "may be NULL": a present tensor is still checked. */
  test_tensor tt;
  make(&tt, g_buf, kDLUInt, 8, kDLCPU, 1, SHAPE(4), NULL);
  assert_status(CHECK(tt, s), OSFT_STATUS_DTYPE_MISMATCH);
  make_f32(&tt, g_buf, 1, SHAPE(4), NULL);
  assert_ok(CHECK(tt, s));
}

/* ------------------------------------------------------------- rank */

static void test_rank_range(void **state) {
  osfti_tensor_spec s = spec_any();
  s.min_rank = 2;
  s.max_rank = 3;
  test_tensor tt;
  make_f32(&tt, g_buf, 0, NULL, NULL);
  assert_status(CHECK(tt, s), OSFT_STATUS_SHAPE_MISMATCH);
  make_f32(&tt, g_buf, 1, SHAPE(4), NULL);
  assert_status(CHECK(tt, s), OSFT_STATUS_SHAPE_MISMATCH);
  make_f32(&tt, g_buf, 2, SHAPE(3, 4), NULL);
  assert_ok(CHECK(tt, s));
  make_f32(&tt, g_buf, 3, SHAPE(2, 3, 4), NULL);
  assert_ok(CHECK(tt, s));
  make_f32(&tt, g_buf, 4, SHAPE(1, 2, 3, 4), NULL);
  assert_status(CHECK(tt, s), OSFT_STATUS_SHAPE_MISMATCH);
}

static void test_rank_exact(void **state) {
  osfti_tensor_spec s = spec_any();
  s.min_rank = s.max_rank = 2;
  test_tensor tt;
  make_f32(&tt, g_buf, 2, SHAPE(3, 4), NULL);
  assert_ok(CHECK(tt, s));
  make_f32(&tt, g_buf, 1, SHAPE(12), NULL);
  assert_status(CHECK(tt, s), OSFT_STATUS_SHAPE_MISMATCH);
  make_f32(&tt, g_buf, 3, SHAPE(1, 3, 4), NULL);
  assert_status(CHECK(tt, s), OSFT_STATUS_SHAPE_MISMATCH);
}

static void test_rank_scalar(void **state) {
  osfti_tensor_spec s = spec_any();
  s.min_rank = s.max_rank = 0;
  test_tensor tt;
  make_f32(&tt, g_buf, 0, NULL, NULL);
  assert_ok(CHECK(tt, s));
  tt.t.shape = NULL; /* a 0-d tensor needs no shape array */
  assert_ok(CHECK(tt, s));
  make_f32(&tt, g_buf, 1, SHAPE(1), NULL);
  assert_status(CHECK(tt, s), OSFT_STATUS_SHAPE_MISMATCH);
}

static void test_rank_invalid_ndim(void **state) {
  osfti_tensor_spec s = spec_any();
  s.max_rank = 1000; /* a too-generous spec must not admit them either */
  int64_t shape[16];
  for (int i = 0; i < 16; ++i) shape[i] = 1;
  test_tensor tt;
  make_f32(&tt, g_buf, 0, NULL, NULL);
  tt.t.shape = shape;

  tt.t.ndim = OSFTI_MAX_RANK;
  assert_ok(CHECK(tt, s));
  const int bad[] = {OSFTI_MAX_RANK + 1, 16, INT_MAX, -1, INT_MIN};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
    tt.t.ndim = bad[i];
    assert_status(CHECK(tt, s), OSFT_STATUS_SHAPE_MISMATCH);
  }
  /* Likewise with the default spec (max_rank 8). */
  s = spec_any();
  tt.t.ndim = OSFTI_MAX_RANK + 1;
  assert_status(CHECK(tt, s), OSFT_STATUS_SHAPE_MISMATCH);
  tt.t.ndim = -1;
  assert_status(CHECK(tt, s), OSFT_STATUS_SHAPE_MISMATCH);
}

static void test_rank_null_shape(void **state) {
  osfti_tensor_spec s = spec_any();
  test_tensor tt;
  for (int ndim = 1; ndim <= OSFTI_MAX_RANK; ++ndim) {
    make_f32(&tt, g_buf, 0, NULL, NULL);
    tt.t.ndim = ndim;
    tt.t.shape = NULL;
    assert_status(CHECK(tt, s), OSFT_STATUS_SHAPE_MISMATCH);
  }
}

/* --------------------------------------------------- trailing dims */

static void test_trailing_dims_exact(void **state) {
  osfti_tensor_spec s = {.name = "w",
                         .dtypes = OSFTI_F32,
                         .min_rank = 2,
                         .max_rank = 2,
                         .n_dims = 2,
                         .dims = {3, 4},
                         .layout = OSFTI_LAYOUT_CONTIGUOUS};
  test_tensor tt;
  make_f32(&tt, g_buf, 2, SHAPE(3, 4), NULL);
  assert_ok(CHECK(tt, s));
  make_f32(&tt, g_buf, 2, SHAPE(4, 3), NULL);
  assert_status(CHECK(tt, s), OSFT_STATUS_SHAPE_MISMATCH);
  make_f32(&tt, g_buf, 2, SHAPE(3, 5), NULL);
  assert_status(CHECK(tt, s), OSFT_STATUS_SHAPE_MISMATCH);
  make_f32(&tt, g_buf, 2, SHAPE(2, 4), NULL);
  assert_status(CHECK(tt, s), OSFT_STATUS_SHAPE_MISMATCH);
  make_f32(&tt, g_buf, 2, SHAPE(0, 4), NULL);
  assert_status(CHECK(tt, s), OSFT_STATUS_SHAPE_MISMATCH);
}

static void test_trailing_dims_any(void **state) {
  osfti_tensor_spec s = {.name = "x",
                         .dtypes = OSFTI_F32,
                         .min_rank = 2,
                         .max_rank = 2,
                         .n_dims = 2,
                         .dims = {OSFTI_ANY, 4},
                         .layout = OSFTI_LAYOUT_CONTIGUOUS};
  test_tensor tt;
  const int64_t rows[] = {0, 1, 7, 100};
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; ++i) {
    make_f32(&tt, g_buf, 2, SHAPE(rows[i], 4), NULL);
    assert_ok(CHECK(tt, s));
  }
  make_f32(&tt, g_buf, 2, SHAPE(7, 5), NULL);
  assert_status(CHECK(tt, s), OSFT_STATUS_SHAPE_MISMATCH);

  s.dims[0] = OSFTI_ANY;
  s.dims[1] = OSFTI_ANY;
  make_f32(&tt, g_buf, 2, SHAPE(9, 11), NULL);
  assert_ok(CHECK(tt, s));
  make_f32(&tt, g_buf, 2, SHAPE(3, 0), NULL);
  assert_ok(CHECK(tt, s));
}

static void test_trailing_dims_any_leading_count(void **state) {
  /* [..., 4]: any number of leading dims up to the maximum rank. */
  osfti_tensor_spec s = {.name = "x",
                         .dtypes = OSFTI_F32,
                         .min_rank = 1,
                         .max_rank = OSFTI_MAX_RANK,
                         .n_dims = 1,
                         .dims = {4},
                         .layout = OSFTI_LAYOUT_CONTIGUOUS};
  test_tensor tt;
  for (int ndim = 1; ndim <= OSFTI_MAX_RANK; ++ndim) {
    int64_t shape[OSFTI_MAX_RANK];
    for (int i = 0; i < ndim - 1; ++i) shape[i] = i % 2 ? 1 : 2;
    shape[ndim - 1] = 4;
    make_f32(&tt, g_buf, ndim, shape, NULL);
    assert_ok(CHECK(tt, s));
    shape[ndim - 1] = 5;
    make_f32(&tt, g_buf, ndim, shape, NULL);
    assert_status(CHECK(tt, s), OSFT_STATUS_SHAPE_MISMATCH);
    /* The expected size is the last dim, not any other. */
    if (ndim >= 2) {
      shape[ndim - 1] = 3;
      shape[ndim - 2] = 4;
      make_f32(&tt, g_buf, ndim, shape, NULL);
      assert_status(CHECK(tt, s), OSFT_STATUS_SHAPE_MISMATCH);
    }
  }
  /* A rank below the number of trailing dims never passes, even when
   * min_rank says it could. */
  s.min_rank = 0;
  make_f32(&tt, g_buf, 0, NULL, NULL);
  assert_status(CHECK(tt, s), OSFT_STATUS_SHAPE_MISMATCH);
  s.n_dims = 2;
  s.dims[0] = OSFTI_ANY;
  s.dims[1] = 4;
  make_f32(&tt, g_buf, 1, SHAPE(4), NULL);
  assert_status(CHECK(tt, s), OSFT_STATUS_SHAPE_MISMATCH);
  make_f32(&tt, g_buf, 2, SHAPE(1, 4), NULL);
  assert_ok(CHECK(tt, s));
  make_f32(&tt, g_buf, 3, SHAPE(2, 3, 4), NULL);
  assert_ok(CHECK(tt, s));
}

static void test_negative_dim(void **state) {
  osfti_tensor_spec s = spec_any();
  test_tensor tt;
  make_f32(&tt, g_buf, 1, SHAPE(-1), NULL);
  assert_status(CHECK(tt, s), OSFT_STATUS_SHAPE_MISMATCH);
  make_f32(&tt, g_buf, 2, SHAPE(3, -4), NULL);
  assert_status(CHECK(tt, s), OSFT_STATUS_SHAPE_MISMATCH);
  make_f32(&tt, g_buf, 3, SHAPE(-2, -3, 4), NULL);
  assert_status(CHECK(tt, s), OSFT_STATUS_SHAPE_MISMATCH);
  make_f32(&tt, g_buf, 2, SHAPE(INT64_MIN, 1), NULL);
  assert_status(CHECK(tt, s), OSFT_STATUS_SHAPE_MISMATCH);
  /* Not even when an empty dim makes the product zero, nor against OSFTI_ANY
   * (which is -1 too). */
  make_f32(&tt, g_buf, 2, SHAPE(0, -1), NULL);
  assert_status(CHECK(tt, s), OSFT_STATUS_SHAPE_MISMATCH);
  s.n_dims = 1;
  s.dims[0] = OSFTI_ANY;
  make_f32(&tt, g_buf, 1, SHAPE(-1), NULL);
  assert_status(CHECK(tt, s), OSFT_STATUS_SHAPE_MISMATCH);
}

static void test_overflowing_numel(void **state) {
  osfti_tensor_spec s = spec_any();
  test_tensor tt;
  const int64_t big = INT64_C(1) << 32;
  make_f32(&tt, g_buf, 2, SHAPE(big, big), NULL);
  assert_status(CHECK(tt, s), OSFT_STATUS_SHAPE_MISMATCH);
  make_f32(&tt, g_buf, 2, SHAPE(INT64_MAX, 2), NULL);
  assert_status(CHECK(tt, s), OSFT_STATUS_SHAPE_MISMATCH);
  make_f32(&tt, g_buf, 3, SHAPE(INT64_C(1) << 31, INT64_C(1) << 31, 2), NULL);
  assert_status(CHECK(tt, s), OSFT_STATUS_SHAPE_MISMATCH);
  make_f32(&tt, g_buf, 8, SHAPE(256, 256, 256, 256, 256, 256, 256, 256), NULL);
  assert_status(CHECK(tt, s), OSFT_STATUS_SHAPE_MISMATCH);
  /* The largest element count that fits is still counted exactly. */
  make_f32(&tt, g_buf, 1, SHAPE(INT64_MAX), NULL);
  assert_int_equal(osfti_numel(&tt.t), INT64_MAX);
}

/* ------------------------------------------------------------- data */

static void test_data_null(void **state) {
  osfti_tensor_spec s = spec_any();
  test_tensor tt;
  make_f32(&tt, NULL, 2, SHAPE(3, 4), NULL);
  assert_status(CHECK(tt, s), OSFT_STATUS_INVALID_ARGUMENT);
  make_f32(&tt, NULL, 1, SHAPE(1), NULL);
  assert_status(CHECK(tt, s), OSFT_STATUS_INVALID_ARGUMENT);
  make_f32(&tt, NULL, 0, NULL, NULL); /* a scalar has one element */
  assert_status(CHECK(tt, s), OSFT_STATUS_INVALID_ARGUMENT);
  /* A byte_offset does not make a NULL pointer valid. */
  make_f32(&tt, NULL, 1, SHAPE(4), NULL);
  tt.t.byte_offset = 64;
  assert_status(CHECK(tt, s), OSFT_STATUS_INVALID_ARGUMENT);
}

static void test_data_null_empty(void **state) {
  osfti_tensor_spec s = spec_any();
  test_tensor tt;
  make_f32(&tt, NULL, 1, SHAPE(0), NULL);
  assert_ok(CHECK(tt, s));
  make_f32(&tt, NULL, 2, SHAPE(3, 0), NULL);
  assert_ok(CHECK(tt, s));
  make_f32(&tt, NULL, 3, SHAPE(0, 5, 7), NULL);
  assert_ok(CHECK(tt, s));
  s.layout = OSFTI_LAYOUT_ROWS;
  make_f32(&tt, NULL, 2, SHAPE(0, 4), NULL);
  assert_ok(CHECK(tt, s));
}

/* Shapes whose byte size overflows are refused before anything reads them. */
static void test_byte_size_overflow(void **state) {
  (void)state;
  osfti_tensor_spec s = spec_rows();
  test_tensor tt;
  make_f32(&tt, g_buf, 1, SHAPE(INT64_MAX / 2), NULL);
  assert_status(CHECK(tt, s), OSFT_STATUS_SHAPE_MISMATCH);
}

/* ----------------------------------------------------------- numel */

static void test_numel(void **state) {
  (void)state;
  test_tensor tt;
  make_f32(&tt, g_buf, 0, NULL, NULL);
  assert_int_equal(osfti_numel(&tt.t), 1);
  make_f32(&tt, g_buf, 1, SHAPE(7), NULL);
  assert_int_equal(osfti_numel(&tt.t), 7);
  make_f32(&tt, g_buf, 2, SHAPE(3, 4), SHAPE(6, 1)); /* strides don't count */
  assert_int_equal(osfti_numel(&tt.t), 12);
  make_f32(&tt, g_buf, 4, SHAPE(2, 3, 4, 5), NULL);
  assert_int_equal(osfti_numel(&tt.t), 120);
  make_f32(&tt, g_buf, 8, SHAPE(1, 2, 1, 2, 1, 2, 1, 2), NULL);
  assert_int_equal(osfti_numel(&tt.t), 16);
  make_f32(&tt, g_buf, 1, SHAPE(0), NULL);
  assert_int_equal(osfti_numel(&tt.t), 0);
  make_f32(&tt, g_buf, 3, SHAPE(3, 0, 4), NULL);
  assert_int_equal(osfti_numel(&tt.t), 0);
  make_f32(&tt, g_buf, 2, SHAPE(5, 0), NULL);
  assert_int_equal(osfti_numel(&tt.t), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_null_tensor_required),
      cmocka_unit_test(test_null_tensor_optional),
      cmocka_unit_test(test_rank_range),
      cmocka_unit_test(test_rank_exact),
      cmocka_unit_test(test_rank_scalar),
      cmocka_unit_test(test_rank_invalid_ndim),
      cmocka_unit_test(test_rank_null_shape),
      cmocka_unit_test(test_trailing_dims_exact),
      cmocka_unit_test(test_trailing_dims_any),
      cmocka_unit_test(test_trailing_dims_any_leading_count),
      cmocka_unit_test(test_negative_dim),
      cmocka_unit_test(test_overflowing_numel),
      cmocka_unit_test(test_data_null),
      cmocka_unit_test(test_data_null_empty),
      cmocka_unit_test(test_byte_size_overflow),
      cmocka_unit_test(test_numel),
  };
  return cmocka_run_group_tests_name("tensor_check_shapes", tests, tt_setup, tt_teardown);
}
