/* make_mpi_engine() of comm/communicator.h, forwarded to the MPI module
 * (comm_mpi_module.h), which the first MPI communicator loads. In a build
 * without MPI, or where the module or OpenMPI cannot be loaded, creating one
 * is OSFT_STATUS_NOT_SUPPORTED, naming the reason. */
#include "comm/comm_mpi_module.h"
#include "core/error.h"
#include "core/logging.h"
#include "osftrt_build_config.h"

namespace osft {
namespace {

const MpiModule &mpi_module() {
  if (!OSFTRT_HAVE_MPI)
    raise(OSFT_STATUS_NOT_SUPPORTED,
          "MPI support was not compiled into this libosftrt (configure with "
          "-DOSFTRT_MPI=ON and an MPI installation)");
  static LoadedModule<MpiModule> slot(find_mpi_module);
  std::string why;
  bool now = false;
  const MpiModule *m = slot.load(&why, &now);
  if (m == nullptr)
    raise(OSFT_STATUS_NOT_SUPPORTED, "the MPI engine is not available: %s", why.c_str());
  if (now) log_message(OSFT_LOG_INFO, "loaded the MPI module");
  return *m;
}

}  // namespace

Engine *make_mpi_engine(Context &ctx, int64_t mpi_comm_f, const Deadline &deadline,
                        EngineInfo *info) {
  if (on_cuda(ctx)) /* before loading anything */
    raise(OSFT_STATUS_NOT_SUPPORTED,
          "ctx: the MPI engine works on host buffers and needs a CPU context (use NCCL "
          "for CUDA contexts)");
  return mpi_module().make_engine(ctx, mpi_comm_f, deadline, info);
}

}  // namespace osft
