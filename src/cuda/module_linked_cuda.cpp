/* find_cuda_module() for the static archive (libosftrt.a), which links the
 * CUDA module's objects in: the table is at hand, nothing is loaded. */
#include "cuda/module_cuda.h"

namespace osft {

const CudaModule *find_cuda_module(std::string *) {
  return &cuda_module_table();
}

}  // namespace osft
