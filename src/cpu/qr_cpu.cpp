/* The CPU backend of src/backend/qr_backend.h: each job runs LAPACK geqrfp +
 * orgqr on a column-major copy in its
 * lane's scratch, so a failed job leaves its outputs untouched. The
 * Cholesky path (shifted CholeskyQR3, src/backend/qr_backend.h) runs in
 * fp64: dsyrk, dpotrf, dtrsm, on the build's engine (src/core/cpu_blas.h);
 * the TF32 path's first passes emulate the tensor cores (TF32 operands by
 * truncation, sums in fp32: ssyrk for the Gram matrix, sgemm on TF32
 * halves for the 3xTF32 solve) around dpotrf and fp32 strsm blocks; its
 * last pass is dsyrk, dpotrf and the same updates finished by fp64 dtrsm
 * blocks.
 * Lanes are threads; while more than one runs, the BLAS is held at one
 * thread: on
 * two cores, two single-threaded QRs side by side took 0.6x the time of
 * the same QRs one after another with OpenBLAS's two threads (48 of
 * 128^2 + 48 of 512^2, fp32), and letting both lanes use OpenBLAS threads
 * oversubscribed the cores (2-4x slower). Forming Q with GEMMs from the
 * compact WY form (geqrt3 + trmm + gemm) was measured too: 10% faster at
 * 128^2, slower from 512^2 on; orgqr is kept. */
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <exception>
#include <type_traits>
#include <utility>

#include "core/cpu_blas.h"
#include "core/error.h"
#include "backend/qr_backend.h"

