/* Tensor checks of overlap (aliasing): disjoint buffers, the same buffer,
 * partial, adjacent and strided views, empty and NULL tensors, other
 * devices; and a failed check modifies nothing.
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

/* ------------------------------------------------------- no overlap */

/* Checks (a, b) and (b, a), which must agree. */
static void assert_overlap(const test_tensor *a, const test_tensor *b,
                           osft_status_t expected) {
  assert_status(osfti_check_no_overlap("a", a ? &a->t : NULL, "b", b ? &b->t : NULL),
                expected);
  assert_status(osfti_check_no_overlap("b", b ? &b->t : NULL, "a", a ? &a->t : NULL),
                expected);
}

static void test_overlap_disjoint_buffers(void **state) {
  (void)state;
  test_tensor a, b;
  make_f32(&a, g_buf, 2, SHAPE(3, 4), NULL);
  make_f32(&b, g_other, 2, SHAPE(3, 4), NULL);
  assert_overlap(&a, &b, OSFT_STATUS_SUCCESS);
}

static void test_overlap_same_buffer(void **state) {
  (void)state;
  test_tensor a, b;
  make_f32(&a, g_buf, 2, SHAPE(3, 4), NULL);
  assert_overlap(&a, &a, OSFT_STATUS_ALIASING);
  make_f32(&b, g_buf, 1, SHAPE(12), NULL); /* another view of it */
  assert_overlap(&a, &b, OSFT_STATUS_ALIASING);
  make_f32(&b, g_buf, 1, SHAPE(1), NULL); /* its first element */
  assert_overlap(&a, &b, OSFT_STATUS_ALIASING);
  make_f32(&a, g_buf, 0, NULL, NULL); /* two scalars */
  make_f32(&b, g_buf, 0, NULL, NULL);
  assert_overlap(&a, &b, OSFT_STATUS_ALIASING);
  /* The same array through a data pointer and through a byte_offset. */
  make_f32(&a, (float *)g_buf + 4, 1, SHAPE(4), NULL);
  make_f32(&b, g_buf, 1, SHAPE(4), NULL);
  b.t.byte_offset = 16;
  assert_overlap(&a, &b, OSFT_STATUS_ALIASING);
}

static void test_overlap_partial(void **state) {
  (void)state;
  float *f = (float *)g_buf;
  test_tensor a, b;
  make_f32(&a, f, 1, SHAPE(8), NULL);
  make_f32(&b, f + 4, 1, SHAPE(8), NULL); /* [4, 12) vs [0, 8) */
  assert_overlap(&a, &b, OSFT_STATUS_ALIASING);
  make_f32(&b, f + 7, 1, SHAPE(8), NULL); /* one shared element */
  assert_overlap(&a, &b, OSFT_STATUS_ALIASING);
  make_f32(&b, f + 2, 1, SHAPE(2), NULL); /* inside */
  assert_overlap(&a, &b, OSFT_STATUS_ALIASING);
  make_f32(&b, f, 1, SHAPE(8), NULL); /* via byte_offset */
  b.t.byte_offset = 7 * sizeof(float);
  assert_overlap(&a, &b, OSFT_STATUS_ALIASING);
  /* Element sizes differ: a float64[4] covers bytes [0, 32). */
  make(&a, g_buf, kDLFloat, 64, kDLCPU, 1, SHAPE(4), NULL);
  make_f32(&b, f + 7, 1, SHAPE(4), NULL); /* bytes [28, 44) */
  assert_overlap(&a, &b, OSFT_STATUS_ALIASING);
  make(&a, g_buf, kDLFloat, 16, kDLCPU, 1, SHAPE(16), NULL); /* [0, 32) */
  assert_overlap(&a, &b, OSFT_STATUS_ALIASING);
}

static void test_overlap_adjacent(void **state) {
  (void)state;
  float *f = (float *)g_buf;
  test_tensor a, b;
  make_f32(&a, f, 1, SHAPE(8), NULL);
  make_f32(&b, f + 8, 1, SHAPE(8), NULL);
  assert_overlap(&a, &b, OSFT_STATUS_SUCCESS);
  make_f32(&b, f, 1, SHAPE(8), NULL);
  b.t.byte_offset = 8 * sizeof(float);
  assert_overlap(&a, &b, OSFT_STATUS_SUCCESS);
  make_f32(&a, f, 2, SHAPE(2, 4), NULL); /* rows 0-1 and rows 2-3 */
  make_f32(&b, f + 8, 2, SHAPE(2, 4), NULL);
  assert_overlap(&a, &b, OSFT_STATUS_SUCCESS);
  make(&a, g_buf, kDLFloat, 64, kDLCPU, 1, SHAPE(4), NULL); /* bytes [0, 32) */
  make(&b, (char *)g_buf + 32, kDLFloat, 16, kDLCPU, 1, SHAPE(3), NULL);
  assert_overlap(&a, &b, OSFT_STATUS_SUCCESS);
  make(&b, (char *)g_buf + 30, kDLFloat, 16, kDLCPU, 1, SHAPE(3), NULL);
  assert_overlap(&a, &b, OSFT_STATUS_ALIASING);
}

