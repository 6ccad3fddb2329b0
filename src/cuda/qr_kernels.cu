/* The kernels of batched QR on CUDA; see src/cuda/qr_kernels.cuh.
 *
 * The batched small-matrix kernel runs LAPACK's unblocked algorithms
 * (dgeqr2: Householder vectors as dlarfg makes them; dorg2r: Q formed
 * backwards in place) on one matrix per block, entirely in shared memory:
 * for matrices this small, one cuSOLVER call per matrix is all launch
 * latency. Block: 256 threads (8 warps); a column update is one warp's
 * dot product and axpy. */
#include "cuda/qr_kernels.cuh"

#include <cuda_runtime.h>

#include <algorithm>
#include <cfloat>

#include "core/error.h"
#include "backend/qr_backend.h"

namespace osft::cuda::qr {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr unsigned kFullMask = 0xffffffffu;
constexpr size_t kSmallSmemCap = 96 * 1024;

void check_launch(const char *what) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    raise(OSFT_STATUS_BACKEND_ERROR, "%s launch: %s", what, cudaGetErrorString(e));
}

template <class F>
void with_type(osfti_dtype_t dt, F &&f) {
  if (dt == OSFTI_F64) return f(double{});
  if (dt == OSFTI_F32) return f(float{});
  raise(OSFT_STATUS_INTERNAL_ERROR, "QR kernels: dtype %s", osfti_dtype_name(dt));
}

/* ------------------------------------------------------------ reductions */

enum class Op { sum, max, min };

__device__ __forceinline__ double combine(double a, double b, Op op) {
  return op == Op::sum ? a + b : op == Op::max ? fmax(a, b) : fmin(a, b);
}

__device__ __forceinline__ double warp_reduce(double v, Op op) {
  for (int off = 16; off > 0; off >>= 1)
    v = combine(v, __shfl_xor_sync(kFullMask, v, off), op);
  return v;
}

/* Every thread of a kThreads block calls it; all get the result. `red`
 * holds kWarps + 1 doubles of shared memory. */
__device__ double block_reduce(double v, Op op, double *red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_reduce(v, op);
  if (lane == 0) red[warp] = v;
  __syncthreads();
  if (warp == 0) {
    const double identity = op == Op::sum ? 0.0 : op == Op::max ? -DBL_MAX : DBL_MAX;
    double w = lane < kWarps ? red[lane] : identity;
    w = warp_reduce(w, op);
    if (lane == 0) red[kWarps] = w;
  }
  __syncthreads();
  const double result = red[kWarps];
  __syncthreads(); /* red is free again */
  return result;
}

/* ------------------------------------------------------------- transfer */

template <class T>
struct TransferArgs {
  const T *src;
  int64_t s_rs, s_cs;
  T *dst;
  int64_t d_rs, d_cs;
  int64_t rows, cols;
  const T *scale;
  int axis;
  bool upper;
  const uint32_t *skip;
  uint32_t skip_mask;
  uint32_t *flag;
  uint32_t bit;
};

/* Block (32, 8) moves 32 x 32 tiles; blockIdx.x picks the column tile,
 * blockIdx.y strides over row tiles (grids are capped at 65535 rows). */
template <class T>
__global__ void transfer_kernel(TransferArgs<T> t) {
  if (t.skip != nullptr && (*t.skip & t.skip_mask) != 0) return;
  __shared__ T tile[32][33];
  const bool src_rows = t.s_cs == 1, dst_rows = t.d_cs == 1;
  const int64_t j0 = static_cast<int64_t>(blockIdx.x) * 32;
  const int64_t row_tiles = (t.rows + 31) / 32;
  bool bad = false;
  for (int64_t ti = blockIdx.y; ti < row_tiles; ti += gridDim.y) {
    const int64_t i0 = ti * 32;
    for (int k = threadIdx.y; k < 32; k += blockDim.y) {
      const int64_t i = i0 + (src_rows ? k : threadIdx.x);
      const int64_t j = j0 + (src_rows ? threadIdx.x : k);
      if (i < t.rows && j < t.cols) {
        const T v = t.src[i * t.s_rs + j * t.s_cs];
        if (!(t.upper && j < i) && !isfinite(v)) bad = true;
        tile[i - i0][j - j0] = v;
      }
    }
    __syncthreads();
    if (t.dst != nullptr) {
      for (int k = threadIdx.y; k < 32; k += blockDim.y) {
        const int64_t i = i0 + (dst_rows ? k : threadIdx.x);
        const int64_t j = j0 + (dst_rows ? threadIdx.x : k);
        if (i >= t.rows || j >= t.cols) continue;
        T v = t.upper && j < i ? T(0) : tile[i - i0][j - j0];
        if (t.axis == static_cast<int>(Scale::rows)) v *= t.scale[i];
        if (t.axis == static_cast<int>(Scale::cols)) v *= t.scale[j];
        t.dst[i * t.d_rs + j * t.d_cs] = v;
      }
    }
    __syncthreads();
  }
  if (bad && t.flag != nullptr) atomicOr(t.flag, t.bit);
}

