/* C ABI: devices, allocators and contexts. Validation and work live in
 * src/core; this layer names the function and maps exceptions to status. */
#include "osftrt/context.h"

#include "capi/capi_util.h"
#include "core/context_impl.h"
#include "core/cpu_blas.h"
#include "core/cuda_runtime.h"
#include "core/error.h"
#include "core/handle.h"
#include "core/options.h"

namespace {

using osft::api_call;
using osft::init_struct;
using osft::raise;
using osft::require;

}  // namespace

extern "C" {

OSFT_API osft_status_t osft_device_count(osft_device_type_t type, int *count) {
  return api_call("osft_device_count", [&] {
    require(count, "count");
    int n = 0;
    switch (osft::raw_enum(type)) {
      case OSFT_DEVICE_CPU: n = 1; break;
      case OSFT_DEVICE_CUDA: n = osft::cuda::device_count(); break;
      default:
        raise(OSFT_STATUS_INVALID_ARGUMENT, "type: %d is not an osft_device_type_t",
              osft::raw_enum(type));
    }
    *count = n;
    return OSFT_STATUS_SUCCESS;
  });
}

OSFT_API osft_status_t osft_allocator_init(osft_allocator_t *allocator,
                                           size_t struct_size) {
  return api_call("osft_allocator_init", [&] {
    osft_allocator_t defaults{};
    return init_struct(allocator, struct_size, defaults,
                       OSFTI_V1_SIZE(osft_allocator_t, device_free), "allocator",
                       "osft_allocator_t");
  });
}

OSFT_API osft_status_t osft_context_options_init(osft_context_options_t *opts,
                                                 size_t struct_size) {
  return api_call("osft_context_options_init", [&] {
    osft_context_options_t defaults{};
    defaults.device_type = OSFT_DEVICE_CPU;
    return init_struct(opts, struct_size, defaults,
                       OSFTI_V1_SIZE(osft_context_options_t, workspace_limit), "opts",
                       "osft_context_options_t");
  });
}

OSFT_API osft_status_t osft_context_create(osft_context_t *ctx,
                                           const osft_context_options_t *opts) {
  return api_call("osft_context_create", [&] {
    require(ctx, "ctx");
    *ctx = osft::create_context(opts);
    return OSFT_STATUS_SUCCESS;
  });
}

OSFT_API osft_status_t osft_context_destroy(osft_context_t ctx) {
  return api_call("osft_context_destroy", [&] {
    if (ctx == nullptr) return OSFT_STATUS_SUCCESS;
    if (osft::is_live_handle(ctx, osft::HandleKind::context) && ctx->live_children > 0)
      raise(OSFT_STATUS_INVALID_ARGUMENT,
            "ctx: %d handle(s) created from this context are still alive; destroy them "
            "first",
            ctx->live_children);
    if (!osft::unregister_handle(ctx, osft::HandleKind::context))
      raise(OSFT_STATUS_INVALID_HANDLE,
            "ctx: not a live context handle (destroyed, or not created by "
            "libosftrt)");
    osft::destroy_context(ctx);
    return OSFT_STATUS_SUCCESS;
  });
}

OSFT_API osft_status_t osft_context_get_device(osft_context_t ctx,
                                               osft_device_type_t *type, int *device_id) {
  return api_call("osft_context_get_device", [&] {
    const osft::Context &c = osft::checked_context(ctx, "ctx");
    if (type != nullptr) *type = c.device_type;
    if (device_id != nullptr) *device_id = c.device_id;
    return OSFT_STATUS_SUCCESS;
  });
}

OSFT_API osft_status_t osft_context_set_stream(osft_context_t ctx, void *stream) {
  return api_call("osft_context_set_stream", [&] {
    osft::set_stream(osft::checked_context(ctx, "ctx"), stream);
    return OSFT_STATUS_SUCCESS;
  });
}

OSFT_API osft_status_t osft_context_get_stream(osft_context_t ctx, void **stream) {
  return api_call("osft_context_get_stream", [&] {
    const osft::Context &c = osft::checked_context(ctx, "ctx");
    require(stream, "stream");
    *stream = c.stream;
    return OSFT_STATUS_SUCCESS;
  });
}

OSFT_API osft_status_t osft_context_synchronize(osft_context_t ctx) {
  return api_call("osft_context_synchronize", [&] {
    osft::synchronize(osft::checked_context(ctx, "ctx"));
    return OSFT_STATUS_SUCCESS;
  });
}

OSFT_API osft_status_t osft_context_reserve_workspace(osft_context_t ctx, size_t bytes) {
  return api_call("osft_context_reserve_workspace", [&] {
    osft::workspace(osft::checked_context(ctx, "ctx"), bytes);
    return OSFT_STATUS_SUCCESS;
  });
}

OSFT_API osft_status_t osft_context_release_workspace(osft_context_t ctx) {
  return api_call("osft_context_release_workspace", [&] {
    osft::Context &c = osft::checked_context(ctx, "ctx");
    osft::synchronize(c);
    osft::release_workspace(c);
    return OSFT_STATUS_SUCCESS;
  });
}

OSFT_API osft_status_t osft_context_get_workspace_size(osft_context_t ctx,
                                                       size_t *bytes) {
  return api_call("osft_context_get_workspace_size", [&] {
    const osft::Context &c = osft::checked_context(ctx, "ctx");
    require(bytes, "bytes");
    *bytes = c.workspace_bytes;
    return OSFT_STATUS_SUCCESS;
  });
}

OSFT_API osft_status_t osft_memory_stats_init(osft_memory_stats_t *stats,
                                              size_t struct_size) {
  return api_call("osft_memory_stats_init", [&] {
    return osft::init_output_struct(stats, struct_size,
                                    OSFTI_V1_SIZE(osft_memory_stats_t, workspace_bytes),
                                    "stats", "osft_memory_stats_t");
  });
}

OSFT_API osft_status_t osft_context_get_memory_stats(osft_context_t ctx,
                                                     osft_memory_stats_t *stats) {
  return api_call("osft_context_get_memory_stats", [&] {
    const osft::Context &c = osft::checked_context(ctx, "ctx");
    require(stats, "stats");
    osft::check_struct_size("stats", "osft_memory_stats_t", stats->struct_size,
                            OSFTI_V1_SIZE(osft_memory_stats_t, workspace_bytes));
    const osft::MemoryCounters &m = c.allocator.counters();
    osft_memory_stats_t out{};
    out.host_in_use = m.host_in_use;
    out.host_peak = m.host_peak;
    out.device_in_use = m.device_in_use;
    out.device_peak = m.device_peak;
    out.host_allocs = m.host_allocs;
    out.device_allocs = m.device_allocs;
    out.workspace_bytes = c.workspace_bytes;
    osft::write_struct(stats, stats->struct_size, out);
    return OSFT_STATUS_SUCCESS;
  });
}

OSFT_API osft_status_t osft_context_reset_peak_memory(osft_context_t ctx) {
  return api_call("osft_context_reset_peak_memory", [&] {
    osft::checked_context(ctx, "ctx").allocator.reset_peaks();
    return OSFT_STATUS_SUCCESS;
  });
}

OSFT_API osft_status_t osft_set_num_threads(int n) {
  return api_call("osft_set_num_threads", [&] {
    if (n < 0)
      raise(OSFT_STATUS_INVALID_ARGUMENT,
            "n: %d is negative; pass a thread count from 1 to %d, or 0 for the "
            "automatic count",
            n, osft::blas::kMaxThreads);
    if (n > osft::blas::kMaxThreads)
      raise(OSFT_STATUS_INVALID_ARGUMENT, "n: %d is above the limit of %d threads", n,
            osft::blas::kMaxThreads);
    osft::blas::set_num_threads(n);
    return OSFT_STATUS_SUCCESS;
  });
}

OSFT_API osft_status_t osft_get_num_threads(int *n) {
  return api_call("osft_get_num_threads", [&] {
    require(n, "n");
    *n = osft::blas::num_threads();
    return OSFT_STATUS_SUCCESS;
  });
}

}  // extern "C"
