/* Internal: the lifecycle every handle created from a context shares (flinear
 * layers, MLPs, cross-entropy handles, communicators, projectors). The handle
 * struct has members `Context *ctx` and `bool counted`. A registered child is
 * live in the handle registry and counted in ctx.live_children, so the
 * context refuses to be destroyed under it. */
#ifndef OSFTRT_SRC_CORE_CHILD_HANDLE_H
#define OSFTRT_SRC_CORE_CHILD_HANDLE_H

#include "core/context_impl.h"
#include "core/error.h"
#include "core/handle.h"

namespace osft {

/* Makes `child` live; on failure runs `undo` (which frees it) and rethrows. */
template <class T, class Undo>
T *register_child(T *child, HandleKind kind, Undo &&undo) {
  try {
    register_handle(child, kind);
  } catch (...) {
    undo(child);
    throw;
  }
  child->ctx->live_children++;
  child->counted = true;
  return child;
}

/* Drops the count taken by register_child (the registry entry is removed
 * by the C ABI's destroy before it frees the object). */
template <class T>
void uncount_child(T *child) noexcept {
  if (child->counted) child->ctx->live_children--;
  child->counted = false;
}

/* Throws OSFT_STATUS_INVALID_HANDLE naming `arg` unless `child` is a live
 * handle of `kind` whose context is also still live. */
template <class T>
T &checked_child(T *child, HandleKind kind, const char *arg) {
  check_handle(child, kind, arg);
  if (!is_live_handle(child->ctx, HandleKind::context))
    raise(OSFT_STATUS_INVALID_HANDLE,
          "%s: its context was destroyed; destroy %ss before their context", arg,
          handle_kind_name(kind));
  return *child;
}

}  // namespace osft

#endif
