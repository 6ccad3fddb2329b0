/* The CUDA MLP kernels of src/backend/mlp_backend.h: the launchers of
 * src/cuda/mlp_kernels.cu on the context's device and stream. */
#include "cuda/cuda_check.h"
#include "backend/mlp_backend.h"
#include "cuda/device_guard.h"
#include "cuda/mlp_kernels.cuh"
#include "cuda/module_cuda.h"

namespace osft {
namespace {

using mlp::Activation;

void cuda_activate(Context &ctx, Activation act, const Mat *g, const Mat &u,
                   const Mat &h) {
  cuda::DeviceGuard guard(ctx.device_id);
  cuda::launch_mlp_activate(stream_of(ctx), act, g, u, h);
}

void cuda_activate_backward(Context &ctx, Activation act, const Mat *g, const Mat &u,
                            const Mat &dh, const Mat *h, const Mat *dg, const Mat &du) {
  cuda::DeviceGuard guard(ctx.device_id);
  cuda::launch_mlp_activate_backward(stream_of(ctx), act, g, u, dh, h, dg, du);
}

}  // namespace

const MlpKernels &cuda_mlp_table() {
  static const MlpKernels table = {cuda_activate, cuda_activate_backward};
  return table;
}

}  // namespace osft
