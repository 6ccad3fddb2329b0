/* Internal (CUDA builds): turning CUDA, cuBLAS and cuSOLVER results into
 * statuses (OSFT_STATUS_OUT_OF_MEMORY for a refused allocation,
 * OSFT_STATUS_BACKEND_ERROR with the library's name for the error
 * otherwise), and the context's stream as a cudaStream_t. */
#ifndef OSFTRT_SRC_CUDA_CUDA_CHECK_H
#define OSFTRT_SRC_CUDA_CUDA_CHECK_H

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cusolverDn.h>

#include "core/context_impl.h"
#include "core/error.h"

namespace osft {

/* Only a refused allocation is "out of memory"; a sticky error from an
 * earlier fault, or a refusal during stream capture, keeps its own name. */
inline void check_cuda(cudaError_t e, const char *what) {
  if (e == cudaSuccess) return;
  cudaGetLastError(); /* clear a non-sticky error; a sticky one stays */
  raise(e == cudaErrorMemoryAllocation ? OSFT_STATUS_OUT_OF_MEMORY
                                       : OSFT_STATUS_BACKEND_ERROR,
        "%s: %s (%s)", what, cudaGetErrorName(e), cudaGetErrorString(e));
}

inline void check_blas(cublasStatus_t s, const char *what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    raise(s == CUBLAS_STATUS_ALLOC_FAILED ? OSFT_STATUS_OUT_OF_MEMORY
                                          : OSFT_STATUS_BACKEND_ERROR,
          "%s: %s", what, cublasGetStatusName(s));
}

inline void check_solver(cusolverStatus_t s, const char *what) {
  if (s != CUSOLVER_STATUS_SUCCESS)
    raise(s == CUSOLVER_STATUS_ALLOC_FAILED ? OSFT_STATUS_OUT_OF_MEMORY
                                            : OSFT_STATUS_BACKEND_ERROR,
          "%s: cuSOLVER status %d", what, static_cast<int>(s));
}

inline cudaStream_t stream_of(const Context &ctx) noexcept {
  return static_cast<cudaStream_t>(ctx.stream);
}

}  // namespace osft

#endif