namespace osft {
namespace {

/* ------------------------------------------------------- typed LAPACK/BLAS */

using li = int;

/* geqrfp: geqrf with reflectors chosen so that diag(R) >= 0 (xLARFGP),
 * which makes Q the sign-convention one without a pass over it. */
template <class T>
void geqrfp(li m, li n, T *a, T *tau, T *work, li lwork, li *info) {
  blas::geqrfp(m, n, a, m, tau, work, lwork, info);
}
template <class T>
void orgqr(li m, li n, T *a, const T *tau, T *work, li lwork, li *info) {
  blas::orgqr(m, n, n, a, m, tau, work, lwork, info);
}
/* The Cholesky path's kernels, all in fp64 (column-major). */
void potrf_upper(li n, double *a, li *info) {
  blas::potrf_upper(n, a, n, info);
}
/* g (n x n, upper) = w^T w, w m x n. */
void gram(int m, int n, const double *w, double *g) {
  blas::syrk_upper_t(n, m, w, m, g, n);
}
/* w = w r^-1, r upper n x n. */
void solve_right_upper(int m, int n, const double *r, double *w) {
  blas::trsm_right_upper(m, n, r, n, w, m);
}
/* b = r b, r upper n x n. */
void mul_left_upper(int n, const double *r, double *b) {
  blas::trmm_left_upper(n, r, n, b, n);
}
/* out (column-major m x n) = A q, A row-major m x m (row stride lda), i.e.
 * the column-major A^T, transposed. */
template <class T>
void product(int m, int n, const T *a, int lda, const T *q, T *out) {
  blas::gemm(blas::Layout::col, Op::T, Op::N, m, n, m, T(1), a, lda, q, m, T(0), out, m);
}

/* Optimal lwork of geqrfp and orgqr for m x n (a workspace query). */
template <class T>
li lapack_lwork(li m, li n) {
  T query[2] = {T(0), T(0)}, dummy[1] = {T(0)};
  li info = 0;
  geqrfp(m, n, dummy, dummy, &query[0], -1, &info);
  orgqr(m, n, dummy, dummy, &query[1], -1, &info);
  return std::max<li>(static_cast<li>(std::max(query[0], query[1])), std::max<li>(n, 1));
}

/* --------------------------------------------------------------- copies */

/* The engine's transposing copy: B (cols x rows, row-major, ldb) = A^T for
 * A rows x cols row-major (lda). About 8x faster than a tiled loop here
 * for fp32 (OpenBLAS). A column-major matrix is its transpose, row-major. */
template <class T>
void transpose(int64_t rows, int64_t cols, const T *a, int64_t lda, T *b, int64_t ldb) {
  blas::transpose(static_cast<int>(rows), static_cast<int>(cols), a,
                  static_cast<int>(lda), b, static_cast<int>(ldb));
}

/* The exponent field of T's bit pattern, as an unsigned integer mask. */
template <class T>
struct ExponentBits;
template <>
struct ExponentBits<float> {
  using type = uint32_t;
  static constexpr type mask = 0x7f800000u;
};
template <>
struct ExponentBits<double> {
  using type = uint64_t;
  static constexpr type mask = 0x7ff0000000000000ull;
};

/* True if no element is NaN or Inf: those, and only those, have an
 * all-ones exponent, the largest exponent field there is. Branch-free, so
 * the compiler vectorizes it. */
template <class T>
bool all_finite(const T *p, int64_t n) {
  using Bits = typename ExponentBits<T>::type;
  constexpr Bits kExp = ExponentBits<T>::mask;
  Bits top = 0;
  for (int64_t i = 0; i < n; ++i) {
    Bits bits;
    std::memcpy(&bits, p + i, sizeof bits);
    top = std::max<Bits>(top, bits & kExp);
  }
  return top != kExp;
}

/* dst (column-major m x n, ld m) = src (a row-major view); false if src
 * has a NaN or Inf. */
template <class T>
bool pack(const Mat &src, T *dst) {
  transpose(src.rows, src.cols, static_cast<const T *>(src.data), src.ld, dst, src.rows);
  return all_finite(dst, src.rows * src.cols);
}

/* dst (a row-major view) = src (column-major, ld = dst.rows). */
template <class T>
void unpack(const T *src, const Mat &dst) {
  transpose(dst.cols, dst.rows, src, dst.rows, static_cast<T *>(dst.data), dst.ld);
}

/* Rank and finiteness of R from its diagonal (column-major, ld rows). */
template <class T>
uint32_t diagonal_flags(const T *r, int64_t ld, int64_t n, double tol) {
  double big = 0.0, small = INFINITY;
  for (int64_t j = 0; j < n; ++j) {
    const double v = std::fabs(static_cast<double>(r[j + j * ld]));
    if (!std::isfinite(v)) return kQrNonfiniteResult;
    big = std::max(big, v);
    small = std::min(small, v);
  }
  return tol >= 0.0 && !(small > tol * big) ? kQrRankDeficient : 0u;
}

/* ----------------------------------------------------------- lane work */

template <class T>
using Buffers = QrBuffers<T>;

/* The job's buffers in its lane's scratch (nullptr: only counts). */
template <class T>
size_t carve(const QrJob &job, const QrCall &call, char *base, Buffers<T> *b) {
  const li lwork = lapack_lwork<T>(static_cast<li>(job.m()), static_cast<li>(job.n()));
  return qr_carve<T>(job, call, lwork, base, b);
}

void check_info(li info, const char *routine) {
  if (info < 0)
    raise(OSFT_STATUS_INTERNAL_ERROR, "%s: argument %d invalid", routine,
          static_cast<int>(-info));
}

/* x rounded to TF32 (10 explicit mantissa bits) by truncation: what a
 * tensor core that ignores the low 13 bits of its fp32 operands multiplies;
 * with round-to-nearest the error would be half as large. */
inline float tf32(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  bits &= 0xffffe000u;
  std::memcpy(&x, &bits, sizeof bits);
  return x;
}

void round_to_tf32(const float *src, float *dst, int64_t count) {
  for (int64_t i = 0; i < count; ++i) dst[i] = tf32(src[i]);
}

/* x = hi + lo to ~2^-20, both TF32 (lo as the tensor core would read it). */
void split_tf32(const float *x, float *hi, float *lo, int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    hi[i] = tf32(x[i]);
    lo[i] = tf32(x[i] - hi[i]);
  }
}

/* The steps of shifted_cholesky_qr3 and tf32_cholesky_qr
 * (src/backend/qr_backend.h) on the CPU: each returns false as soon as the
 * matrix must fall back. */
template <class T>
class CpuCholesky {
 public:
  CpuCholesky(const Buffers<T> &b, int64_t m, int64_t n, bool want_r, double threshold)
      : b_(b), m_(m), n_(n), want_r_(want_r), threshold_(threshold) {}

