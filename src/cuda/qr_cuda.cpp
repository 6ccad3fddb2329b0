/* The CUDA backend of src/backend/qr_backend.h.
 *
 * Small matrices (those that fit one block's shared memory) are factored
 * together by one batched kernel per dtype on the context's stream. The
 * others run on "lanes": worker streams, each with its own cuBLAS and
 * cuSOLVER handle, forked from and joined back to the context's stream
 * with events. Per matrix, on its lane: a tiled transposing copy into a
 * column-major scratch matrix (checking for NaN/Inf), cuSOLVER geqrf +
 * orgqr (or the Cholesky path, shifted CholeskyQR3 in fp64: cuBLAS dsyrk,
 * cuSOLVER dpotrf, cuBLAS dtrsm, three times; or the TF32 path: three
 * passes of a TF32 cublasGemmEx Gram matrix, dpotrf and a blocked solve
 * (3xTF32 cublasGemmEx updates, fp32 strsm diagonal blocks), then the
 * last pass: dsyrk, dpotrf, the same updates with each block finished by
 * a dtrsm in fp64), checks of diag(R) and of
 * the result, and copies out that skip themselves on the device when the
 * job's flag says it failed, so a failed matrix's outputs are never
 * touched and nothing waits for the host: no job reads a status, queries
 * a workspace size or allocates while it is enqueued. The Cholesky path's
 * verdict is also taken on the device; the call then waits once (its only
 * wait, when nothing falls back), and redoes the matrices that need it
 * with Householder. bench/results/qr_lanes_analysis.md has the story.
 *
 * Lanes are costly to create (a cuSOLVER handle each), so they are pooled
 * per device for the life of the process and lent to one call at a time. */
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cusolverDn.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <type_traits>
#include <vector>

#include "cuda/cuda_check.h"
#include "core/error.h"
#include "backend/qr_backend.h"
#include "cuda/device_guard.h"
#include "cuda/qr_kernels.cuh"
#include "cuda/module_cuda.h"

namespace osft {
namespace {

namespace kq = cuda::qr;
using cuda::DeviceGuard;

constexpr int kDefaultLanes = 8;
constexpr int kMaxStreams = 64;
constexpr uint32_t kSkipMask = kQrFailureMask | kQrNeedsFallback;

/* ------------------------------------------------------------------ lanes */

struct Lane {
  int device = -1;
  CUcontext owner = nullptr; /* the context its handles belong to */
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr, done = nullptr;
  cublasHandle_t blas = nullptr;
  cusolverDnHandle_t solver = nullptr;
};

void destroy_lane(Lane *l) noexcept {
  if (l->solver) cusolverDnDestroy(l->solver);
  if (l->blas) cublasDestroy(l->blas);
  if (l->start) cudaEventDestroy(l->start);
  if (l->done) cudaEventDestroy(l->done);
  if (l->stream) cudaStreamDestroy(l->stream);
  delete l;
}

/* On the current device (the caller holds a DeviceGuard). */
Lane *create_lane(int device) {
  Lane *l = new Lane();
  l->device = device;
  cuda::current_context(&l->owner);
  try {
    check_cuda(cudaStreamCreateWithFlags(&l->stream, cudaStreamNonBlocking),
               "cudaStreamCreateWithFlags");
    check_cuda(cudaEventCreateWithFlags(&l->start, cudaEventDisableTiming),
               "cudaEventCreateWithFlags");
    check_cuda(cudaEventCreateWithFlags(&l->done, cudaEventDisableTiming),
               "cudaEventCreateWithFlags");
    check_blas(cublasCreate(&l->blas), "cublasCreate");
    check_blas(cublasSetStream(l->blas, l->stream), "cublasSetStream");
    check_blas(cublasSetPointerMode(l->blas, CUBLAS_POINTER_MODE_HOST),
               "cublasSetPointerMode");
    check_solver(cusolverDnCreate(&l->solver), "cusolverDnCreate");
    check_solver(cusolverDnSetStream(l->solver, l->stream), "cusolverDnSetStream");
  } catch (...) {
    destroy_lane(l);
    throw;
  }
  return l;
}

/* Idle lanes of every device; never destroyed (CUDA may be gone at exit). */
class LanePool {
 public:
  static LanePool &instance() {
    static LanePool *pool = new LanePool();
    return *pool;
  }

  /* Fills out[0..count): idle lanes of `device` first, new ones after.
   * Lanes whose CUDA context is gone (a cudaDeviceReset since) are dropped:
   * their handles died with it and cannot even be destroyed. */
  void acquire(int device, int count, Lane **out) {
    int got = 0;
    CUcontext current = nullptr;
    const bool known = cuda::current_context(&current);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (size_t i = idle_.size(); i-- > 0 && got < count;) {
        Lane *l = idle_[i];
        if (l->device != device) continue;
        idle_.erase(idle_.begin() + static_cast<std::ptrdiff_t>(i));
        if (known && l->owner != current)
          delete l; /* stale: the handles are not ours to destroy any more */
        else
          out[got++] = l;
      }
    }
    try {
      for (; got < count; ++got) out[got] = create_lane(device);
    } catch (...) {
      release(out, got);
      throw;
    }
  }

