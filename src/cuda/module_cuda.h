/* Internal: what the CUDA module's files define for its table
 * (src/cuda/module_cuda.cpp, the seam of src/backend/cuda_module.h). The
 * core reaches them only through the table, never by name, so the module's
 * definitions and the core's forwarders (src/backend/cuda_module.cpp) can
 * live in one static archive. */
#ifndef OSFTRT_SRC_CUDA_MODULE_CUDA_H
#define OSFTRT_SRC_CUDA_MODULE_CUDA_H

#include "backend/cuda_module.h"

namespace osft {

const Backend &cuda_linalg_table();   /* linalg_cuda.cpp */
const MlpKernels &cuda_mlp_table();   /* mlp_cuda.cpp */
const QrKernels &cuda_qr_table();     /* qr_cuda.cpp */
const FlceKernels &cuda_flce_table(); /* flce_cuda.cpp */

/* src/comm/comm_nccl.cpp; absent from a module built without NCCL. */
void cuda_nccl_unique_id(osft_nccl_unique_id_t *id);
Engine *cuda_make_nccl_engine(Context &ctx, void *nccl_comm, EngineInfo *info);
Engine *cuda_make_nccl_engine_from_id(Context &ctx, const osft_nccl_unique_id_t &id,
                                      int nranks, int rank, const Deadline &deadline,
                                      EngineInfo *info);

/* runtime_cuda.cpp: sets the table's runtime entries (src/core/
 * cuda_runtime.h's functions as the module implements them), copy() from
 * memcpy_cuda.cpp included. */
void fill_cuda_runtime(CudaModule &table);
void cuda_copy(int device_id, void *stream, void *dst, const void *src, size_t bytes,
               cuda::CopyKind kind); /* memcpy_cuda.cpp */

/* The table itself, built once (module_cuda.cpp). */
const CudaModule &cuda_module_table();

}  // namespace osft

#endif
