#include "core/allocator.h"

#include <cstdlib>

#include "core/cuda_runtime.h"
#include "core/error.h"
#include "core/logging.h"
#include "core/options.h"

namespace osft {
namespace {

constexpr size_t kAllocatorV1Size = OSFTI_V1_SIZE(osft_allocator_t, device_free);

osft_allocator_t read_callbacks(const osft_allocator_t *user, const char *arg) {
  osft_allocator_t defaults{};
  defaults.struct_size = sizeof defaults;
  if (user == nullptr) return defaults;
  osft_allocator_t cb =
      read_struct(user, defaults, kAllocatorV1Size, arg, "osft_allocator_t");
  if ((cb.host_alloc == nullptr) != (cb.host_free == nullptr))
    raise(OSFT_STATUS_INVALID_ARGUMENT,
          "%s: host_alloc and host_free must both be set or both be NULL", arg);
  if ((cb.device_alloc == nullptr) != (cb.device_free == nullptr))
    raise(OSFT_STATUS_INVALID_ARGUMENT,
          "%s: device_alloc and device_free must both be set or both be NULL", arg);
  return cb;
}

void *builtin_host_alloc(size_t bytes) {
  /* aligned_alloc wants a multiple of the alignment */
  const size_t a = Allocator::host_alignment;
  return std::aligned_alloc(a, (bytes + a - 1) / a * a);
}

void count_alloc(uint64_t &in_use, uint64_t &peak, uint64_t &allocs, size_t bytes) {
  in_use += bytes;
  if (in_use > peak) peak = in_use;
  ++allocs;
}

}  // namespace

Allocator::Allocator(const osft_allocator_t *callbacks, const char *arg)
    : callbacks_(read_callbacks(callbacks, arg)) {}

void *Allocator::host_alloc(size_t bytes, const char *what) {
  void *p = callbacks_.host_alloc != nullptr
                ? callbacks_.host_alloc(callbacks_.user, bytes, host_alignment)
                : builtin_host_alloc(bytes);
  if (p == nullptr)
    raise(OSFT_STATUS_OUT_OF_MEMORY, "%s: host allocation of %zu bytes failed%s", what,
          bytes,
          callbacks_.host_alloc != nullptr ? " (caller's host_alloc returned NULL)" : "");
  count_alloc(counters_.host_in_use, counters_.host_peak, counters_.host_allocs, bytes);
  return p;
}

void Allocator::host_free(void *ptr, size_t bytes) noexcept {
  if (ptr == nullptr) return;
  if (callbacks_.host_free != nullptr)
    callbacks_.host_free(callbacks_.user, ptr, bytes);
  else
    std::free(ptr);
  counters_.host_in_use -= bytes;
}

void *Allocator::device_alloc(size_t bytes, int device_id, void *stream,
                              const char *what) {
  void *p = nullptr;
  if (callbacks_.device_alloc != nullptr) {
    p = callbacks_.device_alloc(callbacks_.user, bytes, device_id, stream);
    if (p == nullptr)
      raise(OSFT_STATUS_OUT_OF_MEMORY,
            "%s: allocation of %zu bytes on CUDA device %d failed (caller's device_alloc "
            "returned NULL)",
            what, bytes, device_id);
  } else {
    try {
      p = cuda::device_malloc(bytes, device_id, stream);
    } catch (const Error &e) {
      raise(e.status(), "%s: allocation of %zu bytes on CUDA device %d: %s", what, bytes,
            device_id, e.what());
    }
  }
  count_alloc(counters_.device_in_use, counters_.device_peak, counters_.device_allocs,
              bytes);
  return p;
}

void Allocator::device_free(void *ptr, size_t bytes, int device_id,
                            void *stream) noexcept {
  if (ptr == nullptr) return;
  if (callbacks_.device_free != nullptr)
    callbacks_.device_free(callbacks_.user, ptr, bytes, device_id, stream);
  else
    cuda::device_free(ptr, device_id, stream);
  counters_.device_in_use -= bytes;
}

void Allocator::reset_peaks() noexcept {
  counters_.host_peak = counters_.host_in_use;
  counters_.device_peak = counters_.device_in_use;
}

}  // namespace osft
