/* The NCCL engine in builds without NCCL: every entry point is
 * OSFT_STATUS_NOT_SUPPORTED. */
#include "comm/communicator.h"
#include "core/error.h"

namespace osft {
namespace {

[[noreturn]] void no_nccl() {
  raise(OSFT_STATUS_NOT_SUPPORTED,
        "NCCL support was not compiled into this libosftrt (configure with CUDA and "
        "-DOSFTRT_NCCL=ON where NCCL is installed)");
}

}  // namespace

void nccl_unique_id(osft_nccl_unique_id_t *) {
  no_nccl();
}

Engine *make_nccl_engine(Context &, void *, EngineInfo *) {
  no_nccl();
}

Engine *make_nccl_engine_from_id(Context &, const osft_nccl_unique_id_t &, int, int,
                                 const Deadline &, EngineInfo *) {
  no_nccl();
}

}  // namespace osft
