#include "tensor_check_testlib.h"

#include <limits.h>
#include <stdint.h>
#include <string.h>

#include "core/tensor_check.h"
#include "test_util.h"

double g_buf[1024];

double g_other[1024];

void make(test_tensor *tt, void *data, uint8_t code, uint8_t bits, int dev, int ndim,
          const int64_t *shape, const int64_t *strides) {
  test_tensor_make(tt, data, code, bits, dev, 0, 0);
  tt->t.ndim = ndim;
  for (int i = 0; i < ndim; ++i) tt->shape[i] = shape[i];
  if (strides != NULL) {
    for (int i = 0; i < ndim; ++i) tt->strides[i] = strides[i];
    tt->t.strides = tt->strides;
  }
}

void make_f32(test_tensor *tt, void *data, int ndim, const int64_t *shape,
              const int64_t *strides) {
  make(tt, data, kDLFloat, 32, kDLCPU, ndim, shape, strides);
}

osfti_tensor_spec spec_any(void) {
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

osfti_tensor_spec spec_rows(void) {
  osfti_tensor_spec s = spec_any();
  s.layout = OSFTI_LAYOUT_ROWS;
  return s;
}

osft_context_t ctx_of(void **state) {
  return (osft_context_t)*state;
}

const dtype_case k_dtypes[] = {
    {kDLFloat, 32, OSFTI_F32, 4, "float32"}, {kDLFloat, 64, OSFTI_F64, 8, "float64"},
    {kDLFloat, 16, OSFTI_F16, 2, "float16"}, {kDLBfloat, 16, OSFTI_BF16, 2, "bfloat16"},
    {kDLInt, 32, OSFTI_I32, 4, "int32"},     {kDLInt, 64, OSFTI_I64, 8, "int64"},
};
