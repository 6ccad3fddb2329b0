#include "core/tensor_args.h"

#include "core/error.h"

namespace osft {

osfti_tensor_spec matrix_spec(const char *name, unsigned dtypes, int64_t rows,
                              int64_t cols) {
  osfti_tensor_spec s{};
  s.name = name;
  s.dtypes = dtypes;
  s.min_rank = s.max_rank = s.n_dims = 2;
  s.dims[0] = rows;
  s.dims[1] = cols;
  s.layout = OSFTI_LAYOUT_ROWS;
  return s;
}

osfti_tensor_spec vector_spec(const char *name, unsigned dtypes, int64_t n) {
  osfti_tensor_spec s{};
  s.name = name;
  s.dtypes = dtypes;
  s.min_rank = s.max_rank = s.n_dims = 1;
  s.dims[0] = n;
  s.layout = OSFTI_LAYOUT_CONTIGUOUS;
  return s;
}

Mat as_mat(const DLTensor *t) {
  const osfti_matrix m = osfti_as_matrix(t);
  return Mat{m.data, m.rows, m.cols, m.ld, m.dtype};
}

Vec as_vec(const DLTensor *t) {
  /* NULL data (an empty tensor) stays NULL: no arithmetic on a null pointer. */
  return Vec{t->data != nullptr ? static_cast<char *>(t->data) + t->byte_offset : nullptr,
             t->ndim > 0 ? t->shape[0] : 1, osfti_dtype_from_dl(t->dtype)};
}

Mat checked_matrix(Context &ctx, const DLTensor *t, const char *name, unsigned dtypes,
                   int64_t rows, int64_t cols) {
  const osfti_tensor_spec s = matrix_spec(name, dtypes, rows, cols);
  throw_if_error(osfti_check_tensor(&ctx, t, &s));
  return as_mat(t);
}

Vec checked_vector(Context &ctx, const DLTensor *t, const char *name, unsigned dtypes,
                   int64_t n) {
  const osfti_tensor_spec s = vector_spec(name, dtypes, n);
  throw_if_error(osfti_check_tensor(&ctx, t, &s));
  return as_vec(t);
}

Mat checked_rows(Context &ctx, const DLTensor *t, const char *name, unsigned dtypes,
                 int64_t cols, const DLTensor *like, const char *like_name) {
  osfti_tensor_spec s{};
  s.name = name;
  s.dtypes = dtypes;
  s.min_rank = like != nullptr ? like->ndim : 1;
  s.max_rank = like != nullptr ? like->ndim : OSFTI_MAX_RANK;
  s.n_dims = 1;
  s.dims[0] = cols;
  s.layout = OSFTI_LAYOUT_ROWS;
  throw_if_error(osfti_check_tensor(&ctx, t, &s));
  if (like == nullptr) return as_mat(t);
  throw_if_error(osfti_check_same_dtype(like_name, like, name, t));
  for (int d = 0; d + 1 < t->ndim; ++d)
    if (t->shape[d] != like->shape[d])
      raise(OSFT_STATUS_SHAPE_MISMATCH,
            "%s: leading dim %d is %lld, but %s has %lld; they must match", name, d,
            static_cast<long long>(t->shape[d]), like_name,
            static_cast<long long>(like->shape[d]));
  return as_mat(t);
}

void check_no_overlap(const char *name_a, const DLTensor *a, const char *name_b,
                      const DLTensor *b) {
  throw_if_error(osfti_check_no_overlap(name_a, a, name_b, b));
}

}  // namespace osft