  void widen() {
    if constexpr (!std::is_same<T, double>::value)
      for (int64_t i = 0; i < m_ * n_; ++i) b_.w64[i] = static_cast<double>(b_.w[i]);
  }
  void gram() { osft::gram(static_cast<int>(m_), static_cast<int>(n_), b_.w64, b_.g); }
  void shift(double factor) {
    double trace = 0.0;
    for (int64_t j = 0; j < n_; ++j) trace += b_.g[j + j * n_];
    for (int64_t j = 0; j < n_; ++j) b_.g[j + j * n_] += factor * trace;
  }
  void shift_by_norm(double factor) {
    const double norm = distance(0.0);
    for (int64_t j = 0; j < n_; ++j) b_.g[j + j * n_] += factor * norm;
  }
  bool deviation_ok() const { return distance(1.0) <= threshold_; }
  bool cholesky(int) {
    if (!factor_g()) return false;
    solve_right_upper(static_cast<int>(m_), static_cast<int>(n_), b_.g, b_.w64);
    return true;
  }
  /* The TF32 path (fp32 jobs only). w64 holds the rounded copy of w, then
   * w's TF32 halves (2 m n floats: its size); r the fp32 Gram matrix and
   * factor; g, once accumulate_r() has read the factor, r's halves. None is
   * used otherwise before widen() or narrow(). */
  void gram_tf32() {
    float *rounded = reinterpret_cast<float *>(b_.w64);
    round_to_tf32(b_.w, rounded, m_ * n_);
    blas::syrk_upper_t(static_cast<int>(n_), static_cast<int>(m_), rounded,
                       static_cast<int>(m_), b_.r, static_cast<int>(n_));
    for (int64_t j = 0; j < n_; ++j)
      for (int64_t i = 0; i <= j; ++i) b_.g[i + j * n_] = b_.r[i + j * n_];
  }
  bool cholesky_tf32(int) {
    if (!factor_g()) return false;
    for (int64_t j = 0; j < n_; ++j)
      for (int64_t i = 0; i <= j; ++i) {
        b_.r[i + j * n_] = static_cast<float>(b_.g[i + j * n_]);
        b_.g[i + j * n_] = b_.r[i + j * n_];
      }
    return true;
  }
  bool cholesky_unit(int) {
    if (!factor_g()) return false;
    for (int64_t j = 0; j < n_; ++j) {
      const double d = b_.g[j + j * n_];
      const int64_t j0 = j / kTf32SolveBlock * kTf32SolveBlock;
      const int64_t jb = std::min(kTf32SolveBlock, n_ - j0);
      double *block = b_.ublk + j0 * kTf32SolveBlock;
      for (int64_t i = 0; i <= j; ++i) {
        const float u = i == j ? 1.0f : static_cast<float>(b_.g[i + j * n_] / d);
        b_.r[i + j * n_] = u;
        if (i < j) b_.g[i + j * n_] = static_cast<double>(u) * d;
        if (i >= j0) block[(i - j0) + (j - j0) * jb] = u;
      }
      for (int64_t i = j + 1; i < j0 + jb; ++i) block[(i - j0) + (j - j0) * jb] = 0.0;
      b_.dlast[j] = d;
    }
    return true;
  }
  void split_r() { /* the upper triangle, column by column */
    for (int64_t j = 0; j < n_; ++j)
      split_tf32(b_.r + j * n_, r_hi() + j * n_, r_lo() + j * n_, j + 1);
  }
  void update_3xtf32(int64_t j0, int64_t jb, bool to_t) {
    const float *a[3] = {w_lo(), w_hi(), w_hi()}, *b[3] = {r_hi(), r_lo(), r_hi()};
    float *c = to_t ? b_.t : b_.w + j0 * m_;
    for (int t = 0; t < 3; ++t) /* the small terms first */
      blas::gemm(blas::Layout::col, Op::N, Op::N, static_cast<int>(m_),
                 static_cast<int>(jb), static_cast<int>(j0), to_t ? 1.0f : -1.0f, a[t],
                 static_cast<int>(m_), b[t] + j0 * n_, static_cast<int>(n_),
                 to_t && t == 0 ? 0.0f : 1.0f, c, static_cast<int>(m_));
  }
  void solve_block(int64_t j0, int64_t jb) {
    blas::trsm_right_upper(static_cast<int>(m_), static_cast<int>(jb),
                           b_.r + j0 + j0 * n_, static_cast<int>(n_), b_.w + j0 * m_,
                           static_cast<int>(m_));
  }
  void solve_block_fp64(int64_t j0, int64_t jb) {
    float *w = b_.w + j0 * m_;
    for (int64_t j = 0; j < jb; ++j)
      for (int64_t i = 0; i < m_; ++i) {
        const int64_t e = i + j * m_;
        b_.z[e] = static_cast<double>(w[e]) / b_.dlast[j0 + j] -
                  (j0 > 0 ? static_cast<double>(b_.t[e]) : 0.0);
      }
    blas::trsm_right_upper(static_cast<int>(m_), static_cast<int>(jb),
                           b_.ublk + j0 * kTf32SolveBlock, static_cast<int>(jb), b_.z,
                           static_cast<int>(m_));
    for (int64_t e = 0; e < m_ * jb; ++e) w[e] = static_cast<float>(b_.z[e]);
  }
  void split_w(int64_t j0, int64_t jb) {
    split_tf32(b_.w + j0 * m_, w_hi() + j0 * m_, w_lo() + j0 * m_, m_ * jb);
  }
  void accumulate_r(int pass) {
    for (int64_t j = 0; j < n_; ++j)
      b_.d64[j] = pass == 0 ? b_.g[j + j * n_] : b_.d64[j] * b_.g[j + j * n_];
    if (!want_r_) return;
    if (pass > 0) return mul_left_upper(static_cast<int>(n_), b_.g, b_.r64);
    for (int64_t j = 0; j < n_; ++j)
      for (int64_t i = 0; i < n_; ++i)
        b_.r64[i + j * n_] = i <= j ? b_.g[i + j * n_] : 0.0;
  }
  /* Q (from w64 when q_in_w64), diag(R) (into sign) and R in T; an fp64
   * value beyond fp32's range becomes Inf and is reported as an overflow. */
  bool narrow(bool q_in_w64) {
    for (int64_t j = 0; j < n_; ++j) b_.sign[j] = static_cast<T>(b_.d64[j]);
    if constexpr (!std::is_same<T, double>::value) {
      if (q_in_w64)
        for (int64_t i = 0; i < m_ * n_; ++i) b_.w[i] = static_cast<T>(b_.w64[i]);
      if (want_r_)
        for (int64_t i = 0; i < n_ * n_; ++i) b_.r[i] = static_cast<T>(b_.r64[i]);
    }
    return true;
  }

