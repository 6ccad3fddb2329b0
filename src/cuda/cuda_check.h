/* Internal (CUDA builds): turning CUDA, cuBLAS and cuSOLVER results into
 * OSFT_STATUS_BACKEND_ERROR, and the context's stream as a cudaStream_t. */
#ifndef OSFTRT_SRC_CUDA_CUDA_CHECK_H
#define OSFTRT_SRC_CUDA_CUDA_CHECK_H

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cusolverDn.h>

#include "core/context_impl.h"
#include "core/error.h"

namespace osft {

inline void check_cuda(cudaError_t e, const char *what) {
  if (e != cudaSuccess)
    raise(OSFT_STATUS_BACKEND_ERROR, "%s: %s", what, cudaGetErrorString(e));
}

inline void check_blas(cublasStatus_t s, const char *what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    raise(OSFT_STATUS_BACKEND_ERROR, "%s: %s", what, cublasGetStatusName(s));
}

inline void check_solver(cusolverStatus_t s, const char *what) {
  if (s != CUSOLVER_STATUS_SUCCESS)
    raise(OSFT_STATUS_BACKEND_ERROR, "%s: cuSOLVER status %d", what, static_cast<int>(s));
}

inline cudaStream_t stream_of(const Context &ctx) noexcept {
  return static_cast<cudaStream_t>(ctx.stream);
}

}  // namespace osft

#endif
