/* Internal: every byte the library allocates for a context goes through
 * this, to the caller's callbacks or the built-in allocators, and is
 * counted (osft_memory_stats_t). */
#ifndef OSFTRT_SRC_CORE_ALLOCATOR_H
#define OSFTRT_SRC_CORE_ALLOCATOR_H

#include "core/core_api.h"
#include <cstddef>
#include <cstdint>
#include <new>
#include <utility>

#include "osftrt/context.h"

namespace osft {

struct MemoryCounters {
  uint64_t host_in_use = 0, host_peak = 0, host_allocs = 0;
  uint64_t device_in_use = 0, device_peak = 0, device_allocs = 0;
};

class Allocator {
 public:
  /* Host blocks are aligned to this (cache line, and enough for AVX-512). */
  static constexpr size_t host_alignment = 64;

  /* `callbacks` NULL: built-in. Throws for a half-set pair or a bad
   * struct_size, naming `arg`. */
  Allocator(const osft_allocator_t *callbacks, const char *arg);

  /* Throw OSFT_STATUS_OUT_OF_MEMORY naming `what` on failure. `bytes` > 0. */
  OSFT_CORE_API void *host_alloc(size_t bytes, const char *what);
  void *device_alloc(size_t bytes, int device_id, void *stream, const char *what);
  OSFT_CORE_API void host_free(void *ptr, size_t bytes) noexcept;
  void device_free(void *ptr, size_t bytes, int device_id, void *stream) noexcept;

  /* A host object constructed in memory from host_alloc, and its undoing;
   * for the library's own bookkeeping (contexts, layers). */
  template <class T, class... Args>
  T *make(const char *what, Args &&...args) {
    void *mem = host_alloc(sizeof(T), what);
    try {
      return new (mem) T(std::forward<Args>(args)...);
    } catch (...) {
      host_free(mem, sizeof(T));
      throw;
    }
  }
  template <class T>
  void destroy(T *object) noexcept {
    if (object == nullptr) return;
    object->~T();
    host_free(object, sizeof(T));
  }

  const MemoryCounters &counters() const noexcept { return counters_; }
  void reset_peaks() noexcept;

 private:
  osft_allocator_t callbacks_;
  MemoryCounters counters_;
};

}  // namespace osft

#endif