 private:
  /* g = chol(g) in place (upper); false if g is not positive definite. */
  bool factor_g() {
    li info = 0;
    potrf_upper(static_cast<li>(n_), b_.g, &info);
    check_info(info, "dpotrf");
    return info == 0;
  }
  /* ||g - diagonal I||_F of the symmetric g whose upper triangle is stored. */
  double distance(double diagonal) const {
    double sum = 0.0;
    for (int64_t j = 0; j < n_; ++j)
      for (int64_t i = 0; i <= j; ++i) {
        const double v = b_.g[i + j * n_] - (i == j ? diagonal : 0.0);
        sum += (i == j ? 1.0 : 2.0) * v * v;
      }
    return std::sqrt(sum);
  }
  float *w_hi() const noexcept { return reinterpret_cast<float *>(b_.w64); }
  float *w_lo() const noexcept { return w_hi() + m_ * n_; }
  float *r_hi() const noexcept { return reinterpret_cast<float *>(b_.g); }
  float *r_lo() const noexcept { return r_hi() + n_ * n_; }

  const Buffers<T> &b_;
  int64_t m_, n_;
  bool want_r_;
  double threshold_;
};

template <class T>
class Factorizer {
 public:
  Factorizer(const QrJob &job, const QrCall &call, const Buffers<T> &b)
      : job_(job), call_(call), b_(b), m_(job.m()), n_(job.n()) {}

