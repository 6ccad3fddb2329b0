/* The NCCL engine (CUDA contexts, device buffers, the context's stream).
 *
 * Hangs become statuses: a communicator made from a unique id is
 * non-blocking (ncclConfig_t.blocking = 0), so every NCCL call may return
 * ncclInProgress and is polled with ncclCommGetAsyncError against the
 * deadline; after each collective an event on the stream is polled the same
 * way (with a finite timeout), and on timeout or error the communicator is
 * aborted, which also frees the kernels stuck on the stream. Part of the
 * CUDA module (src/cuda/module_cuda.h) when NCCL is found. */
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>

#include "cuda/cuda_check.h"
#include "comm/communicator.h"
#include "core/error.h"
#include "core/logging.h"
#include "cuda/device_guard.h"
#include "cuda/module_cuda.h"

namespace osft {
namespace {

using cuda::DeviceGuard;

[[noreturn]] void nccl_failed(ncclResult_t r, const char *what) {
  raise(OSFT_STATUS_COMM_ERROR, "%s: %s (%s)", what, ncclGetErrorString(r),
        ncclGetLastError(nullptr));
}

void check_nccl(ncclResult_t r, const char *what) {
  if (r != ncclSuccess && r != ncclInProgress) nccl_failed(r, what);
}

ncclDataType_t nccl_type(osfti_dtype_t dtype) {
  return dtype == OSFTI_BF16 ? ncclBfloat16 : ncclFloat32;
}

/* Polls the communicator's state until it leaves ncclInProgress; aborts it
 * on error or timeout. Returns normally only in state ncclSuccess. */
void settle(ncclComm_t comm, const Deadline &deadline, const char *what, bool *aborted) {
  Backoff backoff;
  for (;;) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(comm, &state);
    if (r != ncclSuccess) state = r;
    if (state == ncclSuccess) return;
    if (state != ncclInProgress) {
      ncclCommAbort(comm);
      *aborted = true;
      nccl_failed(state, what);
    }
    if (deadline.passed()) {
      ncclCommAbort(comm);
      *aborted = true;
      raise(OSFT_STATUS_TIMEOUT,
            "%s did not complete within %g s (a peer is dead or stuck); the NCCL "
            "communicator was aborted",
            what, deadline.seconds());
    }
    backoff.pause();
  }
}

class NcclEngine final : public Engine {
 public:
  NcclEngine(Context &ctx, ncclComm_t comm, bool owned, int rank, int size,
             double timeout)
      : ctx_(ctx),
        comm_(comm),
        owned_(owned),
        rank_(rank),
        size_(size),
        timeout_(timeout) {}

  /* The event and the barrier's float; called once after construction. */
  void setup() {
    DeviceGuard guard(ctx_.device_id);
    check_cuda(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming),
               "cudaEventCreateWithFlags");
    one_ = memory_alloc(ctx_, sizeof(float), "NCCL barrier");
    check_cuda(cudaMemsetAsync(one_, 0, sizeof(float), stream()), "cudaMemsetAsync");
  }

  /* Setup failed: the creator disposes of the NCCL communicator. */
  void forget_comm() noexcept { aborted_ = true; }

  void release(Context &ctx, bool broken) noexcept override {
    try {
      DeviceGuard guard(ctx.device_id);
      if (!aborted_ && owned_) shut_down(broken);
      if (done_ != nullptr) cudaEventDestroy(done_);
    } catch (...) {
    }
    memory_free(ctx, one_, sizeof(float));
    ctx.allocator.destroy(this);
  }

  void allreduce_sum(void *buf, size_t count, osfti_dtype_t dtype,
                     const Deadline &deadline) override {
    DeviceGuard guard(ctx_.device_id);
    issue("ncclAllReduce", deadline, [&] {
      return ncclAllReduce(buf, buf, count, nccl_type(dtype), ncclSum, comm_, stream());
    });
    complete(deadline, false, "NCCL all-reduce");
  }

