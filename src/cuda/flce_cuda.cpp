/* The CUDA kernels of fused linear cross-entropy (src/backend/flce_backend.h):
 * launches on the context's stream and device. Only prepare() waits, for
 * the target check, before the operation enqueues any write to an output;
 * with device_target_check it does not (the check's result stays on the
 * device). */
#include <cuda_runtime.h>

#include "cuda/cuda_check.h"
#include "core/error.h"
#include "backend/flce_backend.h"
#include "cuda/device_guard.h"
#include "cuda/flce_kernels.cuh"
#include "cuda/module_cuda.h"

namespace osft {
namespace {

FlceTotals cuda_prepare(Context &ctx, const FlcePrepare &a) {
  cuda::DeviceGuard guard(ctx.device_id);
  cuda::launch_flce_prepare(stream_of(ctx), a);
  FlceTotals host;
  if (!a.wait) return host; /* first_bad -1: the device has the verdict */
  check_cuda(cudaMemcpyAsync(&host, a.totals, sizeof host, cudaMemcpyDeviceToHost,
                             stream_of(ctx)),
             "cudaMemcpyAsync (target check)");
  check_cuda(cudaStreamSynchronize(stream_of(ctx)),
             "cudaStreamSynchronize (target check)");
  return host;
}

void cuda_rows(Context &ctx, const FlceRowPass &a) {
  cuda::DeviceGuard guard(ctx.device_id);
  cuda::launch_flce_rows(stream_of(ctx), a);
}

void cuda_finalize(Context &ctx, const FlceFinalize &a) {
  cuda::DeviceGuard guard(ctx.device_id);
  cuda::launch_flce_finalize(stream_of(ctx), a);
}

}  // namespace

const FlceKernels &cuda_flce_table() {
  /* flops per byte: an H100's ~800 TFLOP/s of large bf16 GEMMs over its
   * ~3.3 TB/s of HBM3 (an H200's 4.8 TB/s: ~170) */
  static const FlceKernels table = {true, 240.0, cuda_prepare, cuda_rows, cuda_finalize};
  return table;
}

}  // namespace osft