/* ------------------------------------------------------ diagonal, Gram */

template <class T>
__global__ void diagonal_kernel(const T *w, int64_t ld, int64_t n, T *signs,
                                uint32_t *flag, double rank_tol) {
  __shared__ double red[kWarps + 1];
  double big = 0.0, small = DBL_MAX;
  int bad = 0;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    const T d = w[j + j * ld];
    const double v = fabs(static_cast<double>(d));
    if (!isfinite(v)) bad = 1;
    big = fmax(big, v);
    small = fmin(small, v);
    if (signs != nullptr) signs[j] = d < T(0) ? T(-1) : T(1);
  }
  big = block_reduce(big, Op::max, red);
  small = block_reduce(small, Op::min, red);
  bad = __syncthreads_or(bad);
  if (threadIdx.x != 0) return;
  uint32_t f = 0;
  if (bad)
    f = kQrNonfiniteResult;
  else if (rank_tol >= 0.0 && !(small > rank_tol * big))
    f = kQrRankDeficient;
  if (f != 0) atomicOr(flag, f);
}

template <class T>
__global__ void gram_deviation_kernel(const T *g, int64_t n, double diagonal,
                                      double *acc) {
  __shared__ double red[kWarps + 1];
  double sum = 0.0;
  const int64_t total = n * n;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = e % n, j = e / n;
    if (i > j) continue;
    const double v = static_cast<double>(g[e]) - (i == j ? diagonal : 0.0);
    sum += (i == j ? 1.0 : 2.0) * v * v;
  }
  sum = block_reduce(sum, Op::sum, red);
  if (threadIdx.x == 0) atomicAdd(acc, sum);
}

__global__ void cholqr2_verdict_kernel(const int *info, int n_info, const double *acc,
                                       double threshold, uint32_t *flag) {
  bool fallback = !(sqrt(*acc) <= threshold);
  for (int k = 0; k < n_info; ++k) fallback = fallback || info[k] != 0;
  if (fallback) atomicOr(flag, static_cast<uint32_t>(kQrNeedsFallback));
}

/* ------------------------------------------------- the Cholesky path */

template <class S, class D>
__global__ void convert_kernel(const S *src, D *dst, int64_t count) {
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < count;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dst[e] = static_cast<D>(src[e]);
}

/* g_jj += factor * sqrt(*squared_norm) */
__global__ void shift_diagonal_norm_kernel(double *g, int64_t n, double factor,
                                           const double *squared_norm) {
  const double s = factor * sqrt(*squared_norm);
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < n;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x)
    g[j + j * n] += s;
}

/* One block: g_jj += factor * trace(g); every read of the diagonal happens
 * before the first write (block_reduce synchronizes). */
__global__ void shift_diagonal_kernel(double *g, int64_t n, double factor) {
  __shared__ double red[kWarps + 1];
  double trace = 0.0;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) trace += g[j + j * n];
  trace = block_reduce(trace, Op::sum, red);
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) g[j + j * n] += factor * trace;
}

__global__ void diagonal_product_kernel(const double *g, int64_t n, double *d,
                                        bool first) {
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < n;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x)
    d[j] = first ? g[j + j * n] : d[j] * g[j + j * n];
}

/* The TF32 path's 3xTF32 operands: hi = x with its low 13 mantissa bits
 * cleared (a TF32 number, which the tensor core multiplies exactly), lo =
 * x - hi (exact in fp32; the tensor core reads it as TF32). */
__global__ void split_tf32_kernel(const float *x, float *hi, float *lo, int64_t count) {
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < count;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float v = x[e];
    const float h = __uint_as_float(__float_as_uint(v) & 0xffffe000u);
    hi[e] = h;
    lo[e] = v - h;
  }
}

