/* The CUDA backend of src/backend/linalg_backend.h: cuBLAS GEMMs, a cuSOLVER SVD in
 * fp64, and the kernels of src/cuda/linalg_kernels.cu. Everything is
 * enqueued on the context's stream, on its device; only svd waits (for the
 * solver's convergence flag). */
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cusolverDn.h>

#include <algorithm>

#include "cuda/cuda_check.h"
#include "backend/linalg_backend.h"
#include "core/error.h"
#include "cuda/device_guard.h"
#include "cuda/linalg_kernels.cuh"
#include "cuda/module_cuda.h"

namespace osft {
namespace {

using cuda::DeviceGuard;
using cuda::Strided;
using cuda::strided;
using cuda::transposed;

/* Device scratch from the context's allocator. Freeing right after
 * enqueuing is safe: a caller's allocator gets the stream and frees in
 * stream order, and so does the built-in one (cudaFreeAsync into the
 * library's pool, which keeps the block cached: no wait). */
class DeviceBuffer {
 public:
  DeviceBuffer(Context &ctx, int64_t count, size_t elem_size, const char *what)
      : ctx_(ctx), bytes_(static_cast<size_t>(count) * elem_size) {
    if (bytes_ > 0) ptr_ = device_alloc(ctx_, bytes_, what);
  }
  ~DeviceBuffer() { device_free(ctx_, ptr_, bytes_); }
  DeviceBuffer(const DeviceBuffer &) = delete;
  DeviceBuffer &operator=(const DeviceBuffer &) = delete;
  template <class T = void>
  T *as() const noexcept {
    return static_cast<T *>(ptr_);
  }
  size_t bytes() const noexcept { return bytes_; }

 private:
  Context &ctx_;
  size_t bytes_;
  void *ptr_ = nullptr;
};

/* Host scratch for cuSOLVER, which may use it until the stream gets past
 * the call: the destructor waits for the stream first (a no-op on the
 * normal path, which has synchronized already). */
class SolverHostBuffer {
 public:
  SolverHostBuffer(Context &ctx, size_t bytes) : ctx_(ctx), bytes_(bytes) {
    if (bytes_ > 0) ptr_ = ctx_.allocator.host_alloc(bytes_, "cuSOLVER host workspace");
  }
  ~SolverHostBuffer() {
    if (ptr_ == nullptr) return;
    cudaStreamSynchronize(static_cast<cudaStream_t>(ctx_.stream));
    ctx_.allocator.host_free(ptr_, bytes_);
  }
  SolverHostBuffer(const SolverHostBuffer &) = delete;
  SolverHostBuffer &operator=(const SolverHostBuffer &) = delete;
  void *get() const noexcept { return ptr_; }

 private:
  Context &ctx_;
  size_t bytes_;
  void *ptr_ = nullptr;
};

class SolverParams {
 public:
  SolverParams();
  ~SolverParams() { cusolverDnDestroyParams(params_); }
  SolverParams(const SolverParams &) = delete;
  SolverParams &operator=(const SolverParams &) = delete;
  cusolverDnParams_t get() const noexcept { return params_; }

