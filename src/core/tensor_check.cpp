#include "core/tensor_check.h"

#include <cstdint>
#include <string>

#include "core/context_impl.h"
#include "core/error.h"
#include "core/options.h"

namespace {

std::string dims_string(const int64_t *dims, int n, bool leading) {
  std::string s = "[";
  if (leading) s += n > 0 ? "..., " : "...";
  for (int i = 0; i < n; ++i) {
    if (i > 0) s += ", ";
    s += dims[i] == OSFTI_ANY ? std::string("*") : std::to_string(dims[i]);
  }
  return s + "]";
}

std::string expected_shape(const osfti_tensor_spec &spec) {
  return dims_string(spec.dims, spec.n_dims,
                     spec.max_rank > spec.n_dims || spec.min_rank != spec.max_rank);
}

const char *dl_device_name(int type) {
  switch (type) {
    case kDLCPU: return "cpu";
    case kDLCUDA: return "cuda";
    case kDLCUDAHost: return "cuda_host";
    case kDLCUDAManaged: return "cuda_managed";
    default: return "an unsupported device type";
  }
}

/* DLDevice.device_type may hold any int from a C caller; read it as one. */
int device_type_of(DLDevice d) {
  return osft::raw_enum(d.device_type);
}

bool host_memory(int type) {
  return type == kDLCPU || type == kDLCUDAHost;
}

bool device_matches(const osft::Context &ctx, DLDevice d) {
  const int type = device_type_of(d);
  if (!osft::on_cuda(ctx)) return host_memory(type);
  return (type == kDLCUDA || type == kDLCUDAManaged) && d.device_id == ctx.device_id;
}

/* The stride between rows when the leading dims are flattened, or 0 if
 * they cannot be (a gap or overlap between leading dims, a non-positive or
 * overflowing stride). Dims of size 1 impose nothing. For a compact tensor
 * this is the row length. */
int64_t flattened_row_stride(const DLTensor *t) {
  const int n = t->ndim;
  const int64_t cols = n > 0 ? t->shape[n - 1] : 1;
  if (t->strides == nullptr || n < 2) return cols;
  bool found = false;
  int64_t row_stride = cols, inner_extent = 0;
  for (int i = n - 2; i >= 0; --i) {
    if (t->shape[i] == 1) continue;
    const int64_t stride = t->strides[i];
    if (stride <= 0) return 0;
    if (!found) {
      row_stride = stride;
      found = true;
    } else if (stride != inner_extent) {
      return 0;
    }
    if (__builtin_mul_overflow(stride, t->shape[i], &inner_extent)) return 0;
  }
  return row_stride;
}

bool is_compact(const DLTensor *t) {
  if (t->strides == nullptr) return true;
  int64_t expected = 1;
  for (int i = t->ndim - 1; i >= 0; --i) {
    if (t->shape[i] != 1 && t->strides[i] != expected) return false;
    expected *= t->shape[i];
  }
  return true;
}

bool has_padded_rows(const DLTensor *t) {
  const int n = t->ndim;
  if (n == 0) return true;
  if (t->strides != nullptr && t->shape[n - 1] != 1 && t->strides[n - 1] != 1)
    return false;
  const int64_t ld = flattened_row_stride(t);
  return ld >= t->shape[n - 1] && ld >= 1;
}

std::string strides_string(const DLTensor *t) {
  return t->strides == nullptr ? std::string("NULL")
                               : dims_string(t->strides, t->ndim, false);
}

osft_status_t check_shape(const DLTensor *t, const osfti_tensor_spec &s) {
  if (t->ndim < 0 || t->ndim > OSFTI_MAX_RANK || (t->ndim > 0 && t->shape == nullptr))
    return osfti_set_error(OSFT_STATUS_SHAPE_MISMATCH,
                           "%s: ndim %d with %s shape is not a valid tensor", s.name,
                           t->ndim, t->shape ? "a" : "a NULL");
  int64_t numel = 1;
  for (int i = 0; i < t->ndim; ++i) {
    if (t->shape[i] < 0 || (t->shape[i] > 0 && numel > INT64_MAX / t->shape[i]))
      return osfti_set_error(OSFT_STATUS_SHAPE_MISMATCH,
                             "%s: shape %s has a negative or overflowing size", s.name,
                             dims_string(t->shape, t->ndim, false).c_str());
    numel *= t->shape[i];
  }
  /* The shape's text only for a message: building it on every check was a
   * fifth of a small call's fixed cost (issue 55). */
  if (t->ndim < s.min_rank || t->ndim > s.max_rank)
    return osfti_set_error(OSFT_STATUS_SHAPE_MISMATCH,
                           "%s: rank %d (shape %s), expected shape %s", s.name, t->ndim,
                           dims_string(t->shape, t->ndim, false).c_str(),
                           expected_shape(s).c_str());
  for (int j = 0; j < s.n_dims; ++j) {
    const int axis = t->ndim - s.n_dims + j;
    const int64_t want = s.dims[j];
    if (axis < 0 || (want != OSFTI_ANY && t->shape[axis] != want))
      return osfti_set_error(OSFT_STATUS_SHAPE_MISMATCH, "%s: shape %s, expected %s",
                             s.name, dims_string(t->shape, t->ndim, false).c_str(),
                             expected_shape(s).c_str());
  }
  return OSFT_STATUS_SUCCESS;
}

osft_status_t check_dtype(const DLTensor *t, const osfti_tensor_spec &s) {
  const osfti_dtype_t dt = osfti_dtype_from_dl(t->dtype);
  if (dt != OSFTI_DTYPE_INVALID && (s.dtypes & dt) != 0) return OSFT_STATUS_SUCCESS;
  char accepted[96];
  osfti_dtype_mask_names(s.dtypes, accepted, sizeof accepted);
  return osfti_set_error(OSFT_STATUS_DTYPE_MISMATCH,
                         "%s: dtype (code %d, %d bits, %d lanes)%s%s, expected %s",
                         s.name, t->dtype.code, t->dtype.bits, t->dtype.lanes,
                         dt != OSFTI_DTYPE_INVALID ? " = " : "",
                         dt != OSFTI_DTYPE_INVALID ? osfti_dtype_name(dt) : "", accepted);
}

/* The whole tensor, padding included, must be addressable in bytes. */
osft_status_t check_byte_size(const DLTensor *t, const osfti_tensor_spec &s) {
  const int64_t elem =
      static_cast<int64_t>(osfti_dtype_size(osfti_dtype_from_dl(t->dtype)));
  int64_t bytes = 0;
  if (!__builtin_mul_overflow(osfti_numel(t), elem, &bytes)) return OSFT_STATUS_SUCCESS;
  return osfti_set_error(OSFT_STATUS_SHAPE_MISMATCH,
                         "%s: shape %s is too large to address in bytes", s.name,
                         dims_string(t->shape, t->ndim, false).c_str());
}

/* The bytes from the first to the last element of a tensor whose layout
 * passed (so every dim of size > 1 has a positive stride) fit in an int64:
 * byte_extent() and every address computed from the strides stay defined. */
bool extent_fits(const DLTensor *t, int64_t elem) {
  if (t->strides == nullptr) return true; /* compact: numel * elem was checked */
  int64_t high = 0;
  for (int i = 0; i < t->ndim; ++i) {
    if (t->shape[i] <= 1) continue;
    int64_t reach = 0;
    if (t->strides[i] <= 0 ||
        __builtin_mul_overflow(t->shape[i] - 1, t->strides[i], &reach) ||
        __builtin_add_overflow(high, reach, &high))
      return false;
  }
  int64_t bytes = 0;
  return !__builtin_add_overflow(high, 1, &high) &&
         !__builtin_mul_overflow(high, elem, &bytes);
}

osft_status_t check_layout(const DLTensor *t, const osfti_tensor_spec &s) {
  const size_t elem = osfti_dtype_size(osfti_dtype_from_dl(t->dtype));
  const uintptr_t first = reinterpret_cast<uintptr_t>(t->data) + t->byte_offset;
  if (first % elem != 0)
    return osfti_set_error(OSFT_STATUS_BAD_LAYOUT,
                           "%s: data + byte_offset (%p + %llu) is not aligned to its "
                           "%zu-byte elements",
                           s.name, t->data,
                           static_cast<unsigned long long>(t->byte_offset), elem);
  const bool ok =
      s.layout == OSFTI_LAYOUT_CONTIGUOUS ? is_compact(t) : has_padded_rows(t);
  if (ok && !extent_fits(t, static_cast<int64_t>(elem)))
    return osfti_set_error(OSFT_STATUS_BAD_LAYOUT,
                           "%s: strides %s for shape %s reach beyond the address space",
                           s.name, strides_string(t).c_str(),
                           dims_string(t->shape, t->ndim, false).c_str());
  if (ok) return OSFT_STATUS_SUCCESS;
  return osfti_set_error(
      OSFT_STATUS_BAD_LAYOUT, "%s: strides %s for shape %s, expected %s", s.name,
      strides_string(t).c_str(), dims_string(t->shape, t->ndim, false).c_str(),
      s.layout == OSFTI_LAYOUT_CONTIGUOUS
          ? "a compact row-major tensor"
          : "row-major rows (unit stride in the last dim, row stride >= row "
            "length)");
}

/* [lo, hi) byte range touched by a non-empty tensor. */
void byte_extent(const DLTensor *t, uintptr_t *lo, uintptr_t *hi) {
  const int64_t elem =
      static_cast<int64_t>(osfti_dtype_size(osfti_dtype_from_dl(t->dtype)));
  int64_t low = 0, high = 0, compact = 1;
  for (int i = t->ndim - 1; i >= 0; --i) {
    const int64_t stride = t->strides ? t->strides[i] : compact;
    const int64_t reach = (t->shape[i] - 1) * stride;
    (reach < 0 ? low : high) += reach;
    compact *= t->shape[i];
  }
  const uintptr_t base = reinterpret_cast<uintptr_t>(t->data) + t->byte_offset;
  *lo = base + static_cast<uintptr_t>(low * elem);
  *hi = base + static_cast<uintptr_t>((high + 1) * elem);
}

bool same_memory_space(DLDevice a, DLDevice b) {
  const int ta = device_type_of(a), tb = device_type_of(b);
  if (host_memory(ta) && host_memory(tb)) return true;
  return ta == tb && a.device_id == b.device_id;
}

}  // namespace

