/* The CUDA module's table (src/backend/cuda_module.h) and its one exported
 * symbol, osftrt_cuda_module_entry, through which the core takes it. */
#include "cuda/module_cuda.h"

#include <cuda_runtime.h>

#include "osftrt/version.h"
#include "osftrt_build_config.h"

namespace osft {

const CudaModule &cuda_module_table() {
  static const CudaModule table = [] {
    CudaModule t{};
    t.header.version = OSFT_VERSION_NUMBER;
    t.header.table_bytes = sizeof(CudaModule);
    t.toolkit_version = CUDART_VERSION;
    fill_cuda_runtime(t);
    t.linalg = &cuda_linalg_table();
    t.mlp = &cuda_mlp_table();
    t.qr = &cuda_qr_table();
    t.flce = &cuda_flce_table();
#if OSFTRT_HAVE_NCCL
    t.nccl_unique_id = cuda_nccl_unique_id;
    t.make_nccl_engine = cuda_make_nccl_engine;
    t.make_nccl_engine_from_id = cuda_make_nccl_engine_from_id;
#endif
    return t;
  }();
  return table;
}

}  // namespace osft

extern "C" __attribute__((visibility("default"))) const osft::ModuleHeader *
osftrt_cuda_module_entry(uint32_t core_version, char *why, size_t why_bytes) {
  if (!osft::module_version_matches(core_version, why, why_bytes)) return nullptr;
  return &osft::cuda_module_table().header;
}
