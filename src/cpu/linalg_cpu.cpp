/* The CPU backend of src/backend/linalg_backend.h: GEMMs on the build's
 * engine (src/core/cpu_blas.h: OpenBLAS, or oneMKL); bf16 operands go to
 * the engine's bf16 GEMM where it has one, else are widened to fp32),
 * LAPACK SVD in fp64, and the element-wise and reduction kernels a block
 * of columns at a time through the vector rows of osft::simd (fp32 math;
 * fp64 only where an end is fp64, and for the sums). */
#include <algorithm>
#include <atomic>
#include <climits>
#include <cstring>
#include <cmath>
#include <type_traits>
#include <utility>

#include "backend/linalg_backend.h"
#include "core/bf16.h"
#include "core/cpu_blas.h"
#include "core/error.h"

namespace osft {
namespace {

/* Host scratch from the context's allocator, freed on scope exit. */
class HostBuffer {
 public:
  HostBuffer(Context &ctx, size_t bytes) : ctx_(ctx), bytes_(bytes) {
    if (bytes_ > 0) ptr_ = ctx_.allocator.host_alloc(bytes_, "cpu scratch");
  }
  ~HostBuffer() { ctx_.allocator.host_free(ptr_, bytes_); }
  HostBuffer(const HostBuffer &) = delete;
  HostBuffer &operator=(const HostBuffer &) = delete;
  template <class T>
  T *as() const noexcept {
    return static_cast<T *>(ptr_);
  }

 private:
  Context &ctx_;
  size_t bytes_;
  void *ptr_ = nullptr;
};

/* Element types the kernels are instantiated for; loads widen to the math
 * type, stores round from it (bf16: to nearest even). */
inline double widen_value(float v) {
  return v;
}
inline double widen_value(double v) {
  return v;
}
inline double widen_value(bf16 v) {
  return to_float(v);
}
inline void narrow_value(float *p, double v) {
  *p = static_cast<float>(v);
}
inline void narrow_value(double *p, double v) {
  *p = v;
}
inline void narrow_value(bf16 *p, double v) {
  *p = to_bf16(static_cast<float>(v));
}

template <class T>
struct Tag {
  using type = T;
};

/* Calls f(Tag<T>{}) for the element type of dt. */
template <class F>
void with_type(osfti_dtype_t dt, F &&f) {
  switch (dt) {
    case OSFTI_F32: return f(Tag<float>{});
    case OSFTI_F64: return f(Tag<double>{});
    case OSFTI_BF16: return f(Tag<bf16>{});
    default:
      raise(OSFT_STATUS_NOT_SUPPORTED, "CPU kernels: dtype %s is not supported here",
            osfti_dtype_name(dt));
  }
}

inline int64_t at(const Mat &m, int64_t i, int64_t j) noexcept {
  return i * m.ld + j;
}

/* A bf16 GEMM's fp32 C narrowed on one core left the other core idle
 * (spinning in MKL's OpenMP team) for as long: the passes below split
 * their rows over the threads. */
using blas::parallel_rows;

/* Row [0, n) of one dtype into another: bf16 <-> fp32 through the vector
 * rows of osft::simd, same dtype by copy, the rest (fp64, only the SVD's
 * copies) by the scalar conversions. */
template <class Src, class Dst>
void convert_row(const Src *in, Dst *out, int64_t n) {
  if constexpr (std::is_same_v<Src, Dst>)
    std::memcpy(out, in, static_cast<size_t>(n) * sizeof(Dst));
  else if constexpr (std::is_same_v<Src, bf16> && std::is_same_v<Dst, float>)
    simd::widen(in, out, n);
  else if constexpr (std::is_same_v<Src, float> && std::is_same_v<Dst, bf16>)
    simd::narrow(in, out, n);
  else
    for (int64_t j = 0; j < n; ++j) narrow_value(out + j, widen_value(in[j]));
}

/* Copies a view of any float dtype into a compact T buffer, and back. */
template <class T>
void widen(const Mat &src, T *dst) {
  with_type(src.dtype, [&](auto tag) {
    using Src = typename decltype(tag)::type;
    const auto *in = static_cast<const Src *>(src.data);
    parallel_rows(src.rows, src.cols, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i)
        convert_row(in + i * src.ld, dst + i * src.cols, src.cols);
    });
  });
}

