/* C ABI: status names and the thread-local error message. */
#include "osftrt/status.h"

#include "core/error.h"
#include "core/options.h"

extern "C" {

OSFT_API const char *osft_status_string(osft_status_t status) {
  /* A C caller may pass any int: read it as one (loading an out-of-range
   * value as the C++ enum is UB). */
  const int raw = osft::raw_enum(status);
  if (raw < OSFT_STATUS_SUCCESS || raw > OSFT_STATUS_INTERNAL_ERROR)
    return "unknown status";
  return osft::status_name(static_cast<osft_status_t>(raw));
}

OSFT_API const char *osft_last_error(void) {
  return osft::last_error();
}

OSFT_API void osft_clear_last_error(void) {
  osft::clear_last_error();
}

}  // extern "C"
