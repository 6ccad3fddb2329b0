/* The whole-row vector kernels of src/core/cpu_blas.h (osft::simd): bf16
 * widening and narrowing, scaling and fp64-accumulated sums, each cloned
 * for AVX-512 (x86-64-v4), AVX2 (x86-64-v3) and the baseline, picked at
 * load time. Rows run 16 lanes at a time, a partial vector at the end. */
#include <algorithm>

#include "core/bf16.h"
#include "core/cpu_blas.h"

namespace osft::simd {

namespace {

/* dst = src in another dtype, lane for lane as to_float / to_bf16. */
template <class Src, class Dst>
OSFT_SIMD_CLONES void convert(const Src *src, Dst *dst, int64_t n) noexcept {
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    f32v v;
    load(v, src + j);
    store(dst + j, v);
  }
  for (; j < n; ++j) {
    f32v v;
    load_partial(v, src + j, 1, 0.0f);
    store_partial(dst + j, v, 1);
  }
}

}  // namespace

void widen(const bf16 *src, float *dst, int64_t n) noexcept {
  convert(src, dst, n);
}

void narrow(const float *src, bf16 *dst, int64_t n) noexcept {
  convert(src, dst, n);
}

OSFT_SIMD_CLONES
void scale(int64_t n, const float *a, const float *s, float s0, float beta,
           float *y) noexcept {
  for (int64_t j = 0; j < n; j += kLanes) {
    const int k = static_cast<int>(std::min<int64_t>(kLanes, n - j));
    f32v x, f;
    load_partial(x, a + j, k, 0.0f);
    if (s != nullptr)
      load_partial(f, s + j, k, 0.0f);
    else
      splat(f, s0);
    x *= f;
    if (beta != 0.0f) {
      f32v old;
      load_partial(old, y + j, k, 0.0f);
      x += beta * old;
    }
    store_partial(y + j, x, k);
  }
}

typedef double f64v __attribute__((vector_size(64)));
typedef float f32h __attribute__((vector_size(32)));
constexpr int kLanes64 = 8;

/* t = a[j, j + 8) * b[j, j + 8) (b == nullptr: a alone) in fp64 lanes:
 * the products of fp32 values are exact there. By reference, as the
 * helpers of cpu_blas.h: no vector ABI at a call. */
static OSFT_SIMD_INLINE void products(f64v &t, const float *a, const float *b,
                                      int64_t j) {
  f32h x;
  std::memcpy(&x, a + j, sizeof x);
  t = __builtin_convertvector(x, f64v);
  if (b != nullptr) {
    std::memcpy(&x, b + j, sizeof x);
    t *= __builtin_convertvector(x, f64v);
  }
}

OSFT_SIMD_CLONES
void accumulate(int64_t n, const float *a, const float *b, double *sums) noexcept {
  int64_t j = 0;
  for (; j + kLanes64 <= n; j += kLanes64) {
    f64v acc, t;
    std::memcpy(&acc, sums + j, sizeof acc);
    products(t, a, b, j);
    acc += t;
    std::memcpy(sums + j, &acc, sizeof acc);
  }
  for (; j < n; ++j) sums[j] += static_cast<double>(a[j]) * (b != nullptr ? b[j] : 1.0);
}

OSFT_SIMD_CLONES
double dot(int64_t n, const float *a, const float *b) noexcept {
  f64v acc = {};
  int64_t j = 0;
  for (; j + kLanes64 <= n; j += kLanes64) {
    f64v t;
    products(t, a, b, j);
    acc += t;
  }
  double sum = 0.0;
  for (int l = 0; l < kLanes64; ++l) sum += acc[l];
  for (; j < n; ++j) sum += static_cast<double>(a[j]) * (b != nullptr ? b[j] : 1.0);
  return sum;
}

}  // namespace osft::simd
