/* Internal: the one validation layer every operation runs on its DLTensor
 * arguments before it writes anything (see osftrt/tensor.h for the rules).
 * C-callable; each check returns a status and records a message naming the
 * argument. */
#ifndef OSFTRT_SRC_CORE_TENSOR_CHECK_H
#define OSFTRT_SRC_CORE_TENSOR_CHECK_H

#include <stdint.h>

#include "core/dtype.h"
#include "osftrt/context.h"
#include "osftrt/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define OSFTI_MAX_RANK 8
/* In osfti_tensor_spec.dims: any size. */
#define OSFTI_ANY (-1)

typedef enum osfti_layout_e {
  /* Compact row-major (strides NULL or equal to it; size-1 dims may carry
   * any stride, as PyTorch gives them). */
  OSFTI_LAYOUT_CONTIGUOUS = 0,
  /* A row-major matrix whose rows may be padded: unit stride in the last
   * dim, the leading dims collapse into one row dim with a row stride >= the
   * row length. What BLAS accepts with a leading dimension. */
  OSFTI_LAYOUT_ROWS = 1
} osfti_layout_t;

typedef struct osfti_tensor_spec_s {
  const char *name; /* the argument's name, for messages */
  unsigned dtypes;  /* mask of accepted osfti_dtype_t */
  int min_rank;     /* accepted rank range; equal for an exact rank */
  int max_rank;
  int n_dims;                   /* number of entries in dims: the trailing dims */
  int64_t dims[OSFTI_MAX_RANK]; /* expected trailing sizes or OSFTI_ANY */
  osfti_layout_t layout;
  int optional; /* a NULL DLTensor pointer is accepted */
} osfti_tensor_spec;

/* Checks `t` against `spec` and the device of `ctx` (a live context).
 * A NULL `t` passes only if spec->optional. */
osft_status_t osfti_check_tensor(osft_context_t ctx, const DLTensor *t,
                                 const osfti_tensor_spec *spec);

/* OSFT_STATUS_ALIASING if the memory ranges of `a` and `b` overlap (either
 * may be NULL or empty: no overlap). */
osft_status_t osfti_check_no_overlap(const char *name_a, const DLTensor *a,
                                     const char *name_b, const DLTensor *b);

/* OSFT_STATUS_DTYPE_MISMATCH unless `a` and `b` have the same dtype. */
osft_status_t osfti_check_same_dtype(const char *name_a, const DLTensor *a,
                                     const char *name_b, const DLTensor *b);

/* Number of elements; 0 for an empty tensor. Assumes a checked tensor. */
int64_t osfti_numel(const DLTensor *t);

/* A checked tensor seen as a row-major matrix: leading dims flattened into
 * rows, the last dim as columns, `ld` the row stride in elements (cols for
 * a compact tensor; 1-D tensors are one row). */
typedef struct osfti_matrix_s {
  void *data; /* first element (byte_offset applied) */
  int64_t rows, cols, ld;
  osfti_dtype_t dtype;
} osfti_matrix;

osfti_matrix osfti_as_matrix(const DLTensor *t);

#ifdef __cplusplus
}
#endif

#endif
