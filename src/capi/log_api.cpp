/* C ABI: the log sink. */
#include "osftrt/log.h"

#include "core/error.h"
#include "core/logging.h"
#include "core/options.h"

extern "C" OSFT_API osft_status_t osft_set_log_callback(osft_log_callback_t callback,
                                                        void *user,
                                                        osft_log_level_t max_level) {
  return osft::api_call("osft_set_log_callback", [&] {
    const int level = osft::raw_enum(max_level);
    if (level < OSFT_LOG_OFF || level > OSFT_LOG_DEBUG)
      osft::raise(OSFT_STATUS_INVALID_ARGUMENT,
                  "max_level: %d is not an osft_log_level_t (0..4)", level);
    osft::set_log_sink(callback, user, max_level);
    return OSFT_STATUS_SUCCESS;
  });
}
