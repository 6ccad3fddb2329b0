/* Internal: the communicator behind osft_comm_t — one interface (Engine)
 * with one implementation per file: comm_self.cpp, comm_mpi.cpp (or
 * comm_mpi_none.cpp without MPI), comm_nccl.cpp (in the CUDA module, reached
 * through comm_nccl_module.cpp), comm_callbacks.cpp. communicator.cpp
 * holds what every engine shares: the handle, argument checks, deadlines,
 * broken-state bookkeeping and statistics. */
#ifndef OSFTRT_SRC_COMM_COMMUNICATOR_H
#define OSFTRT_SRC_COMM_COMMUNICATOR_H

#include "core/core_api.h"
#include <chrono>
#include <cstddef>
#include <cstdint>

#include "core/context_impl.h"
#include "core/dtype.h"
#include "osftrt/comm.h"

namespace osft {

/* The moment a collective must have finished by. */
class Deadline {
 public:
  OSFT_CORE_API explicit Deadline(double seconds);
  bool infinite() const noexcept { return infinite_; }
  OSFT_CORE_API bool passed() const noexcept;
  double seconds() const noexcept { return seconds_; }

 private:
  bool infinite_ = true;
  double seconds_ = 0.0;
  std::chrono::steady_clock::time_point at_{};
};

/* The wait between polls of a pending collective: none for the first
 * 2 ms, then a yield of the CPU (to ranks that share the core), and 100 us
 * of sleep per poll once the wait has lasted 100 ms. */
class Backoff {
 public:
  OSFT_CORE_API void pause();

 private:
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

/* One engine. Buffers are in the context's memory (host for a CPU context,
 * the GPU for a CUDA one) and arrive validated; counts are elements of
 * `dtype` (OSFTI_F32 or OSFTI_BF16). Failures throw Error with
 * OSFT_STATUS_COMM_ERROR or OSFT_STATUS_TIMEOUT; the common layer then
 * marks the communicator broken. */
class Engine {
 public:
  virtual ~Engine() = default;
  /* Destroys this engine (it was made with ctx.allocator.make). `broken`:
   * a collective failed, so release without waiting for peers. */
  virtual void release(Context &ctx, bool broken) noexcept = 0;
  virtual void allreduce_sum(void *buf, size_t count, osfti_dtype_t dtype,
                             const Deadline &deadline) = 0;
  /* counts: one entry per rank; recv gets the blocks in rank order. */
  virtual void allgather(const void *send, void *recv, const int64_t *counts,
                         osfti_dtype_t dtype, const Deadline &deadline) = 0;
  virtual void barrier(const Deadline &deadline) = 0;
};

/* Rank and size an engine reports at creation. */
struct EngineInfo {
  int rank = 0, size = 1;
};

/* A block from the context's allocator, freed on scope exit: host memory,
 * or memory where the context computes (memory_alloc: the GPU for a CUDA
 * context). Empty for 0 bytes. */
class ScopedMemory {
 public:
  enum class Where { host, context };
  ScopedMemory(Context &ctx, size_t bytes, Where where, const char *what);
  ~ScopedMemory();
  ScopedMemory(const ScopedMemory &) = delete;
  ScopedMemory &operator=(const ScopedMemory &) = delete;
  template <class T = void>
  T *get() const noexcept {
    return static_cast<T *>(ptr_);
  }

