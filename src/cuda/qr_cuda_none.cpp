/* src/backend/qr_backend.h for builds without CUDA: no CUDA context can
 * exist there, so this is only reached by mistake. */
#include "core/error.h"
#include "backend/qr_backend.h"

namespace osft {

const QrKernels &cuda_qr_kernels() {
  raise(OSFT_STATUS_NOT_SUPPORTED,
        "batched QR on CUDA: CUDA support was not compiled into this libosftrt "
        "(configure with -DOSFTRT_CUDA=ON)");
}

}  // namespace osft
