/* Internal: reading and initializing the public struct_size-versioned
 * structs (ABI.md, "Options structs"). */
#ifndef OSFTRT_SRC_CORE_OPTIONS_H
#define OSFTRT_SRC_CORE_OPTIONS_H

#include <algorithm>
#include <cstddef>
#include <cstring>

#include "core/error.h"

/* The size of the 1.0 layout of a public struct: the end of its last 1.0
 * field. It never changes, even when fields are appended. */
#define OSFTI_V1_SIZE(type, last_field) \
  (offsetof(type, last_field) + sizeof(((type *)nullptr)->last_field))

namespace osft {

/* The integer in a caller-supplied enum. A C caller may pass any int; in
 * C++ loading an out-of-range enumerator is undefined, so read the bytes. */
template <class Enum>
int raw_enum(const Enum &value) noexcept {
  static_assert(sizeof(Enum) == sizeof(int), "C enums are int-sized");
  int raw;
  std::memcpy(&raw, &value, sizeof raw);
  return raw;
}

/* Throws unless a caller struct of `struct_size` bytes can be read. */
void check_struct_size(const char *arg, const char *type, size_t struct_size,
                       size_t v1_size);

/* Copies the caller's struct into a full, library-sized one: fields the
 * caller's (older) layout lacks keep `defaults`; a caller compiled against a
 * newer layout is accepted only if every byte this library does not know
 * is zero (an unset appended field). */
template <class T>
T read_struct(const T *user, const T &defaults, size_t v1_size, const char *arg,
              const char *type) {
  check_struct_size(arg, type, user->struct_size, v1_size);
  const auto *bytes = reinterpret_cast<const unsigned char *>(user);
  for (size_t i = sizeof(T); i < user->struct_size; ++i)
    if (bytes[i] != 0)
      raise(OSFT_STATUS_INVALID_STRUCT_SIZE,
            "%s->struct_size: %zu bytes, but this library knows only %zu of "
            "%s and the unknown fields are set; a newer libosftrt is needed",
            arg, user->struct_size, sizeof(T), type);
  T out = defaults;
  std::memcpy(&out, user, std::min(user->struct_size, sizeof(T)));
  out.struct_size = sizeof(T);
  return out;
}

/* Writes `values` into a caller struct of `struct_size` bytes: the known
 * part up to the caller's size, zeros beyond what this library knows. */
template <class T>
void write_struct(T *user, size_t struct_size, const T &values) {
  const size_t known = std::min(struct_size, sizeof(T));
  std::memcpy(user, &values, known);
  if (struct_size > known)
    std::memset(reinterpret_cast<unsigned char *>(user) + known, 0, struct_size - known);
  user->struct_size = struct_size;
}

}  // namespace osft

#endif