extern "C" osft_status_t osfti_check_tensor(osft_context_t ctx, const DLTensor *t,
                                            const osfti_tensor_spec *spec) {
  const osfti_tensor_spec &s = *spec;
  if (t == nullptr)
    return s.optional
               ? OSFT_STATUS_SUCCESS
               : osfti_set_error(OSFT_STATUS_INVALID_ARGUMENT, "%s: NULL tensor", s.name);
  osft_status_t st = check_shape(t, s);
  if (st == OSFT_STATUS_SUCCESS) st = check_dtype(t, s);
  if (st == OSFT_STATUS_SUCCESS) st = check_byte_size(t, s);
  if (st != OSFT_STATUS_SUCCESS) return st;
  if (t->data == nullptr && osfti_numel(t) > 0)
    return osfti_set_error(OSFT_STATUS_INVALID_ARGUMENT,
                           "%s: data is NULL for a non-empty tensor", s.name);
  if (!device_matches(*ctx, t->device))
    return osfti_set_error(OSFT_STATUS_DEVICE_MISMATCH,
                           "%s: on %s device %d, but the context is %s device %d", s.name,
                           dl_device_name(device_type_of(t->device)), t->device.device_id,
                           osft::on_cuda(*ctx) ? "CUDA" : "CPU", ctx->device_id);
  if (osfti_numel(t) == 0) return OSFT_STATUS_SUCCESS;
  return check_layout(t, s);
}

