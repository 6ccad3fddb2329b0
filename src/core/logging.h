/* Internal: diagnostics to the caller's log sink (osftrt/log.h). */
#ifndef OSFTRT_SRC_CORE_LOGGING_H
#define OSFTRT_SRC_CORE_LOGGING_H

#include "core/core_api.h"
#include "osftrt/log.h"

namespace osft {

/* True if a message at `level` would be delivered; lets callers skip
 * formatting work. */
bool log_enabled(osft_log_level_t level) noexcept;

/* Formats and delivers one line to the sink if `level` is enabled. Never
 * throws; a message that cannot be formatted is dropped. */
OSFT_CORE_API void log_message(osft_log_level_t level, const char *fmt, ...) noexcept
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Installs the sink; see osft_set_log_callback(). */
void set_log_sink(osft_log_callback_t callback, void *user, osft_log_level_t max_level);

}  // namespace osft

#endif
