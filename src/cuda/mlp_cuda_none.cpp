/* src/backend/mlp_backend.h for builds without CUDA: the CUDA MLP kernels are
 * OSFT_STATUS_NOT_SUPPORTED (no CUDA context can exist there anyway). */
#include "core/error.h"
#include "backend/mlp_backend.h"

namespace osft {

const MlpKernels &cuda_mlp_kernels() {
  raise(OSFT_STATUS_NOT_SUPPORTED,
        "the CUDA MLP kernels: CUDA support was not compiled into this libosftrt "
        "(configure with -DOSFTRT_CUDA=ON)");
}

}  // namespace osft