/* The TF32 path's last factor, R = U D (g: n x n fp64, upper, ld n; D its
 * diagonal): r = U in fp32 (unit diagonal, zeros below), g's strict upper
 * triangle = fp64(r) d_j (the factor as the solve applies it), ublk = U's
 * diagonal blocks of `block` columns in fp64 (block J at ublk + j0 * block,
 * ld jb, zeros below), dlast = D. No thread writes what another reads:
 * the diagonal of g is only read. */
__global__ void unit_factor_kernel(double *g, int64_t n, int64_t block, float *r,
                                   double *ublk, double *dlast) {
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n * n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = e % n, j = e / n;
    const double d = g[j + j * n];
    const float u = i == j ? 1.0f : i < j ? static_cast<float>(g[e] / d) : 0.0f;
    r[e] = u;
    if (i < j) g[e] = static_cast<double>(u) * d;
    if (i == j) dlast[j] = d;
    const int64_t j0 = j / block * block, jb = n - j0 < block ? n - j0 : block;
    if (i >= j0 && i < j0 + jb) ublk[j0 * block + (i - j0) + (j - j0) * jb] = u;
  }
}

/* The TF32 path's last pass, one block of m x jb columns (all column-major,
 * ld m): z = w / d_j - t in fp64 (t nullptr: nothing subtracted). */
__global__ void scaled_block_kernel(const float *w, const float *t, const double *d,
                                    double *z, int64_t m, int64_t count) {
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < count;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const double v = static_cast<double>(w[e]) / d[e / m];
    z[e] = t != nullptr ? v - static_cast<double>(t[e]) : v;
  }
}

unsigned elementwise_blocks(int64_t count) {
  return static_cast<unsigned>(
      std::max<int64_t>(1, std::min<int64_t>((count + kThreads - 1) / kThreads, 4096)));
}

/* ------------------------------------------------------------ small QR */

/* The shared-memory layout of one small job: W (m x n, column-major), P
 * (power iteration's current Q, m x n), tau (n), signs (n). */
template <class T>
struct SmallSmem {
  T *w, *p, *tau, *sign;
  __device__ SmallSmem(T *base, int m, int n, bool power) {
    w = base;
    p = w + static_cast<int64_t>(m) * n;
    tau = p + (power ? static_cast<int64_t>(m) * n : 0);
    sign = tau + n;
  }
};

/* w (m x n, column-major, ld m) = A w_rows, reading a row-major source
 * (ld lda) and flagging NaN/Inf into *bad. */
template <class T>
__device__ void load_rows(const T *src, int64_t ld, int m, int n, T *w, int *bad) {
  int local = 0;
  for (int64_t e = threadIdx.x; e < static_cast<int64_t>(m) * n; e += blockDim.x) {
    const int64_t i = e / n, j = e % n;
    const T v = src[i * ld + j];
    if (!isfinite(v)) local = 1;
    w[i + j * m] = v;
  }
  if (local) atomicOr(bad, 1);
}

/* Householder QR in place (dgeqr2): R on and above the diagonal, the
 * vectors below it with an implicit 1, tau[j] their scalars. */
template <class T>
__device__ void householder_qr(T *w, int m, int n, T *tau, double *red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int j = 0; j < n; ++j) {
    T *col = w + static_cast<int64_t>(j) * m;
    double big = 0.0;
    for (int i = j + 1 + threadIdx.x; i < m; i += blockDim.x)
      big = fmax(big, fabs(static_cast<double>(col[i])));
    const double below = block_reduce(big, Op::max, red);
    const T alpha = col[j];
    T beta = alpha, t = T(0), scal = T(0);
    if (below != 0.0) { /* dlarfg; a zero column below the diagonal: H = I */
      /* The norm of the scaled column, as dnrm2 does: plain squares of
       * fp64 entries underflow to 0 below ~1e-162 (every tau 0, Q = I) and
       * overflow above ~1e154. A NaN or Inf stays and is flagged later. */
      const double a = static_cast<double>(alpha);
      const double scale = fmax(below, fabs(a));
      double part = 0.0;
      for (int i = j + 1 + threadIdx.x; i < m; i += blockDim.x) {
        const double v = static_cast<double>(col[i]) / scale;
        part += v * v;
      }
      const double ssq = block_reduce(part, Op::sum, red);
      const double norm = scale * sqrt((a / scale) * (a / scale) + ssq);
      beta = static_cast<T>(a >= 0.0 ? -norm : norm);
      t = (beta - alpha) / beta;
      scal = T(1) / (alpha - beta);
    }
    __syncthreads(); /* everyone has read alpha */
    if (t != T(0))
      for (int i = j + 1 + threadIdx.x; i < m; i += blockDim.x) col[i] *= scal;
    if (threadIdx.x == 0) {
      col[j] = beta;
      tau[j] = t;
    }
    __syncthreads();
    if (t == T(0)) continue;
    /* W(j:m, j+1:n) -= t v (v^T W(j:m, j+1:n)), one warp per column */
    for (int k = j + 1 + warp; k < n; k += kWarps) {
      T *c = w + static_cast<int64_t>(k) * m;
      T dot = lane == 0 ? c[j] : T(0);
      for (int i = j + 1 + lane; i < m; i += 32) dot += col[i] * c[i];
      for (int off = 16; off > 0; off >>= 1) dot += __shfl_xor_sync(kFullMask, dot, off);
      const T f = t * dot;
      if (lane == 0) c[j] -= f;
      for (int i = j + 1 + lane; i < m; i += 32) c[i] -= f * col[i];
    }
    __syncthreads();
  }
}