template <class T>
void narrow(const T *src, const Mat &dst) {
  with_type(dst.dtype, [&](auto tag) {
    using Dst = typename decltype(tag)::type;
    auto *out = static_cast<Dst *>(dst.data);
    parallel_rows(dst.rows, dst.cols, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i)
        convert_row(src + i * dst.cols, out + i * dst.ld, dst.cols);
    });
  });
}

void check_blas_dims(std::initializer_list<int64_t> dims) {
  for (int64_t d : dims)
    if (d > INT_MAX)
      raise(OSFT_STATUS_NOT_SUPPORTED,
            "a matrix dimension of %lld exceeds the 32-bit BLAS interface",
            static_cast<long long>(d));
}

/* An fp32 view of `m`: itself when it already is one, else a widened copy. */
struct F32View {
  const float *data;
  int64_t ld;
};

F32View as_f32(const Mat &m, float *storage) {
  if (m.dtype == OSFTI_F32) return {static_cast<const float *>(m.data), m.ld};
  widen(m, storage);
  return {storage, m.cols};
}

/* Bytes of m's fp32 copy (0 if it is fp32), rounded up to 64 bytes. */
size_t f32_bytes(const Mat &m) {
  const size_t b =
      m.dtype == OSFTI_F32 ? 0 : static_cast<size_t>(m.rows * m.cols) * sizeof(float);
  return (b + 63) / 64 * 64;
}

/* C = alpha op(A) op(B) + beta C straight from the operands' own dtypes,
 * accumulated in fp32 like the BLAS path, with no memory of its own: the
 * path of a GEMM whose fp32 staging could not be allocated, so that an
 * operation that already wrote some outputs never fails halfway (the
 * staging grows on the first call with new shapes). Slow, and only taken
 * when the allocator refuses. */
void gemm_unstaged(Op op_a, const Mat &a, Op op_b, const Mat &b, float alpha, float beta,
                   const Mat &c) {
  const int64_t k = op_a == Op::N ? a.cols : a.rows;
  with_type(a.dtype, [&](auto a_tag) {
    with_type(c.dtype, [&](auto c_tag) {
      using A = typename decltype(a_tag)::type; /* A and B share a dtype */
      using C = typename decltype(c_tag)::type;
      const auto *pa = static_cast<const A *>(a.data);
      const auto *pb = static_cast<const A *>(b.data);
      auto *pc = static_cast<C *>(c.data);
      for (int64_t i = 0; i < c.rows; ++i)
        for (int64_t j = 0; j < c.cols; ++j) {
          float acc = 0.0f;
          for (int64_t l = 0; l < k; ++l) {
            const A x = op_a == Op::N ? pa[at(a, i, l)] : pa[at(a, l, i)];
            const A y = op_b == Op::N ? pb[at(b, l, j)] : pb[at(b, j, l)];
            acc +=
                static_cast<float>(widen_value(x)) * static_cast<float>(widen_value(y));
          }
          float v = alpha * acc;
          if (beta != 0.0f) v += beta * static_cast<float>(widen_value(pc[at(c, i, j)]));
          narrow_value(pc + at(c, i, j), v);
        }
    });
  });
}

