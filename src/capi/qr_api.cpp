/* C ABI: batched QR. */
#include "osftrt/qr.h"

#include "capi/capi_util.h"
#include "core/context_impl.h"
#include "ops/qr_ops.h"

namespace {

using osft::api_call;
using osft::raise;

osft_status_t run(osft_context_t ctx, const osft_qr_options_t *opts, size_t count,
                  const DLTensor *const *a, DLTensor *const *q, DLTensor *const *r,
                  int iterations, osft_status_t *per_matrix_status) {
  osft::Context &c = osft::checked_context(ctx, "ctx");
  osft::QrList list;
  list.count = count;
  list.a = a;
  list.q = q;
  list.r = r;
  list.iterations = iterations;
  osft::run_qr(c, osft::read_qr_options(opts), list, per_matrix_status);
  return OSFT_STATUS_SUCCESS;
}

}  // namespace

extern "C" {

OSFT_API osft_status_t osft_qr_options_init(osft_qr_options_t *opts, size_t struct_size) {
  return api_call("osft_qr_options_init", [&] {
    return osft::init_struct(opts, struct_size, osft::read_qr_options(nullptr),
                             OSFTI_V1_SIZE(osft_qr_options_t, max_concurrency), "opts",
                             "osft_qr_options_t");
  });
}

OSFT_API osft_status_t osft_qr_batch(osft_context_t ctx, const osft_qr_options_t *opts,
                                     size_t count, const DLTensor *const *a,
                                     DLTensor *const *q, DLTensor *const *r,
                                     osft_status_t *per_matrix_status) {
  return api_call("osft_qr_batch",
                  [&] { return run(ctx, opts, count, a, q, r, 0, per_matrix_status); });
}

OSFT_API osft_status_t osft_qr_power_iteration(osft_context_t ctx,
                                               const osft_qr_options_t *opts,
                                               size_t count, const DLTensor *const *a,
                                               DLTensor *const *q, int iterations,
                                               osft_status_t *per_matrix_status) {
  return api_call("osft_qr_power_iteration", [&] {
    osft::checked_context(ctx, "ctx");
    if (iterations < 1)
      raise(OSFT_STATUS_INVALID_ARGUMENT, "iterations: %d; must be >= 1", iterations);
    return run(ctx, opts, count, a, q, nullptr, iterations, per_matrix_status);
  });
}

}  // extern "C"