/* Q from the reflectors in place (dorg2r with k = n). */
template <class T>
__device__ void form_q(T *w, int m, int n, const T *tau) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int j = n - 1; j >= 0; --j) {
    T *col = w + static_cast<int64_t>(j) * m;
    const T t = tau[j];
    if (j < n - 1 && t != T(0)) {
      if (threadIdx.x == 0) col[j] = T(1);
      __syncthreads();
      for (int k = j + 1 + warp; k < n; k += kWarps) {
        T *c = w + static_cast<int64_t>(k) * m;
        T dot = T(0);
        for (int i = j + lane; i < m; i += 32) dot += col[i] * c[i];
        for (int off = 16; off > 0; off >>= 1)
          dot += __shfl_xor_sync(kFullMask, dot, off);
        const T f = t * dot;
        for (int i = j + lane; i < m; i += 32) c[i] -= f * col[i];
      }
      __syncthreads();
    }
    for (int i = threadIdx.x; i < m; i += blockDim.x) {
      if (i < j)
        col[i] = T(0);
      else if (i == j)
        col[i] = T(1) - t;
      else
        col[i] *= -t;
    }
    __syncthreads();
  }
}

/* After householder_qr: signs of diag(R), rank and finiteness checks.
 * Returns the job's flags (the same in every thread). */
template <class T>
__device__ uint32_t check_factor(const T *w, int m, int n, T *tau, T *sign,
                                 double rank_tol, double *red) {
  int bad = 0;
  for (int64_t e = threadIdx.x; e < static_cast<int64_t>(m) * n; e += blockDim.x)
    if (!isfinite(w[e])) bad = 1;
  double big = 0.0, small = DBL_MAX;
  for (int j = threadIdx.x; j < n; j += blockDim.x) {
    if (!isfinite(tau[j])) bad = 1;
    const T d = w[j + static_cast<int64_t>(j) * m];
    big = fmax(big, fabs(static_cast<double>(d)));
    small = fmin(small, fabs(static_cast<double>(d)));
    sign[j] = d < T(0) ? T(-1) : T(1);
  }
  big = block_reduce(big, Op::max, red);
  small = block_reduce(small, Op::min, red);
  if (__syncthreads_or(bad)) return kQrNonfiniteResult;
  return rank_tol >= 0.0 && !(small > rank_tol * big) ? kQrRankDeficient : 0u;
}

/* dst (m x n, column-major) = A src, A row-major m x m (ld lda). */
template <class T>
__device__ void multiply(const T *a, int64_t lda, const T *src, int m, int n, T *dst) {
  for (int64_t e = threadIdx.x; e < static_cast<int64_t>(m) * n; e += blockDim.x) {
    const int64_t i = e % m, j = e / m;
    T s = T(0);
    for (int k = 0; k < m; ++k) s += a[i * lda + k] * src[k + j * m];
    dst[e] = s;
  }
}

