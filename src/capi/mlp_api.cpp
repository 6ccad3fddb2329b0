/* C ABI: the tiled MLP. */
#include "osftrt/mlp.h"

#include "capi/capi_util.h"
#include "core/context_impl.h"
#include "core/error.h"
#include "core/handle.h"
#include "core/options.h"
#include "ops/mlp_ops.h"

namespace {

using osft::api_call;
using osft::init_struct;
using osft::raise;
using osft::require;

constexpr size_t kWeightsV1 = OSFTI_V1_SIZE(osft_mlp_weights_t, down_bias);
constexpr size_t kOptionsV1 = OSFTI_V1_SIZE(osft_mlp_options_t, dtype);
constexpr size_t kGradsV1 = OSFTI_V1_SIZE(osft_mlp_grads_t, accumulate);
constexpr size_t kPlanV1 = OSFTI_V1_SIZE(osft_mlp_plan_t, kept_bytes);

}  // namespace

extern "C" {

OSFT_API osft_status_t osft_mlp_weights_init(osft_mlp_weights_t *weights,
                                             size_t struct_size) {
  return api_call("osft_mlp_weights_init", [&] {
    return init_struct(weights, struct_size, osft_mlp_weights_t{}, kWeightsV1, "weights",
                       "osft_mlp_weights_t");
  });
}

OSFT_API osft_status_t osft_mlp_options_init(osft_mlp_options_t *opts,
                                             size_t struct_size) {
  return api_call("osft_mlp_options_init", [&] {
    return init_struct(opts, struct_size, osft::mlp::read_mlp_options(nullptr),
                       kOptionsV1, "opts", "osft_mlp_options_t");
  });
}

OSFT_API osft_status_t osft_mlp_grads_init(osft_mlp_grads_t *grads, size_t struct_size) {
  return api_call("osft_mlp_grads_init", [&] {
    return init_struct(grads, struct_size, osft_mlp_grads_t{}, kGradsV1, "grads",
                       "osft_mlp_grads_t");
  });
}

OSFT_API osft_status_t osft_mlp_create(osft_context_t ctx, osft_mlp_variant_t variant,
                                       int64_t hidden, int64_t intermediate,
                                       const osft_mlp_weights_t *weights,
                                       const osft_mlp_options_t *opts, osft_mlp_t *mlp) {
  return api_call("osft_mlp_create", [&] {
    osft::Context &c = osft::checked_context(ctx, "ctx");
    require(mlp, "mlp");
    require(weights, "weights");
    const osft_mlp_weights_t w = osft::read_struct(
        weights, osft_mlp_weights_t{}, kWeightsV1, "weights", "osft_mlp_weights_t");
    *mlp = osft::mlp::create_mlp(c, osft::raw_enum(variant), hidden, intermediate, w,
                                 osft::mlp::read_mlp_options(opts));
    return OSFT_STATUS_SUCCESS;
  });
}

OSFT_API osft_status_t osft_mlp_destroy(osft_mlp_t mlp) {
  return api_call("osft_mlp_destroy", [&] {
    if (mlp == nullptr) return OSFT_STATUS_SUCCESS;
    if (!osft::unregister_handle(mlp, osft::HandleKind::mlp))
      raise(OSFT_STATUS_INVALID_HANDLE,
            "mlp: not a live MLP handle (destroyed, or not created by libosftrt)");
    osft::mlp::destroy_mlp(mlp);
    return OSFT_STATUS_SUCCESS;
  });
}

OSFT_API osft_status_t osft_mlp_get_tile_count(osft_mlp_t mlp, int64_t tokens,
                                               int64_t *num_tiles, int64_t *tile_tokens) {
  return api_call("osft_mlp_get_tile_count", [&] {
    const osft::mlp::Mlp &m = osft::mlp::checked_mlp(mlp, "mlp");
    require(num_tiles, "num_tiles");
    if (tokens < 0)
      raise(OSFT_STATUS_INVALID_ARGUMENT, "tokens: %lld is negative",
            static_cast<long long>(tokens));
    const osft::mlp::Tiling t = osft::mlp::plan_tiles(m, tokens, 0);
    *num_tiles = t.count;
    if (tile_tokens != nullptr) *tile_tokens = t.max_rows;
    return OSFT_STATUS_SUCCESS;
  });
}

OSFT_API osft_status_t osft_mlp_plan_init(osft_mlp_plan_t *plan, size_t struct_size) {
  return api_call("osft_mlp_plan_init", [&] {
    return osft::init_output_struct(plan, struct_size, kPlanV1, "plan",
                                    "osft_mlp_plan_t");
  });
}

OSFT_API osft_status_t osft_mlp_get_plan(osft_mlp_t mlp, int64_t tokens,
                                         int64_t num_tiles, osft_mlp_plan_t *plan) {
  return api_call("osft_mlp_get_plan", [&] {
    const osft::mlp::Mlp &m = osft::mlp::checked_mlp(mlp, "mlp");
    require(plan, "plan");
    if (tokens < 0)
      raise(OSFT_STATUS_INVALID_ARGUMENT, "tokens: %lld is negative",
            static_cast<long long>(tokens));
    if (num_tiles < 0)
      raise(OSFT_STATUS_INVALID_ARGUMENT, "num_tiles: %lld is negative (0: automatic)",
            static_cast<long long>(num_tiles));
    osft::check_struct_size("plan", "osft_mlp_plan_t", plan->struct_size, kPlanV1);
    const osft::mlp::Tiling t = osft::mlp::plan_tiles(m, tokens, num_tiles);
    const bool keep = osft::mlp::keeps_outputs(m, tokens);
    osft_mlp_plan_t out{};
    out.struct_size = sizeof out;
    out.num_tiles = t.count;
    out.tile_tokens = t.max_rows;
    out.recompute = keep || tokens == 0 ? 0 : 1;
    out.kept_bytes = keep ? osft::mlp::kept_bytes_for(m, tokens) : 0;
    osft::write_struct(plan, plan->struct_size, out);
    return OSFT_STATUS_SUCCESS;
  });
}

OSFT_API osft_status_t osft_mlp_forward(osft_mlp_t mlp, const DLTensor *x, DLTensor *y,
                                        int64_t num_tiles) {
  return api_call("osft_mlp_forward", [&] {
    osft::mlp::mlp_forward(osft::mlp::checked_mlp(mlp, "mlp"), x, y, num_tiles);
    return OSFT_STATUS_SUCCESS;
  });
}

OSFT_API osft_status_t osft_mlp_backward(osft_mlp_t mlp, const DLTensor *x,
                                         const DLTensor *grad_y,
                                         const osft_mlp_grads_t *grads,
                                         int64_t num_tiles) {
  return api_call("osft_mlp_backward", [&] {
    osft::mlp::Mlp &m = osft::mlp::checked_mlp(mlp, "mlp");
    require(grads, "grads");
    const osft_mlp_grads_t g = osft::read_struct(grads, osft_mlp_grads_t{}, kGradsV1,
                                                 "grads", "osft_mlp_grads_t");
    osft::mlp::mlp_backward(m, x, grad_y, g, num_tiles);
    return OSFT_STATUS_SUCCESS;
  });
}

}  // extern "C"
