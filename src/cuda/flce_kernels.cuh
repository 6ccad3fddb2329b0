/* Internal: the CUDA kernels of fused linear cross-entropy
 * (src/cuda/flce_kernels.cu) behind plain C++ launchers, so that
 * src/cuda/flce_cuda.cpp can be compiled by the host compiler. Launchers enqueue
 * on `stream` on the current device, never synchronize, and throw
 * OSFT_STATUS_BACKEND_ERROR if a launch fails. */
#ifndef OSFTRT_SRC_CUDA_FLCE_KERNELS_CUH
#define OSFTRT_SRC_CUDA_FLCE_KERNELS_CUH

#include <cuda_runtime_api.h>

#include "backend/flce_backend.h"

namespace osft::cuda {

/* One block: checks the targets and writes *args.totals (deterministic
 * sums, in fp64). */
void launch_flce_prepare(cudaStream_t stream, const FlcePrepare &args);

/* One block per row of the chunk (the merge phase: one thread per row). */
void launch_flce_rows(cudaStream_t stream, const FlceRowPass &args);

/* One block: the reductions and per-token copies of FlceFinalize. */
void launch_flce_finalize(cudaStream_t stream, const FlceFinalize &args);

}  // namespace osft::cuda

#endif