  /* The lanes' cuBLAS workspaces were lent by the call (its scratch): they
   * are taken back before the lanes idle. */
  void release(Lane *const *lanes, int count) noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    for (int i = 0; i < count; ++i) {
      cublasSetWorkspace(lanes[i]->blas, nullptr, 0);
      try {
        idle_.push_back(lanes[i]);
      } catch (...) {
        destroy_lane(lanes[i]);
      }
    }
  }

 private:
  std::mutex mutex_;
  std::vector<Lane *> idle_;
};

/* The lanes of one call: forked from the context's stream, joined back
 * (also when an exception unwinds), returned to the pool. */
class LaneSet {
 public:
  LaneSet(Context &ctx, int count) : main_(stream_of(ctx)), count_(count) {
    LanePool::instance().acquire(ctx.device_id, count_, lanes_);
  }
  ~LaneSet() {
    if (forked_) join_quietly();
    LanePool::instance().release(lanes_, count_);
  }
  LaneSet(const LaneSet &) = delete;
  LaneSet &operator=(const LaneSet &) = delete;

  Lane &lane(int l) const noexcept { return *lanes_[l % count_]; }

  /* Every lane waits for what the context's stream has enqueued so far. */
  void fork() {
    check_cuda(cudaEventRecord(lanes_[0]->start, main_), "cudaEventRecord");
    forked_ = true;
    for (int i = 0; i < count_; ++i)
      check_cuda(cudaStreamWaitEvent(lanes_[i]->stream, lanes_[0]->start, 0),
                 "cudaStreamWaitEvent");
  }

  /* The context's stream waits for everything the lanes enqueued. */
  void join() {
    for (int i = 0; i < count_; ++i) {
      check_cuda(cudaEventRecord(lanes_[i]->done, lanes_[i]->stream), "cudaEventRecord");
      check_cuda(cudaStreamWaitEvent(main_, lanes_[i]->done, 0), "cudaStreamWaitEvent");
    }
    forked_ = false;
  }

 private:
  void join_quietly() noexcept {
    for (int i = 0; i < count_; ++i) {
      if (cudaEventRecord(lanes_[i]->done, lanes_[i]->stream) == cudaSuccess)
        cudaStreamWaitEvent(main_, lanes_[i]->done, 0);
    }
    cudaGetLastError();
  }

  cudaStream_t main_;
  int count_;
  bool forked_ = false;
  Lane *lanes_[kMaxStreams] = {};
};

/* Waits for the context's stream when leaving a scope, so that host
 * memory a pending copy still reads or writes outlives it. */
class SyncOnExit {
 public:
  explicit SyncOnExit(cudaStream_t s) : stream_(s) {}
  ~SyncOnExit() {
    if (cudaStreamSynchronize(stream_) != cudaSuccess) cudaGetLastError();
  }
  SyncOnExit(const SyncOnExit &) = delete;
  SyncOnExit &operator=(const SyncOnExit &) = delete;

 private:
  cudaStream_t stream_;
};

/* --------------------------------------------------- typed cuSOLVER/cuBLAS */

cusolverStatus_t geqrf_size(cusolverDnHandle_t h, int m, int n, float *a, int *lwork) {
  return cusolverDnSgeqrf_bufferSize(h, m, n, a, m, lwork);
}
cusolverStatus_t geqrf_size(cusolverDnHandle_t h, int m, int n, double *a, int *lwork) {
  return cusolverDnDgeqrf_bufferSize(h, m, n, a, m, lwork);
}
cusolverStatus_t orgqr_size(cusolverDnHandle_t h, int m, int n, float *a, int *lwork) {
  return cusolverDnSorgqr_bufferSize(h, m, n, n, a, m, a, lwork);
}
cusolverStatus_t orgqr_size(cusolverDnHandle_t h, int m, int n, double *a, int *lwork) {
  return cusolverDnDorgqr_bufferSize(h, m, n, n, a, m, a, lwork);
}
cusolverStatus_t potrf_size(cusolverDnHandle_t h, int n, double *a, int *lwork) {
  return cusolverDnDpotrf_bufferSize(h, CUBLAS_FILL_MODE_UPPER, n, a, n, lwork);
}
cusolverStatus_t geqrf(cusolverDnHandle_t h, int m, int n, float *a, float *tau,
                       float *work, int lwork, int *info) {
  return cusolverDnSgeqrf(h, m, n, a, m, tau, work, lwork, info);
}
cusolverStatus_t geqrf(cusolverDnHandle_t h, int m, int n, double *a, double *tau,
                       double *work, int lwork, int *info) {
  return cusolverDnDgeqrf(h, m, n, a, m, tau, work, lwork, info);
}
cusolverStatus_t orgqr(cusolverDnHandle_t h, int m, int n, float *a, const float *tau,
                       float *work, int lwork, int *info) {
  return cusolverDnSorgqr(h, m, n, n, a, m, tau, work, lwork, info);
}
cusolverStatus_t orgqr(cusolverDnHandle_t h, int m, int n, double *a, const double *tau,
                       double *work, int lwork, int *info) {
  return cusolverDnDorgqr(h, m, n, n, a, m, tau, work, lwork, info);
}
cusolverStatus_t potrf(cusolverDnHandle_t h, int n, double *a, double *work, int lwork,
                       int *info) {
  return cusolverDnDpotrf(h, CUBLAS_FILL_MODE_UPPER, n, a, n, work, lwork, info);
}
/* The Cholesky path's kernels, all fp64. g (upper) = w^T w, w column-major
 * m x n */