/* cpu_gemm, with B packed by cpu_pack_b where packed_b != nullptr. */
void gemm_with(Context &ctx, Op op_a, const Mat &a, Op op_b, const Mat &b,
               const void *packed_b, float alpha, float beta, const Mat &c) {
  const int64_t k = op_a == Op::N ? a.cols : a.rows;
  check_blas_dims({a.rows, a.cols, a.ld, b.rows, b.cols, b.ld, c.rows, c.cols, c.ld});
  if (c.rows == 0 || c.cols == 0) return;
  /* bf16 operands go to the engine as they are where it multiplies bf16
   * itself (fp32 accumulation); otherwise they are widened to fp32. */
  const bool native_bf16 =
      a.dtype == OSFTI_BF16 && b.dtype == OSFTI_BF16 && k > 0 && blas::has_bf16_gemm();
  /* The fp32 copies of bf16 operands, from the context's kernel scratch
   * (kept between calls: a steady state allocates nothing). The native
   * path copies only C but reserves what widening would: the scratch then
   * grows at the same calls and to the same sizes on every engine, so an
   * op's first call still grows all it needs (a workspace growth later in
   * the same call drops the kernel block; a smaller request after it would
   * leave a larger one to the second call). Untouched, the rest costs no
   * resident memory. */
  const size_t na = f32_bytes(a), nb = f32_bytes(b), nc = f32_bytes(c);
  char *staging = nullptr;
  if (na + nb + nc > 0) {
    staging = static_cast<char *>(
        kernel_scratch_if_available(ctx, na + nb + nc, "gemm fp32 staging"));
    if (staging == nullptr) return gemm_unstaged(op_a, a, op_b, b, alpha, beta, c);
  }
  float *cp = static_cast<float *>(c.data);
  int64_t ldc = c.ld;
  if (c.dtype != OSFTI_F32) {
    cp = reinterpret_cast<float *>(staging + na + nb);
    ldc = c.cols;
    if (beta != 0.0f) widen(c, cp);
  }
  const int m = static_cast<int>(c.rows), n = static_cast<int>(c.cols);
  if (k == 0) {
    /* BLAS leaves C alone for k == 0 only when beta == 1; be explicit. */
    for (int64_t i = 0; i < c.rows; ++i)
      for (int64_t j = 0; j < c.cols; ++j)
        cp[i * ldc + j] = beta == 0.0f ? 0.0f : beta * cp[i * ldc + j];
  } else if (native_bf16 && packed_b != nullptr) {
    blas::gemm_bf16_packed(blas::Layout::row, op_a, m, n, static_cast<int>(k), alpha,
                           static_cast<const bf16 *>(a.data), static_cast<int>(a.ld),
                           packed_b, beta, cp, static_cast<int>(ldc));
  } else if (native_bf16) {
    blas::gemm_bf16(blas::Layout::row, op_a, op_b, m, n, static_cast<int>(k), alpha,
                    static_cast<const bf16 *>(a.data), static_cast<int>(a.ld),
                    static_cast<const bf16 *>(b.data), static_cast<int>(b.ld), beta, cp,
                    static_cast<int>(ldc));
  } else {
    const F32View av = as_f32(a, reinterpret_cast<float *>(staging));
    const F32View bv = as_f32(b, reinterpret_cast<float *>(staging + na));
    blas::gemm(blas::Layout::row, op_a, op_b, m, n, static_cast<int>(k), alpha, av.data,
               static_cast<int>(av.ld), bv.data, static_cast<int>(bv.ld), beta, cp,
               static_cast<int>(ldc));
  }
  if (c.dtype != OSFTI_F32) narrow(cp, c);
}

/* Whether a single bf16 GEMM packs B first (through a one-shot PackedB:
 * oneMKL's plain bf16 GEMM is slow where one dimension is vocabulary-sized).
 * Measured one GEMM, pack time included (Intel
 * Xeon Emerald Rapids, 2 cores, oneMKL, 2 threads), median saved: 1024 x
 * 32000 x 512 (M x N x K, x W^T) 39-41%, 512 rows 39%; 1024 x 512 x 32000
 * (g W) 17-31%, 512 rows 7%, 256 rows -2%; 32000 x 512 x 256/512 (g^T x)
 * 24-36%, x 1024 27% / -9% (best: 18%); 1024 x 16384 x 512 19-21%, x 2048
 * 0%. FLCE bf16 (1024 x 512 x 32000) forward + backward, interleaved in one
 * process: best -11..-15%. The OSFT layer's 2048- and 1792 x 512-wide GEMMs
 * at 4096 tokens: -23..+15% (noise), 512^3: -6..-25%: not packed. */
bool pack_single(const Mat &a, const Mat &b, const Mat &c, int64_t k) {
  return a.dtype == OSFTI_BF16 && b.dtype == OSFTI_BF16 && c.rows >= 512 &&
         std::max({c.rows, c.cols, k}) >= 16384;
}