 private:
  Context &ctx_;
  size_t bytes_;
  Where where_;
  void *ptr_ = nullptr;
};

/* The two kinds by name. */
struct HostMemory : ScopedMemory {
  HostMemory(Context &ctx, size_t bytes, const char *what)
      : ScopedMemory(ctx, bytes, Where::host, what) {}
};
struct ContextMemory : ScopedMemory {
  ContextMemory(Context &ctx, size_t bytes, const char *what)
      : ScopedMemory(ctx, bytes, Where::context, what) {}
};

/* ---- engine factories (one per file); each throws on failure */
Engine *make_self_engine(Context &ctx);
Engine *make_mpi_engine(Context &ctx, int64_t mpi_comm_f, const Deadline &deadline,
                        EngineInfo *info);
void nccl_unique_id(osft_nccl_unique_id_t *id);
Engine *make_nccl_engine(Context &ctx, void *nccl_comm, EngineInfo *info);
Engine *make_nccl_engine_from_id(Context &ctx, const osft_nccl_unique_id_t &id,
                                 int nranks, int rank, const Deadline &deadline,
                                 EngineInfo *info);
Engine *make_callbacks_engine(Context &ctx, const osft_comm_callbacks_t &callbacks,
                              EngineInfo *info);

}  // namespace osft

struct osft_comm_s {
  osft::Context *ctx = nullptr;
  osft::Engine *engine = nullptr;
  osft_comm_engine_t kind = OSFT_COMM_ENGINE_SELF;
  int rank = 0, size = 1;
  double timeout_seconds = 300.0;
  bool broken = false;          /* a collective failed: refuse further ones */
  char broken_reason[512] = {}; /* the first failure's message */
  int users = 0;                /* projectors and cross-entropy handles that use it */
  bool counted = false;         /* registered and counted in ctx->live_children */
  osft_comm_stats_t stats{};
};

namespace osft {

using Comm = osft_comm_s;

osft_comm_options_t read_comm_options(const osft_comm_options_t *user);

/* Registers a communicator over `engine` (taking ownership, also on
 * failure). */
Comm *register_comm(Context &ctx, Engine *engine, osft_comm_engine_t kind,
                    const EngineInfo &info, const osft_comm_options_t &opts);
/* Undoes register_comm; throws OSFT_STATUS_INVALID_ARGUMENT while a
 * projector uses it. The caller has unregistered the handle. */
void destroy_comm(Comm *comm);
/* Throws unless `comm` is a live communicator whose context is alive. */
Comm &checked_comm(osft_comm_t comm, const char *arg);

/* The collectives on buffers in the context's memory, for the library's
 * own use (the public functions validate DLTensors, then call these).
 * Each counts in the statistics, refuses a broken communicator, and marks
 * it broken when the engine fails. */
void comm_allreduce_sum(Comm &comm, void *buf, size_t count, osfti_dtype_t dtype);
void comm_allgather(Comm &comm, const void *send, void *recv, const int64_t *counts,
                    osfti_dtype_t dtype);
void comm_barrier(Comm &comm);
/* Whether a collective on `comm` makes the host wait for the device: a
 * CUDA context whose engine is not NCCL (staged through the host), or NCCL
 * with a finite timeout (polled to completion). Self and CPU: never. */
bool comm_waits_on_host(const Comm &comm) noexcept;

/* The public collectives: validate the DLTensors (naming the argument),
 * then run the collective. */
void checked_allreduce(Comm &comm, DLTensor *buf);
void checked_allgather(Comm &comm, const DLTensor *send, DLTensor *recv,
                       const int64_t *counts, int64_t n_counts);

/* All-gathers `bytes` of host memory from every rank into `all` (size *
 * bytes, rank order), through the engine's all-gather on fp32 data in the
 * context's memory (each 16-bit half-word as one exact float), so that
 * every engine, callbacks included, carries it. One all-gather. */
void comm_exchange_host(Comm &comm, const void *mine, size_t bytes, void *all);

/* Host <-> context memory (a plain memcpy on a CPU context; on CUDA a copy
 * on the context's stream that has finished when these return). */
void copy_to_host(Context &ctx, void *dst, const void *src, size_t bytes);
void copy_from_host(Context &ctx, void *dst, const void *src, size_t bytes);
/* Within the context's memory; asynchronous on CUDA (the stream orders it). */
void copy_on_device(Context &ctx, void *dst, const void *src, size_t bytes);

}  // namespace osft

#endif
