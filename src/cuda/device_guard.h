/* Internal (CUDA builds): makes a device current for a scope and restores
 * the caller's, so the library never changes a framework's current device
 * behind its back. Handles, streams and kernels are bound to that device. */
#ifndef OSFTRT_SRC_CUDA_DEVICE_GUARD_H
#define OSFTRT_SRC_CUDA_DEVICE_GUARD_H

#include <cuda_runtime_api.h>

#include "core/error.h"

namespace osft::cuda {

class DeviceGuard {
 public:
  explicit DeviceGuard(int device_id) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
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
  int previous_ = -1;
};

}  // namespace osft::cuda

#endif
