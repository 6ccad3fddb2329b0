/* C ABI: communicators. */
#include "osftrt/comm.h"

#include "capi/capi_util.h"
#include "comm/communicator.h"
#include "core/handle.h"

namespace {

using osft::api_call;
using osft::init_struct;
using osft::raise;
using osft::require;

constexpr size_t kCallbacksV1 = OSFTI_V1_SIZE(osft_comm_callbacks_t, release);
constexpr size_t kStatsV1 = OSFTI_V1_SIZE(osft_comm_stats_t, failures);

/* The shared tail of every osft_comm_create_*: read the options, build the
 * engine, register the handle. */
template <class Make>
osft_status_t create(osft_context_t ctx, const osft_comm_options_t *opts,
                     osft_comm_t *comm, osft_comm_engine_t kind, Make &&make) {
  osft::Context &c = osft::checked_context(ctx, "ctx");
  require(comm, "comm");
  const osft_comm_options_t o = osft::read_comm_options(opts);
  osft::EngineInfo info;
  osft::Engine *engine = make(c, osft::Deadline(o.timeout_seconds), &info);
  *comm = osft::register_comm(c, engine, kind, info, o);
  return OSFT_STATUS_SUCCESS;
}

}  // namespace

extern "C" {

OSFT_API osft_status_t osft_comm_options_init(osft_comm_options_t *opts,
                                              size_t struct_size) {
  return api_call("osft_comm_options_init", [&] {
    return init_struct(opts, struct_size, osft::read_comm_options(nullptr),
                       OSFTI_V1_SIZE(osft_comm_options_t, timeout_seconds), "opts",
                       "osft_comm_options_t");
  });
}

OSFT_API osft_status_t osft_comm_callbacks_init(osft_comm_callbacks_t *callbacks,
                                                size_t struct_size) {
  return api_call("osft_comm_callbacks_init", [&] {
    osft_comm_callbacks_t d{};
    d.size = 1;
    return init_struct(callbacks, struct_size, d, kCallbacksV1, "callbacks",
                       "osft_comm_callbacks_t");
  });
}

OSFT_API osft_status_t osft_comm_create_self(osft_context_t ctx,
                                             const osft_comm_options_t *opts,
                                             osft_comm_t *comm) {
  return api_call("osft_comm_create_self", [&] {
    return create(ctx, opts, comm, OSFT_COMM_ENGINE_SELF,
                  [](osft::Context &c, const osft::Deadline &, osft::EngineInfo *) {
                    return osft::make_self_engine(c);
                  });
  });
}

OSFT_API osft_status_t osft_comm_create_mpi(osft_context_t ctx, int64_t mpi_comm_f,
                                            const osft_comm_options_t *opts,
                                            osft_comm_t *comm) {
  return api_call("osft_comm_create_mpi", [&] {
    return create(ctx, opts, comm, OSFT_COMM_ENGINE_MPI,
                  [&](osft::Context &c, const osft::Deadline &d, osft::EngineInfo *info) {
                    return osft::make_mpi_engine(c, mpi_comm_f, d, info);
                  });
  });
}

OSFT_API osft_status_t osft_comm_nccl_unique_id(osft_nccl_unique_id_t *id) {
  return api_call("osft_comm_nccl_unique_id", [&] {
    require(id, "id");
    osft::nccl_unique_id(id);
    return OSFT_STATUS_SUCCESS;
  });
}

OSFT_API osft_status_t osft_comm_create_nccl(osft_context_t ctx, void *nccl_comm,
                                             const osft_comm_options_t *opts,
                                             osft_comm_t *comm) {
  return api_call("osft_comm_create_nccl", [&] {
    return create(ctx, opts, comm, OSFT_COMM_ENGINE_NCCL,
                  [&](osft::Context &c, const osft::Deadline &, osft::EngineInfo *info) {
                    return osft::make_nccl_engine(c, nccl_comm, info);
                  });
  });
}

OSFT_API osft_status_t osft_comm_create_nccl_from_id(osft_context_t ctx,
                                                     const osft_nccl_unique_id_t *id,
                                                     int nranks, int rank,
                                                     const osft_comm_options_t *opts,
                                                     osft_comm_t *comm) {
  return api_call("osft_comm_create_nccl_from_id", [&] {
    require(id, "id");
    return create(ctx, opts, comm, OSFT_COMM_ENGINE_NCCL,
                  [&](osft::Context &c, const osft::Deadline &d, osft::EngineInfo *info) {
                    return osft::make_nccl_engine_from_id(c, *id, nranks, rank, d, info);
                  });
  });
}

OSFT_API osft_status_t osft_comm_create_callbacks(osft_context_t ctx,
                                                  const osft_comm_callbacks_t *callbacks,
                                                  const osft_comm_options_t *opts,
                                                  osft_comm_t *comm) {
  return api_call("osft_comm_create_callbacks", [&] {
    require(callbacks, "callbacks");
    const osft_comm_callbacks_t cb =
        osft::read_struct(callbacks, osft_comm_callbacks_t{}, kCallbacksV1, "callbacks",
                          "osft_comm_callbacks_t");
    return create(ctx, opts, comm, OSFT_COMM_ENGINE_CALLBACKS,
                  [&](osft::Context &c, const osft::Deadline &, osft::EngineInfo *info) {
                    return osft::make_callbacks_engine(c, cb, info);
                  });
  });
}

OSFT_API osft_status_t osft_comm_destroy(osft_comm_t comm) {
  return api_call("osft_comm_destroy", [&] {
    if (comm == nullptr) return OSFT_STATUS_SUCCESS;
    osft::Comm &c = osft::checked_comm(comm, "comm");
    if (c.users > 0)
      raise(OSFT_STATUS_INVALID_ARGUMENT,
            "comm: still used by %d handle(s) (projectors, cross-entropy handles); "
            "destroy them first",
            c.users);
    if (!osft::unregister_handle(comm, osft::HandleKind::comm))
      raise(OSFT_STATUS_INVALID_HANDLE, "comm: not a live communicator handle");
    osft::destroy_comm(comm);
    return OSFT_STATUS_SUCCESS;
  });
}

OSFT_API osft_status_t osft_comm_get_info(osft_comm_t comm, int *rank, int *size,
                                          osft_comm_engine_t *engine) {
  return api_call("osft_comm_get_info", [&] {
    const osft::Comm &c = osft::checked_comm(comm, "comm");
    if (rank != nullptr) *rank = c.rank;
    if (size != nullptr) *size = c.size;
    if (engine != nullptr) *engine = c.kind;
    return OSFT_STATUS_SUCCESS;
  });
}

OSFT_API osft_status_t osft_comm_allreduce_sum(osft_comm_t comm, DLTensor *buf) {
  return api_call("osft_comm_allreduce_sum", [&] {
    osft::checked_allreduce(osft::checked_comm(comm, "comm"), buf);
    return OSFT_STATUS_SUCCESS;
  });
}

OSFT_API osft_status_t osft_comm_allgather(osft_comm_t comm, const DLTensor *send,
                                           DLTensor *recv, const int64_t *counts,
                                           int64_t n_counts) {
  return api_call("osft_comm_allgather", [&] {
    osft::checked_allgather(osft::checked_comm(comm, "comm"), send, recv, counts,
                            n_counts);
    return OSFT_STATUS_SUCCESS;
  });
}

OSFT_API osft_status_t osft_comm_barrier(osft_comm_t comm) {
  return api_call("osft_comm_barrier", [&] {
    osft::comm_barrier(osft::checked_comm(comm, "comm"));
    return OSFT_STATUS_SUCCESS;
  });
}

OSFT_API osft_status_t osft_comm_stats_init(osft_comm_stats_t *stats,
                                            size_t struct_size) {
  return api_call("osft_comm_stats_init", [&] {
    return osft::init_output_struct(stats, struct_size, kStatsV1, "stats",
                                    "osft_comm_stats_t");
  });
}

OSFT_API osft_status_t osft_comm_get_stats(osft_comm_t comm, osft_comm_stats_t *stats) {
  return api_call("osft_comm_get_stats", [&] {
    const osft::Comm &c = osft::checked_comm(comm, "comm");
    require(stats, "stats");
    osft::check_struct_size("stats", "osft_comm_stats_t", stats->struct_size, kStatsV1);
    osft::write_struct(stats, stats->struct_size, c.stats);
    return OSFT_STATUS_SUCCESS;
  });
}

OSFT_API osft_status_t osft_comm_reset_stats(osft_comm_t comm) {
  return api_call("osft_comm_reset_stats", [&] {
    osft::Comm &c = osft::checked_comm(comm, "comm");
    const size_t size = c.stats.struct_size;
    c.stats = osft_comm_stats_t{};
    c.stats.struct_size = size;
    return OSFT_STATUS_SUCCESS;
  });
}

}  // extern "C"
