/* The element-wise and reduction kernels of the CUDA backend; see
 * src/cuda/linalg_kernels.cuh. One kernel template per primitive, with the
 * dtypes dispatched on the host. */
#include "cuda/linalg_kernels.cuh"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <type_traits>

#include "core/error.h"

namespace osft::cuda {
namespace {

using bf16_t = __nv_bfloat16;

/* ------------------------------------------------------------ element access */

template <class T>
struct View {
  T *data;
  int64_t rs, cs;
  __device__ T *at(int64_t i, int64_t j) const { return data + i * rs + j * cs; }
};

template <class T>
View<T> view_of(const Strided &m) {
  return {static_cast<T *>(m.data), m.rs, m.cs};
}

template <class M>
__device__ __forceinline__ M load(const float *p) {
  return static_cast<M>(*p);
}
template <class M>
__device__ __forceinline__ M load(const double *p) {
  return static_cast<M>(*p);
}
template <class M>
__device__ __forceinline__ M load(const bf16_t *p) {
  return static_cast<M>(__bfloat162float(*p));
}

__device__ __forceinline__ void store(float *p, float v) {
  *p = v;
}
__device__ __forceinline__ void store(float *p, double v) {
  *p = static_cast<float>(v);
}
__device__ __forceinline__ void store(double *p, double v) {
  *p = v;
}
__device__ __forceinline__ void store(double *p, float v) {
  *p = v;
}
/* Through fp32 as on the CPU (to_bf16(float(v))), round to nearest even. */
__device__ __forceinline__ void store(bf16_t *p, float v) {
  *p = __float2bfloat16(v);
}
__device__ __forceinline__ void store(bf16_t *p, double v) {
  *p = __float2bfloat16(static_cast<float>(v));
}

/* ------------------------------------------------------------ dtype dispatch */

template <class T>
struct Tag {
  using type = T;
};

/* Calls f(Tag<T>{}) for the element type of `dt`. fp64 only where a caller
 * asks for it, which keeps the number of kernel instantiations down. */
template <bool kWithF64, class F>
void with_type(osfti_dtype_t dt, F &&f) {
  switch (dt) {
    case OSFTI_F32: f(Tag<float>{}); return;
    case OSFTI_BF16: f(Tag<bf16_t>{}); return;
    case OSFTI_F64:
      if constexpr (kWithF64) {
        f(Tag<double>{});
        return;
      }
      break;
    default: break;
  }
  raise(OSFT_STATUS_NOT_SUPPORTED, "CUDA kernels: dtype %s is not supported here",
        osfti_dtype_name(dt));
}

void check_launch(const char *kernel) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    raise(OSFT_STATUS_BACKEND_ERROR, "%s kernel launch: %s", kernel,
          cudaGetErrorString(e));
}

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

/* ------------------------------------------------------------ scale */

/* 32 x 8 threads: a warp covers 32 consecutive columns of one row, so row-
 * major accesses coalesce. Grid-stride loops cover what the grid does not. */
constexpr int kBlockCols = 32, kBlockRows = 8;

dim3 elementwise_grid(int64_t rows, int64_t cols) {
  return dim3(
      static_cast<unsigned>(std::min<int64_t>(ceil_div(cols, kBlockCols), 1 << 20)),
      static_cast<unsigned>(std::min<int64_t>(ceil_div(rows, kBlockRows), 65535)));
}

template <class Src, class Dst>
using MathOf =
    std::conditional_t<std::is_same_v<Src, double> || std::is_same_v<Dst, double>, double,
                       float>;

/* Calls f(i, j) for every element of a rows x cols grid-stride range. */
template <class F>
__device__ __forceinline__ void for_each_element(int64_t rows, int64_t cols, F &&f) {
  const int64_t i0 = static_cast<int64_t>(blockIdx.y) * blockDim.y + threadIdx.y;
  const int64_t j0 = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t di = static_cast<int64_t>(gridDim.y) * blockDim.y;
  const int64_t dj = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = i0; i < rows; i += di)
    for (int64_t j = j0; j < cols; j += dj) f(i, j);
}

template <class Src, class S, class Dst>
__global__ void scale_kernel(View<const Src> src, const S *s, bool s_along_cols,
                             float alpha, float beta, View<Dst> dst, int64_t rows,
                             int64_t cols) {
  using M = MathOf<Src, Dst>;
  for_each_element(rows, cols, [&](int64_t i, int64_t j) {
    M scale = static_cast<M>(alpha);
    if (s != nullptr) scale *= load<M>(s + (s_along_cols ? j : i));
    M v = scale * load<M>(src.at(i, j));
    /* beta == 0 must not read dst: it may be uninitialized (NaN). */
    if (beta != 0.0f) v += static_cast<M>(beta) * load<M>(dst.at(i, j));
    store(dst.at(i, j), v);
  });
}