cublasStatus_t gram(cublasHandle_t h, int m, int n, const double *w, double *g) {
  const double one = 1.0, zero = 0.0;
  return cublasDsyrk(h, CUBLAS_FILL_MODE_UPPER, CUBLAS_OP_T, n, m, &one, w, m, &zero, g,
                     n);
}
/* w = w r^-1, r upper n x n */
cublasStatus_t solve_right_upper(cublasHandle_t h, int m, int n, const double *r,
                                 double *w) {
  const double one = 1.0;
  return cublasDtrsm(h, CUBLAS_SIDE_RIGHT, CUBLAS_FILL_MODE_UPPER, CUBLAS_OP_N,
                     CUBLAS_DIAG_NON_UNIT, m, n, &one, r, n, w, m);
}
/* b = r b in place (cuBLAS's trmm is out of place; C == B is allowed) */
cublasStatus_t mul_left_upper(cublasHandle_t h, int n, const double *r, double *b) {
  const double one = 1.0;
  return cublasDtrmm(h, CUBLAS_SIDE_LEFT, CUBLAS_FILL_MODE_UPPER, CUBLAS_OP_N,
                     CUBLAS_DIAG_NON_UNIT, n, n, &one, r, n, b, n, b, n);
}
/* The TF32 path's kernels. g32 (n x n, all of it) = w^T w for the fp32
 * column-major m x n w, on the tensor cores in TF32 (cuBLAS rounds the
 * operands to TF32 and sums in fp32). */
cublasStatus_t gram_tf32(cublasHandle_t h, int m, int n, const float *w, float *g32) {
  const float one = 1.0f, zero = 0.0f;
  return cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n, n, m, &one, w, CUDA_R_32F, m, w,
                      CUDA_R_32F, m, &zero, g32, CUDA_R_32F, n,
                      CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_GEMM_DEFAULT);
}
/* w (m x n, ld m) = w r^-1 in fp32, r upper n x n with leading dimension ldr */
cublasStatus_t solve_right_upper(cublasHandle_t h, int m, int n, const float *r, int ldr,
                                 float *w) {
  const float one = 1.0f;
  return cublasStrsm(h, CUBLAS_SIDE_RIGHT, CUBLAS_FILL_MODE_UPPER, CUBLAS_OP_N,
                     CUBLAS_DIAG_NON_UNIT, m, n, &one, r, ldr, w, m);
}
/* c (m x n, ld m) = alpha a (m x k, ld m) b (k x n, ld ldb) + beta c, one
 * TF32 GEMM */
cublasStatus_t product_tf32(cublasHandle_t h, int m, int n, int k, float alpha,
                            const float *a, const float *b, int ldb, float beta,
                            float *c) {
  return cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &alpha, a, CUDA_R_32F, m, b,
                      CUDA_R_32F, ldb, &beta, c, CUDA_R_32F, m,
                      CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_GEMM_DEFAULT);
}
/* out (column-major m x n) = A q, A row-major m x m = column-major A^T */
cublasStatus_t product(cublasHandle_t h, int m, int n, const float *a, int lda,
                       const float *q, float *out) {
  const float one = 1.0f, zero = 0.0f;
  return cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, m, &one, a, lda, q, m, &zero, out,
                     m);
}
cublasStatus_t product(cublasHandle_t h, int m, int n, const double *a, int lda,
                       const double *q, double *out) {
  const double one = 1.0, zero = 0.0;
  return cublasDgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, m, &one, a, lda, q, m, &zero, out,
                     m);
}

/* The workspace queries read no data, but may reject a null pointer: hand
 * them a non-null address that is never dereferenced. */
template <class T>
T *unused_device_pointer() noexcept {
  return reinterpret_cast<T *>(static_cast<uintptr_t>(4096));
}

/* cuSOLVER workspace (elements of T) for a job: geqrf, orgqr, and the
 * fp64 potrf of the Cholesky path (whose fall-back needs the first two). */
template <class T>
int query_lwork(Context &ctx, int m, int n, bool cholesky) {
  const auto h = static_cast<cusolverDnHandle_t>(solver_handle(ctx));
  T *a = unused_device_pointer<T>();
  int l1 = 0, l2 = 0, l3 = 0;
  check_solver(geqrf_size(h, m, n, a, &l1), "geqrf_bufferSize");
  check_solver(orgqr_size(h, m, n, a, &l2), "orgqr_bufferSize");
  if (cholesky)
    check_solver(potrf_size(h, n, unused_device_pointer<double>(), &l3),
                 "potrf_bufferSize");
  const int64_t l3_t = static_cast<int64_t>(l3) * static_cast<int64_t>(sizeof(double)) /
                       static_cast<int64_t>(sizeof(T));
  return static_cast<int>(std::max<int64_t>({l1, l2, l3_t, 1}));
}

