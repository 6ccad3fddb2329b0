/* Internal: the seam between the core and the MPI module (libosftrt_mpi.so.1:
 * the MPI engine of src/comm/comm_mpi.cpp, the only code that links
 * OpenMPI). The first MPI communicator loads it (src/backend/module_load.h,
 * beside the core or from $OSFTRT_MPI_MODULE), so a program that never
 * makes one maps no MPI library, and the library runs where none is
 * installed. The static archive links it in (comm_mpi_linked.cpp). */
#ifndef OSFTRT_SRC_COMM_COMM_MPI_MODULE_H
#define OSFTRT_SRC_COMM_COMM_MPI_MODULE_H

#include <string>

#include "backend/module_load.h"
#include "comm/communicator.h"

namespace osft {

struct MpiModule {
  ModuleHeader header; /* OSFT_VERSION_NUMBER, sizeof(MpiModule) */
  /* make_mpi_engine() of comm/communicator.h, as the module implements it. */
  Engine *(*make_engine)(Context &ctx, int64_t mpi_comm_f, const Deadline &deadline,
                         EngineInfo *info);
};

/* The module's one exported symbol, an osft::ModuleEntry. */
#define OSFTRT_MPI_MODULE_ENTRY "osftrt_mpi_module_entry"

/* How the core finds it: dlopen (comm_mpi_load.cpp) or linked in
 * (comm_mpi_linked.cpp). nullptr with the reason in *why. */
const MpiModule *find_mpi_module(std::string *why);

/* The module's table (comm_mpi.cpp). */
const MpiModule &mpi_module_table();

}  // namespace osft

#endif