/* ------------------------------------------------------------ fill_zero */

template <class T>
__global__ void zero_kernel(View<T> dst, int64_t rows, int64_t cols) {
  for_each_element(rows, cols, [&](int64_t i, int64_t j) { store(dst.at(i, j), 0.0f); });
}

/* ------------------------------------------------------------ all_finite */

/* Raises *flag if any element is NaN or infinite (a benign race: all
 * writers store 1). */
template <class T>
__global__ void nonfinite_kernel(View<const T> a, int64_t rows, int64_t cols, int *flag) {
  for_each_element(rows, cols, [&](int64_t i, int64_t j) {
    if (!isfinite(load<double>(a.at(i, j)))) *flag = 1;
  });
}

/* ------------------------------------------------------------ reduce */

template <class A, class B>
__device__ __forceinline__ float term(const View<const A> &a, const View<const B> &b,
                                      int64_t i, int64_t j) {
  float v = load<float>(a.at(i, j));
  if (b.data != nullptr) v *= load<float>(b.at(i, j));
  return v;
}

template <class Y>
__device__ __forceinline__ void finish(Y *y, float sum, float beta) {
  float v = sum;
  if (beta != 0.0f) v = beta * load<float>(y) + sum;
  store(y, v);
}

constexpr int kWarp = 32, kRowsBlock = 256;

/* Axis rows: one warp per row, lanes striding along it (coalesced), then a
 * shuffle reduction. */
template <class A, class B, class Y>
__global__ void reduce_rows_kernel(View<const A> a, View<const B> b, int64_t rows,
                                   int64_t cols, float beta, Y *y) {
  const int64_t row =
      (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
  /* Whole warps leave together, so the shuffles below see full warps. */
  if (row >= rows) return;
  const int lane = static_cast<int>(threadIdx.x % kWarp);
  float acc = 0.0f;
  for (int64_t j = lane; j < cols; j += kWarp) acc += term(a, b, row, j);
  for (int offset = kWarp / 2; offset > 0; offset /= 2)
    acc += __shfl_down_sync(0xffffffffu, acc, offset);
  if (lane == 0) finish(y + row, acc, beta);
}

/* Axis cols: a block owns 32 columns (one per lane, coalesced) of one chunk
 * of rows; its 8 warps stride down the chunk and combine in shared memory.
 * With several chunks, each writes partial sums that reduce_chunks_kernel
 * adds in a fixed order, so results do not depend on scheduling (no
 * atomics). */
constexpr int kTileCols = 32, kTileRows = 8;
/* ~8 resident blocks of 256 threads per SM on a 132-SM H100. */
constexpr int64_t kTargetBlocks = 1024;
/* Each thread should sum at least 32 rows before a chunk is split off. */
constexpr int64_t kMinChunkRows = 256;

int64_t col_chunks(int64_t rows, int64_t cols) {
  const int64_t tiles = std::max<int64_t>(1, ceil_div(cols, kTileCols));
  const int64_t wanted = ceil_div(kTargetBlocks, tiles);
  return std::max<int64_t>(1, std::min(wanted, ceil_div(rows, kMinChunkRows)));
}

template <class A, class B, class Y>
__global__ void reduce_cols_kernel(View<const A> a, View<const B> b, int64_t rows,
                                   int64_t cols, int64_t chunk_rows, float beta, Y *y,
                                   float *partial) {
  __shared__ float sums[kTileRows][kTileCols];
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kTileCols + threadIdx.x;
  const int64_t begin = static_cast<int64_t>(blockIdx.y) * chunk_rows;
  const int64_t end = begin + chunk_rows < rows ? begin + chunk_rows : rows;
  float acc = 0.0f;
  if (j < cols)
    for (int64_t i = begin + threadIdx.y; i < end; i += kTileRows)
      acc += term(a, b, i, j);
  sums[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y != 0 || j >= cols) return;
  float total = 0.0f;
  for (int t = 0; t < kTileRows; ++t) total += sums[t][threadIdx.x];
  if (partial != nullptr)
    partial[blockIdx.y * cols + j] = total;
  else
    finish(y + j, total, beta);
}

template <class Y>
__global__ void reduce_chunks_kernel(const float *partial, int64_t chunks, int64_t cols,
                                     float beta, Y *y) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < cols;
       j += stride) {
    float total = 0.0f;
    for (int64_t c = 0; c < chunks; ++c) total += partial[c * cols + j];
    finish(y + j, total, beta);
  }
}