/* The workspace queries of the shapes seen so far (a call has few), so
 * that enqueuing a job does no host work beyond its launches. */
struct LworkCache {
  struct Entry {
    int device;
    osfti_dtype_t dtype;
    int m, n;
    bool cholesky;
    int lwork;
  };
  std::mutex mutex;
  std::vector<Entry> entries;
};

template <class T>
int solver_lwork(Context &ctx, int m, int n, bool cholesky) {
  static LworkCache *cache = new LworkCache(); /* never destroyed */
  const osfti_dtype_t dt = std::is_same<T, double>::value ? OSFTI_F64 : OSFTI_F32;
  {
    std::lock_guard<std::mutex> lock(cache->mutex);
    for (const LworkCache::Entry &e : cache->entries)
      if (e.device == ctx.device_id && e.dtype == dt && e.m == m && e.n == n &&
          e.cholesky == cholesky)
        return e.lwork;
  }
  const int lwork = query_lwork<T>(ctx, m, n, cholesky);
  std::lock_guard<std::mutex> lock(cache->mutex);
  if (cache->entries.size() < 256)
    cache->entries.push_back({ctx.device_id, dt, m, n, cholesky, lwork});
  return lwork;
}

/* ---------------------------------------------------------------- jobs */

template <class T>
using Buffers = QrBuffers<T>;

/* The job's buffers in its lane's scratch (nullptr: only counts). */
/* cuBLAS workspace of a lane, at the start of its scratch: from the
 * context's allocator (so it is counted and bounded by workspace_limit)
 * instead of the handle's own cudaMalloc. cuBLAS documents 4 MiB for GPUs
 * before Hopper and 32 MiB for Hopper; the lanes run only syrk, trsm, trmm
 * and a power-iteration gemm, so the smaller size is the default until a
 * GPU profile says otherwise. */
constexpr size_t kLaneBlasWorkspace = size_t{4} << 20;

template <class T>
size_t carve(Context &ctx, const QrJob &job, const QrCall &call, char *base,
             Buffers<T> *out) {
  const int lwork =
      solver_lwork<T>(ctx, static_cast<int>(job.m()), static_cast<int>(job.n()),
                      qr_is_cholesky(call.method));
  return kLaneBlasWorkspace +
         qr_carve<T>(job, call, lwork,
                     base != nullptr ? base + kLaneBlasWorkspace : nullptr, out);
}

/* The steps of shifted_cholesky_qr3 (src/backend/qr_backend.h) on a lane,
 * all in fp64: enqueued without a host wait, the verdict (kQrNeedsFallback)
 * and the checks of diag(R), Q and R taken on the device into *flag. */
template <class T>
class CudaCholesky {
 public:
  CudaCholesky(const Lane &lane, const Buffers<T> &b, const QrJob &job, bool want_r,
               const QrCall &call, uint32_t *flag)
      : lane_(lane),
        b_(b),
        job_(job),
        m_(job.m()),
        n_(job.n()),
        want_r_(want_r),
        threshold_(call.ortho_threshold),
        passes_(qr_cholesky_passes<T>(call.method)),
        flag_(flag) {}