void cpu_gemm(Context &ctx, Op op_a, const Mat &a, Op op_b, const Mat &b, float alpha,
              float beta, const Mat &c) {
  if (pack_single(a, b, c, op_a == Op::N ? a.cols : a.rows)) {
    /* packs only where the engine packs and the copy fits (else plain) */
    const PackedB once(ctx, op_b, b, c.rows);
    if (once.packed()) return once.gemm(op_a, a, alpha, beta, c);
  }
  gemm_with(ctx, op_a, a, op_b, b, nullptr, alpha, beta, c);
}

/* Only bf16 B on an engine with bf16 GEMMs that packs (oneMKL); op(B) is
 * k x n. */
size_t cpu_packed_b_bytes(Context &, Op op_b, const Mat &b, int64_t m) {
  if (b.dtype != OSFTI_BF16 || !blas::has_bf16_gemm() || m <= 0 || b.rows == 0 ||
      b.cols == 0)
    return 0;
  check_blas_dims({m, b.rows, b.cols, b.ld});
  const int64_t k = op_b == Op::N ? b.rows : b.cols, n = op_b == Op::N ? b.cols : b.rows;
  return blas::gemm_bf16_pack_bytes(static_cast<int>(m), static_cast<int>(n),
                                    static_cast<int>(k));
}

void cpu_pack_b(Context &, Op op_b, const Mat &b, int64_t m, void *dst) {
  const int64_t k = op_b == Op::N ? b.rows : b.cols, n = op_b == Op::N ? b.cols : b.rows;
  blas::gemm_bf16_pack(blas::Layout::row, op_b, static_cast<int>(m), static_cast<int>(n),
                       static_cast<int>(k), static_cast<const bf16 *>(b.data),
                       static_cast<int>(b.ld), dst);
}

void cpu_gemm_packed_b(Context &ctx, Op op_a, const Mat &a, Op op_b, const Mat &b,
                       const void *packed, float alpha, float beta, const Mat &c) {
  gemm_with(ctx, op_a, a, op_b, b, packed, alpha, beta, c);
}

/* dst = beta dst + scale * src in fp64, if either end is fp64 (only the
 * SVD's copies). */
template <class Src, class S, class Dst>
void scale_f64(Axis axis, const Mat &src, const S *s, float beta, const Mat &dst) {
  const auto *in = static_cast<const Src *>(src.data);
  auto *out = static_cast<Dst *>(dst.data);
  for (int64_t i = 0; i < src.rows; ++i) {
    const double row_scale = s != nullptr && axis == Axis::rows ? widen_value(s[i]) : 1.0;
    const Src *a = in + i * src.ld;
    Dst *d = out + i * dst.ld;
    for (int64_t j = 0; j < src.cols; ++j) {
      const double scale =
          s != nullptr && axis == Axis::cols ? widen_value(s[j]) : row_scale;
      double v = scale * widen_value(a[j]);
      if (beta != 0.0f) v += static_cast<double>(beta) * widen_value(d[j]);
      narrow_value(d + j, v);
    }
  }
}

/* Columns per block of the fp32 passes: 3 fp32 blocks of 4 KiB stay in L1. */
constexpr int64_t kColBlock = 1024;

/* An fp32 view of [j0, j0 + n) of a row: the row itself when it is fp32,
 * else converted into buf. */
template <class T>
const float *f32_block(const T *p, int64_t n, float *buf) {
  if constexpr (std::is_same_v<T, float>) {
    return p;
  } else {
    convert_row(p, buf, n);
    return buf;
  }
}

/* dst = beta dst + scale * src in fp32 (fp32 and bf16 ends), a block of
 * columns at a time through osft::simd; src may be dst. */
