/* find_mpi_module() for the shared library: libosftrt_mpi.so.1, opened with
 * dlopen (src/backend/module_load.h). */
#include "comm/comm_mpi_module.h"

namespace osft {

const MpiModule *find_mpi_module(std::string *why) {
  static const ModuleSpec spec = {"libosftrt_mpi.so.1", "OSFTRT_MPI_MODULE",
                                  OSFTRT_MPI_MODULE_ENTRY};
  return reinterpret_cast<const MpiModule *>(open_module(spec, sizeof(MpiModule), why));
}

}  // namespace osft
