/* The CPU MLP kernels of src/backend/mlp_backend.h: one loop per pass over the
 * tile's intermediates, the activation inlined (specialized per activation
 * and dtype), fp32 math in 16-lane vectors (AVX-512, AVX2 or the baseline,
 * picked at load time: osft::simd), bf16 rounded to nearest even on store.
 * The rows of a pass are split over the cores: single-threaded, the
 * activation passes took the time of a fifth of the tile's GEMMs on two
 * cores (SwiGLU 4096 x 512 x 1792 on oneMKL), the other core idle. Scalar,
 * with expf through the PLT, they took a third of a bf16 tile's time. */
#include <algorithm>

#include "core/bf16.h"
#include "core/cpu_blas.h"
#include "core/error.h"
#include "backend/mlp_backend.h"

namespace osft {
namespace {

using namespace mlp; /* the activation math and its dispatch */

/* Row i of a view as T*. */
template <class T>
T *row(const Mat &m, int64_t i) {
  return static_cast<T *>(m.data) + i * m.ld;
}
template <class T>
T *row(const Mat *m, int64_t i) {
  return m != nullptr ? row<T>(*m, i) : nullptr;
}

template <class F>
void with_dtype(osfti_dtype_t dt, F &&f) {
  if (dt == OSFTI_F32) return f(float{});
  if (dt == OSFTI_BF16) return f(bf16{});
  raise(OSFT_STATUS_NOT_SUPPORTED, "CPU MLP kernels: dtype %s is not supported",
        osfti_dtype_name(dt));
}

using blas::parallel_rows;
using simd::f32v;

/* The activation's value and derivative on 16 lanes. The generic form runs
 * the scalar activation<A> lane by lane (gelu_erf: erff has no vector form
 * here); silu, gelu_tanh and relu are written in vector form with
 * simd::exp (about 1 ulp), their edge cases as in mlp_activation.h. The
 * derivative is dead code, removed, where a caller uses only the value. */
template <Activation A>
OSFT_SIMD_INLINE void act_vec(const f32v &z, f32v &f, f32v &df) {
  for (int l = 0; l < simd::kLanes; ++l) {
    const ActValue a = activation<A>(z[l]);
    f[l] = a.f;
    df[l] = a.df;
  }
}

template <>
OSFT_SIMD_INLINE void act_vec<Activation::silu>(const f32v &z, f32v &f, f32v &df) {
  f32v e = -z;
  simd::exp(e); /* clamped: s is ~1e-38 rather than 0 for z < -87 */
  const f32v s = 1.0f / (1.0f + e);
  f = z * s;
  df = s * (1.0f + z * (1.0f - s));
}

template <>
OSFT_SIMD_INLINE void act_vec<Activation::gelu_tanh>(const f32v &z, f32v &f, f32v &df) {
  constexpr float k0 = 0.7978845608028654f; /* sqrt(2 / pi) */
  constexpr float k1 = 0.044715f;
  /* tanh(u) = 1 - 2 / (e^(2u) + 1), exactly +-1 once |u| is large */
  f32v e = (2.0f * k0) * (z + k1 * z * z * z);
  simd::exp(e);
  const f32v t = 1.0f - 2.0f / (e + 1.0f);
  const f32v dt = (1.0f - t * t) * k0 * (1.0f + 3.0f * k1 * z * z);
  const f32v zero = {};
  const f32v one = zero + 1.0f;
  /* beyond |z| = 10 the value is z or 0 (the cube could overflow) */
  const auto big = (z > 10.0f) | (z < -10.0f);
  const auto pos = z > 0.0f;
  f = big ? (pos ? z : zero) : 0.5f * z * (1.0f + t);
  df = big ? (pos ? one : zero) : 0.5f * (1.0f + t) + 0.5f * z * dt;
}

template <>
OSFT_SIMD_INLINE void act_vec<Activation::relu>(const f32v &z, f32v &f, f32v &df) {
  const f32v zero = {};
  const auto pos = z > 0.0f;
  f = pos | (z != z) ? z : zero; /* NaN propagates */
  df = pos ? zero + 1.0f : zero;
}

/* Gated is a template parameter so that the inner loops carry no branch.
 * 16 columns at a time, a partial vector at the end of a row. */
template <Activation A, bool Gated, class T>
OSFT_SIMD_CLONES void activate_rows(const Mat *g, const Mat &u, const Mat &h,
                                    int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) {
    const T *gi = row<const T>(g, i);
    const T *ui = row<const T>(u, i);
    T *hi = row<T>(h, i);
    for (int64_t j = 0; j < u.cols; j += simd::kLanes) {
      const int k = static_cast<int>(std::min<int64_t>(simd::kLanes, u.cols - j));
      f32v x, f, df;
      if constexpr (Gated) {
        f32v uj;
        simd::load_partial(x, gi + j, k, 0.0f);
        simd::load_partial(uj, ui + j, k, 0.0f);
        act_vec<A>(x, f, df);
        f *= uj;
      } else {
        simd::load_partial(x, ui + j, k, 0.0f);
        act_vec<A>(x, f, df);
      }
      simd::store_partial(hi + j, f, k);
    }
  }
}

template <Activation A, bool Gated, bool WithH, class T>
OSFT_SIMD_CLONES void backward_rows(const Mat *g, const Mat &u, const Mat &dh,
                                    const Mat *h, const Mat *dg, const Mat &du,
                                    int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) {
    const T *gi = row<const T>(g, i);
    const T *ui = row<const T>(u, i);
    const T *dhi = row<const T>(dh, i);
    T *hi = row<T>(h, i), *dgi = row<T>(dg, i), *dui = row<T>(du, i);
    for (int64_t j = 0; j < u.cols; j += simd::kLanes) {
      const int k = static_cast<int>(std::min<int64_t>(simd::kLanes, u.cols - j));
      f32v uj, dhj, f, df;
      simd::load_partial(uj, ui + j, k, 0.0f);
      simd::load_partial(dhj, dhi + j, k, 0.0f);
      if constexpr (Gated) {
        f32v gj;
        simd::load_partial(gj, gi + j, k, 0.0f);
        act_vec<A>(gj, f, df);
        simd::store_partial(dgi + j, dhj * uj * df, k);
        simd::store_partial(dui + j, dhj * f, k);
        if constexpr (WithH) simd::store_partial(hi + j, f * uj, k);
      } else {
        act_vec<A>(uj, f, df);
        simd::store_partial(dui + j, dhj * df, k);
        if constexpr (WithH) simd::store_partial(hi + j, f, k);
      }
    }
  }
}

