/* Helpers of the tests of the internal tensor validation layer
 * (src/core/tensor_check.h and src/core/dtype.h; test_tensor_check_*.c):
 * tensors over static storage, the specs the checks run against, and CHECK,
 * which runs a check on the group's CPU context. */
#ifndef OSFTRT_TENSOR_CHECK_TESTLIB_H
#define OSFTRT_TENSOR_CHECK_TESTLIB_H

#include <limits.h>
#include <stdint.h>
#include <string.h>

#include "test_util.h"
#include "core/tensor_check.h"

/* ------------------------------------------------------------ helpers */

/* Backing storage for the tensors: 8-byte aligned (every dtype's size). */
extern double g_buf[1024];

extern double g_other[1024];

#define SHAPE(...) ((const int64_t[]){__VA_ARGS__})

#define ALL_DTYPES (OSFTI_FLOATS | OSFTI_INTS)

/* A tensor over `data` of dtype (code, bits) on device `dev` with `ndim`
 * dims from `shape` and, unless NULL, explicit `strides`. */
void make(test_tensor *tt, void *data, uint8_t code, uint8_t bits, int dev, int ndim,
          const int64_t *shape, const int64_t *strides);

/* A float32 CPU tensor. */
void make_f32(test_tensor *tt, void *data, int ndim, const int64_t *shape,
              const int64_t *strides);

/* Accepts every dtype, rank 0..8, any sizes, compact layout. */
osfti_tensor_spec spec_any(void);

osfti_tensor_spec spec_rows(void);

osft_context_t ctx_of(void **state);

/* Checks `tt` against `spec` on the test's CPU context. */
#define CHECK(tt, spec) osfti_check_tensor(ctx_of(state), &(tt).t, &(spec))

typedef struct dtype_case_s {
  uint8_t code, bits;
  osfti_dtype_t dtype;
  size_t size;
  const char *name;
} dtype_case;

extern const dtype_case k_dtypes[6]; /* every dtype the layer supports */

#define N_DTYPES (sizeof k_dtypes / sizeof k_dtypes[0])

#endif
