/* Internal: helpers every C ABI file uses (src/capi/). */
#ifndef OSFTRT_SRC_CAPI_CAPI_UTIL_H
#define OSFTRT_SRC_CAPI_CAPI_UTIL_H

#include "core/error.h"
#include "core/options.h"

namespace osft {

/* Throws OSFT_STATUS_INVALID_ARGUMENT naming `arg` if ptr is NULL. */
template <class T>
void require(const T *ptr, const char *arg) {
  if (ptr == nullptr) raise(OSFT_STATUS_INVALID_ARGUMENT, "%s: NULL pointer", arg);
}

/* The body of every *_init(ptr, struct_size) function: writes `defaults`
 * into a caller struct of struct_size bytes. */
template <class T>
osft_status_t init_struct(T *user, size_t struct_size, const T &defaults, size_t v1_size,
                          const char *arg, const char *type) {
  require(user, arg);
  check_struct_size(arg, type, struct_size, v1_size);
  write_struct(user, struct_size, defaults);
  return OSFT_STATUS_SUCCESS;
}

/* The *_init() of a struct the library fills in (statistics, a plan): all
 * zeros and the caller's struct_size, checked against the 1.0 layout. */
template <class T>
osft_status_t init_output_struct(T *user, size_t struct_size, size_t v1_size,
                                 const char *arg, const char *type) {
  T zeros{};
  zeros.struct_size = sizeof zeros;
  return init_struct(user, struct_size, zeros, v1_size, arg, type);
}

}  // namespace osft

#endif