static void test_overlap_strided_views(void **state) {
  (void)state;
  float *f = (float *)g_buf;
  test_tensor a, b;
  /* Padded rows [2, 4] with row stride 8 touch elements [0, 12). */
  make_f32(&a, f, 2, SHAPE(2, 4), SHAPE(8, 1));
  make_f32(&b, f + 12, 2, SHAPE(2, 4), SHAPE(8, 1));
  assert_overlap(&a, &b, OSFT_STATUS_SUCCESS);
  make_f32(&b, f + 11, 1, SHAPE(1), NULL);
  assert_overlap(&a, &b, OSFT_STATUS_ALIASING);
  make_f32(&b, f + 12, 1, SHAPE(1), NULL);
  assert_overlap(&a, &b, OSFT_STATUS_SUCCESS);
  /* A transposed view of the same storage. */
  make_f32(&a, f, 2, SHAPE(3, 4), NULL);
  make_f32(&b, f, 2, SHAPE(4, 3), SHAPE(1, 4));
  assert_overlap(&a, &b, OSFT_STATUS_ALIASING);
  /* Size-1 dims reach nothing, whatever their stride. */
  make_f32(&a, f, 2, SHAPE(1, 4), SHAPE(1000, 1));
  make_f32(&b, f + 4, 1, SHAPE(4), NULL);
  assert_overlap(&a, &b, OSFT_STATUS_SUCCESS);
  /* Negative strides reach below the first element: [3, -1] covers f[0..3]. */
  make_f32(&a, f + 3, 1, SHAPE(4), SHAPE(-1));
  make_f32(&b, f + 4, 1, SHAPE(4), NULL);
  assert_overlap(&a, &b, OSFT_STATUS_SUCCESS);
  make_f32(&b, f, 1, SHAPE(1), NULL);
  assert_overlap(&a, &b, OSFT_STATUS_ALIASING);
  /* Interleaved column slices of one [3, 8] matrix share no element:
   * columns 0-3 and 4-7 are disjoint, columns 0-4 and 4-7 are not, and a
   * slice that wraps into the next row's columns is not either. */
  make_f32(&a, f, 2, SHAPE(3, 4), SHAPE(8, 1));
  make_f32(&b, f + 4, 2, SHAPE(3, 4), SHAPE(8, 1));
  assert_overlap(&a, &b, OSFT_STATUS_SUCCESS);
  make_f32(&a, f, 2, SHAPE(3, 5), SHAPE(8, 1));
  assert_overlap(&a, &b, OSFT_STATUS_ALIASING);
  make_f32(&a, f + 2, 2, SHAPE(3, 2), SHAPE(8, 1));
  make_f32(&b, f + 5, 2, SHAPE(3, 3), SHAPE(8, 1));
  assert_overlap(&a, &b, OSFT_STATUS_SUCCESS);
  make_f32(&b, f + 5, 2, SHAPE(3, 6), SHAPE(8, 1)); /* wraps onto a's next row */
  assert_overlap(&a, &b, OSFT_STATUS_ALIASING);
  /* different row strides: judged by address range */
  make_f32(&a, f, 2, SHAPE(3, 4), SHAPE(8, 1));
  make_f32(&b, f + 4, 2, SHAPE(3, 4), SHAPE(9, 1));
  assert_overlap(&a, &b, OSFT_STATUS_ALIASING);
}

static void test_overlap_empty_and_null(void **state) {
  (void)state;
  test_tensor a, b;
  make_f32(&a, g_buf, 2, SHAPE(3, 4), NULL);
  make_f32(&b, g_buf, 2, SHAPE(0, 4), NULL);
  assert_overlap(&a, &b, OSFT_STATUS_SUCCESS);
  make_f32(&b, g_buf, 2, SHAPE(3, 0), NULL);
  assert_overlap(&a, &b, OSFT_STATUS_SUCCESS);
  make_f32(&b, NULL, 1, SHAPE(0), NULL);
  assert_overlap(&a, &b, OSFT_STATUS_SUCCESS);
  assert_overlap(&b, &b, OSFT_STATUS_SUCCESS);
  assert_overlap(&a, NULL, OSFT_STATUS_SUCCESS);
  assert_overlap(NULL, NULL, OSFT_STATUS_SUCCESS);
}

static void test_overlap_devices(void **state) {
  (void)state;
  test_tensor a, b;
  /* The same address on different devices is different memory. */
  make(&a, g_buf, kDLFloat, 32, kDLCPU, 1, SHAPE(8), NULL);
  make(&b, g_buf, kDLFloat, 32, kDLCUDA, 1, SHAPE(8), NULL);
  assert_overlap(&a, &b, OSFT_STATUS_SUCCESS);
  make(&a, g_buf, kDLFloat, 32, kDLCUDA, 1, SHAPE(8), NULL);
  b.t.device.device_id = 1;
  assert_overlap(&a, &b, OSFT_STATUS_SUCCESS);
  /* ... but on the same device it is the same memory. */
  b.t.device.device_id = 0;
  assert_overlap(&a, &b, OSFT_STATUS_ALIASING);
  /* Pinned host memory and CPU memory are one address space. */
  make(&a, g_buf, kDLFloat, 32, kDLCPU, 1, SHAPE(8), NULL);
  make(&b, g_buf, kDLFloat, 32, kDLCUDAHost, 1, SHAPE(8), NULL);
  assert_overlap(&a, &b, OSFT_STATUS_ALIASING);
  make(&b, (float *)g_buf + 8, kDLFloat, 32, kDLCUDAHost, 1, SHAPE(8), NULL);
  assert_overlap(&a, &b, OSFT_STATUS_SUCCESS);
}