template <class T>
__global__ void __launch_bounds__(kThreads)
    small_qr_kernel(const SmallDesc *descs, int iterations, uint32_t *flags) {
  extern __shared__ double smem_raw[];
  __shared__ double red[kWarps + 1];
  __shared__ int bad;
  const SmallDesc d = descs[blockIdx.x];
  const int m = d.m, n = d.n;
  const bool power = iterations > 0;
  SmallSmem<T> s(reinterpret_cast<T *>(smem_raw), m, n, power);
  if (threadIdx.x == 0) bad = 0;
  __syncthreads();
  const T *a = static_cast<const T *>(d.a);
  T *q = static_cast<T *>(d.q);
  uint32_t f = 0;
  if (!power) {
    load_rows(a, d.lda, m, n, s.w, &bad);
  } else {
    load_rows(q, d.ldq, m, n, s.p, &bad);
    int local = 0;
    for (int64_t e = threadIdx.x; e < static_cast<int64_t>(m) * m; e += blockDim.x)
      if (!isfinite(a[(e / m) * d.lda + e % m])) local = 1;
    if (local) atomicOr(&bad, 1);
  }
  __syncthreads();
  if (bad) f = kQrNonfiniteInput;
  for (int it = 0; f == 0 && it < (power ? iterations : 1); ++it) {
    if (power) {
      multiply(a, d.lda, s.p, m, n, s.w);
      __syncthreads();
    }
    householder_qr(s.w, m, n, s.tau, red);
    f = check_factor(s.w, m, n, s.tau, s.sign, d.rank_tol, red);
    if (f != 0) break;
    if (!power && d.r != nullptr) {
      T *r = static_cast<T *>(d.r);
      for (int64_t e = threadIdx.x; e < static_cast<int64_t>(n) * n; e += blockDim.x) {
        const int64_t i = e / n, j = e % n;
        r[i * d.ldr + j] = j >= i ? s.sign[i] * s.w[i + j * m] : T(0);
      }
      __syncthreads(); /* R is read from W before form_q overwrites it */
    }
    form_q(s.w, m, n, s.tau);
    if (power) {
      for (int64_t e = threadIdx.x; e < static_cast<int64_t>(m) * n; e += blockDim.x)
        s.p[e] = s.w[e] * s.sign[e / m];
      __syncthreads();
    }
  }
  if (f == 0) {
    const T *src = power ? s.p : s.w;
    for (int64_t e = threadIdx.x; e < static_cast<int64_t>(m) * n; e += blockDim.x) {
      const int64_t i = e / n, j = e % n;
      const T v = src[i + j * m];
      q[i * d.ldq + j] = power ? v : v * s.sign[j];
    }
  }
  if (threadIdx.x == 0 && f != 0) atomicOr(flags + d.flag_index, f);
}

}  // namespace

void launch_transfer(cudaStream_t stream, osfti_dtype_t dtype, const Transfer &t) {
  if (t.src.rows == 0 || t.src.cols == 0) return;
  with_type(dtype, [&](auto tag) {
    using T = decltype(tag);
    TransferArgs<T> args{static_cast<const T *>(t.src.data),
                         t.src.rs,
                         t.src.cs,
                         static_cast<T *>(t.dst.data),
                         t.dst.rs,
                         t.dst.cs,
                         t.src.rows,
                         t.src.cols,
                         static_cast<const T *>(t.scale),
                         static_cast<int>(t.axis),
                         t.upper,
                         t.skip,
                         t.skip_mask,
                         t.flag,
                         t.bit};
    const int64_t col_tiles = (t.src.cols + 31) / 32, row_tiles = (t.src.rows + 31) / 32;
    const dim3 grid(static_cast<unsigned>(col_tiles),
                    static_cast<unsigned>(std::min<int64_t>(row_tiles, 65535)));
    transfer_kernel<T><<<grid, dim3(32, 8), 0, stream>>>(args);
  });
  check_launch("QR transfer");
}

void launch_diagonal(cudaStream_t stream, osfti_dtype_t dtype, const void *w, int64_t ld,
                     int64_t n, void *signs, uint32_t *flag, double rank_tol) {
  with_type(dtype, [&](auto tag) {
    using T = decltype(tag);
    diagonal_kernel<T><<<1, kThreads, 0, stream>>>(
        static_cast<const T *>(w), ld, n, static_cast<T *>(signs), flag, rank_tol);
  });
  check_launch("QR diagonal");
}

void launch_gram_deviation(cudaStream_t stream, osfti_dtype_t dtype, const void *g,
                           int64_t n, double diagonal, double *acc) {
  const int64_t blocks = std::min<int64_t>((n * n + kThreads - 1) / kThreads, 1024);
  with_type(dtype, [&](auto tag) {
    using T = decltype(tag);
    gram_deviation_kernel<T>
        <<<static_cast<unsigned>(std::max<int64_t>(blocks, 1)), kThreads, 0, stream>>>(
            static_cast<const T *>(g), n, diagonal, acc);
  });
  check_launch("QR Gram deviation");
}

