/* Internal: the MLP's activations, written once for the CPU loops and the
 * CUDA kernels (host and device): each one's value and derivative in fp32,
 * and the helpers that turn the runtime choice into a compile-time one.
 * To add an activation: CONTRIBUTING.md, "Adding an activation". */
#ifndef OSFTRT_SRC_BACKEND_MLP_ACTIVATION_H
#define OSFTRT_SRC_BACKEND_MLP_ACTIVATION_H

#include <math.h>

#if defined(__CUDACC__)
#define OSFT_HOST_DEVICE __host__ __device__
#else
#define OSFT_HOST_DEVICE
#endif

namespace osft::mlp {

enum class Activation { silu, gelu_tanh, gelu_erf, relu };

/* An activation's value and derivative at one point, in fp32. */
struct ActValue {
  float f, df;
};

template <Activation A>
OSFT_HOST_DEVICE inline ActValue activation(float z);

template <>
OSFT_HOST_DEVICE inline ActValue activation<Activation::silu>(float z) {
  /* exp overflows to inf for very negative z: s = 0, f = -0, df = 0. */
  const float s = 1.0f / (1.0f + expf(-z));
  return {z * s, s * (1.0f + z * (1.0f - s))};
}

template <>
OSFT_HOST_DEVICE inline ActValue activation<Activation::gelu_tanh>(float z) {
  constexpr float k0 = 0.7978845608028654f; /* sqrt(2 / pi) */
  constexpr float k1 = 0.044715f;
  /* tanh is exactly +-1 in fp32 long before |z| = 10; beyond it the
   * polynomial below could overflow to inf * 0. */
  if (fabsf(z) > 10.0f) return z > 0.0f ? ActValue{z, 1.0f} : ActValue{0.0f, 0.0f};
  const float t = tanhf(k0 * (z + k1 * z * z * z));
  const float dt = (1.0f - t * t) * k0 * (1.0f + 3.0f * k1 * z * z);
  return {0.5f * z * (1.0f + t), 0.5f * (1.0f + t) + 0.5f * z * dt};
}

template <>
OSFT_HOST_DEVICE inline ActValue activation<Activation::gelu_erf>(float z) {
  constexpr float inv_sqrt2 = 0.7071067811865476f;
  constexpr float inv_sqrt_2pi = 0.3989422804014327f;
  const float cdf = 0.5f * (1.0f + erff(z * inv_sqrt2));
  return {z * cdf, cdf + z * inv_sqrt_2pi * expf(-0.5f * z * z)};
}

template <>
OSFT_HOST_DEVICE inline ActValue activation<Activation::relu>(float z) {
  /* NaN propagates (as torch.relu), like every other activation: a NaN
   * input must not turn into a finite 0 that hides a diverged step. */
  if (z != z) return ActValue{z, 0.0f};
  return z > 0.0f ? ActValue{z, 1.0f} : ActValue{0.0f, 0.0f};
}

/* Calls f(ActTag<a>{}) with the activation as a compile-time value, so each
 * kernel is specialized per activation. */
template <Activation A>
struct ActTag {
  static constexpr Activation value = A;
};

template <class F>
void with_activation(Activation a, F &&f) {
  switch (a) {
    case Activation::silu: return f(ActTag<Activation::silu>{});
    case Activation::gelu_tanh: return f(ActTag<Activation::gelu_tanh>{});
    case Activation::gelu_erf: return f(ActTag<Activation::gelu_erf>{});
    case Activation::relu: return f(ActTag<Activation::relu>{});
  }
}

/* Calls f(Flag<b>{}) with b as a compile-time value (gated or not, ...). */
template <bool B>
struct Flag {
  static constexpr bool value = B;
};

template <class F>
void with_flag(bool b, F &&f) {
  if (b) return f(Flag<true>{});
  f(Flag<false>{});
}

}  // namespace osft::mlp

#endif
