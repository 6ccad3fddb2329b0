/* Host <-> device staging in builds without CUDA: no CUDA context can
 * exist, so these are never reached; they refuse all the same. */
#include "comm/comm.h"
#include "core/error.h"

namespace osft {

void cuda_copy(Context &, void *, const void *, size_t, CopyKind) {
  raise(OSFT_STATUS_NOT_SUPPORTED, "CUDA support was not compiled into this libosftrt");
}

void cuda_stream_sync(Context &) {
  raise(OSFT_STATUS_NOT_SUPPORTED, "CUDA support was not compiled into this libosftrt");
}

}  // namespace osft
