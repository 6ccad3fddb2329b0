/* Internal: the kernels of batched QR on CUDA (src/cuda/qr_kernels.cu),
 * behind plain C++ launchers so that src/cuda/qr_cuda.cpp is compiled by the
 * host compiler. Launchers enqueue on `stream` on the current device,
 * never synchronize, and throw OSFT_STATUS_BACKEND_ERROR if a launch
 * fails. Dtypes: OSFTI_F32 and OSFTI_F64. Per-job flags are the QrFlag
 * bits of src/backend/qr_backend.h, set with atomicOr. */
#ifndef OSFTRT_SRC_CUDA_QR_KERNELS_CUH
#define OSFTRT_SRC_CUDA_QR_KERNELS_CUH

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace osft::cuda::qr {

/* A matrix with element strides: (i, j) at data + i * rs + j * cs. */
struct View {
  void *data = nullptr;
  int64_t rows = 0, cols = 0, rs = 0, cs = 1;
};

inline View row_major(void *data, int64_t rows, int64_t cols, int64_t ld) noexcept {
  return View{data, rows, cols, ld, 1};
}
inline View col_major(void *data, int64_t rows, int64_t cols, int64_t ld) noexcept {
  return View{data, rows, cols, 1, ld};
}

enum class Scale { none = 0, rows = 1, cols = 2 };

/* dst(i, j) = src(i, j) * scale (scale[i] for rows, scale[j] for cols),
 * with zeros below the diagonal when `upper`, through shared-memory tiles
 * so that both sides are read and written along their unit stride. Skips
 * everything if *skip & skip_mask (a job already failed). Sets `bit` in
 * *flag if an element it reads (above the diagonal when `upper`) is NaN or
 * Inf. dst.data == nullptr: only that check. */
struct Transfer {
  View src, dst;
  const void *scale = nullptr;
  Scale axis = Scale::none;
  bool upper = false;
  const uint32_t *skip = nullptr;
  uint32_t skip_mask = 0;
  uint32_t *flag = nullptr;
  uint32_t bit = 0;
};
void launch_transfer(cudaStream_t stream, osfti_dtype_t dtype, const Transfer &t);

/* From the diagonal of the column-major w (leading dimension ld, n x n
 * used): signs[j] = w_jj < 0 ? -1 : 1 (signs may be nullptr), and in
 * *flag kQrNonfiniteResult (a diagonal NaN/Inf) or kQrRankDeficient
 * (min |w_jj| <= rank_tol * max |w_jj|; rank_tol < 0: no check). */
void launch_diagonal(cudaStream_t stream, osfti_dtype_t dtype, const void *w, int64_t ld,
                     int64_t n, void *signs, uint32_t *flag, double rank_tol);

/* *acc += ||G - diagonal I||_F^2 for the symmetric n x n G whose upper
 * triangle is stored (column-major, ld n): diagonal 1 for the loss of
 * orthogonality, 0 for ||G||_F^2. *acc must be zeroed before. */
void launch_gram_deviation(cudaStream_t stream, osfti_dtype_t dtype, const void *g,
                           int64_t n, double diagonal, double *acc);

/* The Cholesky path's verdict: kQrNeedsFallback in *flag if any of the
 * n_info Cholesky infos is non-zero or sqrt(*acc) > threshold (or NaN). */
void launch_cholqr2_verdict(cudaStream_t stream, const int *info, int n_info,
                            const double *acc, double threshold, uint32_t *flag);

/* dst[e] = src[e] for e < count, converted between fp32 and fp64 (an fp64
 * value beyond fp32's range becomes Inf). */
void launch_convert(cudaStream_t stream, osfti_dtype_t src_dtype, const void *src,
                    osfti_dtype_t dst_dtype, void *dst, int64_t count);

/* The TF32 path's operand split: hi[e] = x[e] truncated to TF32, lo[e] =
 * x[e] - hi[e] (fp32), for e < count. */
void launch_split_tf32(cudaStream_t stream, const float *x, float *hi, float *lo,
                       int64_t count);

/* The TF32 path's last factor R = U D (g: n x n fp64, upper, ld n): r = U
 * in fp32 (unit diagonal, zeros below, ld n), g's strict upper triangle =
 * fp64(r) D (the factor as applied), ublk = U's diagonal blocks of `block`
 * columns in fp64 (block J at ublk + j0 * block, ld jb), dlast = D. */
void launch_unit_factor(cudaStream_t stream, double *g, int64_t n, int64_t block,
                        float *r, double *ublk, double *dlast);

/* The TF32 path's last pass, one block of columns (m x jb, column-major, ld
 * m): z = w / d_j - t in fp64; t nullptr: z = w / d_j. */
void launch_scaled_block(cudaStream_t stream, const float *w, const float *t,
                         const double *d, double *z, int64_t m, int64_t jb);

/* The shifted first pass of the Cholesky path: g_jj += factor * trace(g)
 * for the n x n fp64 g (column-major, ld n). */
void launch_shift_diagonal(cudaStream_t stream, double *g, int64_t n, double factor);

/* The TF32 path's shifted passes: g_jj += factor * sqrt(*squared_norm) for
 * the n x n fp64 g (column-major, ld n). */
void launch_shift_diagonal_norm(cudaStream_t stream, double *g, int64_t n, double factor,
                                const double *squared_norm);

/* d[j] = g_jj (first) or d[j] * g_jj: diag(R) of a product of triangular
 * factors, pass after pass. */
void launch_diagonal_product(cudaStream_t stream, const double *g, int64_t n, double *d,
                             bool first);

/* One small matrix for the batched kernel: everything it needs sits in one
 * block's shared memory. Power iteration: a is the m x m factor and q the
 * starting Q (overwritten); otherwise a is the m x n input. */
struct SmallDesc {
  const void *a = nullptr;
  void *q = nullptr;
  void *r = nullptr; /* n x n or nullptr */
  int64_t lda = 0, ldq = 0, ldr = 0;
  int32_t m = 0, n = 0;
  double rank_tol = 0.0;
  int64_t flag_index = 0;
};

/* Shared memory the batched kernel needs for an m x n job. */
size_t small_smem_bytes(osfti_dtype_t dtype, int64_t m, int64_t n, bool power) noexcept;
/* The most it will use on `device` (the opt-in limit, at most 96 KiB). */
size_t small_smem_limit(int device);

/* Householder QR of each descriptor's matrix in one block of shared memory,
 * all of one dtype; `smem` the largest small_smem_bytes() among them.
 * Writes Q (and R) only if the job succeeded; flags[flag_index] gets its
 * QrFlag bits. iterations 0: QR of a; >= 1: power iteration. */
void launch_small_qr(cudaStream_t stream, osfti_dtype_t dtype, const SmallDesc *descs,
                     int count, size_t smem, int iterations, uint32_t *flags);

}  // namespace osft::cuda::qr

#endif
