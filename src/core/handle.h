/* Internal: the registry of live handles, so that a NULL, foreign or
 * destroyed handle is reported as OSFT_STATUS_INVALID_HANDLE instead of
 * being dereferenced. */
#ifndef OSFTRT_SRC_CORE_HANDLE_H
#define OSFTRT_SRC_CORE_HANDLE_H

#include <cstdint>

namespace osft {

/* One value per handle type; a handle of one kind is never accepted where
 * another is expected. */
enum class HandleKind : uint32_t {
  context = 1,
  flinear = 2,
  mlp = 3,
  comm = 4,
  projector = 5,
  flce = 6,
};

/* Human name of a kind for messages ("context"). */
const char *handle_kind_name(HandleKind kind) noexcept;

void register_handle(const void *handle, HandleKind kind);

/* Removes the handle if it is live and of `kind`; returns whether it was.
 * Atomic, so two threads destroying the same handle cannot both succeed. */
bool unregister_handle(const void *handle, HandleKind kind) noexcept;

bool is_live_handle(const void *handle, HandleKind kind) noexcept;

/* Throws Error(OSFT_STATUS_INVALID_HANDLE) naming `arg` unless `handle` is a
 * live handle of `kind`. */
void check_handle(const void *handle, HandleKind kind, const char *arg);

}  // namespace osft

#endif
