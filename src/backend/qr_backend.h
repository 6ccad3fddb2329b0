/* Internal: the kernels of batched QR (osftrt/qr.h). src/ops/qr*.cpp
 * validates the list and plans it once for both backends: which matrices
 * each worker ("lane") runs, how much scratch each lane gets, the
 * tolerances; src/cpu/qr_cpu.cpp (LAPACK on threads) and src/cuda/qr_cuda.cpp
 * (cuSOLVER on streams, plus a batched kernel for small matrices) run the
 * plan and report what went wrong per matrix. Kernels never validate. */
#ifndef OSFTRT_SRC_BACKEND_QR_BACKEND_H
#define OSFTRT_SRC_BACKEND_QR_BACKEND_H

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>
#include <type_traits>

#include "backend/linalg_backend.h"
#include "core/context_impl.h"

namespace osft {

enum class QrMethod { householder, cholesky_qr2, cholesky_tf32 };

/* Both Cholesky paths share the check, the fall-back and the fp64 buffers. */
constexpr bool qr_is_cholesky(QrMethod m) noexcept {
  return m != QrMethod::householder;
}

/* Why a matrix failed, as bits (a job may collect several). */
enum QrFlag : uint32_t {
  kQrNonfiniteInput = 1u << 0, /* A (or the starting Q) has NaN or Inf */
  kQrRankDeficient = 1u << 1,  /* min |R_jj| <= tol * max |R_jj| */
  kQrNonfiniteResult = 1u << 2,
  /* Internal to a backend: the Cholesky path must be redone with Householder. */
  kQrNeedsFallback = 1u << 3,
  /* Not a failure: the Cholesky path was redone with Householder. */
  kQrFellBack = 1u << 4,
  /* Not a failure: rank-deficient, factored and written anyway (the job's
   * factor_deficient; opts->rank_deficient). */
  kQrRankReported = 1u << 5,
  kQrFailureMask = kQrNonfiniteInput | kQrRankDeficient | kQrNonfiniteResult,
};

/* One matrix (or power-iteration pair) of a call, validated. */
struct QrJob {
  Mat a; /* the matrix to factor, m x n; power iteration: the m x m factor */
  Mat q; /* m x n: the output; power iteration: the starting Q as well */
  Mat r; /* n x n, or data == nullptr when R is not wanted */
  /* Resolved rank tolerance; negative: no check. */
  double rank_tol = 0.0;
  /* A rank-deficient result is written and flagged kQrRankReported instead
   * of failing with kQrRankDeficient (backends whose table says
   * reports_rank_deficient; the others fail it and src/ops redoes it with
   * the check off). */
  bool factor_deficient = false;
  int lane = -1;    /* the worker that runs it; -1: a backend batch kernel */
  size_t index = 0; /* position in the caller's list */
  int64_t m() const noexcept { return q.rows; }
  int64_t n() const noexcept { return q.cols; }
};

/* A whole call, planned. */
struct QrCall {
  QrJob *jobs = nullptr; /* sorted by lane, then by dtype and shape */
  size_t count = 0;
  int lanes = 0; /* lanes in use (jobs have lane < lanes) */
  QrMethod method = QrMethod::householder;
  double ortho_threshold = 0.5; /* the Cholesky path's bound on ||Q2^T Q2 - I||_F */
  int iterations = 0;           /* 0: QR of a; >= 1: power iteration */
  /* Scratch: `shared_bytes` for the call at offset 0, then lane l at
   * lane_offset[l]; all 256-byte aligned. */
  size_t shared_bytes = 0;
  const size_t *lane_offset = nullptr;
};

struct QrKernels {
  /* True: lanes are threads that take any job when free (so every lane's
   * scratch must fit every lane job); false: a lane runs the jobs
   * assigned to it, in order (CUDA streams). */
  bool lanes_take_any_job;
  /* True: the kernels honour QrJob::factor_deficient (kQrRankReported);
   * false: they fail such a job with kQrRankDeficient, and src/ops runs it
   * again with the rank check off. */
  bool reports_rank_deficient;
  /* Workers to use when the caller does not say (opts->max_concurrency 0). */
  int (*default_concurrency)(Context &ctx);
  /* True if the backend factors this job in a batch kernel rather than on a
   * lane (given the call's method and iterations). */
  bool (*batched)(Context &ctx, const QrJob &job, const QrCall &call);
  /* Scratch bytes a lane needs to run `job`, reused job after job. */
  size_t (*lane_bytes)(Context &ctx, const QrJob &job, const QrCall &call);
  /* Scratch bytes the call needs besides its lanes (batched jobs'
   * descriptors, per-job flags), given `call` with every job's lane set. */
  size_t (*shared_bytes)(Context &ctx, const QrCall &call);
  /* Runs every job, writing its outputs only if it succeeded, and sets
   * flags[p] (zeroed by the caller) for the job at position p of
   * call.jobs: its QrFlag bits, never kQrNeedsFallback. Returns with the
   * outputs ready (CUDA: after synchronizing). */
  void (*run)(Context &ctx, const QrCall &call, void *scratch, uint32_t *flags);
};

const QrKernels &cpu_qr_kernels() noexcept;
/* Throws OSFT_STATUS_NOT_SUPPORTED in builds without CUDA. */
const QrKernels &cuda_qr_kernels();

inline const QrKernels &qr_kernels(Context &ctx) {
  return on_cuda(ctx) ? cuda_qr_kernels() : cpu_qr_kernels();
}

/* A host array of trivially copyable T from the context's host scratch,
 * zero-filled and given back on scope exit: per-call bookkeeping that
 * allocates nothing once the scratch has grown to a call's needs. */
template <class T>
class HostArray {
  static_assert(std::is_trivially_copyable<T>::value, "plain data only");

