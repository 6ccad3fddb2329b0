/* Internal: recording errors (C-callable) and the C++ boundary guard. */
#ifndef OSFTRT_SRC_CORE_ERROR_H
#define OSFTRT_SRC_CORE_ERROR_H

#include "core/core_api.h"
#include "osftrt/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Records `status` and a printf-style message (naming the argument and the
 * reason) as the calling thread's pending error, and returns `status`. The
 * API boundary prefixes the public function's name and logs it. */
osft_status_t osfti_set_error(osft_status_t status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

#ifdef __cplusplus
}

#include <exception>
#include <new>
#include <string>

namespace osft {

/* Thrown inside the core; caught and turned into a status at the C
 * boundary by api_call(). */
class OSFT_CORE_API Error : public std::exception {
 public:
  Error(osft_status_t status, std::string message)
      : status_(status), message_(std::move(message)) {}
  osft_status_t status() const noexcept { return status_; }
  const char *what() const noexcept override { return message_.c_str(); }

 private:
  osft_status_t status_;
  std::string message_;
};

/* A short English name for a status ("shape mismatch"); never NULL. */
const char *status_name(osft_status_t status) noexcept;

/* The calling thread's last finished error message ("" if none). */
const char *last_error() noexcept;
void clear_last_error() noexcept;

/* Throws Error(status, formatted message). */
[[noreturn]] OSFT_CORE_API void raise(osft_status_t status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Turns a status returned by a C-callable internal check into an exception
 * carrying the message that check recorded. */
void throw_if_error(osft_status_t status);

/* Called by api_call() on failure: prefixes the public function's name to
 * the pending message, makes it the thread's last error and logs it. */
osft_status_t finish_failure(const char *function, osft_status_t status) noexcept;

/* Runs `body` (returning osft_status_t) and turns any exception into a
 * recorded status: the one place where exceptions stop. */
template <class Body>
osft_status_t run_catching(Body &&body) noexcept {
  try {
    return body();
  } catch (const Error &e) {
    return osfti_set_error(e.status(), "%s", e.what());
  } catch (const std::bad_alloc &) {
    return osfti_set_error(OSFT_STATUS_OUT_OF_MEMORY, "host memory allocation failed");
  } catch (const std::exception &e) {
    return osfti_set_error(OSFT_STATUS_INTERNAL_ERROR, "unexpected exception: %s",
                           e.what());
  } catch (...) {
    return osfti_set_error(OSFT_STATUS_INTERNAL_ERROR, "unknown exception");
  }
}

/* Every public function body runs inside this, so nothing but a status
 * crosses the C boundary, and every failure is named and logged. */
template <class Body>
osft_status_t api_call(const char *function, Body &&body) noexcept {
  const osft_status_t status = run_catching(body);
  return status == OSFT_STATUS_SUCCESS ? status : finish_failure(function, status);
}

}  // namespace osft

#endif /* __cplusplus */

#endif /* OSFTRT_SRC_CORE_ERROR_H */