  void widen() {
    if (!kNarrow) return;
    kq::launch_convert(lane_.stream, dtype(), b_.w, OSFTI_F64, b_.w64, m_ * n_);
  }
  void gram() {
    check_blas(osft::gram(lane_.blas, m(), n(), b_.w64, b_.g), "cublas dsyrk");
  }
  void shift(double factor) { kq::launch_shift_diagonal(lane_.stream, b_.g, n_, factor); }
  bool deviation_ok() {
    squared_distance(1.0);
    return true;
  }
  void shift_by_norm(double factor) { /* acc is free until deviation_ok() */
    squared_distance(0.0);
    kq::launch_shift_diagonal_norm(lane_.stream, b_.g, n_, factor, b_.acc);
  }
  bool cholesky(int pass) {
    factor_g(pass);
    check_blas(solve_right_upper(lane_.blas, m(), n(), b_.g, b_.w64), "cublas dtrsm");
    return true;
  }
  /* The TF32 path (fp32 jobs only): r holds the fp32 Gram matrix, then
   * factor; w64 w's TF32 halves (2 m n floats: its size); g, once
   * accumulate_r() has read the factor, r's halves. None is used otherwise
   * before widen() or narrow(). */
  void gram_tf32() {
    check_blas(osft::gram_tf32(lane_.blas, m(), n(), b_.w, b_.r), "cublasGemmEx (TF32)");
    kq::launch_convert(lane_.stream, OSFTI_F32, b_.r, OSFTI_F64, b_.g, n_ * n_);
  }
  bool cholesky_tf32(int pass) {
    factor_g(pass);
    /* R rounded to fp32 for the solve, and g = that R for accumulate_r */
    kq::launch_convert(lane_.stream, OSFTI_F64, b_.g, OSFTI_F32, b_.r, n_ * n_);
    kq::launch_convert(lane_.stream, OSFTI_F32, b_.r, OSFTI_F64, b_.g, n_ * n_);
    return true;
  }
  void split_r() {
    kq::launch_split_tf32(lane_.stream, f32(b_.r), r_hi(), r_lo(), n_ * n_);
  }
  bool cholesky_unit(int pass) {
    factor_g(pass);
    kq::launch_unit_factor(lane_.stream, b_.g, n_, kTf32SolveBlock, f32(b_.r), b_.ublk,
                           b_.dlast);
    return true;
  }
  void update_3xtf32(int64_t j0, int64_t jb, bool to_t) {
    const float *a[3] = {w_lo(), w_hi(), w_hi()}, *b[3] = {r_hi(), r_lo(), r_hi()};
    float *c = to_t ? b_.t : f32(b_.w) + j0 * m_;
    for (int t = 0; t < 3; ++t) /* the small terms first */
      check_blas(product_tf32(lane_.blas, m(), static_cast<int>(jb), static_cast<int>(j0),
                              to_t ? 1.0f : -1.0f, a[t], b[t] + j0 * n_, n(),
                              to_t && t == 0 ? 0.0f : 1.0f, c),
                 "cublasGemmEx (3xTF32)");
  }
  void solve_block(int64_t j0, int64_t jb) {
    check_blas(solve_right_upper(lane_.blas, m(), static_cast<int>(jb),
                                 f32(b_.r) + j0 + j0 * n_, n(), f32(b_.w) + j0 * m_),
               "cublas strsm");
  }
  void solve_block_fp64(int64_t j0, int64_t jb) {
    float *w = f32(b_.w) + j0 * m_;
    kq::launch_scaled_block(lane_.stream, w, j0 > 0 ? b_.t : nullptr, b_.dlast + j0, b_.z,
                            m_, jb);
    check_blas(solve_right_upper(lane_.blas, m(), static_cast<int>(jb),
                                 b_.ublk + j0 * kTf32SolveBlock, b_.z),
               "cublas dtrsm");
    kq::launch_convert(lane_.stream, OSFTI_F64, b_.z, OSFTI_F32, w, m_ * jb);
  }
  void split_w(int64_t j0, int64_t jb) {
    kq::launch_split_tf32(lane_.stream, f32(b_.w) + j0 * m_, w_hi() + j0 * m_,
                          w_lo() + j0 * m_, m_ * jb);
  }
  void accumulate_r(int pass) {
    kq::launch_diagonal_product(lane_.stream, b_.g, n_, b_.d64, pass == 0);
    if (!want_r_) return;
    if (pass > 0) {
      check_blas(mul_left_upper(lane_.blas, n(), b_.g, b_.r64), "cublas dtrmm");
      return;
    }
    kq::Transfer r1; /* R1 = triu(g) */
    r1.src = kq::col_major(b_.g, n_, n_, n_);
    r1.dst = kq::col_major(b_.r64, n_, n_, n_);
    r1.upper = true;
    kq::launch_transfer(lane_.stream, OSFTI_F64, r1);
  }
  /* Q (from w64 when q_in_w64), diag(R) (into sign) and R in T, then the
   * checks: an fp64 value beyond fp32's range becomes Inf and is reported
   * as an overflow. */
  bool narrow(bool q_in_w64) {
    kq::launch_cholqr2_verdict(lane_.stream, b_.info, passes_, b_.acc, threshold_, flag_);
    kq::launch_convert(lane_.stream, OSFTI_F64, b_.d64, dtype(), b_.sign, n_);
    kq::launch_diagonal(lane_.stream, dtype(), b_.sign, 0, n_, nullptr, flag_,
                        job_.rank_tol);
    if (kNarrow) {
      if (q_in_w64)
        kq::launch_convert(lane_.stream, OSFTI_F64, b_.w64, dtype(), b_.w, m_ * n_);
      if (want_r_)
        kq::launch_convert(lane_.stream, OSFTI_F64, b_.r64, dtype(), b_.r, n_ * n_);
    }
    check_finite(kq::col_major(b_.w, m_, n_, m_), false);
    if (want_r_) check_finite(kq::col_major(b_.r, n_, n_, n_), true);
    return true;
  }