 public:
  HostArray(Context &ctx, size_t count) : ctx_(ctx), bytes_(count * sizeof(T)) {
    if (count != 0 && bytes_ / count != sizeof(T)) throw std::bad_alloc();
    if (bytes_ == 0) return;
    data_ = static_cast<T *>(host_scratch_take(ctx_, bytes_, "QR bookkeeping"));
    std::memset(static_cast<void *>(data_), 0, bytes_);
  }
  ~HostArray() { host_scratch_give(ctx_, data_, bytes_); }
  HostArray(const HostArray &) = delete;
  HostArray &operator=(const HostArray &) = delete;
  T *get() const noexcept { return data_; }
  T &operator[](size_t i) const noexcept { return data_[i]; }

 private:
  Context &ctx_;
  size_t bytes_;
  T *data_ = nullptr;
};

/* Flops, as the measure for balancing lanes: Householder QR plus forming
 * Q is about 4 m n^2; a power-iteration step adds the m x m x n product. */
inline double qr_job_cost(const QrJob &j, int iterations) noexcept {
  const double m = static_cast<double>(j.m()), n = static_cast<double>(j.n());
  const double qr = 4.0 * m * n * n;
  return iterations == 0 ? qr : iterations * (qr + 2.0 * m * m * n);
}

/* Scratch carving shared by the backends: `bytes` rounded up to the
 * 256-byte alignment every buffer gets. */
constexpr size_t qr_align(size_t bytes) noexcept {
  return (bytes + 255) / 256 * 256;
}

/* Columns per block of the TF32 path's solve. */
constexpr int64_t kTf32SolveBlock = 256;

/* One lane job's buffers (elements of T), the same on both backends. The
 * Cholesky path computes in fp64 whatever T is: for fp64 jobs w64 and r64
 * are w and r themselves, for fp32 jobs buffers of their own. */
template <class T>
struct QrBuffers {
  T *w = nullptr;        /* m x n column-major: the matrix being factored */
  T *p = nullptr;        /* m x n: power iteration's current Q */
  T *tau = nullptr;      /* n: Householder scalars */
  T *sign = nullptr;     /* n: signs of diag(R); Cholesky: diag(R) in T */
  T *r = nullptr;        /* n x n column-major: R; TF32 path: the fp32 Gram
                            matrix, then factor, of a pass */
  T *work = nullptr;     /* lwork: the solver's workspace */
  int *info = nullptr;   /* kMaxCholeskyPasses: the Cholesky factorizations' info */
  double *acc = nullptr; /* ||Q2^T Q2 - I||_F^2 (Cholesky) */
  double *w64 = nullptr; /* m x n: w in fp64 (Cholesky); TF32 path: w's TF32
                            halves (2 m n floats) until widen() */
  double *g = nullptr;   /* n x n: a Gram matrix, then its Cholesky factor;
                            TF32 path: r's TF32 halves during a solve */
  double *r64 = nullptr; /* n x n: R = R3 R2 R1 (Cholesky, when R is wanted) */
  double *d64 = nullptr; /* n: diag(R), the product of the passes' diagonals */
  /* The TF32 path's last pass (fp32 jobs), per block of columns J: */
  float *t = nullptr;      /* m x kTf32SolveBlock: Q_<J U_<J,J (3xTF32) */
  double *z = nullptr;     /* m x kTf32SolveBlock: W_J D_J^-1 - t, then Q_J */
  double *ublk = nullptr;  /* n x kTf32SolveBlock: U's diagonal blocks in fp64,
                              block J at ublk + j0 * kTf32SolveBlock (ld jb) */
  double *dlast = nullptr; /* n: D, the last factor's diagonal */
  int64_t lwork = 0;
};

/* Shifted CholeskyQR3 (Fukaya, Kannan, Nakatsukasa, Yamamoto, Yanagisawa,
 * SIAM J. Sci. Comput. 2020), every pass in fp64 whatever the dtype:
 *   pass 1: G = A^T A + s I, R1 = chol(G), Q1 = A R1^-1   (shifted)
 *   pass 2: R2 = chol(Q1^T Q1), Q2 = Q1 R2^-1
 *   pass 3: R3 = chol(Q2^T Q2), Q  = Q2 R3^-1,  R = R3 R2 R1
 * with s = 11 (m n + n (n + 1)) u ||A||_F^2, u = 2^-53. The shift makes the
 * first Cholesky factorization succeed for any full-rank A and bounds
 * kappa(Q1) by about sqrt(11 (m n + n^2) u) kappa(A) (~1e-4 kappa(A) at
 * n = 4096), which passes 2 and 3, plain CholeskyQR2 in fp64, make
 * orthogonal to fp64 rounding for kappa(Q1) up to ~1e7: kappa(A) up to
 * ~1e11 in all, far beyond what an fp32 input can carry (fp32 CholeskyQR2
 * breaks down from ~1e3, and SOAP's P Q products have 1e4 to 1e7). In fp64
 * the GEMM-like kernels (syrk, trsm) run at about fp32's speed on Hopper
 * and on CPUs at half of it. The check: every Cholesky factorization
 * succeeds and ||Q2^T Q2 - I||_F (read from pass 3's Gram matrix) stays
 * within the threshold, else the matrix is redone with Householder. */
constexpr int kCholeskyPasses = 3;

/* s / ||A||_F^2 of the first pass. */
inline double cholesky_shift_factor(int64_t m, int64_t n) noexcept {
  const double md = static_cast<double>(m), nd = static_cast<double>(n);
  return 11.0 * (md * nd + nd * (nd + 1.0)) * 0x1p-53;
}

/* The TF32 path (OSFT_QR_CHOLESKY_TF32, fp32 jobs): kTf32Passes passes whose
 * Gram matrix is a TF32 GEMM, then a last pass with the fp64 Gram matrix
 * and check of the sequence above (tf32_cholesky_qr below).
 * bench/results/qr_tensorcore_plan.md has the reasoning and the figures. */
constexpr int kTf32Passes = 3;
/* Cholesky factorizations (infos) a job may need: either path. */
constexpr int kMaxCholeskyPasses = kTf32Passes + 1;
static_assert(kMaxCholeskyPasses >= kCholeskyPasses, "info slots");

/* Whether a job of dtype T under `method` takes the TF32 path
 * (run_cholesky_path's choice below): fp32 jobs of OSFT_QR_CHOLESKY_TF32. */
template <class T>
constexpr bool qr_tf32_path(QrMethod m) noexcept {
  return std::is_same<T, float>::value && m == QrMethod::cholesky_tf32;
}

/* Cholesky factorizations (infos) of a job of dtype T under `method`. */
template <class T>
constexpr int qr_cholesky_passes(QrMethod m) noexcept {
  return qr_tf32_path<T>(m) ? kMaxCholeskyPasses : kCholeskyPasses;
}

/* s / ||G||_F of the TF32 path's shifted passes: sqrt(m) 2^-26. A TF32 Gram
 * matrix is the exact Gram matrix of the rounded W (products of TF32
 * numbers are exact in fp32), positive semidefinite up to the fp32
 * summation: entry (i, j) off by ~2^-24 ||w_i|| ||w_j|| / sqrt(m) (a random
 * walk of m terms), ~2^-23 sqrt(n / m) max_i ||w_i||^2 in norm, which the
 * shift (>= 2^-26 sqrt(m) max_i ||w_i||^2) exceeds by m / (8 sqrt(n)): 8x
 * at n = m = 4096 (a failed factorization falls back). Against ||G||_F
 * rather than trace(G) (Fukaya et al.'s ||A||_F^2) the shift stays small
 * for matrices with many large singular values, so each pass's gain, about
 * ||A|| / sqrt(s), stays large: kappa 1e7 with log-spaced singular values
 * reached the last pass at ||W^T W - I||_F 0.11 at n = 2048 (1.47 with the
 * trace: a fall-back); SOAP's inputs, whose G has one dominant eigenvalue,
 * gain alike. No factorization failed for kappa up to 1e7 at n = 160 ..
 * 2048 (test_qr_numerics, and a prototype). */
inline double tf32_shift_factor(int64_t m) noexcept {
  return std::sqrt(static_cast<double>(m)) * 0x1p-26;
}

/* The sequence, written once; each backend supplies `ops` (on the CPU each
 * step returns false as soon as the matrix must fall back; on CUDA every
 * step returns true and the verdict is taken on the device):
 *   widen()               w64 = w (fp32 jobs; nothing for fp64)
 *   gram()                g = w64^T w64 (upper triangle)
 *   shift(factor)         g += factor * trace(g) * I
 *   deviation_ok()        ||g - I||_F <= threshold (g from gram())
 *   cholesky(pass)        g = chol(g) (info[pass]), w64 = w64 g^-1
 *   accumulate_r(pass)    d64 (and r64 when R is wanted) take g's factor
 *   narrow(q_in_w64)      w = w64 (if q_in_w64), the diagonal (and R)
 *                         into T; checks
 * Returns false when the matrix must fall back to Householder. */
template <class Ops>
bool shifted_cholesky_qr3(Ops &ops, int64_t m, int64_t n) {
  ops.widen();
  for (int pass = 0; pass < kCholeskyPasses; ++pass) {
    ops.gram();
    if (pass == 0) ops.shift(cholesky_shift_factor(m, n));
    if (pass == kCholeskyPasses - 1 && !ops.deviation_ok()) return false;
    if (!ops.cholesky(pass)) return false;
    ops.accumulate_r(pass);
  }
  return ops.narrow(true);
}

/* w = w r^-1 for the fp32 w (m x n) and the fp32 upper r, accurate to about
 * 2^-20 (the solve defines Q: its error is the QR's backward error) yet
 * with nearly all its flops on the tensor cores: left-looking by blocks of
 * kTf32SolveBlock columns, each block first updated with the solved ones,
 * w_J -= x_<J r_<J,J as three TF32 GEMMs on operands split into TF32
 * halves (x = hi + lo, "3xTF32": hi hi + hi lo + lo hi), then solved with
 * its diagonal block of r in fp32 (a strsm of m x 256). The last pass
 * (`last`) solves W D^-1 U^-1 instead (r = U, unit upper; D = dlast): the
 * update goes to t, and each block is finished in fp64 (z = W_J D_J^-1 -
 * t, z U_JJ^-1) and rounded once, so that Q's entries carry one fp32
 * rounding, not one per GEMM and solve step. The steps:
 *   split_r()                  r into TF32 halves (the rows above each block)
 *   update_3xtf32(j0, jb, to_t) x[:, :j0] r[:j0, j0:j0+jb] subtracted from
 *                              w[:, j0:j0+jb], or (to_t) written to t
 *   solve_block(j0, jb)        w[:, j0:j0+jb] = w[:, j0:j0+jb] r_JJ^-1 (fp32)
 *   solve_block_fp64(j0, jb)   w[:, j0:j0+jb] = fp32((W_J D_J^-1 - t) U_JJ^-1),
 *                              t read only when j0 > 0
 *   split_w(j0, jb)            the solved block into TF32 halves */
template <class Ops>
void solve_3xtf32(Ops &ops, int64_t n, bool last) {
  ops.split_r();
  for (int64_t j0 = 0; j0 < n; j0 += kTf32SolveBlock) {
    const int64_t jb = n - j0 < kTf32SolveBlock ? n - j0 : kTf32SolveBlock;
    if (j0 > 0) ops.update_3xtf32(j0, jb, last);
    if (last)
      ops.solve_block_fp64(j0, jb);
    else
      ops.solve_block(j0, jb);
    if (j0 + jb < n) ops.split_w(j0, jb);
  }
}

/* The TF32 path: the same `ops`, plus steps on the fp32 w itself:
 *   gram_tf32()            g = tf32(w)^T tf32(w), summed in fp32, into g
 *   shift_by_norm(factor)  g += factor * ||g||_F * I
 *   cholesky_tf32(pass)    g = chol(g) (info[pass]) rounded to fp32 into r
 *                          and back into g (so that R accumulates the
 *                          factor the solve uses)
 *   solve_3xtf32's steps   w = w r^-1 (g is free by then: its halves of r)
 *   cholesky_unit(pass)    g = chol(g) (info[pass]) taken as R = U D: r =
 *                          U in fp32 (its unit diagonal exact), ublk its
 *                          diagonal blocks in fp64, dlast = D, and g = U D
 *                          as used (for accumulate_r)
 * then the last pass: its Gram matrix in fp64 (widen(), gram()) with the
 * deviation check, cholesky_unit(), and the solve of W D^-1 U^-1. W is
 * nearly orthogonal there (||W^T W - I||_F <= threshold, so kappa(R) <=
 * sqrt((1 + t) / (1 - t)), 1.7 at t = 0.5): U = I + N with N small, the
 * 3xTF32 updates are corrections of W's size times N, and their error is
 * far below Q's own fp32 rounding, the only one left on each entry (the
 * diagonal blocks and D are applied in fp64). That replaces the n^3 fp64
 * solve and the fp64 copy of Q of an all-fp64 last pass with a GEMM pass
 * on the tensor cores and m n 256 fp64 flops. The fp64 Gram matrix is what
 * makes Q orthonormal to that floor (an fp32 sum of m terms would leave
 * ~n u in Frobenius). narrow(false) keeps Q where the solve wrote it. */
template <class Ops>
bool tf32_cholesky_qr(Ops &ops, int64_t m, int64_t n) {
  for (int pass = 0; pass < kTf32Passes; ++pass) {
    ops.gram_tf32();
    if (pass < kTf32Passes - 1) ops.shift_by_norm(tf32_shift_factor(m));
    if (!ops.cholesky_tf32(pass)) return false;
    ops.accumulate_r(pass);
    solve_3xtf32(ops, n, false);
  }
  ops.widen();
  ops.gram();
  if (!ops.deviation_ok()) return false;
  if (!ops.cholesky_unit(kTf32Passes)) return false;
  ops.accumulate_r(kTf32Passes);
  solve_3xtf32(ops, n, true);
  return ops.narrow(false);
}

/* Runs the job's Cholesky path; fp64 jobs take the fp64 one whatever the
 * method (TF32 would only lose their precision). */
template <class T, class Ops>
bool run_cholesky_path(QrMethod method, Ops &ops, int64_t m, int64_t n) {
  if constexpr (std::is_same<T, float>::value)
    if (method == QrMethod::cholesky_tf32) return tf32_cholesky_qr(ops, m, n);
  return shifted_cholesky_qr3(ops, m, n);
}

/* Lays out the buffers of `job` from `base` (nullptr: only counts) given
 * the backend's solver workspace `lwork`; returns the bytes used. */
template <class T>
size_t qr_carve(const QrJob &job, const QrCall &call, int64_t lwork, char *base,
                QrBuffers<T> *out) {
  const size_t m = static_cast<size_t>(job.m()), n = static_cast<size_t>(job.n());
  const bool chol = qr_is_cholesky(call.method);
  constexpr bool wide = std::is_same<T, double>::value;
  size_t offset = 0;
  auto take = [&](size_t bytes) -> void * {
    void *p = bytes == 0 || base == nullptr ? nullptr : base + offset;
    offset += qr_align(bytes);
    return p;
  };
  auto take64 = [&](size_t count) {
    return static_cast<double *>(take(chol ? count * sizeof(double) : 0));
  };
  QrBuffers<T> b;
  b.w = static_cast<T *>(take(m * n * sizeof(T)));
  b.p = static_cast<T *>(take(call.iterations > 0 ? m * n * sizeof(T) : 0));
  b.tau = static_cast<T *>(take(n * sizeof(T)));
  b.sign = static_cast<T *>(take(n * sizeof(T)));
  b.r = static_cast<T *>(take(n * n * sizeof(T)));
  b.work = static_cast<T *>(take(static_cast<size_t>(lwork) * sizeof(T)));
  b.info = static_cast<int *>(take(kMaxCholeskyPasses * sizeof(int)));
  b.acc = static_cast<double *>(take(sizeof(double)));
  b.g = take64(n * n);
  b.d64 = take64(n);
  if constexpr (wide) {
    b.w64 = chol ? b.w : nullptr;
    b.r64 = chol ? b.r : nullptr;
  } else {
    b.w64 = take64(m * n);
    b.r64 = take64(job.r.data != nullptr ? n * n : 0);
  }
  if (qr_tf32_path<T>(call.method)) {
    const size_t jb = n < static_cast<size_t>(kTf32SolveBlock) ? n : kTf32SolveBlock;
    b.t = static_cast<float *>(take(m * jb * sizeof(float)));
    b.z = static_cast<double *>(take(m * jb * sizeof(double)));
    b.ublk = static_cast<double *>(take(n * jb * sizeof(double)));
    b.dlast = static_cast<double *>(take(n * sizeof(double)));
  }
  b.lwork = lwork;
  if (out != nullptr) *out = b;
  return offset;
}

}  // namespace osft

#endif
