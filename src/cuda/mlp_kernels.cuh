/* Internal: the CUDA MLP kernels (src/cuda/mlp_kernels.cu) behind plain C++
 * launchers, so that src/cuda/mlp_cuda.cpp is compiled by the host compiler.
 * Launchers enqueue on `stream` on the current device, never synchronize,
 * and throw OSFT_STATUS_BACKEND_ERROR if a launch fails. The arguments are
 * those of MlpKernels (src/backend/mlp_backend.h). */
#ifndef OSFTRT_SRC_CUDA_MLP_KERNELS_CUH
#define OSFTRT_SRC_CUDA_MLP_KERNELS_CUH

#include <cuda_runtime_api.h>

#include "backend/mlp_backend.h"

namespace osft::cuda {

void launch_mlp_activate(cudaStream_t stream, mlp::Activation act, const Mat *g,
                         const Mat &u, const Mat &h);

void launch_mlp_activate_backward(cudaStream_t stream, mlp::Activation act, const Mat *g,
                                  const Mat &u, const Mat &dh, const Mat *h,
                                  const Mat *dg, const Mat &du);

}  // namespace osft::cuda

#endif