 private:
  static constexpr bool kNarrow = !std::is_same<T, double>::value;
  /* g = chol(g) in place (upper); its info into info[pass], read by the
   * verdict on the device */
  void factor_g(int pass) {
    check_solver(potrf(lane_.solver, n(), b_.g, reinterpret_cast<double *>(b_.work),
                       lwork64(), b_.info + pass),
                 "cusolverDn dpotrf");
  }
  osfti_dtype_t dtype() const noexcept { return job_.q.dtype; }
  /* acc = ||g - diagonal I||_F^2 (g symmetric, its upper triangle read) */
  void squared_distance(double diagonal) {
    check_cuda(cudaMemsetAsync(b_.acc, 0, sizeof(double), lane_.stream),
               "cudaMemsetAsync");
    kq::launch_gram_deviation(lane_.stream, OSFTI_F64, b_.g, n_, diagonal, b_.acc);
  }
  /* The TF32 path's views (fp32 jobs only; T is float there). */
  static float *f32(T *p) noexcept { return reinterpret_cast<float *>(p); }
  float *w_hi() const noexcept { return reinterpret_cast<float *>(b_.w64); }
  float *w_lo() const noexcept { return w_hi() + m_ * n_; }
  float *r_hi() const noexcept { return reinterpret_cast<float *>(b_.g); }
  float *r_lo() const noexcept { return r_hi() + n_ * n_; }
  /* The solver workspace in doubles (it is sized in elements of T). */
  int lwork64() const noexcept {
    return static_cast<int>(b_.lwork * static_cast<int64_t>(sizeof(T)) /
                            static_cast<int64_t>(sizeof(double)));
  }
  int m() const noexcept { return static_cast<int>(m_); }
  int n() const noexcept { return static_cast<int>(n_); }
  void check_finite(kq::View v, bool upper) {
    kq::Transfer t;
    t.src = v;
    t.upper = upper;
    t.flag = flag_;
    t.bit = kQrNonfiniteResult;
    kq::launch_transfer(lane_.stream, dtype(), t);
  }

  const Lane &lane_;
  const Buffers<T> &b_;
  const QrJob &job_;
  int64_t m_, n_;
  bool want_r_;
  double threshold_;
  int passes_; /* Cholesky infos the verdict reads */
  uint32_t *flag_;
};

/* Enqueues one job on its lane. */
template <class T>
class JobRunner {
 public:
  JobRunner(Context &ctx, const QrCall &call, const Lane &lane, const QrJob &job,
            char *lane_scratch, uint32_t *flag)
      : call_(call), lane_(lane), job_(job), flag_(flag), m_(job.m()), n_(job.n()) {
    carve<T>(ctx, job, call, lane_scratch, &b_);
  }

  void run(bool cholesky) {
    cholesky_ = cholesky;
    if (call_.iterations == 0) return factor_once();
    power_iteration();
  }

 private:
  osfti_dtype_t dtype() const noexcept { return job_.q.dtype; }
  int m() const noexcept { return static_cast<int>(m_); }
  int n() const noexcept { return static_cast<int>(n_); }
  int lwork() const noexcept { return static_cast<int>(b_.lwork); }

  void transfer(kq::View src, kq::View dst, const T *scale, uint32_t check_bit,
                bool skip_failed, bool upper = false) {
    kq::Transfer t;
    t.src = src;
    t.dst = dst;
    t.scale = scale;
    t.axis = scale != nullptr ? kq::Scale::cols : kq::Scale::none;
    t.upper = upper;
    t.skip = skip_failed ? flag_ : nullptr;
    t.skip_mask = kSkipMask;
    t.flag = check_bit != 0 ? flag_ : nullptr;
    t.bit = check_bit;
    kq::launch_transfer(lane_.stream, dtype(), t);
  }

  kq::View work_view(T *p) const noexcept { return kq::col_major(p, m_, n_, m_); }

  void factor_once() {
    const Mat &a = job_.a;
    transfer(kq::row_major(a.data, m_, n_, a.ld), work_view(b_.w), nullptr,
             kQrNonfiniteInput, false);
    factor(job_.r.data != nullptr);
    transfer(work_view(b_.w), kq::row_major(job_.q.data, m_, n_, job_.q.ld),
             cholesky_ ? nullptr : b_.sign, 0, true);
    if (job_.r.data != nullptr)
      transfer(kq::col_major(b_.r, n_, n_, n_),
               kq::row_major(job_.r.data, n_, n_, job_.r.ld), nullptr, 0, true);
  }

  void power_iteration() {
    const Mat &a = job_.a, &q = job_.q;
    transfer(kq::row_major(q.data, m_, n_, q.ld), work_view(b_.p), nullptr,
             kQrNonfiniteInput, false);
    transfer(kq::row_major(a.data, m_, m_, a.ld), kq::View{}, nullptr, kQrNonfiniteInput,
             false);
    for (int it = 0; it < call_.iterations; ++it) {
      check_blas(product(lane_.blas, m(), n(), static_cast<const T *>(a.data),
                         static_cast<int>(a.ld), b_.p, b_.w),
                 "cublas gemm (A Q)");
      factor(false);
      transfer(work_view(b_.w), work_view(b_.p), cholesky_ ? nullptr : b_.sign, 0, false);
    }
    transfer(work_view(b_.p), kq::row_major(q.data, m_, n_, q.ld), nullptr, 0, true);
  }

