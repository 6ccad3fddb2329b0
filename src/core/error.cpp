#include "core/error.h"

#include <cstdarg>
#include <cstdio>
#include <string>

#include "core/logging.h"
#include "core/options.h"

namespace {

/* The calling thread's error state: the message of a failure in progress
 * (pending) and the finished message that osft_last_error() returns. */
struct ThreadError {
  std::string pending;
  bool has_pending = false;
  std::string last;
};

ThreadError &thread_error() {
  thread_local ThreadError state;
  return state;
}

std::string vformat(const char *fmt, va_list args) {
  va_list copy;
  va_copy(copy, args);
  int n = std::vsnprintf(nullptr, 0, fmt, copy);
  va_end(copy);
  if (n <= 0) return std::string();
  std::string out(static_cast<size_t>(n) + 1, '\0');
  std::vsnprintf(out.data(), out.size(), fmt, args);
  out.resize(static_cast<size_t>(n));
  return out;
}

}  // namespace

extern "C" osft_status_t osfti_set_error(osft_status_t status, const char *fmt, ...) {
  ThreadError &state = thread_error();
  va_list args;
  va_start(args, fmt);
  try {
    state.pending = vformat(fmt, args);
  } catch (...) {
    state.pending.clear(); /* out of memory while formatting: keep status */
  }
  va_end(args);
  state.has_pending = true;
  return status;
}

namespace osft {

void raise(osft_status_t status, const char *fmt, ...) {
  va_list args;
  va_start(args, fmt);
  std::string message = vformat(fmt, args);
  va_end(args);
  throw Error(status, std::move(message));
}

void throw_if_error(osft_status_t status) {
  if (status == OSFT_STATUS_SUCCESS) return;
  ThreadError &state = thread_error();
  state.has_pending = false;
  throw Error(status, state.pending);
}

osft_status_t finish_failure(const char *function, osft_status_t status) noexcept {
  ThreadError &state = thread_error();
  try {
    const std::string &reason =
        state.has_pending && !state.pending.empty()
            ? state.pending
            : std::string(status_name(status)) + " (no further detail was recorded)";
    state.last = std::string(function) + ": " + reason;
    log_message(OSFT_LOG_ERROR, "%s", state.last.c_str());
  } catch (...) {
    state.last.clear(); /* out of memory: the status still says what failed */
  }
  state.has_pending = false;
  state.pending.clear();
  return status;
}

}  // namespace osft

namespace osft {

const char *status_name(osft_status_t status) noexcept {
  switch (raw_enum(status)) {
    case OSFT_STATUS_SUCCESS: return "success";
    case OSFT_STATUS_INVALID_ARGUMENT: return "invalid argument";
    case OSFT_STATUS_INVALID_HANDLE: return "invalid handle";
    case OSFT_STATUS_INVALID_STRUCT_SIZE: return "invalid struct size";
    case OSFT_STATUS_DTYPE_MISMATCH: return "dtype mismatch";
    case OSFT_STATUS_SHAPE_MISMATCH: return "shape mismatch";
    case OSFT_STATUS_BAD_LAYOUT: return "bad layout";
    case OSFT_STATUS_DEVICE_MISMATCH: return "device mismatch";
    case OSFT_STATUS_ALIASING: return "aliasing";
    case OSFT_STATUS_INDEX_OUT_OF_RANGE: return "index out of range";
    case OSFT_STATUS_OUT_OF_MEMORY: return "out of memory";
    case OSFT_STATUS_NO_DEVICE: return "no device";
    case OSFT_STATUS_NOT_SUPPORTED: return "not supported";
    case OSFT_STATUS_BACKEND_ERROR: return "backend error";
    case OSFT_STATUS_COMM_ERROR: return "communication error";
    case OSFT_STATUS_TIMEOUT: return "timeout";
    case OSFT_STATUS_NUMERICAL_ERROR: return "numerical error";
    case OSFT_STATUS_INTERNAL_ERROR: return "internal error";
  }
  return "unknown status";
}

const char *last_error() noexcept {
  return thread_error().last.c_str();
}

void clear_last_error() noexcept {
  thread_error().last.clear();
}

}  // namespace osft