  /* Equal counts: one ncclAllGather; uneven: one group of broadcasts, one
   * per rank, each rooted at the rank that owns the block. */
  void allgather(const void *send, void *recv, const int64_t *counts, osfti_dtype_t dtype,
                 const Deadline &deadline) override {
    DeviceGuard guard(ctx_.device_id);
    const size_t e = osfti_dtype_size(dtype);
    bool even = true;
    for (int p = 1; p < size_; ++p) even = even && counts[p] == counts[0];
    if (even) {
      issue("ncclAllGather", deadline, [&] {
        return ncclAllGather(send, recv, static_cast<size_t>(counts[0]), nccl_type(dtype),
                             comm_, stream());
      });
    } else {
      issue("ncclBroadcast group", deadline,
            [&] { return broadcasts(send, recv, counts, e, dtype); });
    }
    complete(deadline, false, "NCCL all-gather");
  }

  void barrier(const Deadline &deadline) override {
    DeviceGuard guard(ctx_.device_id);
    issue("ncclAllReduce (barrier)", deadline, [&] {
      return ncclAllReduce(one_, one_, 1, ncclFloat32, ncclSum, comm_, stream());
    });
    complete(deadline, true, "NCCL barrier");
  }

 private:
  cudaStream_t stream() const noexcept { return static_cast<cudaStream_t>(ctx_.stream); }

  ncclResult_t broadcasts(const void *send, void *recv, const int64_t *counts, size_t e,
                          osfti_dtype_t dtype) {
    /* A non-blocking communicator may answer ncclInProgress to any call:
     * that is acceptance, and stopping there would let the ranks launch
     * different sets of broadcasts (a hang). */
    const auto accepted = [](ncclResult_t x) {
      return x == ncclSuccess || x == ncclInProgress;
    };
    ncclResult_t r = ncclGroupStart();
    if (!accepted(r)) return r;
    size_t displ = 0;
    for (int p = 0; p < size_ && accepted(r); ++p) {
      char *block = static_cast<char *>(recv) + displ * e;
      const size_t n = static_cast<size_t>(counts[p]);
      if (n > 0)
        r = ncclBroadcast(p == rank_ ? send : block, block, n, nccl_type(dtype), p, comm_,
                          stream());
      displ += n;
    }
    const ncclResult_t end = ncclGroupEnd();
    return accepted(r) ? end : r;
  }

  /* Enqueues with `call`, then waits for a non-blocking communicator to
   * accept it. */
  template <class Call>
  void issue(const char *what, const Deadline &deadline, Call &&call) {
    const ncclResult_t r = call();
    if (r != ncclSuccess && r != ncclInProgress) {
      ncclCommAbort(comm_);
      aborted_ = true;
      nccl_failed(r, what);
    }
    settle(comm_, deadline, what, &aborted_);
  }

  /* With a finite deadline (or `always`), waits for the collective to
   * finish on the device, polling the communicator for errors. */
  void complete(const Deadline &deadline, bool always, const char *what) {
    if (deadline.infinite() && !always) return;
    check_cuda(cudaEventRecord(done_, stream()), "cudaEventRecord");
    Backoff backoff;
    for (;;) {
      const cudaError_t q = cudaEventQuery(done_);
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) check_cuda(q, "cudaEventQuery");
      ncclResult_t state = ncclSuccess;
      ncclCommGetAsyncError(comm_, &state);
      if ((state != ncclSuccess && state != ncclInProgress) || deadline.passed()) {
        ncclCommAbort(comm_);
        aborted_ = true;
        if (state != ncclSuccess && state != ncclInProgress) nccl_failed(state, what);
        raise(OSFT_STATUS_TIMEOUT,
              "%s did not complete within %g s (a peer is dead or stuck); the NCCL "
              "communicator was aborted",
              what, deadline.seconds());
      }
      backoff.pause();
    }
  }

  /* Destroys an owned communicator: finalize (flushes, non-blocking),
   * settle, destroy; abort instead when broken or when finalize fails. */
  void shut_down(bool broken) {
    if (broken) {
      ncclCommAbort(comm_);
      return;
    }
    try {
      check_nccl(ncclCommFinalize(comm_), "ncclCommFinalize");
      settle(comm_, Deadline(timeout_), "ncclCommFinalize", &aborted_);
    } catch (const Error &e) {
      log_message(OSFT_LOG_WARN, "NCCL communicator: %s", e.what());
      if (!aborted_) ncclCommAbort(comm_);
      return;
    }
    ncclCommDestroy(comm_);
  }

  Context &ctx_;
  ncclComm_t comm_;
  bool owned_;
  int rank_, size_;
  double timeout_;
  bool aborted_ = false;
  cudaEvent_t done_ = nullptr;
  void *one_ = nullptr;
};

