/* C ABI: the OSFT gradient projector. */
#include "osftrt/projection.h"

#include "capi/capi_util.h"
#include "core/handle.h"
#include "ops/projection_ops.h"

namespace {

using osft::api_call;
using osft::init_struct;
using osft::raise;
using osft::require;

constexpr size_t kTargetV1 = OSFTI_V1_SIZE(osft_projection_target_t, n_v_shards);
constexpr size_t kInfoV1 = OSFTI_V1_SIZE(osft_projector_info_t, setup_pending);

osft_projection_target_t default_target() {
  osft_projection_target_t t{};
  t.struct_size = sizeof t;
  t.u_layout = OSFT_SHARD_REPLICATED;
  t.v_layout = OSFT_SHARD_REPLICATED;
  return t;
}

}  // namespace

extern "C" {

OSFT_API osft_status_t osft_projector_options_init(osft_projector_options_t *opts,
                                                   size_t struct_size) {
  return api_call("osft_projector_options_init", [&] {
    return init_struct(opts, struct_size, osft::read_projector_options(nullptr),
                       OSFTI_V1_SIZE(osft_projector_options_t, check_consistency), "opts",
                       "osft_projector_options_t");
  });
}

OSFT_API osft_status_t osft_projection_target_init(osft_projection_target_t *target,
                                                   size_t struct_size) {
  return api_call("osft_projection_target_init", [&] {
    return init_struct(target, struct_size, default_target(), kTargetV1, "target",
                       "osft_projection_target_t");
  });
}

OSFT_API osft_status_t osft_projector_create(osft_context_t ctx, osft_comm_t comm,
                                             const osft_projector_options_t *opts,
                                             osft_projector_t *projector) {
  return api_call("osft_projector_create", [&] {
    osft::Context &c = osft::checked_context(ctx, "ctx");
    osft::Comm *cm = comm != nullptr ? &osft::checked_comm(comm, "comm") : nullptr;
    require(projector, "projector");
    const osft_projector_options_t o = osft::read_projector_options(opts);
    *projector = osft::create_projector(c, cm, o);
    return OSFT_STATUS_SUCCESS;
  });
}

OSFT_API osft_status_t osft_projector_destroy(osft_projector_t projector) {
  return api_call("osft_projector_destroy", [&] {
    if (projector == nullptr) return OSFT_STATUS_SUCCESS;
    if (!osft::unregister_handle(projector, osft::HandleKind::projector))
      raise(OSFT_STATUS_INVALID_HANDLE,
            "projector: not a live projector handle (destroyed, or not created by "
            "libosftrt)");
    osft::destroy_projector(projector);
    return OSFT_STATUS_SUCCESS;
  });
}

OSFT_API osft_status_t osft_projector_add_target(osft_projector_t projector,
                                                 const osft_projection_target_t *target,
                                                 int64_t *index) {
  return api_call("osft_projector_add_target", [&] {
    osft::Projector &p = osft::checked_projector(projector, "projector");
    require(target, "target");
    const osft_projection_target_t t = osft::read_struct(
        target, default_target(), kTargetV1, "target", "osft_projection_target_t");
    const int64_t i = osft::add_target(p, t);
    if (index != nullptr) *index = i;
    return OSFT_STATUS_SUCCESS;
  });
}

OSFT_API osft_status_t osft_projector_add_layer(osft_projector_t projector,
                                                osft_flinear_t layer,
                                                const DLTensor *grad_u_low,
                                                const DLTensor *grad_v_low,
                                                int64_t *index) {
  return api_call("osft_projector_add_layer", [&] {
    osft::Projector &p = osft::checked_projector(projector, "projector");
    osft::Layer &l = osft::checked_layer(layer, "layer");
    const int64_t i = osft::add_layer(p, l, grad_u_low, grad_v_low);
    if (index != nullptr) *index = i;
    return OSFT_STATUS_SUCCESS;
  });
}

OSFT_API osft_status_t osft_projector_set_grads(osft_projector_t projector, int64_t index,
                                                const DLTensor *grad_u_low,
                                                const DLTensor *grad_v_low) {
  return api_call("osft_projector_set_grads", [&] {
    osft::set_grads(osft::checked_projector(projector, "projector"), index, grad_u_low,
                    grad_v_low);
    return OSFT_STATUS_SUCCESS;
  });
}

OSFT_API osft_status_t osft_projector_prepare(osft_projector_t projector) {
  return api_call("osft_projector_prepare", [&] {
    osft::prepare(osft::checked_projector(projector, "projector"));
    return OSFT_STATUS_SUCCESS;
  });
}

OSFT_API osft_status_t osft_projector_invalidate(osft_projector_t projector) {
  return api_call("osft_projector_invalidate", [&] {
    osft::invalidate(osft::checked_projector(projector, "projector"));
    return OSFT_STATUS_SUCCESS;
  });
}

OSFT_API osft_status_t osft_projector_project(osft_projector_t projector) {
  return api_call("osft_projector_project", [&] {
    osft::project(osft::checked_projector(projector, "projector"), osft::Operands::grads);
    return OSFT_STATUS_SUCCESS;
  });
}

OSFT_API osft_status_t osft_projector_project_params(osft_projector_t projector) {
  return api_call("osft_projector_project_params", [&] {
    osft::project(osft::checked_projector(projector, "projector"),
                  osft::Operands::params);
    return OSFT_STATUS_SUCCESS;
  });
}

OSFT_API osft_status_t osft_projector_orthogonality(osft_projector_t projector,
                                                    double *max_u, double *max_v) {
  return api_call("osft_projector_orthogonality", [&] {
    double u = 0.0, v = 0.0;
    osft::orthogonality(osft::checked_projector(projector, "projector"), &u, &v);
    if (max_u != nullptr) *max_u = u;
    if (max_v != nullptr) *max_v = v;
    return OSFT_STATUS_SUCCESS;
  });
}

OSFT_API osft_status_t osft_projector_info_init(osft_projector_info_t *info,
                                                size_t struct_size) {
  return api_call("osft_projector_info_init", [&] {
    return osft::init_output_struct(info, struct_size, kInfoV1, "info",
                                    "osft_projector_info_t");
  });
}

OSFT_API osft_status_t osft_projector_get_info(osft_projector_t projector,
                                               osft_projector_info_t *info) {
  return api_call("osft_projector_get_info", [&] {
    const osft::Projector &p = osft::checked_projector(projector, "projector");
    require(info, "info");
    osft::check_struct_size("info", "osft_projector_info_t", info->struct_size, kInfoV1);
    osft_projector_info_t out{};
    out.struct_size = sizeof out;
    out.targets = static_cast<int64_t>(p.targets.size());
    out.reduced_elements = p.reduced;
    out.collectives_per_project = p.comm != nullptr && p.reduced > 0 ? 1 : 0;
    out.coefficient_bytes = p.coef_bytes;
    out.gathered_bytes = p.cache_bytes;
    out.setup_pending = p.setup_pending ? 1 : 0;
    out.last_gemms = p.last.gemms;
    out.last_gemm_calls = p.last.gemm_calls;
    out.last_elementwise_calls = p.last.elementwise;
    out.last_collectives = p.last.collectives;
    out.last_host_waits = p.last.host_waits;
    osft::write_struct(info, info->struct_size, out);
    return OSFT_STATUS_SUCCESS;
  });
}

}  // extern "C"
