/* Internal: bfloat16 on the host (the top 16 bits of an IEEE fp32). */
#ifndef OSFTRT_SRC_CORE_BF16_H
#define OSFTRT_SRC_CORE_BF16_H

#include <cstdint>
#include <cstring>

namespace osft {

struct bf16 {
  uint16_t bits;
};

inline float to_float(bf16 v) noexcept {
  const uint32_t u = static_cast<uint32_t>(v.bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

/* Round to nearest even; NaNs stay (quiet) NaNs. */
inline bf16 to_bf16(float f) noexcept {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u)
    return bf16{static_cast<uint16_t>((u >> 16) | 0x40u)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16{static_cast<uint16_t>(u >> 16)};
}

inline float to_float(float v) noexcept {
  return v;
}
inline float to_float(double v) noexcept {
  return static_cast<float>(v);
}

}  // namespace osft

#endif
