#include "core/logging.h"

#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <shared_mutex>

namespace osft {
namespace {

/* Readers (threads logging) hold the lock shared while the callback runs,
 * so set_log_sink() can promise that the old callback is no longer called
 * once it returns. */
struct Sink {
  std::shared_mutex mutex;
  osft_log_callback_t callback = nullptr;
  void *user = nullptr;
  /* The effective maximum level; read without the lock on the fast path. */
  std::atomic<int> max_level{OSFT_LOG_OFF};
  int callback_level = OSFT_LOG_OFF;
  int stderr_level = OSFT_LOG_OFF;
};

int level_from_env() {
  const char *v = std::getenv("OSFT_LOG_LEVEL");
  if (v == nullptr) return OSFT_LOG_OFF;
  static const char *const names[] = {"off", "error", "warn", "info", "debug"};
  for (int i = 0; i < 5; ++i)
    if (std::strcmp(v, names[i]) == 0) return i;
  return OSFT_LOG_OFF;
}

Sink &sink() {
  static Sink *s = [] {
    Sink *created = new Sink(); /* never destroyed: usable during exit */
    created->stderr_level = level_from_env();
    created->max_level = created->stderr_level;
    return created;
  }();
  return *s;
}

const char *level_name(osft_log_level_t level) {
  switch (level) {
    case OSFT_LOG_ERROR: return "error";
    case OSFT_LOG_WARN: return "warn";
    case OSFT_LOG_INFO: return "info";
    case OSFT_LOG_DEBUG: return "debug";
    default: return "?";
  }
}

}  // namespace

bool log_enabled(osft_log_level_t level) noexcept {
  return level != OSFT_LOG_OFF && static_cast<int>(level) <= sink().max_level;
}

void log_message(osft_log_level_t level, const char *fmt, ...) noexcept {
  if (!log_enabled(level)) return;
  char line[1024];
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(line, sizeof line, fmt, args);
  va_end(args);
  Sink &s = sink();
  std::shared_lock<std::shared_mutex> lock(s.mutex);
  if (s.callback != nullptr) {
    if (static_cast<int>(level) <= s.callback_level) s.callback(s.user, level, line);
  } else if (static_cast<int>(level) <= s.stderr_level) {
    std::fprintf(stderr, "[osftrt %s] %s\n", level_name(level), line);
  }
}

void set_log_sink(osft_log_callback_t callback, void *user, osft_log_level_t max_level) {
  Sink &s = sink();
  std::unique_lock<std::shared_mutex> lock(s.mutex);
  s.callback = callback;
  s.user = user;
  s.callback_level = callback != nullptr ? static_cast<int>(max_level) : OSFT_LOG_OFF;
  s.max_level = callback != nullptr ? s.callback_level : s.stderr_level;
}

}  // namespace osft
