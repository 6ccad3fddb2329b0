/* Internal (CUDA builds): makes a device current for a scope and restores
 * the caller's, so the library never changes a framework's current device
 * behind its back. Handles, streams and kernels are bound to that device.
 *
 * "The caller's device" is only restored when the thread really had one:
 * cudaGetDevice() answers 0 on a thread that never selected a device, and
 * since CUDA 12 cudaSetDevice(0) creates GPU 0's primary context (hundreds
 * of MB on every rank of a node). A thread with no current context before
 * the guard keeps the guard's device current after it. */
#ifndef OSFTRT_SRC_CUDA_DEVICE_GUARD_H
#define OSFTRT_SRC_CUDA_DEVICE_GUARD_H

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "core/error.h"

namespace osft::cuda {

/* The calling thread's current CUDA context (nullptr: none), and whether
 * it could be asked at all. The driver's cuCtxGetCurrent is reached through
 * the runtime's entry-point query, so the library does not link libcuda
 * (it must load where no driver is). */
inline bool current_context(CUcontext *out) noexcept {
  using GetCurrent = CUresult (*)(CUcontext *);
  static const GetCurrent get_current = [] {
    void *fn = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuCtxGetCurrent", &fn, 4000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      fn = nullptr;
    }
    return reinterpret_cast<GetCurrent>(fn);
  }();
  *out = nullptr;
  return get_current != nullptr && get_current(out) == CUDA_SUCCESS;
}

/* Whether the calling thread has a current CUDA context; unknown: true
 * (restore as before). */
inline bool thread_has_context() noexcept {
  CUcontext current = nullptr;
  return !current_context(&current) || current != nullptr;
}

class DeviceGuard {
 public:
  explicit DeviceGuard(int device_id) {
    if (!thread_has_context() || cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    if (previous_ == device_id) return;
    const cudaError_t e = cudaSetDevice(device_id);
    if (e != cudaSuccess)
      raise(OSFT_STATUS_BACKEND_ERROR, "cudaSetDevice(%d): %s", device_id,
            cudaGetErrorString(e));
  }
  ~DeviceGuard() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard &) = delete;
  DeviceGuard &operator=(const DeviceGuard &) = delete;

 private:
  int previous_ = -1; /* -1: nothing to restore */
};

}  // namespace osft::cuda

#endif
