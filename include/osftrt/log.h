/**
 * @file
 * @brief libosftrt — diagnostics logging.
 *
 * The library is silent by default. Diagnostics go to at most one sink:
 *   - a callback installed with osft_set_log_callback(), or else
 *   - standard error, when the environment variable OSFT_LOG_LEVEL is set to
 *     "error", "warn", "info" or "debug" (read once, at the first message).
 *
 * What is logged: every failure (OSFT_LOG_ERROR, the same text as
 * osft_last_error()), resource events such as context creation and
 * workspace growth (OSFT_LOG_INFO / OSFT_LOG_DEBUG), and decisions such as
 * the strategy a cost model picked (OSFT_LOG_DEBUG).
 *
 * @code
 *   static void to_syslog(void *user, osft_log_level_t level, const char *msg) {
 *     (void)user;
 *     syslog(level == OSFT_LOG_ERROR ? LOG_ERR : LOG_INFO, "osftrt: %s", msg);
 *   }
 *   ...
 *   osft_set_log_callback(to_syslog, NULL, OSFT_LOG_INFO);
 * @endcode
 */
#ifndef OSFTRT_LOG_H
#define OSFTRT_LOG_H

#include "osftrt/export.h"
#include "osftrt/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/**
 * @defgroup osftrt_log Diagnostics logging
 * @brief A process-wide log sink: a callback, or standard error through
 * OSFT_LOG_LEVEL (osftrt/log.h).
 * @{
 */

/** @brief Severity, most severe first. Values are fixed forever (ABI.md). */
typedef enum osft_log_level_e {
  OSFT_LOG_OFF = 0,   /**< as max_level: deliver nothing */
  OSFT_LOG_ERROR = 1, /**< a call failed; the message says why */
  OSFT_LOG_WARN = 2,  /**< something works, but not as well as it could */
  OSFT_LOG_INFO = 3,  /**< resource events: contexts, devices, workspaces */
  OSFT_LOG_DEBUG = 4  /**< per-call decisions: strategies, chunk sizes */
} osft_log_level_t;

/**
 * @brief A log sink.
 *
 * @param user     The pointer given to osft_set_log_callback().
 * @param level    The message's severity.
 * @param message  A NUL-terminated UTF-8 line without a trailing newline,
 *                 valid only during the call (copy it to keep it).
 *
 * @par Thread safety
 * The callback runs on whichever thread is inside the library, possibly on
 * several threads at once, so it must be thread-safe. It must not call
 * osft_set_log_callback() (that would deadlock); other libosftrt calls are
 * allowed but should be avoided.
 */
typedef void (*osft_log_callback_t)(void *user, osft_log_level_t level,
                                    const char *message);

/**
 * @brief Installs `callback` (with `user` passed back to it) as the
 * process-wide log sink, delivering messages whose level is at most
 * `max_level`.
 *
 * A NULL
 * callback removes the sink (the library is silent again, or logs to stderr
 * if OSFT_LOG_LEVEL is set).
 *
 * @param[in] callback   The sink, or NULL to remove it.
 * @param[in] user       Passed back to every call of `callback`.
 * @param[in] max_level  The least severe level delivered (OSFT_LOG_OFF:
 *                       none).
 * @retval OSFT_STATUS_SUCCESS  The sink is installed (or removed).
 * @retval OSFT_STATUS_INVALID_ARGUMENT  if max_level is not one of
 *   osft_log_level_t (the previous sink stays).
 * @par Thread safety
 * Thread-safe. When it returns, no thread will call the previous callback
 * any more, so its `user` data may be freed.
 */
OSFT_API osft_status_t osft_set_log_callback(osft_log_callback_t callback, void *user,
                                             osft_log_level_t max_level);

/** @} */

#ifdef __cplusplus
}
#endif

#endif /* OSFTRT_LOG_H */
