/* C ABI: the factorized-linear (OSFT) layer. */
#include "osftrt/flinear.h"

#include "capi/capi_util.h"
#include "core/context_impl.h"
#include "core/error.h"
#include "core/handle.h"
#include "core/options.h"
#include "ops/flinear_ops.h"

namespace {

using osft::api_call;
using osft::init_struct;
using osft::raise;
using osft::require;

constexpr size_t kFactorsV1 = OSFTI_V1_SIZE(osft_flinear_factors_t, v_low);
constexpr size_t kGradsV1 = OSFTI_V1_SIZE(osft_flinear_grads_t, accumulate);
constexpr size_t kInfoV1 = OSFTI_V1_SIZE(osft_flinear_info_t, weight_kept);

}  // namespace

extern "C" {

OSFT_API osft_status_t osft_flinear_options_init(osft_flinear_options_t *opts,
                                                 size_t struct_size) {
  return api_call("osft_flinear_options_init", [&] {
    return init_struct(opts, struct_size, osft::read_flinear_options(nullptr),
                       OSFTI_V1_SIZE(osft_flinear_options_t, factor_dtype), "opts",
                       "osft_flinear_options_t");
  });
}

OSFT_API osft_status_t osft_flinear_factors_init(osft_flinear_factors_t *factors,
                                                 size_t struct_size) {
  return api_call("osft_flinear_factors_init", [&] {
    return init_struct(factors, struct_size, osft_flinear_factors_t{}, kFactorsV1,
                       "factors", "osft_flinear_factors_t");
  });
}

OSFT_API osft_status_t osft_flinear_grads_init(osft_flinear_grads_t *grads,
                                               size_t struct_size) {
  return api_call("osft_flinear_grads_init", [&] {
    return init_struct(grads, struct_size, osft_flinear_grads_t{}, kGradsV1, "grads",
                       "osft_flinear_grads_t");
  });
}

OSFT_API osft_status_t osft_flinear_create_from_weight(osft_context_t ctx,
                                                       const DLTensor *weight,
                                                       const osft_flinear_options_t *opts,
                                                       osft_flinear_t *layer) {
  return api_call("osft_flinear_create_from_weight", [&] {
    osft::Context &c = osft::checked_context(ctx, "ctx");
    require(layer, "layer");
    if (weight == nullptr) raise(OSFT_STATUS_INVALID_ARGUMENT, "weight: NULL tensor");
    *layer = osft::create_from_weight(c, weight, osft::read_flinear_options(opts));
    return OSFT_STATUS_SUCCESS;
  });
}

OSFT_API osft_status_t osft_flinear_create_from_factors(
    osft_context_t ctx, const osft_flinear_factors_t *factors,
    const osft_flinear_options_t *opts, osft_flinear_t *layer) {
  return api_call("osft_flinear_create_from_factors", [&] {
    osft::Context &c = osft::checked_context(ctx, "ctx");
    require(layer, "layer");
    require(factors, "factors");
    const osft_flinear_factors_t f =
        osft::read_struct(factors, osft_flinear_factors_t{}, kFactorsV1, "factors",
                          "osft_flinear_factors_t");
    *layer = osft::create_from_factors(c, f, osft::read_flinear_options(opts));
    return OSFT_STATUS_SUCCESS;
  });
}

OSFT_API osft_status_t osft_flinear_destroy(osft_flinear_t layer) {
  return api_call("osft_flinear_destroy", [&] {
    if (layer == nullptr) return OSFT_STATUS_SUCCESS;
    if (!osft::unregister_handle(layer, osft::HandleKind::flinear))
      raise(OSFT_STATUS_INVALID_HANDLE,
            "layer: not a live flinear layer handle (destroyed, or not created by "
            "libosftrt)");
    osft::destroy_layer(layer);
    return OSFT_STATUS_SUCCESS;
  });
}

OSFT_API osft_status_t osft_flinear_get_dims(osft_flinear_t layer, int64_t *out_features,
                                             int64_t *in_features, int64_t *frozen_rank,
                                             int64_t *trainable_rank) {
  return api_call("osft_flinear_get_dims", [&] {
    const osft::Layer &l = osft::checked_layer(layer, "layer");
    if (out_features != nullptr) *out_features = l.n;
    if (in_features != nullptr) *in_features = l.kin;
    if (frozen_rank != nullptr) *frozen_rank = l.r;
    if (trainable_rank != nullptr) *trainable_rank = l.l;
    return OSFT_STATUS_SUCCESS;
  });
}

OSFT_API osft_status_t osft_flinear_get_factor(osft_flinear_t layer,
                                               osft_flinear_factor_t which,
                                               DLTensor *view) {
  return api_call("osft_flinear_get_factor", [&] {
    osft::Layer &l = osft::checked_layer(layer, "layer");
    require(view, "view");
    osft::get_factor(l, osft::raw_enum(which), view);
    return OSFT_STATUS_SUCCESS;
  });
}

OSFT_API osft_status_t osft_flinear_mark_updated(osft_flinear_t layer) {
  return api_call("osft_flinear_mark_updated", [&] {
    osft::Layer &l = osft::checked_layer(layer, "layer");
    ++l.trainable_version;
    return OSFT_STATUS_SUCCESS;
  });
}

OSFT_API osft_status_t osft_flinear_info_init(osft_flinear_info_t *info,
                                              size_t struct_size) {
  return api_call("osft_flinear_info_init", [&] {
    return osft::init_output_struct(info, struct_size, kInfoV1, "info",
                                    "osft_flinear_info_t");
  });
}

OSFT_API osft_status_t osft_flinear_get_info(osft_flinear_t layer,
                                             osft_flinear_info_t *info) {
  return api_call("osft_flinear_get_info", [&] {
    const osft::Layer &l = osft::checked_layer(layer, "layer");
    require(info, "info");
    osft::check_struct_size("info", "osft_flinear_info_t", info->struct_size, kInfoV1);
    osft_flinear_info_t out{};
    out.struct_size = sizeof out;
    out.rebuilds = l.rebuilds;
    out.frozen_builds = l.frozen_builds;
    out.trainable_version = l.trainable_version;
    out.weight_kept = l.w_cur != nullptr && l.w_cur_valid ? 1 : 0;
    osft::write_struct(info, info->struct_size, out);
    return OSFT_STATUS_SUCCESS;
  });
}

OSFT_API osft_status_t osft_flinear_set_strategy(osft_flinear_t layer,
                                                 osft_flinear_strategy_t strategy) {
  return api_call("osft_flinear_set_strategy", [&] {
    osft::Layer &l = osft::checked_layer(layer, "layer");
    const int s = osft::raw_enum(strategy);
    if (s < OSFT_FLINEAR_AUTO || s > OSFT_FLINEAR_HYBRID)
      raise(OSFT_STATUS_INVALID_ARGUMENT,
            "strategy: %d is not an osft_flinear_strategy_t", s);
    l.strategy = strategy;
    return OSFT_STATUS_SUCCESS;
  });
}

OSFT_API osft_status_t osft_flinear_choose_strategy(osft_flinear_t layer, int64_t tokens,
                                                    osft_flinear_pass_t pass,
                                                    osft_flinear_strategy_t *chosen) {
  return api_call("osft_flinear_choose_strategy", [&] {
    const osft::Layer &l = osft::checked_layer(layer, "layer");
    require(chosen, "chosen");
    if (tokens < 0)
      raise(OSFT_STATUS_INVALID_ARGUMENT, "tokens: %lld is negative",
            static_cast<long long>(tokens));
    const int p = osft::raw_enum(pass);
    if (p != OSFT_FLINEAR_FORWARD && p != OSFT_FLINEAR_BACKWARD)
      raise(OSFT_STATUS_INVALID_ARGUMENT, "pass: %d is not an osft_flinear_pass_t", p);
    *chosen = osft::choose_strategy(l, tokens, pass, osft::GradRequest{}, l.factor_dtype);
    return OSFT_STATUS_SUCCESS;
  });
}

OSFT_API osft_status_t osft_flinear_forward(osft_flinear_t layer, const DLTensor *x,
                                            const DLTensor *bias, DLTensor *y) {
  return api_call("osft_flinear_forward", [&] {
    osft::forward(osft::checked_layer(layer, "layer"), x, bias, y);
    return OSFT_STATUS_SUCCESS;
  });
}

OSFT_API osft_status_t osft_flinear_backward(osft_flinear_t layer, const DLTensor *x,
                                             const DLTensor *grad_y,
                                             const osft_flinear_grads_t *grads) {
  return api_call("osft_flinear_backward", [&] {
    osft::Layer &l = osft::checked_layer(layer, "layer");
    require(grads, "grads");
    const osft_flinear_grads_t g = osft::read_struct(
        grads, osft_flinear_grads_t{}, kGradsV1, "grads", "osft_flinear_grads_t");
    if ((g.accumulate & ~OSFT_FLINEAR_ACCUMULATE_ALL) != 0)
      raise(OSFT_STATUS_INVALID_ARGUMENT, "grads->accumulate: unknown bits 0x%x",
            g.accumulate & ~OSFT_FLINEAR_ACCUMULATE_ALL);
    osft::backward(l, x, grad_y, g);
    return OSFT_STATUS_SUCCESS;
  });
}

OSFT_API osft_status_t osft_flinear_merge(osft_flinear_t layer, DLTensor *weight) {
  return api_call("osft_flinear_merge", [&] {
    osft::merge(osft::checked_layer(layer, "layer"), weight);
    return OSFT_STATUS_SUCCESS;
  });
}

OSFT_API osft_status_t osft_flinear_redecompose(osft_flinear_t layer,
                                                const DLTensor *weight) {
  return api_call("osft_flinear_redecompose", [&] {
    osft::redecompose(osft::checked_layer(layer, "layer"), weight);
    return OSFT_STATUS_SUCCESS;
  });
}

OSFT_API osft_status_t osft_flinear_refresh(osft_flinear_t layer) {
  return api_call("osft_flinear_refresh", [&] {
    osft::refresh(osft::checked_layer(layer, "layer"));
    return OSFT_STATUS_SUCCESS;
  });
}

}  // extern "C"

/* Test hook (tests/c, INTERNAL): the layer behaves as on a backend without
 * fingerprints (CUDA), so that the CPU exercises the reported-version path. */
extern "C" void osfti_flinear_test_disable_fingerprints(osft_flinear_t layer) {
  if (layer != nullptr) layer->fingerprints_off = true;
}