template <class A, class B, class Y>
void reduce_typed(cudaStream_t stream, Axis axis, const Mat &a, const Mat *b, float beta,
                  const Vec &y, float *scratch) {
  const View<const A> av = view_of<const A>(strided(a));
  const View<const B> bv =
      b != nullptr ? view_of<const B>(strided(*b)) : View<const B>{nullptr, 0, 0};
  Y *yp = static_cast<Y *>(y.data);
  if (axis == Axis::rows) {
    const int64_t blocks = ceil_div(a.rows, kRowsBlock / kWarp);
    reduce_rows_kernel<A, B, Y><<<static_cast<unsigned>(blocks), kRowsBlock, 0, stream>>>(
        av, bv, a.rows, a.cols, beta, yp);
    check_launch("reduce_rows");
    return;
  }
  /* Without scratch for the partial sums, one chunk of all rows. */
  const int64_t chunks = scratch != nullptr ? col_chunks(a.rows, a.cols) : 1;
  const int64_t chunk_rows = ceil_div(a.rows, chunks);
  float *partial = chunks > 1 ? scratch : nullptr;
  const dim3 grid(static_cast<unsigned>(ceil_div(a.cols, kTileCols)),
                  static_cast<unsigned>(chunks));
  reduce_cols_kernel<A, B, Y><<<grid, dim3(kTileCols, kTileRows), 0, stream>>>(
      av, bv, a.rows, a.cols, chunk_rows, beta, yp, partial);
  check_launch("reduce_cols");
  if (partial == nullptr) return;
  const int64_t blocks = std::min<int64_t>(ceil_div(a.cols, 256), 1 << 20);
  reduce_chunks_kernel<Y><<<static_cast<unsigned>(blocks), 256, 0, stream>>>(
      partial, chunks, a.cols, beta, yp);
  check_launch("reduce_chunks");
}

/* ------------------------------------------------------------ gemm fallback */

constexpr int kGemmTile = 16;

/* One kGemmTile x kGemmTile tile of c per block (grid-stride over row
 * tiles), its k loop through shared memory; fp32 sums. */
template <class A, class B, class C>
__global__ void gemm_unstaged_kernel(View<const A> a, View<const B> b, View<C> c,
                                     int64_t m, int64_t n, int64_t k, float alpha,
                                     float beta) {
  __shared__ float as[kGemmTile][kGemmTile + 1], bs[kGemmTile][kGemmTile + 1];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kGemmTile + tx;
  for (int64_t i0 = static_cast<int64_t>(blockIdx.y) * kGemmTile; i0 < m;
       i0 += static_cast<int64_t>(gridDim.y) * kGemmTile) {
    const int64_t i = i0 + ty;
    float acc = 0.0f;
    for (int64_t l0 = 0; l0 < k; l0 += kGemmTile) {
      as[ty][tx] = i < m && l0 + tx < k ? load<float>(a.at(i, l0 + tx)) : 0.0f;
      bs[ty][tx] = l0 + ty < k && j < n ? load<float>(b.at(l0 + ty, j)) : 0.0f;
      __syncthreads();
      for (int l = 0; l < kGemmTile; ++l) acc += as[ty][l] * bs[l][tx];
      __syncthreads();
    }
    if (i < m && j < n) {
      float v = alpha * acc;
      if (beta != 0.0f) v += beta * load<float>(c.at(i, j));
      store(c.at(i, j), v);
    }
  }
}
}  // namespace

void launch_scale(cudaStream_t stream, Axis axis, const Strided &src, const Vec *s,
                  float alpha, float beta, const Strided &dst) {
  if (dst.rows == 0 || dst.cols == 0) return;
  /* Without s the scale type is arbitrary; f32 avoids extra instantiations. */
  const osfti_dtype_t s_dtype = s != nullptr ? s->dtype : OSFTI_F32;
  with_type<true>(src.dtype, [&](auto src_tag) {
    with_type<false>(s_dtype, [&](auto s_tag) {
      with_type<true>(dst.dtype, [&](auto dst_tag) {
        using Src = typename decltype(src_tag)::type;
        using S = typename decltype(s_tag)::type;
        using Dst = typename decltype(dst_tag)::type;
        const S *sp = s != nullptr ? static_cast<const S *>(s->data) : nullptr;
        scale_kernel<Src, S, Dst>
            <<<elementwise_grid(dst.rows, dst.cols), dim3(kBlockCols, kBlockRows), 0,
               stream>>>(view_of<const Src>(src), sp, axis == Axis::cols, alpha, beta,
                         view_of<Dst>(dst), dst.rows, dst.cols);
      });
    });
  });
  check_launch("scale");
}

