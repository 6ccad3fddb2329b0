/* The MPI engine, the MPI module libosftrt_mpi.so.1 (comm_mpi_module.h): a duplicate of
 * the caller's communicator with MPI_ERRORS_RETURN, nonblocking collectives polled
 * against a deadline, so that a dead or stuck peer becomes a status instead of a hang or
 * an abort.
 *
 * Every timed collective runs on a host staging buffer owned by the engine,
 * never on the caller's memory: after a timeout the pending operation may
 * still write into its buffer, so that buffer is abandoned (never freed)
 * and the caller's memory stays untouched. The staging buffer is plain
 * malloc for the same reason: it may have to outlive the context and its
 * allocator. Without a timeout (INFINITY) the engine uses MPI's blocking
 * collectives on the caller's buffers: Open MPI's blocking collectives are
 * tuned and about twice as fast as its nonblocking ones, which also
 * progress only while polled. */
/* The C API only: the deprecated MPI C++ bindings need their own library. */
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "comm/comm_mpi_module.h"
#include "comm/communicator.h"
#include "core/bf16.h"
#include "core/error.h"
#include "core/logging.h"
#include "osftrt/version.h"

namespace osft {
namespace {

/* MPI's own words for an error code. */
void check_mpi(int rc, const char *what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS)
    std::snprintf(text, sizeof text, "MPI error %d", rc);
  raise(OSFT_STATUS_COMM_ERROR, "%s: %s", what, text);
}

/* memcpy that accepts the NULL pointers of empty buffers. */
void copy_bytes(void *dst, const void *src, size_t bytes) {
  if (bytes > 0) std::memcpy(dst, src, bytes);
}

int checked_int(int64_t v, const char *what) {
  if (v > INT_MAX)
    raise(OSFT_STATUS_NOT_SUPPORTED,
          "%s: %lld elements exceed the int counts of the MPI engine", what,
          static_cast<long long>(v));
  return static_cast<int>(v);
}

/* Polls `reqs` until all completed, the deadline passed (TIMEOUT) or MPI
 * reported an error (COMM_ERROR). */
void wait_all(std::vector<MPI_Request> &reqs, const Deadline &deadline,
              const char *what) {
  Backoff backoff;
  for (;;) {
    int done = 0;
    check_mpi(MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &done,
                          MPI_STATUSES_IGNORE),
              what);
    if (done) return;
    if (deadline.passed())
      raise(OSFT_STATUS_TIMEOUT,
            "%s did not complete within %g s (a peer is dead, stuck, or not calling "
            "the same collective)",
            what, deadline.seconds());
    backoff.pause();
  }
}

class MpiEngine final : public Engine {
 public:
  MpiEngine(MPI_Comm comm, int rank, int size) : comm_(comm), rank_(rank), size_(size) {}

  void release(Context &ctx, bool broken) noexcept override {
    int finalized = 1;
    MPI_Finalized(&finalized);
    /* A failed collective may still be pending on the duplicate: leave it
     * (and its buffer) to MPI_Finalize rather than wait for a dead peer. */
    if (!broken) {
      if (!finalized) MPI_Comm_free(&comm_);
      std::free(staging_);
    }
    ctx.allocator.destroy(this);
  }