  /* QR of the matrix `fill` writes into w: Q into w, R into r (the
   * Cholesky path: only when the job wants R), with diag(R) >= 0. Returns
   * the job's flags. */
  template <class Fill>
  uint32_t factor(Fill &&fill) {
    if (qr_is_cholesky(call_.method)) {
      if (!fill()) return kQrNonfiniteInput;
      const bool want_r = job_.r.data != nullptr && call_.iterations == 0;
      CpuCholesky<T> ops(b_, m_, n_, want_r, call_.ortho_threshold);
      if (run_cholesky_path<T>(call_.method, ops, m_, n_)) {
        /* it passed the orthogonality check: Q R = A with Q orthonormal,
         * a valid factorization even where A is rank-deficient */
        const uint32_t f = admit(diagonal_flags(b_.sign, 0, n_, job_.rank_tol));
        if (f & kQrFailureMask) return f;
        return all_finite(b_.w, m_ * n_) && (!want_r || all_finite(b_.r, n_ * n_))
                   ? f
                   : kQrNonfiniteResult;
      }
      return householder(fill) | kQrFellBack;
    }
    return householder(fill);
  }

 private:
  /* A rank-deficient result is kept and reported where the job asks for it
   * (QrJob::factor_deficient), else it is a failure. */
  uint32_t admit(uint32_t diagonal) const {
    if ((diagonal & kQrRankDeficient) && job_.factor_deficient)
      return (diagonal & ~static_cast<uint32_t>(kQrRankDeficient)) | kQrRankReported;
    return diagonal;
  }

  template <class Fill>
  uint32_t householder(Fill &fill) {
    if (!fill()) return kQrNonfiniteInput;
    const li m = static_cast<li>(m_), n = static_cast<li>(n_);
    li info = 0;
    geqrfp(m, n, b_.w, b_.tau, b_.work, static_cast<li>(b_.lwork), &info);
    check_info(info, "geqrfp");
    const uint32_t f = admit(diagonal_flags(b_.w, m_, n_, job_.rank_tol));
    if (f & kQrFailureMask) return f;
    for (int64_t j = 0; j < n_; ++j) { /* R = triu(w) */
      std::memcpy(b_.r + j * n_, b_.w + j * m_, static_cast<size_t>(j + 1) * sizeof(T));
      std::fill(b_.r + j * n_ + j + 1, b_.r + (j + 1) * n_, T(0));
    }
    orgqr(m, n, b_.w, b_.tau, b_.work, static_cast<li>(b_.lwork), &info);
    check_info(info, "orgqr");
    return all_finite(b_.w, m_ * n_) && all_finite(b_.r, n_ * n_) ? f
                                                                  : kQrNonfiniteResult;
  }

