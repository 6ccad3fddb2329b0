/* Internal: what operations use to validate their DLTensor arguments and
 * view them as backend matrices — throwing C++ conveniences over the
 * C-callable validation layer (core/tensor_check.h). */
#ifndef OSFTRT_SRC_CORE_TENSOR_ARGS_H
#define OSFTRT_SRC_CORE_TENSOR_ARGS_H

#include "core/context_impl.h"
#include "core/matrix_view.h"
#include "core/tensor_check.h"

namespace osft {

/* A 2-D row-major matrix (rows may be padded); OSFTI_ANY for any size. */
osfti_tensor_spec matrix_spec(const char *name, unsigned dtypes, int64_t rows,
                              int64_t cols);
/* A compact 1-D vector of n elements. */
osfti_tensor_spec vector_spec(const char *name, unsigned dtypes, int64_t n);

/* Views of a checked tensor. */
Mat as_mat(const DLTensor *t);
Vec as_vec(const DLTensor *t);

/* Validate (throwing the recorded status) and return the view. */
Mat checked_matrix(Context &ctx, const DLTensor *t, const char *name, unsigned dtypes,
                   int64_t rows, int64_t cols);
Vec checked_vector(Context &ctx, const DLTensor *t, const char *name, unsigned dtypes,
                   int64_t n);

/* Activations (..., cols), any leading dims flattened into rows, padded rows
 * allowed. With `like`, the dtype and every leading dim must match it. */
Mat checked_rows(Context &ctx, const DLTensor *t, const char *name, unsigned dtypes,
                 int64_t cols, const DLTensor *like = nullptr,
                 const char *like_name = nullptr);

/* Throws OSFT_STATUS_ALIASING if the two overlap (either may be NULL). */
void check_no_overlap(const char *name_a, const DLTensor *a, const char *name_b,
                      const DLTensor *b);

}  // namespace osft

#endif
