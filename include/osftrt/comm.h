/**
 * @file
 * @brief libosftrt — communicators: the collectives behind multi-rank OSFT.
 *
 * A communicator connects the P ranks (processes or GPUs) that train one
 * model together. The library needs three collectives from it:
 *
 * @code{.unparsed}
 *   all-reduce (sum, in place)   osft_comm_allreduce_sum()
 *   all-gather (uneven counts)   osft_comm_allgather()
 *   barrier                      osft_comm_barrier()
 * @endcode
 *
 * on fp32 or bf16 data, and one interface serves four engines:
 *
 * @code{.unparsed}
 *   OSFT_COMM_ENGINE_SELF       one rank, no engine needed (all-reduce is a
 *                               no-op, all-gather a copy). Any context.
 *   OSFT_COMM_ENGINE_MPI        wraps an MPI communicator (CPU contexts, host
 *                               buffers). Always available on CPU clusters;
 *                               multi-rank behaviour is tested with it.
 *   OSFT_COMM_ENGINE_NCCL       wraps an ncclComm_t, or creates one from a
 *                               unique id (CUDA contexts, device buffers,
 *                               enqueued on the context's stream).
 *   OSFT_COMM_ENGINE_CALLBACKS  a framework's own all-reduce/all-gather
 *                               functions (e.g. a PyTorch process group);
 *                               buffers in the context's memory.
 * @endcode
 *
 * A communicator belongs to one context (for its device, stream and
 * allocator): create it after the context and destroy it before. It is a
 * collective object: every rank creates it, and every rank calls the same
 * collectives in the same order, as with MPI or NCCL.
 *
 * @par Failures and timeouts
 * A collective that fails (an engine error, a
 * callback returning an error) or does not complete within the
 * communicator's timeout returns OSFT_STATUS_COMM_ERROR or
 * OSFT_STATUS_TIMEOUT, never hangs forever or aborts the process where the
 * engine allows it:
 *   - MPI: the library works on a duplicate of the caller's communicator
 *     with the MPI_ERRORS_RETURN error handler, runs nonblocking
 *     collectives (MPI_Iallreduce, MPI_Iallgatherv, MPI_Ibarrier) and polls
 *     them against a deadline. A dead peer then gives OSFT_STATUS_COMM_ERROR
 *     (if the MPI library reports it) or OSFT_STATUS_TIMEOUT. Note that
 *     most MPI launchers kill the whole job when one process dies; with
 *     Open MPI, `mpirun --enable-recovery` keeps the survivors running.
 *   - NCCL: communicators created from a unique id use non-blocking
 *     initialization (ncclConfig_t.blocking = 0) polled against the
 *     deadline; every collective is followed by a wait on an event that
 *     polls ncclCommGetAsyncError, and on timeout or error the NCCL
 *     communicator is aborted (ncclCommAbort), which also releases the
 *     kernels stuck on the stream. With a finite timeout NCCL collectives
 *     therefore return only once they have completed on the device.
 *   - callbacks: the library cannot interrupt a callback; the framework
 *     applies its own timeout and returns OSFT_STATUS_TIMEOUT or
 *     OSFT_STATUS_COMM_ERROR.
 * After such a failure the ranks are out of step: the communicator is
 * marked broken and every later collective on it returns
 * OSFT_STATUS_COMM_ERROR at once. Destroy it (and, as a rule, the job).
 * After an MPI timeout the library keeps the timed-out operation's internal
 * staging buffer (and the MPI communicator) alive forever, because MPI may
 * still write to them; the caller's buffers are never touched again.
 *
 * @par Thread safety
 * Threading: a communicator is used by one thread at a time, the thread
 * that uses its context. The MPI engine calls MPI from that thread, so MPI
 * must be initialized with a thread level that allows it (MPI_THREAD_SINGLE
 * suffices when that thread is the main thread).
 *
 * @code
 *   // every rank of MPI_COMM_WORLD, on a CPU context
 *   osft_comm_t comm;
 *   if (osft_comm_create_mpi(ctx, (int64_t)MPI_Comm_c2f(MPI_COMM_WORLD), NULL,
 *                            &comm) != OSFT_STATUS_SUCCESS)
 *     fputs(osft_last_error(), stderr);
 *   osft_comm_allreduce_sum(comm, &grad);  // grad: a compact fp32 DLTensor
 *   osft_comm_destroy(comm);
 * @endcode
 *
 * @par Non-finite values (NaN, Inf)
 * osft_comm_allreduce_sum and osft_comm_allgather move values unchanged: NaN
 * and Inf are summed or copied like any value (a NaN on one rank makes that
 * element NaN on every rank) and the call succeeds. opts->timeout_seconds:
 * NaN, 0 and negative values are refused with OSFT_STATUS_INVALID_ARGUMENT;
 * INFINITY means no limit; a finite value above ~31 years (1e9 s) is treated
 * as 1e9 s.
 */