  /* w -> Q in place (Householder: before the sign fix, signs in b_.sign);
   * R into b_.r when wanted. */
  void factor(bool want_r) {
    if (cholesky_) {
      CudaCholesky<T> ops(lane_, b_, job_, want_r, call_, flag_);
      run_cholesky_path<T>(call_.method, ops, m_, n_);
      return;
    }
    check_solver(geqrf(lane_.solver, m(), n(), b_.w, b_.tau, b_.work, lwork(), b_.info),
                 "cusolverDn geqrf");
    kq::launch_diagonal(lane_.stream, dtype(), b_.w, m_, n_, b_.sign, flag_,
                        job_.rank_tol);
    /* R = diag(sign) * triu(w) when wanted; either way all of R is checked
     * for NaN/Inf (launch_diagonal sees only its diagonal), as on the CPU. */
    kq::Transfer t;
    t.src = kq::col_major(b_.w, n_, n_, m_);
    if (want_r) t.dst = kq::col_major(b_.r, n_, n_, n_);
    t.scale = b_.sign;
    t.axis = kq::Scale::rows;
    t.upper = true;
    t.flag = flag_;
    t.bit = kQrNonfiniteResult;
    kq::launch_transfer(lane_.stream, dtype(), t);
    check_solver(orgqr(lane_.solver, m(), n(), b_.w, b_.tau, b_.work, lwork(), b_.info),
                 "cusolverDn orgqr");
    transfer(work_view(b_.w), kq::View{}, nullptr, kQrNonfiniteResult, false);
  }

  const QrCall &call_;
  const Lane &lane_;
  const QrJob &job_;
  uint32_t *flag_;
  int64_t m_, n_;
  bool cholesky_ = false;
  Buffers<T> b_;
};

/* -------------------------------------------------------------- the call */

/* The call's shared scratch: per-job flags, then the small jobs'
 * descriptors. */
struct Shared {
  uint32_t *flags;
  kq::SmallDesc *descs;
};

size_t small_jobs(const QrCall &call) {
  size_t n = 0;
  while (n < call.count && call.jobs[n].lane < 0) ++n; /* they come first */
  return n;
}

Shared shared_layout(const QrCall &call, char *base) {
  Shared s;
  s.flags = reinterpret_cast<uint32_t *>(base);
  s.descs =
      reinterpret_cast<kq::SmallDesc *>(base + qr_align(call.count * sizeof(uint32_t)));
  return s;
}

/* The batched kernel, one launch per dtype (small jobs are sorted by it).
 * `host` must stay alive until the context's stream has passed the copy. */
void run_small(Context &ctx, const QrCall &call, const Shared &s,
               const HostArray<kq::SmallDesc> &host) {
  const size_t count = small_jobs(call);
  if (count == 0) return;
  for (size_t p = 0; p < count; ++p) {
    const QrJob &j = call.jobs[p];
    kq::SmallDesc &d = host[p];
    d.a = j.a.data;
    d.lda = j.a.ld;
    d.q = j.q.data;
    d.ldq = j.q.ld;
    d.r = j.r.data;
    d.ldr = j.r.ld;
    d.m = static_cast<int32_t>(j.m());
    d.n = static_cast<int32_t>(j.n());
    d.rank_tol = j.rank_tol;
    d.flag_index = static_cast<int64_t>(p);
  }
  check_cuda(cudaMemcpyAsync(s.descs, host.get(), count * sizeof(kq::SmallDesc),
                             cudaMemcpyHostToDevice, stream_of(ctx)),
             "cudaMemcpyAsync");
  for (size_t first = 0; first < count;) {
    const osfti_dtype_t dt = call.jobs[first].q.dtype;
    size_t last = first, smem = 0;
    for (; last < count && call.jobs[last].q.dtype == dt; ++last)
      smem =
          std::max(smem, kq::small_smem_bytes(dt, call.jobs[last].m(),
                                              call.jobs[last].n(), call.iterations > 0));
    kq::launch_small_qr(stream_of(ctx), dt, s.descs + first,
                        static_cast<int>(last - first), smem, call.iterations, s.flags);
    first = last;
  }
}

void enqueue_job(Context &ctx, const QrCall &call, const LaneSet &lanes, char *scratch,
                 uint32_t *flags, bool cholesky, size_t p) {
  const QrJob &job = call.jobs[p];
  char *base = scratch + call.lane_offset[job.lane];
  const Lane &lane = lanes.lane(job.lane);
  if (job.q.dtype == OSFTI_F64)
    JobRunner<double>(ctx, call, lane, job, base, flags + p).run(cholesky);
  else
    JobRunner<float>(ctx, call, lane, job, base, flags + p).run(cholesky);
}

/* Enqueues the lane jobs (those with redo[p] set, if redo is given)
 * between a fork and a join of the lanes: round-robin over the lanes (the
 * first job of every lane, then the second, ...), so that every lane has
 * work queued early. Enqueued lane after lane, a lane started only once
 * the host had issued every launch of the lanes before it (a 4096^2
 * Householder QR is hundreds of cuSOLVER launches), and with them the
 * device often had finished those lanes already: they barely overlapped. */
