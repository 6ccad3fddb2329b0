/**
 * @file
 * @brief libosftrt — contexts: a device, a stream, library handles, memory.
 *
 * A context is the first argument of every operation. It owns
 *   - one device: the CPU, or one CUDA GPU (by ordinal);
 *   - on CUDA, one stream (cudaStream_t passed as void *, so this header
 *     needs no CUDA header) on which all of its work is enqueued, and the
 *     cuBLAS and cuSOLVER handles, created lazily on first use and bound to
 *     that stream;
 *   - a reusable workspace for scratch memory, grown on demand and kept
 *     between calls (osft_context_reserve_workspace pre-sizes it);
 *   - an allocator: built-in, or the caller's callbacks, which then serve
 *     every byte the library allocates for this context (host and device),
 *     so a framework's caching allocator can own all memory (except what
 *     the CUDA libraries allocate for themselves: see "Memory" below).
 *
 * @par Memory (CUDA)
 * Without device callbacks, device memory is stream-ordered: blocks come
 * from cudaMallocFromPoolAsync() on the context's stream and go back with
 * cudaFreeAsync() on it, from a memory pool the library creates per device
 * (not the device's default pool, which a framework may tune) with a
 * release threshold of UINT64_MAX: freed blocks stay cached in the pool for
 * the life of the process, so a free never waits for the device and a
 * steady state asks the driver for nothing. With device callbacks, every
 * device block of the context comes from device_alloc and goes back to
 * device_free, each given the context's stream: the library frees a block
 * as soon as its last use is enqueued, so the callbacks must be
 * stream-ordered (as PyTorch's caching allocator is) or wait for the stream
 * themselves. Scratch is kept in the context between calls (the workspace, a
 * kernel scratch block, the tiled MLP's buffers when its projections are
 * OSFT layers, a host block for bookkeeping), so after a first call, later
 * calls with the same shapes allocate nothing, host or device, on either
 * backend; only the workspace counts against workspace_limit (the others
 * are one kernel's partial sums and staging, or the MLP's tile buffers).
 *
 * Memory the allocator does not see, and so neither the memory statistics
 * nor workspace_limit: (1) what cuBLAS and cuSOLVER allocate inside the
 * context's own handles (created on first use, destroyed with the context);
 * (2) the batched QR's lanes (osftrt/qr.h), worker streams with their own
 * cuBLAS and cuSOLVER handles that large matrices use: a process-wide pool
 * per device, created on first need and kept for the life of the process
 * (the lanes' cuBLAS workspace itself is taken from the call's scratch,
 * 4 MiB per lane, which the allocator does see); (3) the memory pools
 * above. After a caller's cudaDeviceReset() the lanes of the reset device
 * are dropped (their handles died with the CUDA context) and new ones are
 * made on demand; contexts created before the reset must not be used
 * again.
 *
 * @par Current device (CUDA)
 * Each call makes the context's device current for its duration and then
 * restores the device that was current before, so the library never
 * changes a framework's device behind its back. A thread that had no
 * current CUDA context before the call (it never selected a device) is
 * left with the context's device current afterwards, rather than switched
 * to device 0, which since CUDA 12 would create a primary context (hundreds
 * of MB) on GPU 0 that nobody asked for.
 *
 * @par Thread safety
 * Threading: a context is used by one thread at a time (like a cuBLAS
 * handle); calls on the same context from several threads at once must be
 * serialized by the caller. Different contexts are fully independent and
 * may be used concurrently from different threads.
 *
 * @par Asynchrony
 * Asynchrony: on CUDA, operations are enqueued on the context's stream and
 * may return before the device has finished; osft_context_synchronize()
 * waits. On the CPU, operations complete before they return.
 *
 * @code
 *   osft_context_options_t o;
 *   OSFT_CONTEXT_OPTIONS_INIT(&o);
 *   o.device_type = OSFT_DEVICE_CUDA;  // GPU 0, the legacy default stream
 *   o.workspace_limit = 2ull << 30;    // at most 2 GiB of scratch
 *   osft_context_t ctx;
 *   if (osft_context_create(&ctx, &o) != OSFT_STATUS_SUCCESS)
 *     fputs(osft_last_error(), stderr);
 *   ...
 *   osft_context_synchronize(ctx);
 *   osft_context_destroy(ctx);
 * @endcode
 *
 * @par Non-finite values (NaN, Inf)
 * No call of this header takes floating-point values (workspace_limit and
 * allocator sizes are integers); nothing to refuse or propagate.
 */