Engine *finish_engine(Context &ctx, ncclComm_t comm, bool owned, double timeout,
                      EngineInfo *info) {
  check_nccl(ncclCommUserRank(comm, &info->rank), "ncclCommUserRank");
  check_nccl(ncclCommCount(comm, &info->size), "ncclCommCount");
  auto *engine = ctx.allocator.make<NcclEngine>("NCCL communicator", ctx, comm, owned,
                                                info->rank, info->size, timeout);
  try {
    engine->setup();
  } catch (...) {
    engine->forget_comm();
    engine->release(ctx, true);
    throw;
  }
  return engine;
}

}  // namespace

void cuda_nccl_unique_id(osft_nccl_unique_id_t *id) {
  ncclUniqueId uid;
  const ncclResult_t r = ncclGetUniqueId(&uid);
  if (r != ncclSuccess) nccl_failed(r, "ncclGetUniqueId");
  static_assert(sizeof uid == sizeof id->internal, "ncclUniqueId size");
  std::memcpy(id->internal, &uid, sizeof uid);
}

Engine *cuda_make_nccl_engine(Context &ctx, void *nccl_comm, EngineInfo *info) {
  /* a CUDA context: checked by the core (comm_nccl_module.cpp) */
  if (nccl_comm == nullptr) raise(OSFT_STATUS_INVALID_ARGUMENT, "nccl_comm: NULL");
  const auto comm = static_cast<ncclComm_t>(nccl_comm);
  int device = -1;
  check_nccl(ncclCommCuDevice(comm, &device), "ncclCommCuDevice");
  if (device != ctx.device_id)
    raise(OSFT_STATUS_DEVICE_MISMATCH,
          "nccl_comm: on CUDA device %d, but the context is on device %d", device,
          ctx.device_id);
  /* A wrapped communicator is not ours to destroy; the timeout is for
   * finalizing owned ones only. */
  return finish_engine(ctx, comm, false, 0.0, info);
}

Engine *cuda_make_nccl_engine_from_id(Context &ctx, const osft_nccl_unique_id_t &id,
                                      int nranks, int rank, const Deadline &deadline,
                                      EngineInfo *info) {
  /* a CUDA context: checked by the core (comm_nccl_module.cpp) */
  if (nranks < 1) raise(OSFT_STATUS_INVALID_ARGUMENT, "nranks: %d; must be >= 1", nranks);
  if (rank < 0 || rank >= nranks)
    raise(OSFT_STATUS_INVALID_ARGUMENT, "rank: %d is outside [0, %d)", rank, nranks);
  DeviceGuard guard(ctx.device_id);
  ncclUniqueId uid;
  std::memcpy(&uid, id.internal, sizeof uid);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  const ncclResult_t r = ncclCommInitRankConfig(&comm, nranks, uid, rank, &config);
  if (r != ncclSuccess && r != ncclInProgress) {
    if (comm != nullptr) ncclCommAbort(comm);
    nccl_failed(r, "ncclCommInitRankConfig");
  }
  bool aborted = false;
  settle(comm, deadline, "ncclCommInitRankConfig", &aborted);
  try {
    return finish_engine(ctx, comm, true, deadline.seconds(), info);
  } catch (...) {
    ncclCommAbort(comm);
    throw;
  }
}

}  // namespace osft
