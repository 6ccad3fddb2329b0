#include "core/handle.h"

#include <mutex>
#include <unordered_map>

#include "core/error.h"

namespace osft {
namespace {

struct Registry {
  std::mutex mutex;
  std::unordered_map<const void *, HandleKind> live;
};

Registry &registry() {
  static Registry *r = new Registry(); /* never destroyed: usable during exit */
  return *r;
}

}  // namespace

const char *handle_kind_name(HandleKind kind) noexcept {
  switch (kind) {
    case HandleKind::context: return "context";
    case HandleKind::flinear: return "flinear layer";
    case HandleKind::mlp: return "MLP";
    case HandleKind::comm: return "communicator";
    case HandleKind::projector: return "projector";
    case HandleKind::flce: return "fused linear cross-entropy";
  }
  return "handle";
}

void register_handle(const void *handle, HandleKind kind) {
  Registry &r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.live.emplace(handle, kind);
}

bool unregister_handle(const void *handle, HandleKind kind) noexcept {
  Registry &r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.live.find(handle);
  if (it == r.live.end() || it->second != kind) return false;
  r.live.erase(it);
  return true;
}

bool is_live_handle(const void *handle, HandleKind kind) noexcept {
  if (handle == nullptr) return false;
  Registry &r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.live.find(handle);
  return it != r.live.end() && it->second == kind;
}

void check_handle(const void *handle, HandleKind kind, const char *arg) {
  if (handle == nullptr)
    raise(OSFT_STATUS_INVALID_HANDLE, "%s: NULL %s handle", arg, handle_kind_name(kind));
  if (!is_live_handle(handle, kind))
    raise(OSFT_STATUS_INVALID_HANDLE,
          "%s: not a live %s handle (destroyed, or not created by libosftrt)", arg,
          handle_kind_name(kind));
}

}  // namespace osft