template <class Src, class S, class Dst>
void scale_f32(Axis axis, const Mat &src, const S *s, float beta, const Mat &dst) {
  const auto *in = static_cast<const Src *>(src.data);
  auto *out = static_cast<Dst *>(dst.data);
  parallel_rows(src.rows, src.cols, [&](int64_t begin, int64_t end) {
    float a_buf[kColBlock], s_buf[kColBlock], y_buf[kColBlock];
    for (int64_t i = begin; i < end; ++i) {
      const float row_scale = s != nullptr && axis == Axis::rows
                                  ? static_cast<float>(widen_value(s[i]))
                                  : 1.0f;
      for (int64_t j0 = 0; j0 < src.cols; j0 += kColBlock) {
        const int64_t n = std::min(kColBlock, src.cols - j0);
        const float *a = f32_block(in + i * src.ld + j0, n, a_buf);
        const float *sc =
            s != nullptr && axis == Axis::cols ? f32_block(s + j0, n, s_buf) : nullptr;
        Dst *d = out + i * dst.ld + j0;
        if constexpr (std::is_same_v<Dst, float>) {
          simd::scale(n, a, sc, row_scale, beta, d);
        } else {
          if (beta != 0.0f) convert_row(d, y_buf, n);
          simd::scale(n, a, sc, row_scale, beta, y_buf);
          convert_row(static_cast<const float *>(y_buf), d, n);
        }
      }
    }
  });
}

template <class Src, class S, class Dst>
void scale_typed(Axis axis, const Mat &src, const S *s, float beta, const Mat &dst) {
  if constexpr (std::is_same_v<Src, double> || std::is_same_v<Dst, double>)
    scale_f64<Src, S, Dst>(axis, src, s, beta, dst);
  else
    scale_f32<Src, S, Dst>(axis, src, s, beta, dst);
}

void cpu_scale_into(Context &, Axis axis, const Mat &src, const Vec *s, float beta,
                    const Mat &dst) {
  if (src.rows == 0 || src.cols == 0) return;
  with_type(src.dtype, [&](auto src_tag) {
    with_type(dst.dtype, [&](auto dst_tag) {
      using Src = typename decltype(src_tag)::type;
      using Dst = typename decltype(dst_tag)::type;
      if (s == nullptr)
        return scale_typed<Src, float, Dst>(axis, src, nullptr, beta, dst);
      with_type(s->dtype, [&](auto s_tag) {
        using S = typename decltype(s_tag)::type;
        scale_typed<Src, S, Dst>(axis, src, static_cast<const S *>(s->data), beta, dst);
      });
    });
  });
}

/* Sums in fp64 (fp32 and bf16 inputs: their fp32 products are exact in
 * fp64, summed by osft::simd in vector lanes). */
template <class A, class B, class Y>
void reduce_typed(Axis axis, const Mat &a, const Mat *b, float beta, const Vec &y) {
  const auto *pa = static_cast<const A *>(a.data);
  const auto *pb = b != nullptr ? static_cast<const B *>(b->data) : nullptr;
  auto *py = static_cast<Y *>(y.data);
  auto finish = [&](int64_t t, double sum) {
    narrow_value(py + t, beta != 0.0f ? beta * widen_value(py[t]) + sum : sum);
  };
  constexpr bool f64 = std::is_same_v<A, double> || std::is_same_v<B, double>;
  if constexpr (f64) {
    auto term = [&](int64_t i, int64_t j) {
      const double v = widen_value(pa[i * a.ld + j]);
      return pb != nullptr ? v * widen_value(pb[i * b->ld + j]) : v;
    };
    if (axis == Axis::rows) {
      for (int64_t i = 0; i < a.rows; ++i) {
        double sum = 0.0;
        for (int64_t j = 0; j < a.cols; ++j) sum += term(i, j);
        finish(i, sum);
      }
      return;
    }
    /* Columns in blocks, each block's sums in fp64, rows streamed in order. */
    constexpr int64_t kBlock = 256;
    for (int64_t j0 = 0; j0 < a.cols; j0 += kBlock) {
      const int64_t j1 = std::min(a.cols, j0 + kBlock);
      double sums[kBlock] = {};
      for (int64_t i = 0; i < a.rows; ++i)
        for (int64_t j = j0; j < j1; ++j) sums[j - j0] += term(i, j);
      for (int64_t j = j0; j < j1; ++j) finish(j, sums[j - j0]);
    }
  } else {
    /* The fp32 views of row i's columns [j0, j0 + n), in the caller's
     * buffers. */
    auto blocks = [&](int64_t i, int64_t j0, int64_t n, float *a_buf, float *b_buf,
                      const float **x, const float **z) {
      *x = f32_block(pa + i * a.ld + j0, n, a_buf);
      *z = pb != nullptr ? f32_block(pb + i * b->ld + j0, n, b_buf) : nullptr;
    };
    if (axis == Axis::rows) {
      parallel_rows(a.rows, a.cols, [&](int64_t begin, int64_t end) {
        float a_buf[kColBlock], b_buf[kColBlock];
        for (int64_t i = begin; i < end; ++i) {
          double sum = 0.0;
          for (int64_t j0 = 0; j0 < a.cols; j0 += kColBlock) {
            const int64_t n = std::min(kColBlock, a.cols - j0);
            const float *x, *z;
            blocks(i, j0, n, a_buf, b_buf, &x, &z);
            sum += simd::dot(n, x, z);
          }
          finish(i, sum);
        }
      });
      return;
    }
    /* Columns in blocks, each block's sums in fp64, rows streamed in order;
     * the blocks over the threads. */
    constexpr int64_t kBlock = 512;
    const int64_t n_blocks = (a.cols + kBlock - 1) / kBlock;
    parallel_rows(n_blocks, a.rows * kBlock, [&](int64_t begin, int64_t end) {
      alignas(64) double sums[kBlock];
      float a_buf[kBlock], b_buf[kBlock];
      for (int64_t blk = begin; blk < end; ++blk) {
        const int64_t j0 = blk * kBlock, n = std::min(kBlock, a.cols - j0);
        std::fill(sums, sums + n, 0.0);
        for (int64_t i = 0; i < a.rows; ++i) {
          const float *x, *z;
          blocks(i, j0, n, a_buf, b_buf, &x, &z);
          simd::accumulate(n, x, z, sums);
        }
        for (int64_t j = 0; j < n; ++j) finish(j0 + j, sums[j]);
      }
    });
  }
}