void launch_cholqr2_verdict(cudaStream_t stream, const int *info, int n_info,
                            const double *acc, double threshold, uint32_t *flag) {
  cholqr2_verdict_kernel<<<1, 1, 0, stream>>>(info, n_info, acc, threshold, flag);
  check_launch("CholeskyQR verdict");
}

void launch_convert(cudaStream_t stream, osfti_dtype_t src_dtype, const void *src,
                    osfti_dtype_t dst_dtype, void *dst, int64_t count) {
  if (count == 0) return;
  with_type(src_dtype, [&](auto src_tag) {
    using S = decltype(src_tag);
    with_type(dst_dtype, [&](auto dst_tag) {
      using D = decltype(dst_tag);
      convert_kernel<S, D><<<elementwise_blocks(count), kThreads, 0, stream>>>(
          static_cast<const S *>(src), static_cast<D *>(dst), count);
    });
  });
  check_launch("QR convert");
}

void launch_split_tf32(cudaStream_t stream, const float *x, float *hi, float *lo,
                       int64_t count) {
  if (count == 0) return;
  split_tf32_kernel<<<elementwise_blocks(count), kThreads, 0, stream>>>(x, hi, lo, count);
  check_launch("QR TF32 split");
}

void launch_unit_factor(cudaStream_t stream, double *g, int64_t n, int64_t block,
                        float *r, double *ublk, double *dlast) {
  if (n == 0) return;
  unit_factor_kernel<<<elementwise_blocks(n * n), kThreads, 0, stream>>>(g, n, block, r,
                                                                         ublk, dlast);
  check_launch("QR unit factor");
}

void launch_scaled_block(cudaStream_t stream, const float *w, const float *t,
                         const double *d, double *z, int64_t m, int64_t jb) {
  if (m * jb == 0) return;
  scaled_block_kernel<<<elementwise_blocks(m * jb), kThreads, 0, stream>>>(w, t, d, z, m,
                                                                           m * jb);
  check_launch("QR scaled block");
}

void launch_shift_diagonal(cudaStream_t stream, double *g, int64_t n, double factor) {
  shift_diagonal_kernel<<<1, kThreads, 0, stream>>>(g, n, factor);
  check_launch("QR shift");
}

void launch_shift_diagonal_norm(cudaStream_t stream, double *g, int64_t n, double factor,
                                const double *squared_norm) {
  shift_diagonal_norm_kernel<<<elementwise_blocks(n), kThreads, 0, stream>>>(
      g, n, factor, squared_norm);
  check_launch("QR shift by norm");
}

void launch_diagonal_product(cudaStream_t stream, const double *g, int64_t n, double *d,
                             bool first) {
  diagonal_product_kernel<<<elementwise_blocks(n), kThreads, 0, stream>>>(g, n, d, first);
  check_launch("QR diagonal product");
}

size_t small_smem_bytes(osfti_dtype_t dtype, int64_t m, int64_t n, bool power) noexcept {
  const size_t elem = osfti_dtype_size(dtype);
  return ((power ? 2 : 1) * static_cast<size_t>(m * n) + 2 * static_cast<size_t>(n)) *
         elem;
}

size_t small_smem_limit(int device) {
  int optin = 0;
  if (cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) !=
      cudaSuccess) {
    cudaGetLastError();
    return 48 * 1024;
  }
  /* The kernel's static shared memory (reductions) comes on top. */
  return std::min(kSmallSmemCap, static_cast<size_t>(optin) - 1024);
}

void launch_small_qr(cudaStream_t stream, osfti_dtype_t dtype, const SmallDesc *descs,
                     int count, size_t smem, int iterations, uint32_t *flags) {
  if (count == 0) return;
  with_type(dtype, [&](auto tag) {
    using T = decltype(tag);
    if (smem > 48 * 1024) {
      const cudaError_t e = cudaFuncSetAttribute(
          small_qr_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
          static_cast<int>(smem));
      if (e != cudaSuccess)
        raise(OSFT_STATUS_BACKEND_ERROR, "cudaFuncSetAttribute(%zu bytes): %s", smem,
              cudaGetErrorString(e));
    }
    small_qr_kernel<T><<<static_cast<unsigned>(count), kThreads, smem, stream>>>(
        descs, iterations, flags);
  });
  check_launch("batched small QR");
}

}  // namespace osft::cuda::qr