namespace {

/* Column slices of one row-major matrix (same row stride) interleave in
 * address space without sharing an element, e.g. U_high and U_low as views
 * of one U. Exact for that case: b's rows, seen from a's row grid, start at
 * `shift` into each period and must fit in the gap after a's row. */
bool interleaved_disjoint(const DLTensor *a, const DLTensor *b) {
  if (a->ndim < 1 || b->ndim < 1 || !has_padded_rows(a) || !has_padded_rows(b))
    return false;
  const osfti_matrix ma = osfti_as_matrix(a), mb = osfti_as_matrix(b);
  const int64_t ea = static_cast<int64_t>(osfti_dtype_size(ma.dtype));
  const int64_t eb = static_cast<int64_t>(osfti_dtype_size(mb.dtype));
  const int64_t period = ma.ld * ea;
  if (ma.rows < 2 || mb.rows < 2 || period <= 0 || mb.ld * eb != period) return false;
  const int64_t wa = ma.cols * ea, wb = mb.cols * eb;
  if (wa > period || wb > period) return false;
  const int64_t delta = static_cast<int64_t>(reinterpret_cast<uintptr_t>(mb.data) -
                                             reinterpret_cast<uintptr_t>(ma.data));
  const int64_t shift = ((delta % period) + period) % period;
  return shift >= wa && shift + wb <= period;
}

}  // namespace