  void allreduce_sum(void *buf, size_t count, osfti_dtype_t dtype,
                     const Deadline &deadline) override {
    if (size_ == 1) return; /* the sum over one rank */
    /* No deadline: MPI's blocking collective, in place where the dtype
     * allows (nothing can be left pending). */
    const bool in_place = deadline.infinite() && dtype == OSFTI_F32;
    float *s =
        in_place ? static_cast<float *>(buf) : staging<float>(count * sizeof(float));
    if (dtype == OSFTI_BF16) {
      const auto *in = static_cast<const bf16 *>(buf);
      for (size_t i = 0; i < count; ++i) s[i] = to_float(in[i]);
    } else if (!in_place) {
      copy_bytes(s, buf, count * sizeof(float));
    }
    /* Chunks of at most INT_MAX elements (all started before waiting). */
    std::vector<MPI_Request> reqs;
    for (size_t first = 0; first < count; first += INT_MAX) {
      const int n = static_cast<int>(std::min<size_t>(count - first, INT_MAX));
      if (deadline.infinite()) {
        check_mpi(MPI_Allreduce(MPI_IN_PLACE, s + first, n, MPI_FLOAT, MPI_SUM, comm_),
                  "MPI_Allreduce");
        continue;
      }
      reqs.push_back(MPI_REQUEST_NULL);
      guarded("MPI_Iallreduce", [&] {
        return MPI_Iallreduce(MPI_IN_PLACE, s + first, n, MPI_FLOAT, MPI_SUM, comm_,
                              &reqs.back());
      });
    }
    finish(reqs, deadline, "MPI all-reduce");
    if (dtype == OSFTI_BF16) {
      auto *out = static_cast<bf16 *>(buf);
      for (size_t i = 0; i < count; ++i) out[i] = to_bf16(s[i]);
    } else if (!in_place) {
      copy_bytes(buf, s, count * sizeof(float));
    }
  }

  void allgather(const void *send, void *recv, const int64_t *counts, osfti_dtype_t dtype,
                 const Deadline &deadline) override {
    const size_t e = osfti_dtype_size(dtype);
    std::vector<int> n(size_), displ(size_);
    int64_t total = 0;
    for (int p = 0; p < size_; ++p) {
      n[p] = checked_int(counts[p], "MPI all-gather");
      displ[p] = checked_int(total, "MPI all-gather");
      total += counts[p];
    }
    checked_int(total, "MPI all-gather");
    if (size_ == 1) return copy_bytes(recv, send, static_cast<size_t>(total) * e);
    const MPI_Datatype type = dtype == OSFTI_BF16 ? MPI_UINT16_T : MPI_FLOAT;
    if (deadline.infinite()) {
      check_mpi(
          MPI_Allgatherv(send, n[rank_], type, recv, n.data(), displ.data(), type, comm_),
          "MPI_Allgatherv");
      return;
    }
    char *s = staging<char>(static_cast<size_t>(total) * e);
    copy_bytes(s + static_cast<size_t>(displ[rank_]) * e, send,
               static_cast<size_t>(n[rank_]) * e);
    std::vector<MPI_Request> reqs(1, MPI_REQUEST_NULL);
    guarded("MPI_Iallgatherv", [&] {
      return MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, s, n.data(),
                             displ.data(), type, comm_, reqs.data());
    });
    finish(reqs, deadline, "MPI all-gather");
    copy_bytes(recv, s, static_cast<size_t>(total) * e);
  }

  void barrier(const Deadline &deadline) override {
    if (size_ == 1) return;
    if (deadline.infinite()) return check_mpi(MPI_Barrier(comm_), "MPI_Barrier");
    std::vector<MPI_Request> reqs(1, MPI_REQUEST_NULL);
    guarded("MPI_Ibarrier", [&] { return MPI_Ibarrier(comm_, reqs.data()); });
    finish(reqs, deadline, "MPI barrier");
  }

 private:
  /* The staging buffer, grown to at least `bytes`. */
  template <class T>
  T *staging(size_t bytes) {
    if (bytes > staging_bytes_) {
      void *grown = std::malloc(bytes);
      if (grown == nullptr)
        raise(OSFT_STATUS_OUT_OF_MEMORY, "MPI staging buffer of %zu bytes", bytes);
      std::free(staging_);
      staging_ = grown;
      staging_bytes_ = bytes;
    }
    return static_cast<T *>(staging_);
  }

  /* Starting an operation failed: what was started before may be pending
   * on the staging buffer, so give it up. */
  template <class Start>
  void guarded(const char *what, Start &&start) {
    const int rc = start();
    if (rc != MPI_SUCCESS) abandon_staging();
    check_mpi(rc, what);
  }

  void finish(std::vector<MPI_Request> &reqs, const Deadline &deadline,
              const char *what) {
    try {
      wait_all(reqs, deadline, what);
    } catch (...) {
      abandon_staging();
      throw;
    }
  }

  void abandon_staging() noexcept {
    if (staging_ != nullptr)
      log_message(OSFT_LOG_WARN,
                  "MPI communicator: abandoning a %zu-byte staging buffer that a "
                  "failed collective may still write",
                  staging_bytes_);
    staging_ = nullptr; /* deliberately never freed */
    staging_bytes_ = 0;
  }

  MPI_Comm comm_;
  int rank_, size_;
  void *staging_ = nullptr;
  size_t staging_bytes_ = 0;
};