/* -------------------------------------- failures modify nothing */

typedef struct snapshot_s {
  test_tensor tt;
  double data[64];
} snapshot;

static void test_failed_check_modifies_nothing(void **state) {
  osfti_tensor_spec rows = spec_rows();
  osfti_tensor_spec exact = {.name = "w",
                             .dtypes = OSFTI_F32,
                             .min_rank = 2,
                             .max_rank = 2,
                             .n_dims = 2,
                             .dims = {3, 4}};
  osfti_tensor_spec f64 = spec_any();
  f64.dtypes = OSFTI_F64;
  osfti_tensor_spec any = spec_any();

  for (int c = 0; c < 8; ++c) {
    test_tensor tt;
    const osfti_tensor_spec *s = &any;
    osft_status_t expected = OSFT_STATUS_SUCCESS;
    for (int i = 0; i < 64; ++i) g_buf[i] = 0.5 * i;
    switch (c) {
      case 0: /* dtype */
        make_f32(&tt, g_buf, 2, SHAPE(3, 4), NULL);
        s = &f64, expected = OSFT_STATUS_DTYPE_MISMATCH;
        break;
      case 1: /* shape */
        make_f32(&tt, g_buf, 2, SHAPE(4, 3), NULL);
        s = &exact, expected = OSFT_STATUS_SHAPE_MISMATCH;
        break;
      case 2: /* rank */
        make_f32(&tt, g_buf, 3, SHAPE(1, 3, 4), NULL);
        s = &exact, expected = OSFT_STATUS_SHAPE_MISMATCH;
        break;
      case 3: /* contiguous layout */
        make_f32(&tt, g_buf, 2, SHAPE(3, 4), SHAPE(1, 3));
        expected = OSFT_STATUS_BAD_LAYOUT;
        break;
      case 4: /* rows layout */
        make_f32(&tt, g_buf, 3, SHAPE(2, 3, 4), SHAPE(20, 6, 1));
        s = &rows, expected = OSFT_STATUS_BAD_LAYOUT;
        break;
      case 5: /* alignment */
        make_f32(&tt, g_buf, 2, SHAPE(3, 4), NULL);
        tt.t.byte_offset = 2;
        expected = OSFT_STATUS_BAD_LAYOUT;
        break;
      case 6: /* device */
        make(&tt, g_buf, kDLFloat, 32, kDLCUDA, 2, SHAPE(3, 4), NULL);
        expected = OSFT_STATUS_DEVICE_MISMATCH;
        break;
      default: /* negative size */
        make_f32(&tt, g_buf, 2, SHAPE(3, -4), NULL);
        expected = OSFT_STATUS_SHAPE_MISMATCH;
        break;
    }
    snapshot before;
    memcpy(&before.tt, &tt, sizeof tt);
    memcpy(before.data, g_buf, sizeof before.data);
    const osfti_tensor_spec spec_before = *s;

    assert_status(CHECK(tt, *s), expected);

    assert_memory_equal(&tt, &before.tt, sizeof tt);
    assert_ptr_equal(tt.t.shape, tt.shape);
    assert_memory_equal(g_buf, before.data, sizeof before.data);
    assert_memory_equal(s, &spec_before, sizeof spec_before);
    /* The overlap and dtype checks leave both tensors alone too. */
    test_tensor other;
    make_f32(&other, g_buf, 1, SHAPE(4), NULL);
    memcpy(&before.tt, &other, sizeof other);
    test_tensor tt_copy = tt;
    (void)osfti_check_no_overlap("a", &tt.t, "b", &other.t);
    (void)osfti_check_same_dtype("a", &tt.t, "b", &other.t);
    assert_memory_equal(&other, &before.tt, sizeof other);
    assert_memory_equal(&tt, &tt_copy, sizeof tt);
    assert_memory_equal(g_buf, before.data, sizeof before.data);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_overlap_disjoint_buffers),
      cmocka_unit_test(test_overlap_same_buffer),
      cmocka_unit_test(test_overlap_partial),
      cmocka_unit_test(test_overlap_adjacent),
      cmocka_unit_test(test_overlap_strided_views),
      cmocka_unit_test(test_overlap_empty_and_null),
      cmocka_unit_test(test_overlap_devices),
      cmocka_unit_test(test_failed_check_modifies_nothing),
  };
  return cmocka_run_group_tests_name("tensor_check_overlap", tests, tt_setup,
                                     tt_teardown);
}
