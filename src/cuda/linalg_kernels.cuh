/* Internal: the element-wise and reduction kernels of the CUDA backend
 * (src/cuda/linalg_kernels.cu), behind plain C++ launchers so that
 * src/cuda/linalg_cuda.cpp can be compiled by the host compiler. Launchers
 * enqueue on `stream` on the current device, never synchronize, and throw
 * OSFT_STATUS_BACKEND_ERROR if a launch fails. */
#ifndef OSFTRT_SRC_CUDA_LINALG_KERNELS_CUH
#define OSFTRT_SRC_CUDA_LINALG_KERNELS_CUH

#include <cuda_runtime_api.h>

#include <cstdint>
#include <utility>

#include "backend/linalg_backend.h"

namespace osft::cuda {

/* A matrix with arbitrary element strides: element (i, j) at
 * data + (i * rs + j * cs) * size(dtype). Lets one kernel also transpose
 * (swap the strides) and broadcast (a zero stride). */
struct Strided {
  void *data = nullptr;
  int64_t rows = 0, cols = 0;
  int64_t rs = 0, cs = 1;
  osfti_dtype_t dtype = OSFTI_DTYPE_INVALID;
};

inline Strided strided(const Mat &m) noexcept {
  return {m.data, m.rows, m.cols, m.ld, 1, m.dtype};
}

inline Strided transposed(Strided v) noexcept {
  std::swap(v.rows, v.cols);
  std::swap(v.rs, v.cs);
  return v;
}

/* dst = beta * dst + alpha * scale(i, j) * src, where scale is s[j] (axis
 * cols), s[i] (axis rows) or 1 (s == nullptr); src and dst have dst's shape.
 * fp32 math (fp64 when src or dst is fp64). beta == 0 never reads dst, so
 * dst may be src then. Dtypes: f32, bf16, f64. */
void launch_scale(cudaStream_t stream, Axis axis, const Strided &src, const Vec *s,
                  float alpha, float beta, const Strided &dst);

/* dst = 0 (all bits zero). Dtypes: f32, bf16, f64. */
void launch_fill_zero(cudaStream_t stream, const Strided &dst);

/* Sets *flag (device memory, zeroed by the caller) to 1 if any element of
 * a is NaN or infinite. Dtypes: f32, bf16, f64. */
void launch_flag_nonfinite(cudaStream_t stream, const Strided &a, int *flag);

/* The fp32 scratch launch_reduce needs for these arguments (0: none). */
int64_t reduce_scratch_floats(Axis axis, int64_t rows, int64_t cols) noexcept;

/* The reduction of Backend::reduce, accumulated in fp32; `scratch` holds
 * reduce_scratch_floats() floats, or is nullptr (one slower pass without
 * partial sums). Dtypes: f32, bf16. */
void launch_reduce(cudaStream_t stream, Axis axis, const Mat &a, const Mat *b, float beta,
                   const Vec &y, float *scratch);

/* c = alpha a b + beta c (beta == 0 never reads c) for a (m x k), b
 * (k x n), c (m x n): a transpose is a transposed() view. fp32 accumulation
 * in a plain shared-memory tiled kernel that needs no memory of its own:
 * the fallback of a GEMM whose fp32 staging was refused (slow; only then).
 * Dtypes: a, b f32 or bf16; c f32 or bf16. */
void launch_gemm_unstaged(cudaStream_t stream, const Strided &a, const Strided &b,
                          float alpha, float beta, const Strided &c);

/* dst[i] = src[i] for i < n: an array of device pointers written by
 * kernels whose arguments carry the values, so that it needs no host
 * memory and is captured by value in a CUDA graph. dst in device memory. */
void launch_write_pointers(cudaStream_t stream, const void *const *src, int64_t n,
                           const void **dst);

}  // namespace osft::cuda

#endif