void run_lanes(Context &ctx, const QrCall &call, const LaneSet &lanes, char *scratch,
               uint32_t *flags, bool cholesky, const uint32_t *redo,
               const HostArray<size_t> &next) {
  for (int l = 0; l <= call.lanes; ++l) next[static_cast<size_t>(l)] = call.count;
  for (size_t p = call.count; p-- > 0;) /* jobs are sorted by lane */
    if (call.jobs[p].lane >= 0) next[static_cast<size_t>(call.jobs[p].lane)] = p;
  for (int l = 0; l < call.lanes; ++l) /* once per call, not per job */
    check_blas(cublasSetWorkspace(lanes.lane(l).blas, scratch + call.lane_offset[l],
                                  kLaneBlasWorkspace),
               "cublasSetWorkspace");
  for (bool more = true; more;) {
    more = false;
    for (int l = 0; l < call.lanes; ++l) {
      size_t &p = next[static_cast<size_t>(l)];
      while (p < call.count && call.jobs[p].lane == l && redo != nullptr && redo[p] == 0)
        ++p;
      if (p >= call.count || call.jobs[p].lane != l) continue;
      enqueue_job(ctx, call, lanes, scratch, flags, cholesky, p++);
      more = true;
    }
  }
}

/* Reads the device flags into `flags` (waits for the context's stream). */
void read_flags(Context &ctx, const QrCall &call, const uint32_t *device,
                uint32_t *flags) {
  check_cuda(cudaMemcpyAsync(flags, device, call.count * sizeof(uint32_t),
                             cudaMemcpyDeviceToHost, stream_of(ctx)),
             "cudaMemcpyAsync");
  check_cuda(cudaStreamSynchronize(stream_of(ctx)), "cudaStreamSynchronize");
}

/* Small jobs run on the context's stream while the lanes run the others. */
void cuda_run(Context &ctx, const QrCall &call, void *scratch, uint32_t *flags) {
  DeviceGuard guard(ctx.device_id);
  char *base = static_cast<char *>(scratch);
  const Shared s = shared_layout(call, base);
  HostArray<kq::SmallDesc> descs(ctx, small_jobs(call));
  HostArray<uint32_t> redo(ctx, call.count);
  /* Every allocation before the first write: a refused one leaves the
   * outputs untouched (the small jobs write theirs before the lanes run). */
  HostArray<size_t> next(ctx, static_cast<size_t>(call.lanes) + 1);
  SyncOnExit sync(stream_of(ctx)); /* before descs and flags may go */
  check_cuda(cudaMemsetAsync(s.flags, 0, call.count * sizeof(uint32_t), stream_of(ctx)),
             "cudaMemsetAsync");
  const bool cholesky = qr_is_cholesky(call.method);
  bool read = false; /* flags already hold the final verdicts */
  if (small_jobs(call) == call.count) {
    run_small(ctx, call, s, descs);
  } else {
    LaneSet lanes(ctx, std::min(call.lanes, kMaxStreams));
    lanes.fork();
    run_small(ctx, call, s, descs);
    run_lanes(ctx, call, lanes, base, s.flags, cholesky, nullptr, next);
    lanes.join();
    if (cholesky) { /* the one host wait, unless a matrix must be redone */
      read_flags(ctx, call, s.flags, flags);
      read = true;
      size_t again = 0;
      for (size_t p = 0; p < call.count; ++p) {
        /* A NaN/Inf input fails either way: no point redoing it. */
        if ((flags[p] & kQrNeedsFallback) == 0 || (flags[p] & kQrNonfiniteInput) != 0)
          continue;
        redo[p] = 1;
        ++again;
        check_cuda(cudaMemsetAsync(s.flags + p, 0, sizeof(uint32_t), stream_of(ctx)),
                   "cudaMemsetAsync");
      }
      if (again > 0) {
        read = false;
        lanes.fork();
        run_lanes(ctx, call, lanes, base, s.flags, false, redo.get(), next);
        lanes.join();
      }
    }
  }
  if (!read) read_flags(ctx, call, s.flags, flags);
  for (size_t p = 0; p < call.count; ++p) {
    flags[p] &= ~static_cast<uint32_t>(kQrNeedsFallback);
    if (redo[p] != 0) flags[p] |= kQrFellBack;
  }
}

/* -------------------------------------------------------------- the table */

int cuda_default_concurrency(Context &) {
  return kDefaultLanes;
}

bool cuda_batched(Context &ctx, const QrJob &job, const QrCall &call) {
  return kq::small_smem_bytes(job.q.dtype, job.m(), job.n(), call.iterations > 0) <=
         kq::small_smem_limit(ctx.device_id);
}

size_t cuda_lane_bytes(Context &ctx, const QrJob &job, const QrCall &call) {
  DeviceGuard guard(ctx.device_id);
  return job.q.dtype == OSFTI_F64 ? carve<double>(ctx, job, call, nullptr, nullptr)
                                  : carve<float>(ctx, job, call, nullptr, nullptr);
}

size_t cuda_shared_bytes(Context &, const QrCall &call) {
  return qr_align(call.count * sizeof(uint32_t)) +
         qr_align(small_jobs(call) * sizeof(kq::SmallDesc));
}

}  // namespace

const QrKernels &cuda_qr_table() {
  static const QrKernels table = {false,        false,           cuda_default_concurrency,
                                  cuda_batched, cuda_lane_bytes, cuda_shared_bytes,
                                  cuda_run};
  return table;
}

}  // namespace osft