void cpu_activate(Context &, Activation act, const Mat *g, const Mat &u, const Mat &h) {
  with_activation(act, [&](auto a) {
    with_flag(g != nullptr, [&](auto gated) {
      with_dtype(u.dtype, [&](auto t) {
        parallel_rows(u.rows, u.cols, [&](int64_t begin, int64_t end) {
          activate_rows<decltype(a)::value, decltype(gated)::value, decltype(t)>(
              g, u, h, begin, end);
        });
      });
    });
  });
}

void cpu_activate_backward(Context &, Activation act, const Mat *g, const Mat &u,
                           const Mat &dh, const Mat *h, const Mat *dg, const Mat &du) {
  with_activation(act, [&](auto a) {
    with_flag(g != nullptr, [&](auto gated) {
      with_flag(h != nullptr, [&](auto with_h) {
        with_dtype(u.dtype, [&](auto t) {
          parallel_rows(u.rows, u.cols, [&](int64_t begin, int64_t end) {
            backward_rows<decltype(a)::value, decltype(gated)::value,
                          decltype(with_h)::value, decltype(t)>(g, u, dh, h, dg, du,
                                                                begin, end);
          });
        });
      });
    });
  });
}

}  // namespace

const MlpKernels &cpu_mlp_kernels() noexcept {
  static const MlpKernels table = {cpu_activate, cpu_activate_backward};
  return table;
}

}  // namespace osft
