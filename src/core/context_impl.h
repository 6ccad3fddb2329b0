/* Internal: the context object behind osft_context_t, and what operations
 * use of it: device, stream, scratch workspace, allocation, lazily created
 * library handles. */
#ifndef OSFTRT_SRC_CORE_CONTEXT_IMPL_H
#define OSFTRT_SRC_CORE_CONTEXT_IMPL_H

#include "core/core_api.h"
#include "osftrt/context.h"

#ifdef __cplusplus
extern "C" {
#endif

/* C-callable accessors (for the C unit tests; operations use the C++ API
 * below). Each returns a status and records a message like the public
 * functions, without the function-name prefix. */
osft_status_t osfti_context_workspace(osft_context_t ctx, size_t bytes, void **ptr);
osft_status_t osfti_context_blas_handle(osft_context_t ctx, void **handle);
osft_status_t osfti_context_solver_handle(osft_context_t ctx, void **handle);
/* The handles created so far (NULL if not yet), without creating any. */
osft_status_t osfti_context_peek_handles(osft_context_t ctx, void **blas, void **solver);
/* The library's CPU thread count, the workers its pool has started and the
 * BLAS engine's own count (what the tests compare). */
void osfti_cpu_threads(int *count, int *pool_workers, int *blas_threads);
/* run_parts of the pool (src/core/cpu_blas.h) for the tests: part(user, p)
 * for p in [0, parts), each holding the BLAS at one thread if serial_blas. */
void osfti_cpu_run_parts(int parts, int serial_blas, void (*part)(void *, int),
                         void *user);

#ifdef __cplusplus
}

#include <dlpack/dlpack.h>

#include "core/allocator.h"

struct osft_context_s {
  osft_context_s(const osft_context_options_t &opts, const osft::Allocator &alloc)
      : device_type(opts.device_type),
        device_id(opts.device_id),
        stream(opts.stream),
        workspace_limit(opts.workspace_limit),
        allow_tf32(opts.allow_tf32 != 0),
        allocator(alloc) {}

  osft_device_type_t device_type;
  int device_id;
  void *stream;
  size_t workspace_limit; /* 0: unlimited */
  bool allow_tf32;        /* fp32 GEMMs may use TF32 (CUDA) */
  osft::Allocator allocator;
  void *workspace = nullptr;
  size_t workspace_bytes = 0;
  /* kernel_scratch(): one block in the context's memory, grown on demand. */
  void *kernel_block = nullptr;
  size_t kernel_block_bytes = 0;
  /* outer_workspace(): one block in the context's memory, grown on demand. */
  void *outer_block = nullptr;
  size_t outer_block_bytes = 0;
  /* HostScratch: a host stack for per-call bookkeeping; `want` is the most
   * a call needed, to which the block grows once the stack is empty. */
  char *host_block = nullptr;
  size_t host_block_bytes = 0, host_block_top = 0, host_block_want = 0;
  size_t host_block_used = 0; /* held now, own blocks of calls included */
  int live_children = 0;      /* handles created from this context and alive */
  void *blas = nullptr;       /* cublasHandle_t, created on first use */
  void *solver = nullptr;     /* cusolverDnHandle_t, created on first use */
};

namespace osft {

using Context = osft_context_s;

/* Validates `opts` (NULL: CPU defaults) and creates a context. */
Context *create_context(const osft_context_options_t *opts);

/* Releases everything; throws OSFT_STATUS_BACKEND_ERROR after destroying if
 * the device reported an error while draining the stream. */
void destroy_context(Context *ctx);

/* Throws unless `ctx` is a live context; returns it as a reference. */
Context &checked_context(osft_context_t ctx, const char *arg);

inline bool on_cuda(const Context &ctx) noexcept {
  return ctx.device_type == OSFT_DEVICE_CUDA;
}

/* Scratch memory of at least `bytes` on the context's device, valid until
 * the next call that takes the workspace. Grows (never shrinks) the
 * workspace; throws OSFT_STATUS_OUT_OF_MEMORY above the limit or when the
 * allocator fails, keeping the old workspace. */
void *workspace(Context &ctx, size_t bytes);
/* Frees the workspace, the kernel scratch and (when no call holds any of
 * it) the host scratch. */
void release_workspace(Context &ctx);

/* Scratch of a single backend kernel call (the partial sums of a
 * reduction, a GEMM's staging, a flag), in the context's memory: a second
 * block, apart from the workspace an operation has planned, so a kernel
 * may use it while the operation holds the workspace. Kept between calls
 * and grown on demand (the old block freed in stream order), so calls with
 * the same shapes allocate nothing after the first. Valid until the next
 * kernel_scratch() call; a kernel takes it once. Not counted against
 * workspace_limit (it is the size of one kernel's partial results). */
OSFT_CORE_API void *kernel_scratch(Context &ctx, size_t bytes, const char *what);

/* kernel_scratch(), or nullptr when the memory is refused
 * (OSFT_STATUS_OUT_OF_MEMORY; any other failure throws): for a kernel with a
 * slower way that needs none, so that a refused allocation in the middle of
 * an operation, after it wrote some outputs, cannot fail it halfway. */
OSFT_CORE_API void *kernel_scratch_if_available(Context &ctx, size_t bytes,
                                                const char *what);

/* The buffers of an operation that calls other operations (the tiled MLP
 * over flinear layers, whose calls take the workspace): a third block, kept
 * and grown like the workspace. Valid until the next outer_workspace()
 * call; not counted against workspace_limit. */
void *outer_workspace(Context &ctx, size_t bytes, const char *what);

/* Host memory for a call's bookkeeping (job lists, descriptors), taken and
 * given back in stack order from a block the context keeps: a call that
 * does not fit allocates from the host allocator, and the block then grows
 * to what that call needed as soon as nothing is held, so the next call
 * with the same shapes allocates nothing. */
OSFT_CORE_API void *host_scratch_take(Context &ctx, size_t bytes, const char *what);
OSFT_CORE_API void host_scratch_give(Context &ctx, void *ptr, size_t bytes) noexcept;

/* CUDA device memory through the context's allocator (CUDA contexts). */
OSFT_CORE_API void *device_alloc(Context &ctx, size_t bytes, const char *what);
OSFT_CORE_API void device_free(Context &ctx, void *ptr, size_t bytes) noexcept;

/* Memory where the context computes (host for a CPU context, its GPU for a
 * CUDA one), through its allocator: for objects that outlive a call. */
OSFT_CORE_API void *memory_alloc(Context &ctx, size_t bytes, const char *what);
OSFT_CORE_API void memory_free(Context &ctx, void *ptr, size_t bytes) noexcept;

/* The DLPack device of the context's memory (kDLCPU or kDLCUDA + id). */
DLDevice dl_device(const Context &ctx) noexcept;

void set_stream(Context &ctx, void *stream);
void synchronize(Context &ctx);

/* cuBLAS / cuSOLVER handles, created on first use, bound to the stream. */
OSFT_CORE_API void *blas_handle(Context &ctx);
OSFT_CORE_API void *solver_handle(Context &ctx);

}  // namespace osft

#endif /* __cplusplus */

#endif
