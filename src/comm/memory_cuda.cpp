/* Host <-> device staging for the communicators and the projector (CUDA
 * builds): copies on the context's stream. */
#include <cuda_runtime.h>

#include "cuda/check.h"
#include "comm/comm.h"
#include "core/error.h"
#include "cuda/device_guard.h"

namespace osft {
namespace {

cudaMemcpyKind memcpy_kind(CopyKind kind) {
  switch (kind) {
    case CopyKind::to_host: return cudaMemcpyDeviceToHost;
    case CopyKind::from_host: return cudaMemcpyHostToDevice;
    case CopyKind::on_device: break;
  }
  return cudaMemcpyDeviceToDevice;
}

}  // namespace

void cuda_copy(Context &ctx, void *dst, const void *src, size_t bytes, CopyKind kind) {
  cuda::DeviceGuard guard(ctx.device_id);
  const auto stream = static_cast<cudaStream_t>(ctx.stream);
  check_cuda(cudaMemcpyAsync(dst, src, bytes, memcpy_kind(kind), stream),
             "cudaMemcpyAsync");
  /* Host memory is read (from_host: pageable memory may be staged later)
   * or written (to_host) by the copy: finish it before returning. */
  if (kind != CopyKind::on_device)
    check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
}

void cuda_stream_sync(Context &ctx) {
  cuda::DeviceGuard guard(ctx.device_id);
  check_cuda(cudaStreamSynchronize(static_cast<cudaStream_t>(ctx.stream)),
             "cudaStreamSynchronize");
}

}  // namespace osft