MPI_Comm caller_comm(int64_t mpi_comm_f) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized)
    raise(OSFT_STATUS_INVALID_ARGUMENT,
          "mpi_comm_f: MPI is %s; initialize MPI before creating an MPI communicator",
          finalized ? "already finalized" : "not initialized");
  if (mpi_comm_f < INT_MIN || mpi_comm_f > INT_MAX)
    raise(OSFT_STATUS_INVALID_ARGUMENT,
          "mpi_comm_f: %lld is not a Fortran handle (MPI_Comm_c2f of the communicator)",
          static_cast<long long>(mpi_comm_f));
  const MPI_Comm c = MPI_Comm_f2c(static_cast<MPI_Fint>(mpi_comm_f));
  if (c == MPI_COMM_NULL || c == MPI_Comm{})
    raise(OSFT_STATUS_INVALID_ARGUMENT,
          "mpi_comm_f: %lld is not a valid communicator handle (MPI_Comm_c2f of the "
          "communicator)",
          static_cast<long long>(mpi_comm_f));
  return c;
}

/* MPI_Comm_idup polled against the deadline, with MPI_ERRORS_RETURN on the
 * caller's communicator for the duration (its handler is restored). */
MPI_Comm duplicate(MPI_Comm c, const Deadline &deadline) {
  MPI_Errhandler previous = MPI_ERRHANDLER_NULL;
  check_mpi(MPI_Comm_get_errhandler(c, &previous), "MPI_Comm_get_errhandler");
  MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN);
  auto restore = [&] {
    MPI_Comm_set_errhandler(c, previous);
    MPI_Errhandler_free(&previous);
  };
  MPI_Comm dup = MPI_COMM_NULL;
  try {
    std::vector<MPI_Request> reqs(1, MPI_REQUEST_NULL);
    check_mpi(MPI_Comm_idup(c, &dup, reqs.data()), "MPI_Comm_idup");
    wait_all(reqs, deadline, "MPI_Comm_idup");
    check_mpi(MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  } catch (...) {
    restore();
    throw;
  }
  restore();
  return dup;
}

/* make_mpi_engine() of comm/communicator.h (a CPU context: checked by the
 * core, comm_mpi_module.cpp). */
Engine *make_engine(Context &ctx, int64_t mpi_comm_f, const Deadline &deadline,
                    EngineInfo *info) {
  MPI_Comm dup = duplicate(caller_comm(mpi_comm_f), deadline);
  try {
    check_mpi(MPI_Comm_rank(dup, &info->rank), "MPI_Comm_rank");
    check_mpi(MPI_Comm_size(dup, &info->size), "MPI_Comm_size");
    return ctx.allocator.make<MpiEngine>("MPI communicator", dup, info->rank, info->size);
  } catch (...) {
    MPI_Comm_free(&dup);
    throw;
  }
}

}  // namespace

const MpiModule &mpi_module_table() {
  static const MpiModule table = {{OSFT_VERSION_NUMBER, sizeof(MpiModule)}, make_engine};
  return table;
}

}  // namespace osft

/* The module's one export (comm_mpi_module.h). */
extern "C" __attribute__((visibility("default"))) const osft::ModuleHeader *
osftrt_mpi_module_entry(uint32_t core_version, char *why, size_t why_bytes) {
  if (!osft::module_version_matches(core_version, why, why_bytes)) return nullptr;
  return &osft::mpi_module_table().header;
}
