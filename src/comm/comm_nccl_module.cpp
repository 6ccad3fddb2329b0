/* The NCCL engine factories of comm/communicator.h, forwarded to the CUDA
 * module (src/backend/cuda_module.h), which holds NCCL and loads on the
 * first NCCL communicator. In a build without NCCL, every one is
 * OSFT_STATUS_NOT_SUPPORTED and nothing is loaded. */
#include "backend/cuda_module.h"
#include "comm/communicator.h"
#include "core/error.h"
#include "osftrt_build_config.h"

namespace osft {
namespace {

const CudaModule &nccl_module(const char *what) {
  if (!OSFTRT_HAVE_NCCL)
    raise(
        OSFT_STATUS_NOT_SUPPORTED,
        "%s: NCCL support was not compiled into this libosftrt (configure with CUDA and "
        "-DOSFTRT_NCCL=ON where NCCL is installed)",
        what);
  const CudaModule &m = cuda_module(what);
  if (m.make_nccl_engine == nullptr)
    raise(OSFT_STATUS_NOT_SUPPORTED, "%s: the CUDA module was built without NCCL", what);
  return m;
}

/* Checked before the module loads: a CPU context never needs it. */
void require_cuda_context(const Context &ctx) {
  if (!on_cuda(ctx))
    raise(OSFT_STATUS_NOT_SUPPORTED,
          "ctx: the NCCL engine needs a CUDA context (use MPI for CPU contexts)");
}

}  // namespace

void nccl_unique_id(osft_nccl_unique_id_t *id) {
  nccl_module("NCCL unique id").nccl_unique_id(id);
}

Engine *make_nccl_engine(Context &ctx, void *nccl_comm, EngineInfo *info) {
  require_cuda_context(ctx);
  return nccl_module("NCCL communicator").make_nccl_engine(ctx, nccl_comm, info);
}

Engine *make_nccl_engine_from_id(Context &ctx, const osft_nccl_unique_id_t &id,
                                 int nranks, int rank, const Deadline &deadline,
                                 EngineInfo *info) {
  require_cuda_context(ctx);
  return nccl_module("NCCL communicator")
      .make_nccl_engine_from_id(ctx, id, nranks, rank, deadline, info);
}

}  // namespace osft