void launch_fill_zero(cudaStream_t stream, const Strided &dst) {
  if (dst.rows == 0 || dst.cols == 0) return;
  with_type<true>(dst.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    zero_kernel<T><<<elementwise_grid(dst.rows, dst.cols), dim3(kBlockCols, kBlockRows),
                     0, stream>>>(view_of<T>(dst), dst.rows, dst.cols);
  });
  check_launch("fill_zero");
}

void launch_flag_nonfinite(cudaStream_t stream, const Strided &a, int *flag) {
  if (a.rows == 0 || a.cols == 0) return;
  with_type<true>(a.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    nonfinite_kernel<T>
        <<<elementwise_grid(a.rows, a.cols), dim3(kBlockCols, kBlockRows), 0, stream>>>(
            view_of<const T>(a), a.rows, a.cols, flag);
  });
  check_launch("all_finite");
}

/* Pointers per launch: 2 KiB of kernel arguments, under the 4 KiB every
 * architecture takes. */
constexpr int kPointersPerLaunch = 256;

struct PointerPack {
  const void *p[kPointersPerLaunch];
};

__global__ void write_pointers_kernel(PointerPack pack, int n, const void **dst) {
  const int i = static_cast<int>(threadIdx.x);
  if (i < n) dst[i] = pack.p[i];
}

void launch_write_pointers(cudaStream_t stream, const void *const *src, int64_t n,
                           const void **dst) {
  for (int64_t first = 0; first < n; first += kPointersPerLaunch) {
    const int count = static_cast<int>(std::min<int64_t>(kPointersPerLaunch, n - first));
    PointerPack pack{};
    for (int i = 0; i < count; ++i) pack.p[i] = src[first + i];
    write_pointers_kernel<<<1, kPointersPerLaunch, 0, stream>>>(pack, count, dst + first);
    check_launch("write_pointers");
  }
}

int64_t reduce_scratch_floats(Axis axis, int64_t rows, int64_t cols) noexcept {
  if (axis != Axis::cols || cols == 0) return 0;
  const int64_t chunks = col_chunks(rows, cols);
  return chunks > 1 ? chunks * cols : 0;
}

void launch_reduce(cudaStream_t stream, Axis axis, const Mat &a, const Mat *b, float beta,
                   const Vec &y, float *scratch) {
  if (y.n == 0) return;
  /* A missing b takes a's type: no instantiation is spent on it. */
  const osfti_dtype_t b_dtype = b != nullptr ? b->dtype : a.dtype;
  with_type<false>(a.dtype, [&](auto a_tag) {
    with_type<false>(b_dtype, [&](auto b_tag) {
      with_type<false>(y.dtype, [&](auto y_tag) {
        reduce_typed<typename decltype(a_tag)::type, typename decltype(b_tag)::type,
                     typename decltype(y_tag)::type>(stream, axis, a, b, beta, y,
                                                     scratch);
      });
    });
  });
}

void launch_gemm_unstaged(cudaStream_t stream, const Strided &a, const Strided &b,
                          float alpha, float beta, const Strided &c) {
  if (c.rows == 0 || c.cols == 0) return;
  const dim3 grid(
      static_cast<unsigned>(ceil_div(c.cols, kGemmTile)),
      static_cast<unsigned>(std::min<int64_t>(ceil_div(c.rows, kGemmTile), 65535)));
  with_type<false>(a.dtype, [&](auto a_tag) {
    with_type<false>(b.dtype, [&](auto b_tag) {
      with_type<false>(c.dtype, [&](auto c_tag) {
        using A = typename decltype(a_tag)::type;
        using B = typename decltype(b_tag)::type;
        using C = typename decltype(c_tag)::type;
        gemm_unstaged_kernel<A, B, C><<<grid, dim3(kGemmTile, kGemmTile), 0, stream>>>(
            view_of<const A>(a), view_of<const B>(b), view_of<C>(c), c.rows, c.cols,
            a.cols, alpha, beta);
      });
    });
  });
  check_launch("gemm_unstaged");
}

}  // namespace osft::cuda