#ifndef OSFTRT_CONTEXT_H
#define OSFTRT_CONTEXT_H

#include <stddef.h>
#include <stdint.h>

#include "osftrt/export.h"
#include "osftrt/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/**
 * @defgroup osftrt_context Contexts
 * @brief A device, a stream, library handles and memory: the first argument
 * of every operation (osftrt/context.h).
 * @{
 */

/**
 * @brief An opaque context handle.
 *
 * Create with osft_context_create(), destroy with
 * osft_context_destroy().
 */
typedef struct osft_context_s *osft_context_t;

/**
 * @brief Device types.
 *
 * The values equal DLPack's DLDeviceType codes (kDLCPU = 1,
 * kDLCUDA = 2) and are fixed forever (ABI.md).
 */
typedef enum osft_device_type_e {
  OSFT_DEVICE_CPU = 1, /**< The host CPU (kDLCPU). */
  OSFT_DEVICE_CUDA = 2 /**< A CUDA GPU (kDLCUDA). */
} osft_device_type_t;

/**
 * @brief Writes to *count how many devices of `type` this process can use.
 *
 * 1 for
 * OSFT_DEVICE_CPU; for OSFT_DEVICE_CUDA the number of visible GPUs, and 0
 * when CUDA is not compiled in, or there is no driver or no GPU (these are
 * not errors: this is how a caller picks a backend). For CUDA it maps only
 * the CUDA driver (libcuda.so.1); the CUDA module (cuBLAS, cuSOLVER, NCCL)
 * loads with the first CUDA context or NCCL communicator.
 *
 * @param[in]  type   The device type.
 * @param[out] count  Receives the number of devices.
 * @retval OSFT_STATUS_SUCCESS  *count was written (0 included).
 * @retval OSFT_STATUS_INVALID_ARGUMENT  if count is NULL or type is unknown.
 * @par Thread safety
 * Thread-safe.
 */
OSFT_API osft_status_t osft_device_count(osft_device_type_t type, int *count);

/**
 * @brief Caller-supplied memory callbacks.
 *
 * Either both host callbacks are set or
 * neither (NULL pair: the built-in aligned malloc/free), and likewise for the
 * device pair (NULL pair: the built-in stream-ordered pool, see "Memory" at
 * the top of this file). Every block obtained from an *_alloc is returned to
 * the matching *_free exactly once, with the same size, before
 * osft_context_destroy() returns. A device block may be returned while work
 * that uses it is still enqueued on the stream passed to device_free: the
 * callbacks free in stream order (or wait for that stream).
 *
 * @code{.unparsed}
 *   host_alloc(user, bytes, alignment): `alignment` is a power of two
 *     (at least 64); return NULL on failure (the call then fails with
 *     OSFT_STATUS_OUT_OF_MEMORY). Never called with bytes == 0.
 *   device_alloc(user, bytes, device_id, stream): memory on CUDA device
 *     `device_id`, usable on `stream` (the context's stream at the time of
 *     the call, a cudaStream_t as void *); aligned to at least 256 bytes.
 *   *_free(user, ptr, bytes[, device_id, stream]): `bytes` is the size that
 *     was requested for `ptr`.
 * @endcode
 *
 * @par Thread safety
 * Callbacks may be invoked from any thread using the context, and must not
 * call back into the library with the same context.
 */
typedef struct osft_allocator_s {
  size_t struct_size; /**< sizeof(osft_allocator_t) as the caller compiled it */
  void *user;         /**< passed back to every callback */
  /** Host memory of `bytes` bytes aligned to `alignment` (see above). */
  void *(*host_alloc)(void *user, size_t bytes, size_t alignment);
  /** Returns a block of host_alloc (see above). */
  void (*host_free)(void *user, void *ptr, size_t bytes);
  /** Device memory on `device_id`, usable on `stream` (see above). */
  void *(*device_alloc)(void *user, size_t bytes, int device_id, void *stream);
  /** Returns a block of device_alloc (see above). */
  void (*device_free)(void *user, void *ptr, size_t bytes, int device_id, void *stream);
} osft_allocator_t;

/**
 * @brief Fills *allocator with the defaults (all callbacks NULL: built-in
 * allocation) for a struct of `struct_size` bytes, and sets
 * allocator->struct_size = struct_size.
 *
 * Pass sizeof(osft_allocator_t), or
 * use OSFT_ALLOCATOR_INIT(&a). Bytes beyond what this library knows are
 * zeroed.
 *
 * @param[out] allocator    The struct to fill.
 * @param[in]  struct_size  sizeof(*allocator) as the caller compiled it.
 * @return OSFT_STATUS_SUCCESS, or an error; on
 * error nothing is written.
 * @retval OSFT_STATUS_SUCCESS  The defaults were written.
 * @retval OSFT_STATUS_INVALID_ARGUMENT  (allocator NULL)
 * @retval OSFT_STATUS_INVALID_STRUCT_SIZE  (struct_size below the 1.0 layout)
 */
OSFT_API osft_status_t osft_allocator_init(osft_allocator_t *allocator,
                                           size_t struct_size);
#define OSFT_ALLOCATOR_INIT(a) osft_allocator_init((a), sizeof(*(a)))

/**
 * @brief Options for osft_context_create().
 *
 * Initialize with
 * OSFT_CONTEXT_OPTIONS_INIT(&o) (or osft_context_options_init), then set
 * fields. New fields are only ever appended (ABI.md).
 */
typedef struct osft_context_options_s {
  size_t struct_size; /**< sizeof(osft_context_options_t) as compiled */
  /** Device type. Default OSFT_DEVICE_CPU. */
  osft_device_type_t device_type;
  /** CUDA device ordinal (as in cudaSetDevice); must be 0 for the CPU.
   * Default 0. */
  int device_id;
  /** CUDA stream (cudaStream_t) for all work of the context; NULL means the
   * legacy default stream. Must be NULL for the CPU. Default NULL. The
   * context does not take ownership. */
  void *stream;
  /** Memory callbacks, copied at creation (the struct need not outlive the
   * call, the callbacks and their user data must outlive the context).
   * NULL: built-in allocation. Default NULL. */
  const osft_allocator_t *allocator;
  /** Upper bound, in bytes, on the context's workspace (scratch) memory. An
   * operation that would need more fails with OSFT_STATUS_OUT_OF_MEMORY, or,
   * where the operation is chunked, picks smaller chunks to stay within it.
   * 0 means no limit. Default 0. */
  size_t workspace_limit;
  /** Non-zero: fp32 GEMMs on CUDA may run on TF32 tensor cores (inputs
   * rounded to a 10-bit mantissa, products accumulated in fp32), like
   * torch.backends.cuda.matmul.allow_tf32: several times faster on Ampere
   * and later GPUs, with a relative error of about 1e-3 instead of 1e-6.
   * Applies to the GEMMs of flinear, the tiled MLP, FLCE and the
   * projection whose operands are fp32 (bf16 operands are unaffected);
   * never to the batched QR, its power iteration or the SVD, whose accuracy
   * the orthogonality checks rely on. Ignored on the CPU. Added in 1.1.0;
   * default 0 (full fp32). */
  int allow_tf32;
} osft_context_options_t;

/**
 * @brief Fills *opts with the defaults documented above for a struct of
 * `struct_size` bytes and sets opts->struct_size = struct_size.
 *
 * Pass
 * sizeof(osft_context_options_t), or use OSFT_CONTEXT_OPTIONS_INIT(&o).
 * Bytes beyond what this library knows are zeroed, which the library reads
 * as "default" for fields added after it was built.
 *
 * @param[out] opts         The struct to fill.
 * @param[in]  struct_size  sizeof(*opts) as the caller compiled it.
 * @return OSFT_STATUS_SUCCESS, or an error; on
 * error nothing is written.
 * @retval OSFT_STATUS_SUCCESS  The defaults were written.
 * @retval OSFT_STATUS_INVALID_ARGUMENT  (opts NULL)
 * @retval OSFT_STATUS_INVALID_STRUCT_SIZE  (struct_size below the 1.0 layout)
 */
OSFT_API osft_status_t osft_context_options_init(osft_context_options_t *opts,
                                                 size_t struct_size);
#define OSFT_CONTEXT_OPTIONS_INIT(o) osft_context_options_init((o), sizeof(*(o)))

/**
 * @brief Creates a context and writes its handle to *ctx.
 *
 * `opts` may be NULL for a
 * CPU context with all defaults; it is only read during the call.
 *
 * For CUDA the device is checked (the driver is loaded, the ordinal exists,
 * and its compute capability is one this library was built for: without
 * that check every later call would fail with "no kernel image");
 * cuBLAS/cuSOLVER handles are created later, on first use. The context's
 * own bookkeeping is allocated with the host allocator.
 *
 * @param[out] ctx   Receives the new context.
 * @param[in]  opts  The options, or NULL (a CPU context with all defaults).
 * @return OSFT_STATUS_SUCCESS, or one of the errors below (nothing is written
 * to *ctx).
 * @retval OSFT_STATUS_SUCCESS  The context was created.
 * @retval OSFT_STATUS_INVALID_ARGUMENT  ctx NULL; unknown device_type;
 *   negative device_id; device_id or stream set for a CPU context; an
 *   allocator with only one callback of a pair.
 * @retval OSFT_STATUS_INVALID_STRUCT_SIZE  opts or opts->allocator
 *   struct_size.
 * @retval OSFT_STATUS_NOT_SUPPORTED  CUDA requested but not compiled in; or
 *   the GPU's compute capability is not among the CUDA architectures the
 *   library was built for (the message names the GPU's capability and the
 *   built architectures, e.g. "built for CUDA architectures 80;90").
 * @retval OSFT_STATUS_NO_DEVICE  no CUDA driver/GPU, or device_id >= the
 *   number of GPUs.
 * @retval OSFT_STATUS_OUT_OF_MEMORY  the host allocator failed.
 * @par Thread safety
 * Thread-safe.
 */
OSFT_API osft_status_t osft_context_create(osft_context_t *ctx,
                                           const osft_context_options_t *opts);

/**
 * @brief Destroys a context: waits for its pending device work, releases its
 * workspace and library handles, and returns every block to the allocator
 * it came from.
 *
 * NULL is accepted and does nothing.
 *
 * @param[in] ctx  The context, or NULL.
 * @return OSFT_STATUS_SUCCESS, or one of the errors below.
 * @retval OSFT_STATUS_SUCCESS  The context was destroyed (or ctx is NULL).
 * @retval OSFT_STATUS_INVALID_HANDLE  (nothing happens then) if ctx is not a
 *   live context (e.g. destroyed twice).
 * @retval OSFT_STATUS_INVALID_ARGUMENT  (nothing happens then) while handles
 *   created from it (e.g. osft_flinear_t layers) are still alive — destroy
 *   those first.
 * @retval OSFT_STATUS_BACKEND_ERROR  if the device reported an error while
 *   synchronizing; the context is destroyed all the same.
 */
OSFT_API osft_status_t osft_context_destroy(osft_context_t ctx);

/**
 * @brief Writes the context's device type and ordinal (0 for the CPU).
 *
 * Either
 * out-pointer may be NULL to skip it.
 *
 * @param[in]  ctx        The context.
 * @param[out] type       Receives the device type, or NULL.
 * @param[out] device_id  Receives the device ordinal, or NULL.
 * @retval OSFT_STATUS_SUCCESS  The values were written.
 * @retval OSFT_STATUS_INVALID_HANDLE  ctx is not a live context.
 */
OSFT_API osft_status_t osft_context_get_device(osft_context_t ctx,
                                               osft_device_type_t *type, int *device_id);

/**
 * @brief Sets the CUDA stream (cudaStream_t as void *, NULL for the legacy
 * default stream) for all later work of the context, and rebinds its cuBLAS
 * and cuSOLVER handles.
 *
 * Work already enqueued stays on the previous stream. The new stream is
 * made to wait, on the device, for the work enqueued so far on the old one
 * (an event; the host does not wait), so memory the old stream may still
 * use (the workspace) is reused or freed only after it: the caller need not
 * order the two streams for the library's sake, only for its own tensors.
 * Not owned by the context.
 *
 * @param[in] ctx     The context.
 * @param[in] stream  A cudaStream_t as void *, or NULL.
 * @retval OSFT_STATUS_SUCCESS  The stream is set.
 * @retval OSFT_STATUS_INVALID_HANDLE  ctx is not a live context.
 * @retval OSFT_STATUS_INVALID_ARGUMENT  for a non-NULL stream on a CPU
 *   context.
 * @retval OSFT_STATUS_BACKEND_ERROR  if the ordering event could not be
 *   recorded or waited on, or a library handle could not be rebound (the
 *   stream is then unchanged).
 */
OSFT_API osft_status_t osft_context_set_stream(osft_context_t ctx, void *stream);

/**
 * @brief Writes the context's stream to *stream (NULL on the CPU and for the
 * default stream).
 *
 * @param[in]  ctx     The context.
 * @param[out] stream  Receives the stream (a cudaStream_t as void *).
 * @retval OSFT_STATUS_SUCCESS  *stream was written.
 * @retval OSFT_STATUS_INVALID_HANDLE  ctx is not a live context.
 * @retval OSFT_STATUS_INVALID_ARGUMENT  (stream NULL)
 */
OSFT_API osft_status_t osft_context_get_stream(osft_context_t ctx, void **stream);

/**
 * @brief Blocks until all work enqueued on the context's stream has finished
 * (a no-op on the CPU).
 *
 * @param[in] ctx  The context.
 * @retval OSFT_STATUS_SUCCESS  The stream is idle.
 * @retval OSFT_STATUS_INVALID_HANDLE  ctx is not a live context.
 * @retval OSFT_STATUS_BACKEND_ERROR  with the CUDA error name.
 */
OSFT_API osft_status_t osft_context_synchronize(osft_context_t ctx);

/**
 * @brief Grows the workspace to at least `bytes` now, so that later
 * operations do not allocate it (useful before graph capture or timing).
 *
 * Never shrinks it. Besides the workspace, a first call of an operation
 * may grow the context's smaller scratch blocks (a kernel's partial sums
 * and staging, the tiled MLP's buffers over OSFT layers, host bookkeeping;
 * see "Memory" at the top of this file): to capture a step in a CUDA
 * graph, run it once uncaptured first; later calls with the same shapes
 * allocate nothing.
 * Growing frees the old block before allocating the larger one, so the
 * memory held peaks at the larger size, not at the sum of both.
 *
 * @param[in] ctx    The context.
 * @param[in] bytes  The least workspace size, in bytes.
 * @retval OSFT_STATUS_SUCCESS  The workspace holds at least `bytes`.
 * @retval OSFT_STATUS_INVALID_HANDLE  ctx is not a live context.
 * @retval OSFT_STATUS_OUT_OF_MEMORY  if `bytes` exceeds the workspace limit
 *   (nothing changes) or the allocator fails (the old size is allocated again
 *   where the allocator allows, else the workspace is left empty and grows on
 *   the next demand). On CUDA with the built-in allocator, only when the
 *   device is out of memory (cudaErrorMemoryAllocation).
 * @retval OSFT_STATUS_BACKEND_ERROR  On CUDA with the built-in allocator,
 *   any other CUDA error of the allocation (a sticky error from an earlier
 *   fault, an allocation refused during stream capture), named in the
 *   message.
 */
OSFT_API osft_status_t osft_context_reserve_workspace(osft_context_t ctx, size_t bytes);

/**
 * @brief Frees the workspace and the context's other scratch blocks (they
 * are grown again on demand).
 *
 * On CUDA, waits for the
 * context's stream first.
 *
 * @param[in] ctx  The context.
 * @retval OSFT_STATUS_SUCCESS  The workspace was freed.
 * @retval OSFT_STATUS_INVALID_HANDLE  ctx is not a live context.
 * @retval OSFT_STATUS_BACKEND_ERROR  On CUDA, waiting for the stream failed
 *   (as in osft_context_synchronize()).
 */
OSFT_API osft_status_t osft_context_release_workspace(osft_context_t ctx);

/**
 * @brief Writes the current workspace size in bytes to *bytes.
 *
 * @param[in]  ctx    The context.
 * @param[out] bytes  Receives the size in bytes.
 * @retval OSFT_STATUS_SUCCESS  *bytes was written.
 * @retval OSFT_STATUS_INVALID_HANDLE  ctx is not a live context.
 * @retval OSFT_STATUS_INVALID_ARGUMENT  (bytes NULL)
 */
OSFT_API osft_status_t osft_context_get_workspace_size(osft_context_t ctx, size_t *bytes);

/**
 * @brief Memory the library holds for a context, in bytes, counted at the
 * allocator (what the callbacks or the built-in allocator handed out).
 *
 * Benchmarks use the peaks to report scratch memory.
 */
typedef struct osft_memory_stats_s {
  size_t struct_size;       /**< set by the caller: sizeof as compiled */
  uint64_t host_in_use;     /**< host bytes allocated and not yet freed */
  uint64_t host_peak;       /**< maximum of host_in_use since creation/reset */
  uint64_t device_in_use;   /**< device bytes allocated and not yet freed */
  uint64_t device_peak;     /**< maximum of device_in_use since creation/reset */
  uint64_t host_allocs;     /**< number of host allocations since creation */
  uint64_t device_allocs;   /**< number of device allocations since creation */
  uint64_t workspace_bytes; /**< current workspace size (part of *_in_use) */
} osft_memory_stats_t;

/**
 * @brief Fills *stats with zeros for a struct of struct_size bytes and sets
 * stats->struct_size = struct_size, ready for osft_context_get_memory_stats().
 *
 * Pass sizeof(osft_memory_stats_t), or use OSFT_MEMORY_STATS_INIT(&s). Added in 1.3.0
 * (before, callers set struct_size by hand).
 *
 * @param[out] stats  The struct to fill.
 * @param[in]  struct_size  sizeof(*stats) as the caller compiled it.
 * @retval OSFT_STATUS_SUCCESS  The struct was filled.
 * @retval OSFT_STATUS_INVALID_ARGUMENT  stats is NULL.
 * @retval OSFT_STATUS_INVALID_STRUCT_SIZE  struct_size below the 1.0 layout.
 */
OSFT_API osft_status_t osft_memory_stats_init(osft_memory_stats_t *stats,
                                              size_t struct_size);
#define OSFT_MEMORY_STATS_INIT(s) osft_memory_stats_init((s), sizeof(*(s)))

/**
 * @brief Writes the context's memory statistics into *stats, whose
 * struct_size the caller has set (fields beyond it are not written).
 *
 * @param[in]     ctx    The context.
 * @param[in,out] stats  In: struct_size set by the caller; out: the
 *                       statistics.
 * @retval OSFT_STATUS_SUCCESS  *stats was written.
 * @retval OSFT_STATUS_INVALID_HANDLE  ctx is not a live context.
 * @retval OSFT_STATUS_INVALID_ARGUMENT  (stats NULL)
 * @retval OSFT_STATUS_INVALID_STRUCT_SIZE  (below the 1.0 layout)
 */
OSFT_API osft_status_t osft_context_get_memory_stats(osft_context_t ctx,
                                                     osft_memory_stats_t *stats);

/**
 * @brief Sets host_peak and device_peak to the current in-use values.
 *
 * @param[in] ctx  The context.
 * @retval OSFT_STATUS_SUCCESS  The peaks were reset.
 * @retval OSFT_STATUS_INVALID_HANDLE  ctx is not a live context.
 */
OSFT_API osft_status_t osft_context_reset_peak_memory(osft_context_t ctx);

/**
 * @brief Sets how many CPU threads the library uses, process-wide: its own
 * worker threads and its BLAS engine's (OpenBLAS or oneMKL) alike.
 *
 * The thread model: one count per process, in this order of precedence:
 *   1. the count set here (n >= 1);
 *   2. the environment, read once when the count is first needed (the first
 *      CPU context, or osft_get_num_threads()): OSFTRT_NUM_THREADS, then
 *      OMP_NUM_THREADS (its first entry), then the engine's own variable
 *      (OPENBLAS_NUM_THREADS or MKL_NUM_THREADS); values that are not
 *      positive integers are ignored (a warning is logged);
 *   3. the CPUs the process may run on (its sched_getaffinity set, which
 *      honours taskset and cgroup cpusets), at most 1024.
 * The library keeps n - 1 worker threads in one pool per process, started
 * on the first call that has enough work for them (not per call: a steady
 * state creates no thread), waiting on a futex when idle after a few tens
 * of microseconds of spinning; the calling thread is the n-th. Work too
 * small to split runs on the calling thread with no synchronization. The
 * BLAS engine is given the same count (openblas_set_num_threads,
 * mkl_set_num_threads) when the count is resolved and at each change, so
 * the library's GEMMs use n threads too (a program that also calls
 * OpenBLAS or oneMKL directly shares that setting). Several contexts used
 * at once from several threads share the pool: a call that finds it busy
 * runs its parallel parts on its own thread rather than waiting (the cores
 * are taken anyway). After fork() the child starts a fresh pool on its
 * first parallel call; the count carries over.
 *
 * A host that owns the process's threads should tell the library its own
 * count: the Python package does so before each call with
 * torch.get_num_threads() (so torch.set_num_threads(n) reaches the
 * library); a C or C++ host calls this function once at start and again
 * whenever its own count changes (e.g. with at::get_num_threads() in
 * libtorch).
 *
 * @param[in] n  Threads, 1 to 1024; 0 returns to the automatic count
 *               (environment, then CPUs).
 * @retval OSFT_STATUS_SUCCESS  The count is set and the engine told; calls
 *   that start afterwards use it (a call already running keeps its own).
 * @retval OSFT_STATUS_INVALID_ARGUMENT  n is negative or above 1024
 *   (nothing changes).
 * @par Thread safety
 * Thread-safe; may be called while other threads run library calls.
 * Added in 1.4.0.
 */
OSFT_API osft_status_t osft_set_num_threads(int n);

/**
 * @brief Writes the CPU thread count in effect (see osft_set_num_threads())
 * to *n: the count set there, else the one from the environment or the
 * CPUs (resolved now if no CPU context has resolved it yet).
 *
 * @param[out] n  Receives the count (>= 1).
 * @retval OSFT_STATUS_SUCCESS  *n was written.
 * @retval OSFT_STATUS_INVALID_ARGUMENT  n is NULL.
 * @par Thread safety
 * Thread-safe. Added in 1.4.0.
 */
OSFT_API osft_status_t osft_get_num_threads(int *n);

/**
 * @def OSFT_ALLOCATOR_INIT(a)
 * @brief osft_allocator_init() with the struct's own size.
 * @param a  Pointer to an osft_allocator_t.
 */

/**
 * @def OSFT_CONTEXT_OPTIONS_INIT(o)
 * @brief osft_context_options_init() with the struct's own size.
 * @param o  Pointer to an osft_context_options_t.
 */

/**
 * @def OSFT_MEMORY_STATS_INIT(s)
 * @brief osft_memory_stats_init() with the struct's own size.
 * @param s  Pointer to an osft_memory_stats_t.
 */

/** @} */

#ifdef __cplusplus
}
#endif

#endif /* OSFTRT_CONTEXT_H */
