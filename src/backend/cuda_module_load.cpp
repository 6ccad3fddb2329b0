/* find_cuda_module() for the shared library: libosftrt_cuda.so.1, opened
 * with dlopen (src/backend/module_load.h). The static archive links the
 * module in instead (src/cuda/module_linked_cuda.cpp). */
#include "backend/cuda_module.h"

namespace osft {

const CudaModule *find_cuda_module(std::string *why) {
  static const ModuleSpec spec = {"libosftrt_cuda.so.1", "OSFTRT_CUDA_MODULE",
                                  OSFTRT_CUDA_MODULE_ENTRY};
  return reinterpret_cast<const CudaModule *>(open_module(spec, sizeof(CudaModule), why));
}

}  // namespace osft
