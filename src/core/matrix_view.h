/* Internal: row-major matrix and vector views of memory on a context's
 * device, and the sub-views every layer slices them into. The kernels
 * (backend/) take them; tensor_args turns checked DLTensors into them. */
#ifndef OSFTRT_SRC_CORE_MATRIX_VIEW_H
#define OSFTRT_SRC_CORE_MATRIX_VIEW_H

#include <cstdint>

#include "core/dtype.h"

namespace osft {

/* A row-major matrix view on the context's device: element (i, j) at
 * data + (i * ld + j) * size(dtype). */
struct Mat {
  void *data = nullptr;
  int64_t rows = 0, cols = 0, ld = 0;
  osfti_dtype_t dtype = OSFTI_DTYPE_INVALID;
};

/* A contiguous vector view. */
struct Vec {
  void *data = nullptr;
  int64_t n = 0;
  osfti_dtype_t dtype = OSFTI_DTYPE_INVALID;
};

/* Column range [first, first + count) of a matrix view. */
inline Mat cols_of(const Mat &m, int64_t first, int64_t count) noexcept {
  /* An empty view (e.g. no tokens: no scratch) may have NULL data: keep it
   * NULL rather than offset a null pointer (UB). */
  if (m.data == nullptr) return Mat{nullptr, m.rows, count, m.ld, m.dtype};
  return Mat{static_cast<char *>(m.data) +
                 first * static_cast<int64_t>(osfti_dtype_size(m.dtype)),
             m.rows, count, m.ld, m.dtype};
}

/* Row range [first, first + count) of a matrix view. */
inline Mat rows_of(const Mat &m, int64_t first, int64_t count) noexcept {
  if (m.data == nullptr) return Mat{nullptr, count, m.cols, m.ld, m.dtype};
  return Mat{static_cast<char *>(m.data) +
                 first * m.ld * static_cast<int64_t>(osfti_dtype_size(m.dtype)),
             count, m.cols, m.ld, m.dtype};
}

/* A vector as a 1 x n matrix. */
inline Mat as_row(const Vec &v) noexcept {
  return Mat{v.data, 1, v.n, v.n, v.dtype};
}

enum class Op { N, T };         /* use a matrix as is, or transposed */
enum class Axis { rows, cols }; /* which index a vector runs along */

}  // namespace osft

#endif
