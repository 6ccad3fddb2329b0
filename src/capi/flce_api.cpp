/* C ABI: fused linear cross-entropy. */
#include "osftrt/flce.h"

#include "core/context_impl.h"
#include "core/error.h"
#include "core/handle.h"
#include "core/options.h"
#include "capi/capi_util.h"
#include "ops/flce_ops.h"

namespace {

using osft::api_call;
using osft::init_struct;
using osft::raise;
using osft::require;

constexpr size_t kOptionsV1 = OSFTI_V1_SIZE(osft_flce_options_t, chunk_rows);
constexpr size_t kInputsV1 = OSFTI_V1_SIZE(osft_flce_inputs_t, grad_loss);
constexpr size_t kOutputsV1 = OSFTI_V1_SIZE(osft_flce_outputs_t, accumulate);
constexpr size_t kPlanV1 = OSFTI_V1_SIZE(osft_flce_plan_t, budget_bytes);

/* The caller's inputs and outputs, read and checked for the struct layer. */
struct Args {
  osft_flce_inputs_t in;
  osft_flce_outputs_t out;
};

Args read_args(const osft_flce_inputs_t *in, const osft_flce_outputs_t *out) {
  require(in, "in");
  require(out, "out");
  Args a{
      osft::read_struct(in, osft_flce_inputs_t{}, kInputsV1, "in", "osft_flce_inputs_t"),
      osft::read_struct(out, osft_flce_outputs_t{}, kOutputsV1, "out",
                        "osft_flce_outputs_t")};
  if ((a.out.accumulate & ~OSFT_FLCE_ACCUMULATE_ALL) != 0)
    raise(OSFT_STATUS_INVALID_ARGUMENT, "out->accumulate: unknown bits 0x%x",
          a.out.accumulate & ~OSFT_FLCE_ACCUMULATE_ALL);
  return a;
}

}  // namespace

extern "C" {

OSFT_API osft_status_t osft_flce_options_init(osft_flce_options_t *opts,
                                              size_t struct_size) {
  return api_call("osft_flce_options_init", [&] {
    return init_struct(opts, struct_size, osft::read_flce_options(nullptr), kOptionsV1,
                       "opts", "osft_flce_options_t");
  });
}

OSFT_API osft_status_t osft_flce_inputs_init(osft_flce_inputs_t *in, size_t struct_size) {
  return api_call("osft_flce_inputs_init", [&] {
    return init_struct(in, struct_size, osft_flce_inputs_t{}, kInputsV1, "in",
                       "osft_flce_inputs_t");
  });
}

OSFT_API osft_status_t osft_flce_outputs_init(osft_flce_outputs_t *out,
                                              size_t struct_size) {
  return api_call("osft_flce_outputs_init", [&] {
    return init_struct(out, struct_size, osft_flce_outputs_t{}, kOutputsV1, "out",
                       "osft_flce_outputs_t");
  });
}

OSFT_API osft_status_t osft_flce_create(osft_context_t ctx,
                                        const osft_flce_options_t *opts,
                                        osft_flce_t *flce) {
  return api_call("osft_flce_create", [&] {
    osft::Context &c = osft::checked_context(ctx, "ctx");
    require(flce, "flce");
    *flce = osft::create_flce(c, osft::read_flce_options(opts));
    return OSFT_STATUS_SUCCESS;
  });
}

OSFT_API osft_status_t osft_flce_destroy(osft_flce_t flce) {
  return api_call("osft_flce_destroy", [&] {
    if (flce == nullptr) return OSFT_STATUS_SUCCESS;
    if (!osft::unregister_handle(flce, osft::HandleKind::flce))
      raise(OSFT_STATUS_INVALID_HANDLE,
            "flce: not a live fused linear cross-entropy handle (destroyed, or not "
            "created by libosftrt)");
    osft::destroy_flce(flce);
    return OSFT_STATUS_SUCCESS;
  });
}

OSFT_API osft_status_t osft_flce_get_options(osft_flce_t flce,
                                             osft_flce_options_t *opts) {
  return api_call("osft_flce_get_options", [&] {
    const osft::Flce &f = osft::checked_flce(flce, "flce");
    require(opts, "opts");
    osft::check_struct_size("opts", "osft_flce_options_t", opts->struct_size, kOptionsV1);
    osft::write_struct(opts, opts->struct_size, f.opts);
    return OSFT_STATUS_SUCCESS;
  });
}

OSFT_API osft_status_t osft_flce_compute(osft_flce_t flce, const osft_flce_inputs_t *in,
                                         const osft_flce_outputs_t *out) {
  return api_call("osft_flce_compute", [&] {
    osft::Flce &f = osft::checked_flce(flce, "flce");
    const Args a = read_args(in, out);
    osft::compute(f, a.in, a.out);
    return OSFT_STATUS_SUCCESS;
  });
}

OSFT_API osft_status_t osft_flce_check_targets(osft_flce_t flce) {
  return api_call("osft_flce_check_targets", [&] {
    osft::check_targets_record(osft::checked_flce(flce, "flce"));
    return OSFT_STATUS_SUCCESS;
  });
}

OSFT_API osft_status_t osft_flce_plan_init(osft_flce_plan_t *plan, size_t struct_size) {
  return api_call("osft_flce_plan_init", [&] {
    return osft::init_output_struct(plan, struct_size, kPlanV1, "plan",
                                    "osft_flce_plan_t");
  });
}

OSFT_API osft_status_t osft_flce_get_plan(osft_flce_t flce, const osft_flce_inputs_t *in,
                                          const osft_flce_outputs_t *out,
                                          osft_flce_plan_t *plan) {
  return api_call("osft_flce_get_plan", [&] {
    const osft::Flce &f = osft::checked_flce(flce, "flce");
    const Args a = read_args(in, out);
    require(plan, "plan");
    osft::check_struct_size("plan", "osft_flce_plan_t", plan->struct_size, kPlanV1);
    const osft::FlceCall call = osft::check_call(f, a.in, a.out);
    const osft::FlcePlan p = osft::plan_call(f, call);
    osft_flce_plan_t info{};
    info.tokens = call.m;
    info.chunk_rows = p.chunk_rows;
    info.chunks = p.chunks;
    info.scratch_bytes = p.scratch.bytes();
    info.budget_bytes = p.budget;
    info.chunking = p.vocab ? OSFT_FLCE_CHUNKING_VOCAB : OSFT_FLCE_CHUNKING_TOKENS;
    info.slices = p.slices;
    info.slice_cols = p.slice_cols;
    osft::write_struct(plan, plan->struct_size, info);
    return OSFT_STATUS_SUCCESS;
  });
}

}  // extern "C"