 private:
  cusolverDnParams_t params_ = nullptr;
};

SolverParams::SolverParams() {
  check_solver(cusolverDnCreateParams(&params_), "cusolverDnCreateParams");
}

/* dst = src, converting the dtype (shapes equal, strides arbitrary). */
void copy(Context &ctx, const Strided &src, const Strided &dst) {
  cuda::launch_scale(stream_of(ctx), Axis::rows, src, nullptr, 1.0f, 0.0f, dst);
}

/* ------------------------------------------------------------ gemm */

cudaDataType blas_type(osfti_dtype_t dt) noexcept {
  return dt == OSFTI_BF16 ? CUDA_R_16BF : CUDA_R_32F;
}

cublasOperation_t blas_op(Op op) noexcept {
  return op == Op::N ? CUBLAS_OP_N : CUBLAS_OP_T;
}

/* cuBLAS wants ld >= the column-major row count (our cols) even where a
 * single row-major row makes ld meaningless, and views may carry any ld
 * there. */
int64_t blas_ld(const Mat &m) noexcept {
  return m.rows <= 1 ? std::max<int64_t>({m.ld, m.cols, 1}) : m.ld;
}

/* Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T, and a
 * row-major matrix read as column-major is its transpose: so cuBLAS gets
 * (B, A) with the same ops and m, n swapped. CUBLAS_COMPUTE_32F keeps fp32
 * operands in full fp32 (the handle keeps the default math mode); with the
 * context's allow_tf32, CUBLAS_COMPUTE_32F_FAST_TF32 lets them run on TF32
 * tensor cores. Chosen per call, so the handle's state never matters. bf16
 * operands run on tensor cores with fp32 accumulation either way. */
cublasComputeType_t compute_type(const Context &ctx, const Mat &a,
                                 const Mat &b) noexcept {
  return ctx.allow_tf32 && a.dtype == OSFTI_F32 && b.dtype == OSFTI_F32
             ? CUBLAS_COMPUTE_32F_FAST_TF32
             : CUBLAS_COMPUTE_32F;
}

/* The context's cuBLAS handle, with host pointers for alpha and beta. */
cublasHandle_t gemm_handle(Context &ctx) {
  const auto handle = static_cast<cublasHandle_t>(blas_handle(ctx));
  check_blas(cublasSetPointerMode(handle, CUBLAS_POINTER_MODE_HOST),
             "cublasSetPointerMode");
  return handle;
}

void gemm_ex(Context &ctx, Op op_a, const Mat &a, Op op_b, const Mat &b, int64_t k,
             float alpha, float beta, const Mat &c) {
  const cublasHandle_t handle = gemm_handle(ctx);
  const cublasComputeType_t compute = compute_type(ctx, a, b);
  check_blas(
      cublasGemmEx_64(handle, blas_op(op_b), blas_op(op_a), c.cols, c.rows, k, &alpha,
                      b.data, blas_type(b.dtype), blas_ld(b), a.data, blas_type(a.dtype),
                      blas_ld(a), &beta, c.data, blas_type(c.dtype), blas_ld(c), compute,
                      CUBLAS_GEMM_DEFAULT),
      "cublasGemmEx");
}

void cuda_fill_zero(Context &ctx, const Mat &dst) {
  DeviceGuard guard(ctx.device_id);
  cuda::launch_fill_zero(stream_of(ctx), strided(dst));
}

/* op(m) as a strided view: a transpose swaps the strides. */
Strided op_view(Op op, const Mat &m) {
  return op == Op::N ? strided(m) : transposed(strided(m));
}

void cuda_gemm(Context &ctx, Op op_a, const Mat &a, Op op_b, const Mat &b, float alpha,
               float beta, const Mat &c) {
  if (c.rows == 0 || c.cols == 0) return;
  DeviceGuard guard(ctx.device_id);
  const int64_t k = op_a == Op::N ? a.cols : a.rows;
  if (k == 0) {
    /* C = beta * C, spelled out rather than trusting every BLAS with k = 0;
     * beta == 0 writes zeros without reading C. */
    if (beta == 0.0f) return cuda_fill_zero(ctx, c);
    return cuda::launch_scale(stream_of(ctx), Axis::rows, strided(c), nullptr, beta, 0.0f,
                              strided(c));
  }
  if (a.dtype == OSFTI_BF16 || c.dtype == OSFTI_F32)
    return gemm_ex(ctx, op_a, a, op_b, b, k, alpha, beta, c);
  /* cuBLAS has no fp32 x fp32 -> bf16 GemmEx: go through an fp32 C, in the
   * context's kernel scratch (kept between calls). Refused (a first call
   * with new shapes, which may have written outputs already): a kernel of
   * our own that needs none, so the call does not fail halfway. */
  void *staging = kernel_scratch_if_available(
      ctx, static_cast<size_t>(c.rows * c.cols) * sizeof(float), "gemm fp32 output");
  if (staging == nullptr)
    return cuda::launch_gemm_unstaged(stream_of(ctx), op_view(op_a, a), op_view(op_b, b),
                                      alpha, beta, strided(c));
  const Mat c32{staging, c.rows, c.cols, c.cols, OSFTI_F32};
  if (beta != 0.0f) copy(ctx, strided(c), strided(c32));
  gemm_ex(ctx, op_a, a, op_b, b, k, alpha, beta, c32);
  copy(ctx, strided(c32), strided(c));
}

/* Problems per cublasGemmBatchedEx call: their pointer arrays (3 x 8 bytes
 * each) are written by a kernel into kernel scratch, then read by cuBLAS;
 * a next chunk reuses the memory after the stream has run the last (the
 * projection's batches hold at most 64: one chunk, one pointer launch). */
constexpr int64_t kBatchChunk = 256;

/* One launch per chunk of problems, the operands swapped as in gemm_ex.
 * Where gemm_ex does not apply (fp32 operands into a bf16 C, k == 0) or
 * the pointer arrays cannot be had, each problem goes through cuda_gemm. */
void cuda_gemm_batched(Context &ctx, Op op_a, Op op_b, int64_t count, const Mat *a,
                       const Mat *b, float alpha, float beta, const Mat *c) {
  DeviceGuard guard(ctx.device_id);
  const int64_t k = op_a == Op::N ? a[0].cols : a[0].rows;
  const size_t bytes = 3 * kBatchChunk * sizeof(void *);
  void *arrays = k > 0 && (a[0].dtype == OSFTI_BF16 || c[0].dtype == OSFTI_F32)
                     ? kernel_scratch_if_available(ctx, bytes, "batched gemm pointers")
                     : nullptr;
  if (arrays == nullptr || c[0].rows == 0 || c[0].cols == 0) {
    for (int64_t i = 0; i < count; ++i)
      cuda_gemm(ctx, op_a, a[i], op_b, b[i], alpha, beta, c[i]);
    return;
  }
  const cublasHandle_t handle = gemm_handle(ctx);
  const auto dev = static_cast<const void **>(arrays);
  for (int64_t first = 0; first < count; first += kBatchChunk) {
    const int64_t n = std::min(kBatchChunk, count - first);
    /* cuBLAS's A array (our B, see gemm_ex), its B (our A), then C: one
     * block, written by as few launches as the kernel arguments allow. */
    const void *host[3 * kBatchChunk];
    for (int64_t i = 0; i < n; ++i) {
      host[i] = b[first + i].data;
      host[n + i] = a[first + i].data;
      host[2 * n + i] = c[first + i].data;
    }
    cuda::launch_write_pointers(stream_of(ctx), host, 3 * n, dev);
    check_blas(cublasGemmBatchedEx_64(
                   handle, blas_op(op_b), blas_op(op_a), c[0].cols, c[0].rows, k, &alpha,
                   dev, blas_type(b[0].dtype), blas_ld(b[0]), dev + n,
                   blas_type(a[0].dtype), blas_ld(a[0]), &beta,
                   const_cast<void *const *>(dev + 2 * n), blas_type(c[0].dtype),
                   blas_ld(c[0]), n, compute_type(ctx, a[0], b[0]), CUBLAS_GEMM_DEFAULT),
               "cublasGemmBatchedEx");
  }
}

/* ------------------------------------------------------------ element-wise */

void cuda_scale_into(Context &ctx, Axis axis, const Mat &src, const Vec *s, float beta,
                     const Mat &dst) {
  DeviceGuard guard(ctx.device_id);
  cuda::launch_scale(stream_of(ctx), axis, strided(src), s, 1.0f, beta, strided(dst));
}

void cuda_reduce(Context &ctx, Axis axis, const Mat &a, const Mat *b, float beta,
                 const Vec &y) {
  DeviceGuard guard(ctx.device_id);
  const size_t floats =
      static_cast<size_t>(cuda::reduce_scratch_floats(axis, a.rows, a.cols));
  /* Refused partials (a first call with new shapes, mid-operation): one
   * pass over all rows instead, slower but needing none. */
  float *partial = floats == 0 ? nullptr
                               : static_cast<float *>(kernel_scratch_if_available(
                                     ctx, floats * sizeof(float), "reduce partial sums"));
  cuda::launch_reduce(stream_of(ctx), axis, a, b, beta, y, partial);
}

/* A zero row stride repeats the vector down the rows. */
void cuda_broadcast_rows(Context &ctx, const Vec &v, const Mat &dst) {
  DeviceGuard guard(ctx.device_id);
  const Strided rows_of_v{v.data, dst.rows, dst.cols, 0, 1, v.dtype};
  copy(ctx, rows_of_v, strided(dst));
}

bool cuda_all_finite(Context &ctx, const Mat &a) {
  DeviceGuard guard(ctx.device_id);
  int *flag = static_cast<int *>(kernel_scratch(ctx, sizeof(int), "all_finite flag"));
  check_cuda(cudaMemsetAsync(flag, 0, sizeof(int), stream_of(ctx)), "cudaMemsetAsync");
  cuda::launch_flag_nonfinite(stream_of(ctx), strided(a), flag);
  int found = 0;
  check_cuda(
      cudaMemcpyAsync(&found, flag, sizeof found, cudaMemcpyDeviceToHost, stream_of(ctx)),
      "cudaMemcpyAsync");
  check_cuda(cudaStreamSynchronize(stream_of(ctx)), "cudaStreamSynchronize");
  return found == 0;
}

/* ------------------------------------------------------------ svd */

/* Column-major fp64 SVD of a rows x cols matrix (rows >= cols) with
 * cusolverDnXgesvd: the QR-iteration algorithm of LAPACK's dgesvd, as
 * accurate as the CPU's dgesdd and robust to rank deficiency (unlike
 * gesvdp), at any size (unlike gesvdj's sweeps); but it only takes
 * rows >= cols. Waits for the stream to read the convergence flag. */
void gesvd(Context &ctx, int64_t rows, int64_t cols, double *a, double *s, double *u,
           double *vt) {
  const auto handle = static_cast<cusolverDnHandle_t>(solver_handle(ctx));
  const SolverParams params;
  const int64_t lda = rows, ldu = rows, ldvt = cols;
  size_t device_bytes = 0, host_bytes = 0;
  check_solver(
      cusolverDnXgesvd_bufferSize(handle, params.get(), 'S', 'S', rows, cols, CUDA_R_64F,
                                  a, lda, CUDA_R_64F, s, CUDA_R_64F, u, ldu, CUDA_R_64F,
                                  vt, ldvt, CUDA_R_64F, &device_bytes, &host_bytes),
      "cusolverDnXgesvd_bufferSize");
  DeviceBuffer work(ctx, static_cast<int64_t>(device_bytes), 1, "SVD workspace");
  DeviceBuffer info(ctx, 1, sizeof(int), "SVD info");
  SolverHostBuffer host_work(ctx, host_bytes);
  check_solver(cusolverDnXgesvd(handle, params.get(), 'S', 'S', rows, cols, CUDA_R_64F, a,
                                lda, CUDA_R_64F, s, CUDA_R_64F, u, ldu, CUDA_R_64F, vt,
                                ldvt, CUDA_R_64F, work.as(), device_bytes,
                                host_work.get(), host_bytes, info.as<int>()),
               "cusolverDnXgesvd");
  int status = 0;
  check_cuda(cudaMemcpyAsync(&status, info.as(), sizeof status, cudaMemcpyDeviceToHost,
                             stream_of(ctx)),
             "cudaMemcpyAsync");
  check_cuda(cudaStreamSynchronize(stream_of(ctx)), "cudaStreamSynchronize");
  if (status > 0)
    raise(OSFT_STATUS_NUMERICAL_ERROR, "SVD did not converge (cusolverDnXgesvd info %d)",
          status);
  if (status < 0)
    raise(OSFT_STATUS_INTERNAL_ERROR, "cusolverDnXgesvd: argument %d invalid", -status);
}

/* cuSOLVER is column-major. gesvd needs a tall matrix, so it gets A itself
 * (column-major m x n, a transposing copy) when m > n, and otherwise A^T:
 * the compact row-major copy of A read as column-major n x m, whose SVD
 * A^T = V S U^T hands back its "U" as our V^T and its "VT" as our U, as in
 * src/cpu/linalg_cpu.cpp. Below, the solver's results are described as column-
 * major views and transposed into our orientation when A^T was solved. */
void cuda_svd(Context &ctx, const Mat &a, const Mat &u, const Vec &s, const Mat &vt) {
  const int64_t m = a.rows, n = a.cols, k = std::min(m, n);
  if (k == 0) return;
  DeviceGuard guard(ctx.device_id);
  const bool solve_at = n >= m;
  const int64_t rows = std::max(m, n); /* the solver's tall rows x k matrix */
  DeviceBuffer a64(ctx, rows * k, sizeof(double), "SVD input");
  DeviceBuffer u64(ctx, rows * k, sizeof(double), "SVD left vectors");
  DeviceBuffer vt64(ctx, k * k, sizeof(double), "SVD right vectors");
  DeviceBuffer s64(ctx, k, sizeof(double), "SVD values");
  const Strided a_cm{a64.as(), rows, k, 1, rows, OSFTI_F64};
  const Strided u_cm{u64.as(), rows, k, 1, rows, OSFTI_F64};
  const Strided vt_cm{vt64.as(), k, k, 1, k, OSFTI_F64};
  copy(ctx, strided(a), solve_at ? transposed(a_cm) : a_cm);
  gesvd(ctx, rows, k, a64.as<double>(), s64.as<double>(), u64.as<double>(),
        vt64.as<double>());
  copy(ctx, solve_at ? transposed(vt_cm) : u_cm, strided(u));
  copy(ctx, solve_at ? transposed(u_cm) : vt_cm, strided(vt));
  copy(ctx, Strided{s64.as(), 1, k, k, 1, OSFTI_F64},
       Strided{s.data, 1, k, k, 1, s.dtype});
}

}  // namespace

const Backend &cuda_linalg_table() {
  static const Backend table = {cuda_gemm,
                                cuda_scale_into,
                                cuda_reduce,
                                cuda_broadcast_rows,
                                cuda_svd,
                                cuda_fill_zero,
                                cuda_all_finite,
                                nullptr,
                                [](Context &) { return true; },
                                nullptr,
                                nullptr,
                                nullptr,
                                cuda_gemm_batched};
  return table;
}

}  // namespace osft
