/* Factorized linear: the cost model that picks a strategy per call. Flops
 * decide; scratch memory rules out a strategy that would not fit the
 * context's workspace limit. */
#include <algorithm>

#include "core/logging.h"
#include "ops/flinear_ops.h"

namespace osft {
namespace {

struct Cost {
  double flops = 0.0;
  double bytes = 0.0; /* workspace needed */
};

Cost factorized_cost(const Layer &l, double m, osft_flinear_pass_t pass,
                     const GradRequest &w, double ec) {
  const double n = l.n, kin = l.kin, lo = l.l, k = l.r + l.l;
  Cost c;
  if (l.factor_dtype != OSFTI_F32 || ec != 4.0) c.bytes += (n * k + k * kin) * ec;
  if (pass == OSFT_FLINEAR_FORWARD) {
    c.flops = 2.0 * m * k * (kin + n);
    c.bytes += m * k * ec;
    return c;
  }
  const bool a_low = w.v || w.s, t_low = w.u || w.s;
  if (w.x || a_low) c.flops += 2.0 * m * n * (w.x ? k : lo);
  if (t_low) c.flops += 2.0 * m * kin * lo;
  if (w.v) c.flops += 2.0 * m * lo * kin;
  if (w.x) c.flops += 2.0 * m * k * kin;
  if (w.u) c.flops += 2.0 * m * n * lo;
  c.bytes +=
      m * ((w.x || a_low) ? (w.x ? k : lo) : 0.0) * ec + (t_low ? m * lo * ec : 0.0);
  return c;
}

Cost dense_cost(const Layer &l, double m, osft_flinear_pass_t pass, const GradRequest &w,
                double ec) {
  const double n = l.n, kin = l.kin, lo = l.l, width = std::max(l.r, l.l);
  /* Where the backend fingerprints the trainable factors, the layer keeps
   * the rebuilt W between calls: one rebuild per step, paid by the
   * forward, and W lives outside the workspace. */
  const bool kept = backend(*l.ctx).fingerprint != nullptr;
  const double rebuild = 2.0 * n * kin * lo + n * kin;
  const double weight_bytes = (kept ? 0.0 : n * kin * 4.0) +
                              (ec != 4.0 ? n * kin * ec : 0.0) + n * width * 4.0 +
                              (l.factor_dtype != OSFTI_F32 ? width * kin * 4.0 : 0.0);
  Cost c;
  if (pass == OSFT_FLINEAR_FORWARD) {
    c.flops = rebuild + 2.0 * m * n * kin;
    c.bytes = weight_bytes;
    return c;
  }
  const bool low = w.u || w.v || w.s;
  if (w.x) {
    c.flops += (kept ? 0.0 : rebuild) + 2.0 * m * n * kin;
    c.bytes = weight_bytes;
  }
  if (low) {
    c.flops += 2.0 * m * n * kin + ((w.v || w.s) ? 2.0 * n * kin * lo : 0.0) +
               (w.u ? 2.0 * n * kin * lo : 0.0);
    c.bytes += (kept || !w.x ? n * kin * 4.0 : 0.0) + (n + kin) * lo * 8.0;
  }
  return c;
}

const char *name(osft_flinear_strategy_t s) {
  return s == OSFT_FLINEAR_DENSE ? "dense" : "factorized";
}

}  // namespace

osft_flinear_strategy_t choose_strategy(const Layer &l, int64_t tokens,
                                        osft_flinear_pass_t pass, const GradRequest &want,
                                        osfti_dtype_t compute) {
  if (l.strategy != OSFT_FLINEAR_AUTO) return l.strategy;
  const double m = static_cast<double>(tokens);
  const double ec = static_cast<double>(osfti_dtype_size(compute));
  const Cost f = factorized_cost(l, m, pass, want, ec);
  const Cost d = dense_cost(l, m, pass, want, ec);
  const double limit = static_cast<double>(l.ctx->workspace_limit);
  const bool dense_fits = limit == 0.0 || d.bytes <= limit;
  const osft_flinear_strategy_t s =
      dense_fits && d.flops < f.flops ? OSFT_FLINEAR_DENSE : OSFT_FLINEAR_FACTORIZED;
  log_message(
      OSFT_LOG_DEBUG,
      "flinear %lldx%lld r=%lld l=%lld, M=%lld %s: factorized %.3g flop / %.3g B, "
      "dense %.3g flop / %.3g B -> %s",
      static_cast<long long>(l.n), static_cast<long long>(l.kin),
      static_cast<long long>(l.r), static_cast<long long>(l.l),
      static_cast<long long>(tokens),
      pass == OSFT_FLINEAR_FORWARD ? "forward" : "backward", f.flops, f.bytes, d.flops,
      d.bytes, name(s));
  return s;
}

}  // namespace osft
