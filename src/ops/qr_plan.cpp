/* Batched QR: options and the validation of the caller's list, all before
 * anything is written. Overlaps are found by sorting the entries' address
 * ranges, so a list of thousands of matrices costs O(N log N), and only
 * ranges that touch get the exact check. */
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>

#include "core/error.h"
#include "core/options.h"
#include "core/tensor_args.h"
#include "ops/qr_ops.h"

namespace osft {
namespace {

constexpr size_t kOptionsV1Size = OSFTI_V1_SIZE(osft_qr_options_t, max_concurrency);
constexpr unsigned kQrDtypes = OSFTI_F32 | OSFTI_F64;

/* "a[12]": an entry's name for messages. */
struct EntryName {
  EntryName(const char *array, size_t i) {
    std::snprintf(text, sizeof text, "%s[%zu]", array, i);
  }
  char text[40];
};

/* LAPACK and cuSOLVER take 32-bit dimensions. */
void check_int_dims(const char *name, const Mat &m) {
  if (m.rows > INT_MAX || m.cols > INT_MAX || m.ld > INT_MAX)
    raise(OSFT_STATUS_NOT_SUPPORTED,
          "%s: shape [%lld, %lld] (row stride %lld) exceeds the 32-bit dimensions of "
          "LAPACK/cuSOLVER",
          name, static_cast<long long>(m.rows), static_cast<long long>(m.cols),
          static_cast<long long>(m.ld));
}

/* A checked matrix that LAPACK and cuSOLVER can address. */
Mat lapack_matrix(Context &ctx, const DLTensor *t, const char *name, unsigned dtypes,
                  int64_t rows, int64_t cols) {
  const Mat m = checked_matrix(ctx, t, name, dtypes, rows, cols);
  check_int_dims(name, m);
  return m;
}

bool same_matrix(const Mat &x, const Mat &y) {
  return x.data == y.data && x.rows == y.rows && x.cols == y.cols &&
         (x.ld == y.ld || x.rows <= 1) && x.dtype == y.dtype;
}

/* Entry i: a (the input), q, r as given; fills the job. */
void check_entry(Context &ctx, const QrList &list, size_t i, QrJob &job) {
  const EntryName an("a", i), qn("q", i), rn("r", i);
  if (list.a[i] == nullptr)
    raise(OSFT_STATUS_INVALID_ARGUMENT, "%s: NULL tensor", an.text);
  const Mat a = lapack_matrix(ctx, list.a[i], an.text, kQrDtypes, OSFTI_ANY, OSFTI_ANY);
  const unsigned dtype = static_cast<unsigned>(a.dtype);
  const bool power = list.iterations > 0;
  if (power && a.rows != a.cols)
    raise(OSFT_STATUS_SHAPE_MISMATCH,
          "%s: shape [%lld, %lld] is not square; power iteration multiplies Q by it",
          an.text, static_cast<long long>(a.rows), static_cast<long long>(a.cols));
  if (!power && a.rows < a.cols)
    raise(OSFT_STATUS_SHAPE_MISMATCH,
          "%s: shape [%lld, %lld] has fewer rows than columns; QR needs m >= n", an.text,
          static_cast<long long>(a.rows), static_cast<long long>(a.cols));
  job.index = i;
  job.a = a;
  job.q = a;
  if (list.q != nullptr) {
    if (list.q[i] == nullptr)
      raise(OSFT_STATUS_INVALID_ARGUMENT,
            "%s: NULL tensor (pass q = NULL to factor every matrix in place)", qn.text);
    job.q =
        lapack_matrix(ctx, list.q[i], qn.text, dtype, a.rows, power ? OSFTI_ANY : a.cols);
    if (power && job.q.cols > job.q.rows)
      raise(OSFT_STATUS_SHAPE_MISMATCH,
            "%s: shape [%lld, %lld] has fewer rows than columns; QR needs m >= n",
            qn.text, static_cast<long long>(job.q.rows),
            static_cast<long long>(job.q.cols));
  }
  if (list.r != nullptr && list.r[i] != nullptr)
    job.r = lapack_matrix(ctx, list.r[i], rn.text, dtype, job.q.cols, job.q.cols);
}

/* ------------------------------------------------------------ overlaps */

struct Region {
  uintptr_t lo, hi;
  const DLTensor *t;
  const char *array; /* "a", "q" or "r" */
  size_t index;
  bool output;
};

Region region_of(const DLTensor *t, const Mat &m, const char *array, size_t index,
                 bool output) {
  const uintptr_t lo = reinterpret_cast<uintptr_t>(m.data);
  const size_t elem = osfti_dtype_size(m.dtype);
  const size_t span = static_cast<size_t>((m.rows - 1) * m.ld + m.cols) * elem;
  return Region{lo, lo + span, t, array, index, output};
}

/* Each job's regions: its output(s), and its input unless it is written
 * in place (then the output region stands for both). */
size_t collect_regions(const QrList &list, const QrJob *jobs, Region *out) {
  size_t n = 0;
  for (size_t i = 0; i < list.count; ++i) {
    const QrJob &j = jobs[i];
    if (j.q.rows * j.q.cols == 0) continue;
    const bool in_place = list.q == nullptr || same_matrix(j.a, j.q);
    const DLTensor *qt = list.q != nullptr ? list.q[i] : list.a[i];
    out[n++] = region_of(qt, j.q, list.q != nullptr ? "q" : "a", i, true);
    if (!in_place || list.iterations > 0)
      out[n++] = region_of(list.a[i], j.a, "a", i, false);
    if (j.r.data != nullptr) out[n++] = region_of(list.r[i], j.r, "r", i, true);
  }
  return n;
}

void check_pair(const Region &x, const Region &y) {
  if (!x.output && !y.output) return; /* inputs may share memory */
  const EntryName xn(x.array, x.index), yn(y.array, y.index);
  check_no_overlap(xn.text, x.t, yn.text, y.t);
}

void check_overlaps(Context &ctx, const QrList &list, const QrJob *jobs) {
  HostArray<Region> regions(ctx, 3 * list.count);
  const size_t n = collect_regions(list, jobs, regions.get());
  Region *r = regions.get();
  std::sort(r, r + n, [](const Region &x, const Region &y) {
    return x.lo != y.lo ? x.lo < y.lo : x.index < y.index;
  });
  for (size_t i = 0; i < n; ++i)
    for (size_t j = i + 1; j < n && r[j].lo < r[i].hi; ++j) check_pair(r[i], r[j]);
}

}  // namespace

osft_qr_options_t read_qr_options(const osft_qr_options_t *user) {
  osft_qr_options_t defaults{};
  defaults.struct_size = sizeof defaults;
  defaults.method = OSFT_QR_HOUSEHOLDER;
  if (user == nullptr) return defaults;
  const osft_qr_options_t o =
      read_struct(user, defaults, kOptionsV1Size, "opts", "osft_qr_options_t");
  const int method = raw_enum(o.method);
  if (method != OSFT_QR_HOUSEHOLDER && method != OSFT_QR_CHOLESKY_QR2 &&
      method != OSFT_QR_CHOLESKY_TF32)
    raise(OSFT_STATUS_INVALID_ARGUMENT, "opts->method: %d is not an osft_qr_method_t",
          method);
  if (!(o.orthogonality_threshold >= 0.0) || std::isinf(o.orthogonality_threshold))
    raise(OSFT_STATUS_INVALID_ARGUMENT,
          "opts->orthogonality_threshold: %g; must be finite and >= 0 (0: default)",
          o.orthogonality_threshold);
  if (std::isnan(o.rank_tolerance))
    raise(OSFT_STATUS_INVALID_ARGUMENT, "opts->rank_tolerance: NaN");
  if (o.max_concurrency < 0)
    raise(OSFT_STATUS_INVALID_ARGUMENT,
          "opts->max_concurrency: %d is negative (0: default)", o.max_concurrency);
  return o;
}

void check_qr_list(Context &ctx, const QrList &list, QrJob *jobs) {
  if (list.count == 0) return;
  if (list.a == nullptr)
    raise(OSFT_STATUS_INVALID_ARGUMENT, "a: NULL array for count = %zu", list.count);
  if (list.iterations > 0 && list.q == nullptr)
    raise(OSFT_STATUS_INVALID_ARGUMENT, "q: NULL array for count = %zu", list.count);
  for (size_t i = 0; i < list.count; ++i) check_entry(ctx, list, i, jobs[i]);
  check_overlaps(ctx, list, jobs);
}

}  // namespace osft
