/* src/backend/flce_backend.h for builds without CUDA. */
#include "core/error.h"
#include "backend/flce_backend.h"

namespace osft {

const FlceKernels &cuda_flce_kernels() {
  raise(OSFT_STATUS_NOT_SUPPORTED,
        "fused linear cross-entropy on CUDA: CUDA support was not compiled into this "
        "libosftrt (configure with -DOSFTRT_CUDA=ON)");
}

}  // namespace osft
