/* Unit tests of the internal tensor validation layer (src/core/tensor_check.h
 * and src/core/dtype.h): the checks every operation runs on its DLTensor
 * arguments before it writes anything (rules in osftrt/tensor.h).
 *
 * The osfti_* checks record their message as a pending error (it becomes
 * osft_last_error() only at a public boundary), so these tests assert the
 * status codes, not the message text. */
#include <limits.h>
#include <stdint.h>
#include <string.h>

#include "core/tensor_check.h"
#include "test_util.h"

/* ------------------------------------------------------------ helpers */

/* Backing storage for the tensors: 8-byte aligned (every dtype's size). */
static double g_buf[1024];
static double g_other[1024];

#define SHAPE(...) ((const int64_t[]){__VA_ARGS__})
#define ALL_DTYPES (OSFTI_FLOATS | OSFTI_INTS)

/* A tensor over `data` of dtype (code, bits) on device `dev` with `ndim`
 * dims from `shape` and, unless NULL, explicit `strides`. */
static void make(test_tensor *tt, void *data, uint8_t code, uint8_t bits, int dev,
                 int ndim, const int64_t *shape, const int64_t *strides) {
  test_tensor_make(tt, data, code, bits, dev, 0, 0);
  tt->t.ndim = ndim;
  for (int i = 0; i < ndim; ++i) tt->shape[i] = shape[i];
  if (strides != NULL) {
    for (int i = 0; i < ndim; ++i) tt->strides[i] = strides[i];
    tt->t.strides = tt->strides;
  }
}

/* A float32 CPU tensor. */
static void make_f32(test_tensor *tt, void *data, int ndim, const int64_t *shape,
                     const int64_t *strides) {
  make(tt, data, kDLFloat, 32, kDLCPU, ndim, shape, strides);
}

/* Accepts every dtype, rank 0..8, any sizes, compact layout. */
static osfti_tensor_spec spec_any(void) {
  osfti_tensor_spec s = {
      .name = "x",
      .dtypes = ALL_DTYPES,
      .min_rank = 0,
      .max_rank = OSFTI_MAX_RANK,
      .n_dims = 0,
      .layout = OSFTI_LAYOUT_CONTIGUOUS,
      .optional = 0,
  };
  return s;
}

static osfti_tensor_spec spec_rows(void) {
  osfti_tensor_spec s = spec_any();
  s.layout = OSFTI_LAYOUT_ROWS;
  return s;
}

static osft_context_t ctx_of(void **state) {
  return (osft_context_t)*state;
}

/* Checks `tt` against `spec` on the test's CPU context. */
#define CHECK(tt, spec) osfti_check_tensor(ctx_of(state), &(tt).t, &(spec))

static int setup_cpu(void **state) {
  osft_context_t ctx = NULL;
  if (osft_context_create(&ctx, NULL) != OSFT_STATUS_SUCCESS) return -1;
  *state = ctx;
  return 0;
}

static int teardown_cpu(void **state) {
  return osft_context_destroy(ctx_of(state)) == OSFT_STATUS_SUCCESS ? 0 : -1;
}

typedef struct dtype_case_s {
  uint8_t code, bits;
  osfti_dtype_t dtype;
  size_t size;
  const char *name;
} dtype_case;

static const dtype_case k_dtypes[] = {
    {kDLFloat, 32, OSFTI_F32, 4, "float32"}, {kDLFloat, 64, OSFTI_F64, 8, "float64"},
    {kDLFloat, 16, OSFTI_F16, 2, "float16"}, {kDLBfloat, 16, OSFTI_BF16, 2, "bfloat16"},
    {kDLInt, 32, OSFTI_I32, 4, "int32"},     {kDLInt, 64, OSFTI_I64, 8, "int64"},
};
#define N_DTYPES (sizeof k_dtypes / sizeof k_dtypes[0])

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

/* Shapes whose byte size overflows are refused before anything reads them. */
static void test_byte_size_overflow(void **state) {
  (void)state;
  osfti_tensor_spec s = spec_rows();
  test_tensor tt;
  make_f32(&tt, g_buf, 1, SHAPE(INT64_MAX / 2), NULL);
  assert_status(CHECK(tt, s), OSFT_STATUS_SHAPE_MISMATCH);
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
      cmocka_unit_test(test_null_tensor_required),
      cmocka_unit_test(test_null_tensor_optional),
      cmocka_unit_test(test_dtype_each_supported),
      cmocka_unit_test(test_dtype_float_vs_int_masks),
      cmocka_unit_test(test_dtype_unsupported_rejected),
      cmocka_unit_test(test_dtype_lanes_rejected),
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
      cmocka_unit_test(test_byte_size_overflow),
      cmocka_unit_test(test_as_matrix),
      cmocka_unit_test(test_as_matrix_data_and_dtype),
      cmocka_unit_test(test_numel),
      cmocka_unit_test(test_overlap_disjoint_buffers),
      cmocka_unit_test(test_overlap_same_buffer),
      cmocka_unit_test(test_overlap_partial),
      cmocka_unit_test(test_overlap_adjacent),
      cmocka_unit_test(test_overlap_strided_views),
      cmocka_unit_test(test_overlap_empty_and_null),
      cmocka_unit_test(test_overlap_devices),
      cmocka_unit_test(test_same_dtype),
      cmocka_unit_test(test_failed_check_modifies_nothing),
      cmocka_unit_test(test_dtype_from_dl),
      cmocka_unit_test(test_dtype_size_and_name),
      cmocka_unit_test(test_dtype_mask_names),
  };
  return cmocka_run_group_tests(tests, setup_cpu, teardown_cpu);
}
