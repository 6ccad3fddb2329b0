/* C ABI: status names and the thread-local error message. */
#include "osftrt/status.h"

#include "core/error.h"

extern "C" {

OSFT_API const char *osft_status_string(osft_status_t status) {
  return osft::status_name(status);
}

OSFT_API const char *osft_last_error(void) {
  return osft::last_error();
}

OSFT_API void osft_clear_last_error(void) {
  osft::clear_last_error();
}

}  // extern "C"