#ifndef OSFTRT_COMM_H
#define OSFTRT_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "osftrt/context.h"
#include "osftrt/export.h"
#include "osftrt/status.h"
#include "osftrt/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/**
 * @defgroup osftrt_comm Communicators
 * @brief All-reduce, all-gather and barrier over MPI, NCCL, a framework's
 * callbacks or one rank (osftrt/comm.h).
 * @{
 */

/** @brief An opaque communicator handle. */
typedef struct osft_comm_s *osft_comm_t;

/** @brief The engine behind a communicator. Values fixed forever (ABI.md). */
typedef enum osft_comm_engine_e {
  OSFT_COMM_ENGINE_SELF = 0,     /**< one rank, no engine needed */
  OSFT_COMM_ENGINE_MPI = 1,      /**< an MPI communicator (CPU contexts) */
  OSFT_COMM_ENGINE_NCCL = 2,     /**< an NCCL communicator (CUDA contexts) */
  OSFT_COMM_ENGINE_CALLBACKS = 3 /**< a framework's host callbacks */
} osft_comm_engine_t;

/**
 * @brief Options for every osft_comm_create_*().
 *
 * Initialize with
 * OSFT_COMM_OPTIONS_INIT(&o), then set fields.
 */
typedef struct osft_comm_options_s {
  size_t struct_size; /**< sizeof(osft_comm_options_t) as compiled */
  /** Upper bound, in seconds, on how long one collective (and the NCCL or
   * MPI communicator setup) may take before it fails with
   * OSFT_STATUS_TIMEOUT. Must be > 0. INFINITY disables the limit: a stuck
   * peer then blocks forever, and in exchange the MPI engine uses MPI's
   * blocking collectives on the caller's buffers (Open MPI's are about
   * twice as fast as the polled nonblocking ones) and NCCL collectives stay
   * asynchronous on the stream. Not applied to host callbacks, which keep
   * their own time. Default 300. */
  double timeout_seconds;
} osft_comm_options_t;

/**
 * @brief Fills *opts with the defaults for a struct of struct_size bytes.
 *
 * @param[out] opts         The struct to fill.
 * @param[in]  struct_size  sizeof(*opts) as the caller compiled it.
 * @retval OSFT_STATUS_SUCCESS  The defaults were written.
 * @retval OSFT_STATUS_INVALID_ARGUMENT  (NULL)
 * @retval OSFT_STATUS_INVALID_STRUCT_SIZE  struct_size below the 1.0 layout.
 */
OSFT_API osft_status_t osft_comm_options_init(osft_comm_options_t *opts,
                                              size_t struct_size);
#define OSFT_COMM_OPTIONS_INIT(o) osft_comm_options_init((o), sizeof(*(o)))

/**
 * @brief Creates the one-rank communicator (rank 0 of 1) on `ctx` (CPU or
 * CUDA).
 *
 * @param[in]  ctx   The context.
 * @param[in]  opts  The options; `opts` may be NULL.
 * @param[out] comm  Receives the communicator.
 * @retval OSFT_STATUS_SUCCESS  The communicator was created.
 * @retval OSFT_STATUS_INVALID_HANDLE  (ctx)
 * @retval OSFT_STATUS_INVALID_ARGUMENT  (comm NULL, bad timeout)
 * @retval OSFT_STATUS_INVALID_STRUCT_SIZE  opts->struct_size.
 * @retval OSFT_STATUS_OUT_OF_MEMORY  The host allocator failed.
 */
OSFT_API osft_status_t osft_comm_create_self(osft_context_t ctx,
                                             const osft_comm_options_t *opts,
                                             osft_comm_t *comm);

/**
 * @brief Wraps an MPI communicator, for a CPU context.
 *
 * `mpi_comm_f` is the
 * communicator's Fortran handle, MPI_Comm_c2f(comm), widened to int64_t:
 * an integer in every MPI implementation, so this header needs no mpi.h
 * and the ABI does not depend on the MPI vendor:
 *
 * @code
 *     osft_comm_create_mpi(ctx, (int64_t)MPI_Comm_c2f(MPI_COMM_WORLD), NULL, &c);
 * @endcode
 *
 * Collective over the MPI communicator: every member calls it. MPI must be
 * initialized (and not finalized) by the caller and stays the caller's to
 * finalize, after every MPI communicator of the library is destroyed. The
 * library duplicates the communicator (MPI_Comm_idup, so its traffic never
 * mixes with the caller's), sets MPI_ERRORS_RETURN on the duplicate, and
 * frees the duplicate in osft_comm_destroy(). While duplicating it sets
 * MPI_ERRORS_RETURN on the caller's communicator and restores the
 * previous error handler before returning. Rank and size are the MPI ones.
 *
 * Buffers are host memory. bf16 all-reduces are summed in fp32 (MPI has
 * no bf16 type) and rounded once.
 *
 * @param[in]  ctx         A CPU context.
 * @param[in]  mpi_comm_f  MPI_Comm_c2f() of the MPI communicator, widened to
 *                         int64_t.
 * @param[in]  opts        The options, or NULL for the defaults.
 * @param[out] comm        Receives the communicator.
 * @return OSFT_STATUS_SUCCESS, or one of the errors below (nothing is
 * created).
 * @retval OSFT_STATUS_SUCCESS  The communicator was created.
 * @retval OSFT_STATUS_INVALID_HANDLE  (ctx)
 * @retval OSFT_STATUS_INVALID_ARGUMENT  (comm NULL; MPI not initialized or
 *   already finalized; mpi_comm_f not a valid handle; bad timeout)
 * @retval OSFT_STATUS_NOT_SUPPORTED  (libosftrt built without MPI; a CUDA
 *   context)
 * @retval OSFT_STATUS_COMM_ERROR  (MPI failed; message carries MPI's error
 *   string)
 * @retval OSFT_STATUS_TIMEOUT  (the duplication did not complete in time)
 * @retval OSFT_STATUS_INVALID_STRUCT_SIZE  opts->struct_size.
 * @retval OSFT_STATUS_OUT_OF_MEMORY  The host allocator failed.
 */
OSFT_API osft_status_t osft_comm_create_mpi(osft_context_t ctx, int64_t mpi_comm_f,
                                            const osft_comm_options_t *opts,
                                            osft_comm_t *comm);

/** @brief The size of an NCCL unique id, in bytes. */
#define OSFT_NCCL_UNIQUE_ID_BYTES 128
/**
 * @brief An NCCL unique id (ncclUniqueId), made on one rank and sent to the
 * others by any means (MPI_Bcast, a file, a TCP store).
 */
typedef struct osft_nccl_unique_id_s {
  char internal[OSFT_NCCL_UNIQUE_ID_BYTES]; /**< the ncclUniqueId's bytes */
} osft_nccl_unique_id_t;

/**
 * @brief Makes a new NCCL unique id (ncclGetUniqueId) into *id.
 *
 * Call on one rank.
 *
 * @param[out] id  Receives the id.
 * @retval OSFT_STATUS_SUCCESS  *id was written.
 * @retval OSFT_STATUS_INVALID_ARGUMENT  (id NULL)
 * @retval OSFT_STATUS_NOT_SUPPORTED  (built without NCCL)
 * @retval OSFT_STATUS_COMM_ERROR  (NCCL failed)
 */
OSFT_API osft_status_t osft_comm_nccl_unique_id(osft_nccl_unique_id_t *id);

/**
 * @brief Wraps the caller's NCCL communicator `nccl_comm` (an ncclComm_t as
 * void *) for a CUDA context on the communicator's device.
 *
 * The caller keeps
 * ownership: osft_comm_destroy() does not destroy it, except that a
 * timeout or an NCCL error aborts it (ncclCommAbort), as it must to
 * release the device. Collectives are enqueued on the context's stream.
 *
 * @param[in]  ctx        A CUDA context on the communicator's device.
 * @param[in]  nccl_comm  The caller's ncclComm_t, as void *.
 * @param[in]  opts       The options, or NULL for the defaults.
 * @param[out] comm       Receives the communicator.
 * @retval OSFT_STATUS_SUCCESS  The communicator was created.
 * @retval OSFT_STATUS_INVALID_HANDLE  (ctx)
 * @retval OSFT_STATUS_INVALID_ARGUMENT  (nccl_comm or comm NULL, bad timeout)
 * @retval OSFT_STATUS_NOT_SUPPORTED  (built without NCCL; a CPU context)
 * @retval OSFT_STATUS_DEVICE_MISMATCH  (the NCCL communicator is on another
 *   device than the context)
 * @retval OSFT_STATUS_COMM_ERROR  NCCL failed.
 * @retval OSFT_STATUS_INVALID_STRUCT_SIZE  opts->struct_size.
 * @retval OSFT_STATUS_OUT_OF_MEMORY  The host allocator failed.
 */
OSFT_API osft_status_t osft_comm_create_nccl(osft_context_t ctx, void *nccl_comm,
                                             const osft_comm_options_t *opts,
                                             osft_comm_t *comm);

/**
 * @brief Creates an NCCL communicator of `nranks` ranks, this one being
 * `rank`, from `id` (the same on every rank), on the CUDA device of `ctx`,
 * owned by the returned communicator (destroyed with it).
 *
 * Collective: every rank
 * calls it. Initialization is non-blocking and polled against the timeout;
 * on timeout the half-made communicator is aborted.
 *
 * @param[in]  ctx     A CUDA context.
 * @param[in]  id      The unique id, the same on every rank.
 * @param[in]  nranks  The number of ranks, >= 1.
 * @param[in]  rank    This rank, in [0, nranks).
 * @param[in]  opts    The options, or NULL for the defaults.
 * @param[out] comm    Receives the communicator.
 * @return Errors: as for osft_comm_create_nccl, plus
 * OSFT_STATUS_INVALID_ARGUMENT (id NULL, nranks < 1, rank outside
 * [0, nranks)) and OSFT_STATUS_TIMEOUT.
 * @retval OSFT_STATUS_SUCCESS  The communicator was created.
 * @retval OSFT_STATUS_INVALID_HANDLE  (ctx)
 * @retval OSFT_STATUS_INVALID_ARGUMENT  (comm NULL, bad timeout; id NULL,
 *   nranks < 1, rank outside [0, nranks))
 * @retval OSFT_STATUS_NOT_SUPPORTED  (built without NCCL; a CPU context)
 * @retval OSFT_STATUS_COMM_ERROR  NCCL failed.
 * @retval OSFT_STATUS_TIMEOUT  The initialization did not complete in time.
 * @retval OSFT_STATUS_INVALID_STRUCT_SIZE  opts->struct_size.
 * @retval OSFT_STATUS_OUT_OF_MEMORY  The host allocator failed.
 */
OSFT_API osft_status_t osft_comm_create_nccl_from_id(osft_context_t ctx,
                                                     const osft_nccl_unique_id_t *id,
                                                     int nranks, int rank,
                                                     const osft_comm_options_t *opts,
                                                     osft_comm_t *comm);

/**
 * @brief Host callbacks: the collectives of a framework.
 *
 * Buffers are in the
 * context's memory (host for a CPU context, the GPU for a CUDA context; for
 * a CUDA context the library synchronizes its stream before each callback,
 * so the data is ready). When a callback returns, its result must be in the
 * buffer, or its work enqueued on the context's stream (which orders it
 * before the library's next kernels); a collective still running on
 * another stream must be waited for first. Tensors handed to callbacks are
 * compact 1-D fp32 or bf16 DLTensors, valid for the call only. Each
 * callback returns OSFT_STATUS_SUCCESS, or an error status
 * (OSFT_STATUS_TIMEOUT is passed through, anything else becomes
 * OSFT_STATUS_COMM_ERROR).
 *
 * @par Thread safety
 * Callbacks run on the thread that called the
 * library and must not call back into libosftrt with the same context.
 */
typedef struct osft_comm_callbacks_s {
  size_t struct_size; /**< sizeof(osft_comm_callbacks_t) as compiled */
  void *user;         /**< passed back to every callback */
  int rank;           /**< this rank, in [0, size) */
  int size;           /**< number of ranks, >= 1 */
  /** Required. Sums `buf` over all ranks, in place. */
  osft_status_t (*allreduce_sum)(void *user, DLTensor *buf);
  /** Required. Concatenates, in rank order, `counts[p]` elements from each
   * rank p into `recv` (sum of counts elements); this rank's `send` holds
   * counts[rank] elements. n_counts == size. */
  osft_status_t (*allgather)(void *user, const DLTensor *send, DLTensor *recv,
                             const int64_t *counts, int64_t n_counts);
  /** Optional (NULL: a one-element all-reduce stands in). */
  osft_status_t (*barrier)(void *user);
  /** Optional: called once from osft_comm_destroy() (e.g. to drop a
   * binding's reference to `user`). */
  void (*release)(void *user);
} osft_comm_callbacks_t;

/**
 * @brief Fills *callbacks with NULL callbacks, rank 0 and size 1.
 *
 * @param[out] callbacks    The struct to fill.
 * @param[in]  struct_size  sizeof(*callbacks) as the caller compiled it.
 * @retval OSFT_STATUS_SUCCESS  The defaults were written.
 * @retval OSFT_STATUS_INVALID_ARGUMENT  callbacks is NULL.
 * @retval OSFT_STATUS_INVALID_STRUCT_SIZE  struct_size below the 1.0 layout.
 */
OSFT_API osft_status_t osft_comm_callbacks_init(osft_comm_callbacks_t *callbacks,
                                                size_t struct_size);
#define OSFT_COMM_CALLBACKS_INIT(c) osft_comm_callbacks_init((c), sizeof(*(c)))

/**
 * @brief Creates a communicator over host callbacks (copied; `user` and the
 * functions must stay valid until osft_comm_destroy()).
 *
 * @param[in]  ctx        The context.
 * @param[in]  callbacks  The callbacks, rank and size.
 * @param[in]  opts       The options, or NULL for the defaults.
 * @param[out] comm       Receives the communicator.
 * @retval OSFT_STATUS_SUCCESS  The communicator was created.
 * @retval OSFT_STATUS_INVALID_HANDLE  (ctx)
 * @retval OSFT_STATUS_INVALID_ARGUMENT  (NULLs, a required callback missing,
 *   size < 1, rank outside [0, size))
 * @retval OSFT_STATUS_INVALID_STRUCT_SIZE  callbacks or opts struct_size.
 * @retval OSFT_STATUS_OUT_OF_MEMORY  The host allocator failed.
 */
OSFT_API osft_status_t osft_comm_create_callbacks(osft_context_t ctx,
                                                  const osft_comm_callbacks_t *callbacks,
                                                  const osft_comm_options_t *opts,
                                                  osft_comm_t *comm);

/**
 * @brief Destroys a communicator (NULL is accepted): frees the MPI duplicate,
 * destroys an owned NCCL communicator, calls the release callback.
 *
 * Not
 * collective, but MPI_Comm_free and ncclCommDestroy may wait for peers
 * where their implementation does. A broken communicator is released
 * without waiting (MPI: the duplicate is left to MPI_Finalize; NCCL:
 * aborted).
 *
 * @param[in] comm  The communicator, or NULL.
 * @retval OSFT_STATUS_SUCCESS  Destroyed (or NULL).
 * @retval OSFT_STATUS_INVALID_HANDLE  (not a live communicator)
 * @retval OSFT_STATUS_INVALID_ARGUMENT  (a projector still uses it: destroy
 *   that first; nothing happens then)
 */
OSFT_API osft_status_t osft_comm_destroy(osft_comm_t comm);

/**
 * @brief Writes this rank, the number of ranks and the engine; any
 * out-pointer may be NULL.
 *
 * @param[in]  comm    The communicator.
 * @param[out] rank    Receives this rank, or NULL.
 * @param[out] size    Receives the number of ranks, or NULL.
 * @param[out] engine  Receives the engine, or NULL.
 * @retval OSFT_STATUS_SUCCESS  The values were written.
 * @retval OSFT_STATUS_INVALID_HANDLE  comm is not a live communicator.
 */
OSFT_API osft_status_t osft_comm_get_info(osft_comm_t comm, int *rank, int *size,
                                          osft_comm_engine_t *engine);

/**
 * @brief Sums `buf` over all ranks, in place: every rank passes a buffer with
 * the same number of elements and dtype (fp32 or bf16; compact, any shape, on
 * the context's device) and receives the sum.
 *
 * Collective. bf16: the MPI
 * engine sums in fp32 and rounds once; NCCL uses its bf16 reduction; host
 * callbacks decide.
 *
 * @param[in]     comm  The communicator.
 * @param[in,out] buf   This rank's values in; the sum over all ranks out.
 * @retval OSFT_STATUS_SUCCESS  buf holds the sum.
 * @retval OSFT_STATUS_INVALID_HANDLE  (nothing is sent then)
 * @retval OSFT_STATUS_INVALID_ARGUMENT  (buf NULL) (nothing is sent then)
 * @retval OSFT_STATUS_DTYPE_MISMATCH  (nothing is sent then)
 * @retval OSFT_STATUS_BAD_LAYOUT  (nothing is sent then)
 * @retval OSFT_STATUS_DEVICE_MISMATCH  (nothing is sent then)
 * @retval OSFT_STATUS_COMM_ERROR  (the communicator is broken afterwards; buf
 *   is unchanged with MPI, unspecified with NCCL and callbacks)
 * @retval OSFT_STATUS_TIMEOUT  (the communicator is broken afterwards; buf is
 *   unchanged with MPI, unspecified with NCCL and callbacks)
 */
OSFT_API osft_status_t osft_comm_allreduce_sum(osft_comm_t comm, DLTensor *buf);

/**
 * @brief All-gather with per-rank counts: recv (sum of counts elements)
 * receives, in rank order, counts[p] elements from every rank p; this rank
 * sends `send`, which must have counts[rank] elements.
 *
 * counts has n_counts ==
 * size entries, each >= 0, identical on every rank. send and recv: same
 * dtype (fp32 or bf16), compact, on the context's device, not overlapping.
 * Collective.
 *
 * @param[in]  comm      The communicator.
 * @param[in]  send      This rank's counts[rank] elements.
 * @param[out] recv      Receives the sum of counts elements, in rank order.
 * @param[in]  counts    The number of elements of every rank.
 * @param[in]  n_counts  The number of entries of counts (the communicator's
 *                       size).
 * @return Errors: as for osft_comm_allreduce_sum, plus
 * OSFT_STATUS_SHAPE_MISMATCH (element counts), OSFT_STATUS_INVALID_ARGUMENT
 * (counts NULL, n_counts, a negative count), OSFT_STATUS_ALIASING.
 * @retval OSFT_STATUS_SUCCESS  recv holds every rank's elements.
 * @retval OSFT_STATUS_INVALID_HANDLE  As for osft_comm_allreduce_sum().
 * @retval OSFT_STATUS_INVALID_ARGUMENT  (send or recv NULL; counts NULL,
 *   n_counts, a negative count)
 * @retval OSFT_STATUS_DTYPE_MISMATCH  As for osft_comm_allreduce_sum().
 * @retval OSFT_STATUS_SHAPE_MISMATCH  (element counts)
 * @retval OSFT_STATUS_BAD_LAYOUT  As for osft_comm_allreduce_sum().
 * @retval OSFT_STATUS_DEVICE_MISMATCH  As for osft_comm_allreduce_sum().
 * @retval OSFT_STATUS_ALIASING  send and recv overlap.
 * @retval OSFT_STATUS_COMM_ERROR  As for osft_comm_allreduce_sum().
 * @retval OSFT_STATUS_TIMEOUT  As for osft_comm_allreduce_sum().
 */
OSFT_API osft_status_t osft_comm_allgather(osft_comm_t comm, const DLTensor *send,
                                           DLTensor *recv, const int64_t *counts,
                                           int64_t n_counts);

/**
 * @brief Returns when every rank has entered the barrier.
 *
 * Collective.
 *
 * @param[in] comm  The communicator.
 * @retval OSFT_STATUS_SUCCESS  Every rank has entered the barrier.
 * @retval OSFT_STATUS_INVALID_HANDLE  comm is not a live communicator.
 * @retval OSFT_STATUS_COMM_ERROR  The collective failed.
 * @retval OSFT_STATUS_TIMEOUT  The collective did not complete in time.
 */
OSFT_API osft_status_t osft_comm_barrier(osft_comm_t comm);

/**
 * @brief What a communicator has done since creation or the last reset: the
 * collective launches this rank made and the payload it passed in.
 *
 * Wire
 * traffic depends on the engine's algorithm (a ring all-reduce of B bytes
 * sends 2 (P - 1) / P * B bytes per rank; an all-gather sends this rank's
 * block to P - 1 peers).
 */
typedef struct osft_comm_stats_s {
  size_t struct_size;       /**< set by the caller: sizeof as compiled */
  uint64_t allreduce_calls; /**< all-reduce launches (incl. the library's own) */
  uint64_t allgather_calls; /**< all-gather launches */
  uint64_t barrier_calls;   /**< barriers */
  uint64_t allreduce_bytes; /**< bytes of the all-reduced buffers */
  uint64_t allgather_bytes; /**< bytes this rank contributed to all-gathers */
  uint64_t failures;        /**< collectives that failed or timed out */
} osft_comm_stats_t;

/**
 * @brief Fills *stats with zeros for a struct of struct_size bytes and sets
 * stats->struct_size = struct_size, ready for osft_comm_get_stats().
 *
 * Pass sizeof(osft_comm_stats_t), or use OSFT_COMM_STATS_INIT(&s). Added in 1.3.0
 * (before, callers set struct_size by hand).
 *
 * @param[out] stats  The struct to fill.
 * @param[in]  struct_size  sizeof(*stats) as the caller compiled it.
 * @retval OSFT_STATUS_SUCCESS  The struct was filled.
 * @retval OSFT_STATUS_INVALID_ARGUMENT  stats is NULL.
 * @retval OSFT_STATUS_INVALID_STRUCT_SIZE  struct_size below the 1.0 layout.
 */
OSFT_API osft_status_t osft_comm_stats_init(osft_comm_stats_t *stats, size_t struct_size);
#define OSFT_COMM_STATS_INIT(s) osft_comm_stats_init((s), sizeof(*(s)))

/**
 * @brief Writes the statistics (fields up to stats->struct_size).
 *
 * @param[in]     comm   The communicator.
 * @param[in,out] stats  In: struct_size set by the caller; out: the
 *                       statistics.
 * @retval OSFT_STATUS_SUCCESS  *stats was written.
 * @retval OSFT_STATUS_INVALID_HANDLE  comm is not a live communicator.
 * @retval OSFT_STATUS_INVALID_ARGUMENT  (stats NULL)
 * @retval OSFT_STATUS_INVALID_STRUCT_SIZE  stats->struct_size.
 */
OSFT_API osft_status_t osft_comm_get_stats(osft_comm_t comm, osft_comm_stats_t *stats);

/**
 * @brief Sets every counter to 0.
 *
 * @param[in] comm  The communicator.
 * @retval OSFT_STATUS_SUCCESS  The counters are 0.
 * @retval OSFT_STATUS_INVALID_HANDLE  comm is not a live communicator.
 */
OSFT_API osft_status_t osft_comm_reset_stats(osft_comm_t comm);

/**
 * @def OSFT_COMM_OPTIONS_INIT(o)
 * @brief osft_comm_options_init() with the struct's own size.
 * @param o  Pointer to an osft_comm_options_t.
 */

/**
 * @def OSFT_COMM_CALLBACKS_INIT(c)
 * @brief osft_comm_callbacks_init() with the struct's own size.
 * @param c  Pointer to an osft_comm_callbacks_t.
 */

/**
 * @def OSFT_COMM_STATS_INIT(s)
 * @brief osft_comm_stats_init() with the struct's own size.
 * @param s  Pointer to an osft_comm_stats_t.
 */

/** @} */

#ifdef __cplusplus
}
#endif

#endif /* OSFTRT_COMM_H */