void cpu_reduce(Context &, Axis axis, const Mat &a, const Mat *b, float beta,
                const Vec &y) {
  if (y.n == 0) return;
  const osfti_dtype_t b_dtype = b != nullptr ? b->dtype : a.dtype;
  with_type(a.dtype, [&](auto a_tag) {
    with_type(b_dtype, [&](auto b_tag) {
      with_type(y.dtype, [&](auto y_tag) {
        reduce_typed<typename decltype(a_tag)::type, typename decltype(b_tag)::type,
                     typename decltype(y_tag)::type>(axis, a, b, beta, y);
      });
    });
  });
}

/* A row stride of 0 repeats the vector down the rows. */
void cpu_broadcast_rows(Context &ctx, const Vec &v, const Mat &dst) {
  cpu_scale_into(ctx, Axis::cols, Mat{v.data, dst.rows, dst.cols, 0, v.dtype}, nullptr,
                 0.0f, dst);
}

void cpu_fill_zero(Context &, const Mat &dst) {
  with_type(dst.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    auto *out = static_cast<T *>(dst.data);
    /* +0 is all zero bits in each of the dtypes */
    for (int64_t i = 0; i < dst.rows; ++i)
      std::memset(out + i * dst.ld, 0, static_cast<size_t>(dst.cols) * sizeof(T));
  });
}

bool cpu_all_finite(Context &, const Mat &a) {
  bool finite = true;
  with_type(a.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const auto *in = static_cast<const T *>(a.data);
    for (int64_t i = 0; i < a.rows && finite; ++i)
      for (int64_t j = 0; j < a.cols; ++j)
        if (!std::isfinite(widen_value(in[i * a.ld + j]))) finite = false;
  });
  return finite;
}

/* Order-independent sum over the matrix's 8-byte words (a row's last one
 * zero-padded) of mix(word ^ index * golden), index the word's position:
 * mix is a bijection, so any single changed element changes the result.
 * It runs at every call of a layer that keeps its dense W (the check that
 * the trainable factors are unchanged): one mix per word, the rows split
 * over the threads. */
