/* The MPI engine in builds without MPI: creating one is
 * OSFT_STATUS_NOT_SUPPORTED. */
#include "comm/communicator.h"
#include "core/error.h"

namespace osft {

Engine *make_mpi_engine(Context &, int64_t, const Deadline &, EngineInfo *) {
  raise(OSFT_STATUS_NOT_SUPPORTED,
        "MPI support was not compiled into this libosftrt (configure with "
        "-DOSFTRT_MPI=ON and an MPI installation)");
}

}  // namespace osft
