/* Internal: the seam between the core (libosftrt.so.1) and the CUDA module
 * (libosftrt_cuda.so.1: the CUDA kernels, cuBLAS, cuSOLVER and NCCL).
 *
 * The core never links a CUDA library. The first CUDA context or NCCL
 * communicator loads the module (src/backend/module_load.h: dlopen, beside
 * the core or from $OSFTRT_CUDA_MODULE) and takes this table from it; a
 * CPU-only program maps none of it. Counting the CUDA devices before that
 * asks the CUDA driver alone (libcuda.so.1: cuda_module.cpp), so a program
 * that finds no GPU maps no module either. The static archive links the
 * module's objects in and takes the table directly (src/cuda/module_linked.cpp).
 *
 * Core and module are built from one source tree and must be of the same
 * version exactly: the table's header carries OSFT_VERSION_NUMBER and its
 * size, and the module checks the core's number when the core asks for it.
 * The module calls back into the core's internal functions (errors, logging,
 * scratch memory) through symbols the core exports under a version node
 * named after its exact version (OSFTRT_CORE_PRIVATE_x.y.z, cmake/), so the
 * dynamic loader itself refuses a module of another version. */
#ifndef OSFTRT_SRC_BACKEND_CUDA_MODULE_H
#define OSFTRT_SRC_BACKEND_CUDA_MODULE_H

#include <cstddef>
#include <cstdint>
#include <string>

#include "backend/module_load.h"
#include "core/context_impl.h"
#include "core/cuda_runtime.h"
#include "osftrt/comm.h"

namespace osft {

struct Backend;
struct MlpKernels;
struct QrKernels;
struct FlceKernels;
class Engine;
class Deadline;
struct EngineInfo;

/* What the module provides. Every entry is set (NCCL's are nullptr in a
 * module built without NCCL); the runtime entries behave as documented in
 * src/core/cuda_runtime.h. */
struct CudaModule {
  ModuleHeader header; /* OSFT_VERSION_NUMBER, sizeof(CudaModule) */
  int toolkit_version; /* CUDART_VERSION it was built with */

  int (*device_count)() noexcept;
  void (*check_device)(int device_id, const char *arg);
  void *(*device_malloc)(size_t bytes, int device_id, void *stream);
  void (*device_free)(void *ptr, int device_id, void *stream) noexcept;
  void (*stream_wait)(int device_id, void *waiting, void *waited_on);
  void (*synchronize)(int device_id, void *stream);
  void (*copy)(int device_id, void *stream, void *dst, const void *src, size_t bytes,
               cuda::CopyKind kind);
  void *(*create_blas)(int device_id, void *stream);
  void *(*create_solver)(int device_id, void *stream);
  void (*set_blas_stream)(void *blas, void *stream);
  void (*set_solver_stream)(void *solver, void *stream);
  void (*destroy_blas)(int device_id, void *blas) noexcept;
  void (*destroy_solver)(int device_id, void *solver) noexcept;

  const Backend *linalg;
  const MlpKernels *mlp;
  const QrKernels *qr;
  const FlceKernels *flce;

  void (*nccl_unique_id)(osft_nccl_unique_id_t *id);
  Engine *(*make_nccl_engine)(Context &ctx, void *nccl_comm, EngineInfo *info);
  Engine *(*make_nccl_engine_from_id)(Context &ctx, const osft_nccl_unique_id_t &id,
                                      int nranks, int rank, const Deadline &deadline,
                                      EngineInfo *info);
};

/* The module, loaded on the first call (thread-safe; a failure is retried
 * on the next call). Throws OSFT_STATUS_NOT_SUPPORTED when this libosftrt
 * was built without CUDA, and OSFT_STATUS_NO_DEVICE when the module or a
 * library it needs cannot be loaded, naming `what` (the request), the file
 * and the loader's reason. */
const CudaModule &cuda_module(const char *what);

/* The module if an earlier call loaded it, else nullptr; never loads. */
const CudaModule *cuda_module_loaded() noexcept;

/* How the module is found (one implementation per way, chosen at link
 * time): the shared library dlopens it (module_load.cpp), the static
 * archive has it linked in (src/cuda/module_linked.cpp). Returns the table,
 * or nullptr with the reason in *why. Called under a lock, at most until it
 * succeeds. */
const CudaModule *find_cuda_module(std::string *why);

}  // namespace osft

/* The module's one exported symbol: its table, after checking that the
 * core asking is of its own version (core_version: OSFT_VERSION_NUMBER of
 * the core). nullptr on a mismatch, with a message in why[0..why_bytes). */
#define OSFTRT_CUDA_MODULE_ENTRY "osftrt_cuda_module_entry"
extern "C" typedef const osft::CudaModule *(*osftrt_cuda_module_entry_fn)(
    uint32_t core_version, char *why, size_t why_bytes);

#endif