uint64_t cpu_fingerprint(Context &, const Mat &a) {
  constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ull;
  auto mix = [](uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  };
  const size_t esize = osfti_dtype_size(a.dtype);
  const size_t row_bytes = static_cast<size_t>(a.cols) * esize;
  const size_t stride = static_cast<size_t>(a.ld) * esize;
  const uint64_t row_words = (row_bytes + 7) / 8;
  std::atomic<uint64_t> total{0};
  parallel_rows(a.rows, a.cols, [&](int64_t begin, int64_t end) {
    uint64_t h = 0;
    for (int64_t i = begin; i < end; ++i) {
      const auto *row = static_cast<const unsigned char *>(a.data) + i * stride;
      uint64_t index = static_cast<uint64_t>(i) * row_words;
      size_t off = 0;
      for (; off + 8 <= row_bytes; off += 8, ++index) {
        uint64_t word;
        std::memcpy(&word, row + off, 8);
        h += mix(word ^ index * kGolden);
      }
      if (off < row_bytes) {
        uint64_t word = 0;
        std::memcpy(&word, row + off, row_bytes - off);
        h += mix(word ^ index * kGolden);
      }
    }
    total.fetch_add(h, std::memory_order_relaxed);
  });
  return total.load(std::memory_order_relaxed);
}

/* LAPACK is column-major: the row-major m x n matrix A is, read as stored,
 * the column-major n x m matrix A^T = V S U^T. So dgesdd's "U" (n x k,
 * column-major) is our V^T (k x n, row-major) and its "VT" (k x m,
 * column-major) is our U (m x k, row-major): no transposes needed. */
void cpu_svd(Context &ctx, const Mat &a, const Mat &u, const Vec &s, const Mat &vt) {
  const int64_t m = a.rows, n = a.cols, k = m < n ? m : n;
  check_blas_dims({m, n});
  HostBuffer a64(ctx, static_cast<size_t>(m * n) * sizeof(double));
  HostBuffer vt64(ctx, static_cast<size_t>(k * n) * sizeof(double));
  HostBuffer u64(ctx, static_cast<size_t>(m * k) * sizeof(double));
  HostBuffer s64(ctx, static_cast<size_t>(k) * sizeof(double));
  HostBuffer iwork(ctx, static_cast<size_t>(8 * k) * sizeof(int));
  widen(a, a64.as<double>());
  const int cm = static_cast<int>(n), cn = static_cast<int>(m);
  const int lda = cm, ldu = cm, ldvt = static_cast<int>(k);
  int lwork = -1, info = 0;
  double query = 0.0;
  blas::gesdd_thin(cm, cn, a64.as<double>(), lda, s64.as<double>(), vt64.as<double>(),
                   ldu, u64.as<double>(), ldvt, &query, lwork, iwork.as<int>(), &info);
  if (info != 0)
    raise(OSFT_STATUS_BACKEND_ERROR, "dgesdd workspace query: info %d", info);
  lwork = static_cast<int>(query);
  HostBuffer work(ctx, static_cast<size_t>(lwork) * sizeof(double));
  blas::gesdd_thin(cm, cn, a64.as<double>(), lda, s64.as<double>(), vt64.as<double>(),
                   ldu, u64.as<double>(), ldvt, work.as<double>(), lwork, iwork.as<int>(),
                   &info);
  if (info > 0)
    raise(OSFT_STATUS_NUMERICAL_ERROR, "SVD did not converge (dgesdd info %d)", info);
  if (info < 0) raise(OSFT_STATUS_INTERNAL_ERROR, "dgesdd: argument %d invalid", -info);
  narrow(u64.as<double>(), u);
  narrow(vt64.as<double>(), vt);
  narrow(s64.as<double>(), as_row(s));
}

/* The engine multiplies bf16 itself (oneMKL on AMX / AVX512-BF16): the
 * projection's update may then split C into bf16 halves. */
bool cpu_native_bf16_gemm(Context &) {
  return blas::has_bf16_gemm();
}

}  // namespace

const Backend &cpu_backend() noexcept {
  static const Backend table = {cpu_gemm,           cpu_scale_into,  cpu_reduce,
                                cpu_broadcast_rows, cpu_svd,         cpu_fill_zero,
                                cpu_all_finite,     cpu_fingerprint, cpu_native_bf16_gemm,
                                cpu_packed_b_bytes, cpu_pack_b,      cpu_gemm_packed_b};
  return table;
}

}  // namespace osft