  const QrJob &job_;
  const QrCall &call_;
  const Buffers<T> &b_;
  int64_t m_, n_;
};

template <class T>
uint32_t run_qr_job(const QrJob &job, const QrCall &call, Buffers<T> &b) {
  Factorizer<T> f(job, call, b);
  const uint32_t flags = f.factor([&] { return pack<T>(job.a, b.w); });
  if (flags & kQrFailureMask) return flags;
  unpack(b.w, job.q);
  if (job.r.data != nullptr) unpack(b.r, job.r);
  return flags;
}

template <class T>
uint32_t run_power_job(const QrJob &job, const QrCall &call, Buffers<T> &b) {
  const int64_t m = job.m(), n = job.n();
  const Mat &a = job.a;
  bool finite = pack<T>(job.q, b.p);
  for (int64_t i = 0; i < m && finite; ++i)
    finite = all_finite(static_cast<const T *>(a.data) + i * a.ld, m);
  if (!finite) return kQrNonfiniteInput;
  Factorizer<T> f(job, call, b);
  uint32_t flags = 0;
  for (int it = 0; it < call.iterations; ++it) {
    flags |= f.factor([&] {
      product(static_cast<int>(m), static_cast<int>(n), static_cast<const T *>(a.data),
              static_cast<int>(a.ld), b.p, b.w);
      return true;
    });
    if (flags & kQrFailureMask) return flags;
    std::swap(b.w, b.p);
  }
  unpack(b.p, job.q);
  return flags;
}

template <class T>
uint32_t run_job(const QrJob &job, const QrCall &call, char *lane_scratch) {
  Buffers<T> b;
  carve<T>(job, call, lane_scratch, &b);
  return call.iterations > 0 ? run_power_job(job, call, b) : run_qr_job(job, call, b);
}

void run_one(const QrCall &call, size_t p, char *lane_scratch, uint32_t *flags) {
  const QrJob &job = call.jobs[p];
  flags[p] = job.q.dtype == OSFTI_F64 ? run_job<double>(job, call, lane_scratch)
                                      : run_job<float>(job, call, lane_scratch);
}

/* -------------------------------------------------------------- the table */

int cpu_default_concurrency(Context &) {
  return blas::num_threads();
}

bool cpu_batched(Context &, const QrJob &, const QrCall &) {
  return false;
}

size_t cpu_lane_bytes(Context &, const QrJob &job, const QrCall &call) {
  return job.q.dtype == OSFTI_F64 ? carve<double>(job, call, nullptr, nullptr)
                                  : carve<float>(job, call, nullptr, nullptr);
}

size_t cpu_shared_bytes(Context &, const QrCall &) {
  return 0;
}

/* Lanes take the jobs, biggest first, as they become free (so a core that
 * the OS gives to someone else delays nobody), each with its lane's
 * scratch, which fits any job: the lanes are parts of one job of the
 * library's thread pool (src/core/cpu_blas.h run_parts), the calling
 * thread taking some; where the pool is taken, this thread runs them all. */
void cpu_run(Context &ctx, const QrCall &call, void *scratch, uint32_t *flags) {
  char *base = static_cast<char *>(scratch);
  HostArray<size_t> order(ctx, call.count);
  for (size_t p = 0; p < call.count; ++p) order[p] = p;
  std::stable_sort(order.get(), order.get() + call.count, [&](size_t x, size_t y) {
    return qr_job_cost(call.jobs[x], call.iterations) >
           qr_job_cost(call.jobs[y], call.iterations);
  });
  if (call.lanes <= 1) {
    for (size_t i = 0; i < call.count; ++i) run_one(call, order[i], base, flags);
    return;
  }
  const int lanes = std::min(call.lanes, blas::kMaxThreads);
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr error; /* the first lane's that failed */
  blas::run_parts(lanes, [&](int t) {
    blas::SerialBlas single; /* the lanes are the threads */
    try {
      for (size_t i; (i = next.fetch_add(1)) < call.count;)
        run_one(call, order[i], base + call.lane_offset[t], flags);
    } catch (...) {
      if (!failed.exchange(true)) error = std::current_exception();
    }
  });
  if (error) std::rethrow_exception(error);
}

}  // namespace

const QrKernels &cpu_qr_kernels() noexcept {
  static const QrKernels table = {true,        true,           cpu_default_concurrency,
                                  cpu_batched, cpu_lane_bytes, cpu_shared_bytes,
                                  cpu_run};
  return table;
}

}  // namespace osft
