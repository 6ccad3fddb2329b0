/* copy() of src/core/cuda_runtime.h: host <-> device staging for the
 * communicators and the projector, on the context's stream, as the CUDA
 * module implements it (src/cuda/module_cuda.h). */
#include <cuda_runtime.h>

#include "core/cuda_runtime.h"
#include "cuda/cuda_check.h"
#include "cuda/device_guard.h"
#include "cuda/module_cuda.h"

namespace osft {
namespace {

using cuda::CopyKind;
using cuda::DeviceGuard;

cudaMemcpyKind memcpy_kind(CopyKind kind) {
  switch (kind) {
    case CopyKind::to_host: return cudaMemcpyDeviceToHost;
    case CopyKind::from_host: return cudaMemcpyHostToDevice;
    case CopyKind::on_device: break;
  }
  return cudaMemcpyDeviceToDevice;
}

}  // namespace

void cuda_copy(int device_id, void *stream, void *dst, const void *src, size_t bytes,
               CopyKind kind) {
  DeviceGuard guard(device_id);
  const auto s = static_cast<cudaStream_t>(stream);
  check_cuda(cudaMemcpyAsync(dst, src, bytes, memcpy_kind(kind), s), "cudaMemcpyAsync");
  /* Host memory is read (from_host: pageable memory may be staged later)
   * or written (to_host) by the copy: finish it before returning. */
  if (kind != CopyKind::on_device)
    check_cuda(cudaStreamSynchronize(s), "cudaStreamSynchronize");
}

}  // namespace osft
