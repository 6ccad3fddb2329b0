/* The CPU MLP kernels of src/backend/mlp_backend.h: one loop per pass over the
 * tile's intermediates, the activation inlined (specialized per activation
 * and dtype), fp32 math, bf16 rounded to nearest even on store. The rows of
 * a pass are split over the cores: single-threaded, the activation passes
 * took the time of a fifth of the tile's GEMMs on two cores (SwiGLU
 * 4096 x 512 x 1792 on oneMKL), the other core idle; every element is
 * computed as before, so the results are bit-identical. */
#include <algorithm>

#include "core/bf16.h"
#include "core/cpu_blas.h"
#include "core/error.h"
#include "backend/mlp_backend.h"

namespace osft {
namespace {

using namespace mlp; /* the activation math and its dispatch */

inline float load(const float *p) {
  return *p;
}
inline float load(const bf16 *p) {
  return to_float(*p);
}
inline void store(float *p, float v) {
  *p = v;
}
inline void store(bf16 *p, float v) {
  *p = to_bf16(v);
}

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

/* The rows of a pass over the engine's threads, at least 64K elements
 * (and one row) each. */
template <class Body>
void parallel_rows(int64_t rows, int64_t cols, const Body &body) {
  constexpr int64_t kGrain = 1 << 16;
  blas::parallel_for(rows, std::max<int64_t>(1, kGrain / std::max<int64_t>(cols, 1)),
                     body);
}

/* Gated is a template parameter so that the inner loops carry no branch. */
template <Activation A, bool Gated, class T>
void activate_rows(const Mat *g, const Mat &u, const Mat &h, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) {
    const T *gi = row<const T>(g, i);
    const T *ui = row<const T>(u, i);
    T *hi = row<T>(h, i);
    for (int64_t j = 0; j < u.cols; ++j) {
      if constexpr (Gated)
        store(hi + j, activation<A>(load(gi + j)).f * load(ui + j));
      else
        store(hi + j, activation<A>(load(ui + j)).f);
    }
  }
}

template <Activation A, bool Gated, bool WithH, class T>
void backward_rows(const Mat *g, const Mat &u, const Mat &dh, const Mat *h, const Mat *dg,
                   const Mat &du, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) {
    const T *gi = row<const T>(g, i);
    const T *ui = row<const T>(u, i);
    const T *dhi = row<const T>(dh, i);
    T *hi = row<T>(h, i), *dgi = row<T>(dg, i), *dui = row<T>(du, i);
    for (int64_t j = 0; j < u.cols; ++j) {
      const float uj = load(ui + j), dhj = load(dhi + j);
      if constexpr (Gated) {
        const ActValue a = activation<A>(load(gi + j));
        store(dgi + j, dhj * uj * a.df);
        store(dui + j, dhj * a.f);
        if constexpr (WithH) store(hi + j, a.f * uj);
      } else {
        const ActValue a = activation<A>(uj);
        store(dui + j, dhj * a.df);
        if constexpr (WithH) store(hi + j, a.f);
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