extern "C" osft_status_t osfti_check_no_overlap(const char *name_a, const DLTensor *a,
                                                const char *name_b, const DLTensor *b) {
  if (a == nullptr || b == nullptr || osfti_numel(a) == 0 || osfti_numel(b) == 0 ||
      !same_memory_space(a->device, b->device))
    return OSFT_STATUS_SUCCESS;
  uintptr_t a_lo, a_hi, b_lo, b_hi;
  byte_extent(a, &a_lo, &a_hi);
  byte_extent(b, &b_lo, &b_hi);
  if (a_lo < b_hi && b_lo < a_hi && !interleaved_disjoint(a, b))
    return osfti_set_error(OSFT_STATUS_ALIASING,
                           "%s and %s share memory; they must not overlap", name_a,
                           name_b);
  return OSFT_STATUS_SUCCESS;
}

extern "C" osft_status_t osfti_check_same_dtype(const char *name_a, const DLTensor *a,
                                                const char *name_b, const DLTensor *b) {
  const osfti_dtype_t da = osfti_dtype_from_dl(a->dtype);
  const osfti_dtype_t db = osfti_dtype_from_dl(b->dtype);
  if (da == db && da != OSFTI_DTYPE_INVALID) return OSFT_STATUS_SUCCESS;
  return osfti_set_error(OSFT_STATUS_DTYPE_MISMATCH,
                         "%s: dtype %s, but %s is %s; they must match", name_b,
                         osfti_dtype_name(db), name_a, osfti_dtype_name(da));
}

extern "C" int64_t osfti_numel(const DLTensor *t) {
  int64_t n = 1;
  for (int i = 0; i < t->ndim; ++i) n *= t->shape[i];
  return n;
}

extern "C" osfti_matrix osfti_as_matrix(const DLTensor *t) {
  osfti_matrix m;
  m.dtype = osfti_dtype_from_dl(t->dtype);
  /* An empty tensor may have NULL data with any byte_offset: no arithmetic
   * on a null pointer (UB). */
  m.data = t->data != nullptr ? static_cast<char *>(t->data) + t->byte_offset : nullptr;
  m.cols = t->ndim > 0 ? t->shape[t->ndim - 1] : 1;
  m.rows = m.cols > 0 ? osfti_numel(t) / m.cols : 0;
  if (m.cols == 0) {
    m.rows = 1;
    for (int i = 0; i + 1 < t->ndim; ++i) m.rows *= t->shape[i];
  }
  m.ld = flattened_row_stride(t);
  return m;
}
