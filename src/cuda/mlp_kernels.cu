/* The CUDA MLP kernels: the fused activation (forward) and the fused
 * derivative (backward), one pass over the tile's intermediates each,
 * specialized per activation, gating and dtype. The math is the shared
 * activation<A>() of src/backend/mlp_backend.h, in fp32. Memory-bound: the
 * forward moves 3 elements per output (2 plain), the backward 5 or 6. */
#include "cuda/mlp_kernels.cuh"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "core/error.h"

namespace osft::cuda {
namespace {

using namespace mlp; /* the activation math and its dispatch */

using bf16_t = __nv_bfloat16;

/* Row-major rows with a leading dimension (null for an absent view). */
template <class T>
struct Rows {
  T *data;
  int64_t ld;
  __device__ T *at(int64_t i, int64_t j) const { return data + i * ld + j; }
};

template <class T>
Rows<T> rows_of(const Mat *m) {
  return m != nullptr ? Rows<T>{static_cast<T *>(m->data), m->ld} : Rows<T>{nullptr, 0};
}

__device__ __forceinline__ float load(const float *p) {
  return *p;
}
__device__ __forceinline__ float load(const bf16_t *p) {
  return __bfloat162float(*p);
}
__device__ __forceinline__ void store(float *p, float v) {
  *p = v;
}
__device__ __forceinline__ void store(bf16_t *p, float v) {
  *p = __float2bfloat16(v); /* round to nearest even, as the CPU */
}

/* Rows go to blockIdx.y (grid-stride), columns to the threads of a block
 * row: a warp reads 32 consecutive elements of one row (coalesced). */
constexpr int kThreads = 256;
constexpr int64_t kMaxBlocksX = 32, kMaxBlocksY = 65535;

dim3 grid_for(int64_t rows, int64_t cols) {
  const int64_t bx = std::min<int64_t>((cols + kThreads - 1) / kThreads, kMaxBlocksX);
  const int64_t by = std::min<int64_t>(rows, kMaxBlocksY);
  return dim3(static_cast<unsigned>(bx), static_cast<unsigned>(by));
}

#define OSFT_MLP_FOR_EACH(rows, cols)                                             \
  for (int64_t i = blockIdx.y; i < (rows); i += gridDim.y)                        \
    for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; \
         j < (cols); j += static_cast<int64_t>(gridDim.x) * blockDim.x)

/* No __restrict__: h may be u or g (in place, element by element). */
template <Activation A, bool Gated, class T>
__global__ void activate_kernel(Rows<const T> g, Rows<const T> u, Rows<T> h, int64_t rows,
                                int64_t cols) {
  OSFT_MLP_FOR_EACH(rows, cols) {
    const float uj = load(u.at(i, j));
    if constexpr (Gated)
      store(h.at(i, j), activation<A>(load(g.at(i, j))).f * uj);
    else
      store(h.at(i, j), activation<A>(uj).f);
  }
}

/* Every input of an element is loaded before any output is stored, so h may
 * be u, dg may be g and du may be dh. */
template <Activation A, bool Gated, bool WithH, class T>
__global__ void backward_kernel(Rows<const T> g, Rows<const T> u, Rows<const T> dh,
                                Rows<T> h, Rows<T> dg, Rows<T> du, int64_t rows,
                                int64_t cols) {
  OSFT_MLP_FOR_EACH(rows, cols) {
    const float uj = load(u.at(i, j)), dhj = load(dh.at(i, j));
    if constexpr (Gated) {
      const ActValue a = activation<A>(load(g.at(i, j)));
      store(dg.at(i, j), dhj * uj * a.df);
      store(du.at(i, j), dhj * a.f);
      if constexpr (WithH) store(h.at(i, j), a.f * uj);
    } else {
      const ActValue a = activation<A>(uj);
      store(du.at(i, j), dhj * a.df);
      if constexpr (WithH) store(h.at(i, j), a.f);
    }
  }
}

#undef OSFT_MLP_FOR_EACH

template <class F>
void with_dtype(osfti_dtype_t dt, F &&f) {
  if (dt == OSFTI_F32) return f(float{});
  if (dt == OSFTI_BF16) return f(bf16_t{});
  raise(OSFT_STATUS_NOT_SUPPORTED, "CUDA MLP kernels: dtype %s is not supported",
        osfti_dtype_name(dt));
}

void check_launch(const char *kernel) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    raise(OSFT_STATUS_BACKEND_ERROR, "%s: %s", kernel, cudaGetErrorString(e));
}

}  // namespace

void launch_mlp_activate(cudaStream_t stream, Activation act, const Mat *g, const Mat &u,
                         const Mat &h) {
  if (u.rows == 0 || u.cols == 0) return;
  with_activation(act, [&](auto a) {
    with_flag(g != nullptr, [&](auto gated) {
      with_dtype(u.dtype, [&](auto t) {
        using T = decltype(t);
        activate_kernel<decltype(a)::value, decltype(gated)::value, T>
            <<<grid_for(u.rows, u.cols), kThreads, 0, stream>>>(
                rows_of<const T>(g), rows_of<const T>(&u), rows_of<T>(&h), u.rows,
                u.cols);
      });
    });
  });
  check_launch("mlp activate kernel launch");
}

void launch_mlp_activate_backward(cudaStream_t stream, Activation act, const Mat *g,
                                  const Mat &u, const Mat &dh, const Mat *h,
                                  const Mat *dg, const Mat &du) {
  if (u.rows == 0 || u.cols == 0) return;
  with_activation(act, [&](auto a) {
    with_flag(g != nullptr, [&](auto gated) {
      with_flag(h != nullptr, [&](auto with_h) {
        with_dtype(u.dtype, [&](auto t) {
          using T = decltype(t);
          backward_kernel<decltype(a)::value, decltype(gated)::value,
                          decltype(with_h)::value, T>
              <<<grid_for(u.rows, u.cols), kThreads, 0, stream>>>(
                  rows_of<const T>(g), rows_of<const T>(&u), rows_of<const T>(&dh),
                  rows_of<T>(h), rows_of<T>(dg), rows_of<T>(&du), u.rows, u.cols);
        });
      });
    });
  });
  check_launch("mlp activate_backward kernel launch");
}

}  // namespace osft::cuda
