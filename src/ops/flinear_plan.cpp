/* Factorized linear: the cost model that picks a strategy per call (of
 * factorized, dense and hybrid; flinear.h describes them). GEMM
 * time decides, counted as flops weighted by how fast the device runs each
 * GEMM's operand type, plus (on CUDA) the bytes the element-wise passes
 * move, counted as the flops the device would do meanwhile; scratch memory
 * rules out a strategy that would not fit the context's workspace limit. */
#include <algorithm>

#include "core/logging.h"
#include "ops/flinear_ops.h"

namespace osft {
namespace {

struct Cost {
  double flops = 0.0;   /* GEMMs on operands of the compute dtype */
  double flops32 = 0.0; /* GEMMs on fp32 operands (the dense form's rebuild, P, Q) */
  double bytes = 0.0;   /* workspace needed */
  double traffic = 0.0; /* bytes read and written by element-wise passes */
  double time(double fp32_weight, double flops_per_byte) const {
    return flops + fp32_weight * flops32 + flops_per_byte * traffic;
  }
};

Cost factorized_cost(const PlanShape &l, double m, osft_flinear_pass_t pass,
                     const GradRequest &w, double ec) {
  const double n = l.n, kin = l.kin, lo = l.l, k = l.r + l.l;
  Cost c;
  if (l.factor_dtype != OSFTI_F32 || ec != 4.0) c.bytes += (n * k + k * kin) * ec;
  if (pass == OSFT_FLINEAR_FORWARD) {
    c.flops = 2.0 * m * k * (kin + n);
    c.bytes += m * k * ec;
    c.traffic = 2.0 * m * k * ec; /* the S scaling of the M x k intermediate */
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
  /* the S scalings of A (or A_low) and T_low */
  c.traffic = 2.0 * ec * m * (((w.x || a_low) ? (w.x ? k : lo) : 0.0) + (w.u ? lo : 0.0));
  return c;
}

/* c with its fp32-operand GEMMs counted as compute-dtype ones where they
 * run on bf16 operands. */
Cost as_compute(Cost c, bool bf16_products) {
  if (bf16_products) {
    c.flops += c.flops32;
    c.flops32 = 0.0;
  }
  return c;
}

/* flinear_compute.cpp's dense form: W = W_high + (U_low diag(S_low)) V_low
 * is rebuilt by an fp32 GEMM; y = x W^T and dx = g W run in the compute
 * dtype, as does G = g^T x (compute-dtype operands, fp32 result); the
 * factor gradients P = U_low^T G and Q = G V_low^T are fp32 GEMMs. Where
 * dense_bf16_products holds, the rebuild, P and Q take bf16 operands (G
 * split into two bf16 halves, P taken over both): compute-dtype flops. */
Cost dense_cost(const PlanShape &l, double m, osft_flinear_pass_t pass,
                const GradRequest &w, double ec, bool bf16_products) {
  const double n = l.n, kin = l.kin, lo = l.l, width = std::max(l.r, l.l);
  /* Where the backend fingerprints the trainable factors, the layer keeps
   * the rebuilt W between calls: one rebuild per step, paid by the
   * forward, and W lives outside the workspace. */
  const bool kept = l.kept;
  const double rebuild = 2.0 * n * kin * lo + n * kin;
  /* the rebuild's element-wise bytes: W_high copied into W (8 per entry),
   * the GEMM's read-modify-write of W (8), W into the compute dtype */
  const double rebuild_traffic = n * kin * (16.0 + (ec != 4.0 ? 4.0 + ec : 0.0));
  const double weight_bytes = (kept ? 0.0 : n * kin * 4.0) +
                              (ec != 4.0 ? n * kin * ec : 0.0) + n * width * 4.0 +
                              (l.factor_dtype != OSFTI_F32 ? width * kin * 4.0 : 0.0);
  Cost c;
  if (pass == OSFT_FLINEAR_FORWARD) {
    c.flops32 = rebuild;
    c.flops = 2.0 * m * n * kin;
    c.bytes = weight_bytes;
    c.traffic = kept ? 0.0 : rebuild_traffic;
    return as_compute(c, bf16_products);
  }
  const bool low = w.u || w.v || w.s;
  if (w.x) {
    c.flops32 += kept ? 0.0 : rebuild;
    c.flops += 2.0 * m * n * kin;
    c.bytes = weight_bytes;
    c.traffic += kept ? 0.0 : rebuild_traffic;
  }
  if (low) {
    c.flops += 2.0 * m * n * kin;
    /* P (twice where bf16_products: G's two halves) and Q */
    const double p = (w.v || w.s) ? 2.0 * n * kin * lo : 0.0;
    c.flops32 += (bf16_products ? 2.0 * p : p) + (w.u ? 2.0 * n * kin * lo : 0.0);
    c.bytes += (kept || !w.x ? n * kin * 4.0 : 0.0) + (n + kin) * lo * 8.0 +
               (bf16_products ? n * kin * 4.0 : 0.0);
    /* G into bf16 halves: split_bf16's three passes (6 + 10 + 6 bytes per
     * entry), or one (6) where only Q needs it */
    c.traffic += bf16_products ? (w.v || w.s ? 22.0 : 6.0) * n * kin : 0.0;
  }
  return as_compute(c, bf16_products);
}

/* The hybrid form: the dense forward; in the backward grad_x on the dense W
 * and the low factors' gradients as the factorized form computes them. */
Cost hybrid_cost(const PlanShape &l, double m, osft_flinear_pass_t pass,
                 const GradRequest &w, double ec, bool bf16_products) {
  if (pass == OSFT_FLINEAR_FORWARD) return dense_cost(l, m, pass, w, ec, bf16_products);
  GradRequest dx, low = w;
  dx.u = dx.s = dx.v = false;
  dx.x = w.x;
  low.x = false;
  Cost c = dense_cost(l, m, pass, dx, ec, bf16_products);
  if (!(w.u || w.s || w.v)) return c;
  Cost f = factorized_cost(l, m, pass, low, ec);
  /* only the low factors are converted to the compute dtype */
  if (l.factor_dtype != OSFTI_F32 || ec != 4.0)
    f.bytes -= (l.n + l.kin) * static_cast<double>(l.r) * ec;
  c.flops += f.flops;
  c.flops32 += f.flops32;
  c.bytes += f.bytes;
  c.traffic += f.traffic;
  return c;
}

const char *name(osft_flinear_strategy_t s) {
  return s == OSFT_FLINEAR_DENSE    ? "dense"
         : s == OSFT_FLINEAR_HYBRID ? "hybrid"
                                    : "factorized";
}

}  // namespace

/* What an fp32-operand GEMM flop costs next to a compute-dtype one. On a
 * CPU engine that widens bf16 to fp32 (OpenBLAS: Backend::native_bf16_gemm
 * false) a flop counts as a flop: both run at fp32 throughput. Where the
 * engine multiplies bf16 itself (oneMKL on AMX: native_bf16_gemm true) its
 * bf16 GEMMs are faster: on an Intel Xeon (Emerald Rapids, 2 cores, oneMKL
 * 2026.2, a shared machine) bench_flinear --dtype bf16 measured its bf16
 * rate at 4.8-5.4x the fp32 one for this layer's token GEMMs at 2048 and
 * 4096 wide (M x N x K = 4096x2048x2048, 2048x4096x4096, 4096x1024x4096),
 * 3.1-5.4x for its rebuild GEMMs (2048x2048x1024, 4096x4096x2048,
 * 1024x4096x512), 1.2-4x for the small 1792x512 ones; so 4. There, with bf16 factors, the
 * dense form's rebuild and factor gradients themselves run on bf16 operands
 * (dense_bf16_products): what is left in fp32 is that form with fp32 factors and bf16
 * activations. On CUDA, bf16 GEMMs run on the tensor cores and fp32 ones, without TF32,
 * on the CUDA cores: an H100 or H200 peaks at 989 TFLOP/s bf16 dense against 67 TFLOP/s
 * fp32 (14.8x), and the H200 run (bench/results/flinear_h200.csv,
 * cuda_validation_h200.md) measured about 18x for the dense form's fp32
 * GEMMs (4096^2, 8192 tokens, rank ratio 0.5: 7.21 ms for cuBLAS's 1.03 ms
 * of bf16 GEMMs plus 275 GFLOP of fp32 ones) and 26x on the smaller
 * 1024x4096. With TF32 allowed, fp32 GEMMs run at half the bf16 rate
 * (495 TFLOP/s). */
double fp32_gemm_weight(const PlanShape &shape, osfti_dtype_t compute) noexcept {
  if (compute == OSFTI_F32) return 1.0;
  if (shape.cuda) return shape.allow_tf32 ? 2.0 : 16.0;
  return shape.native_bf16 ? 4.0 : 1.0;
}

/* What a byte of element-wise traffic costs, in compute-dtype GEMM flops.
 * On CUDA a large bf16 GEMM runs at ~700 TFLOP/s (H100, H200) against ~3
 * TB/s of HBM for a streaming pass: 250 (the H100's 989 TFLOP/s and 3.35
 * TB/s peaks give 295). It matters where the dense form's passes over the
 * N x K weight (~30 bytes per entry a backward) stand against the M x k
 * intermediates of the factorized form: for 14336 x 4096 at 8192 tokens
 * about 0.4 ms, as much as the flops that separate the two forms. The CPU
 * model stays flops alone, as measured (flinear_cpu.md): 0. */
double traffic_weight(const PlanShape &shape) noexcept {
  return shape.cuda ? 250.0 : 0.0;
}

/* Where the engine multiplies bf16 itself (CUDA's tensor cores; oneMKL on
 * AMX) and factors and activations are bf16, the dense form's rebuild, P
 * and Q take bf16 operands, as mini_trainer's rebuild does on a GPU; its
 * fp32 products were measured at about 18x the bf16 ones' time on an H200
 * (7.21 ms at 4096^2, 8192 tokens, against the factorized form's 2.27). */
bool dense_bf16_products(const PlanShape &shape, osfti_dtype_t compute) noexcept {
  return shape.native_bf16 && compute == OSFTI_BF16 && shape.factor_dtype == OSFTI_BF16;
}

osft_flinear_strategy_t choose_strategy(const PlanShape &shape, int64_t tokens,
                                        osft_flinear_pass_t pass, const GradRequest &want,
                                        osfti_dtype_t compute) {
  if (shape.strategy != OSFT_FLINEAR_AUTO) return shape.strategy;
  /* A kept W is free in the backward only where the forward built it
   * (chose the dense form) for the same tokens; else the backward pays
   * the rebuild itself. */
  if (pass == OSFT_FLINEAR_BACKWARD && shape.kept &&
      choose_strategy(shape, tokens, OSFT_FLINEAR_FORWARD, want, compute) !=
          OSFT_FLINEAR_DENSE) {
    PlanShape rebuilt = shape;
    rebuilt.kept = false;
    return choose_strategy(rebuilt, tokens, pass, want, compute);
  }
  const double m = static_cast<double>(tokens);
  const double ec = static_cast<double>(osfti_dtype_size(compute));
  const Cost f = factorized_cost(shape, m, pass, want, ec);
  const bool b16 = dense_bf16_products(shape, compute);
  const Cost d = dense_cost(shape, m, pass, want, ec, b16);
  const Cost h = hybrid_cost(shape, m, pass, want, ec, b16);
  const double limit = static_cast<double>(shape.workspace_limit);
  const auto fits = [limit](const Cost &c) { return limit == 0.0 || c.bytes <= limit; };
  const double w32 = fp32_gemm_weight(shape, compute), wb = traffic_weight(shape);
  const double tf = f.time(w32, wb), td = d.time(w32, wb), th = h.time(w32, wb);
  osft_flinear_strategy_t s = OSFT_FLINEAR_FACTORIZED;
  double best = tf;
  if (fits(d) && td < best) {
    s = OSFT_FLINEAR_DENSE;
    best = td;
  }
  /* the forward of the hybrid form is the dense one: reported as dense */
  if (pass == OSFT_FLINEAR_BACKWARD && fits(h) && th < best) s = OSFT_FLINEAR_HYBRID;
  log_message(OSFT_LOG_DEBUG,
              "flinear %lldx%lld r=%lld l=%lld, M=%lld %s%s: factorized %.3g / %.3g B, "
              "dense %.3g / %.3g B, hybrid %.3g / %.3g B (fp32 GEMM flop x%g, byte "
              "moved x%g) -> %s",
              static_cast<long long>(shape.n), static_cast<long long>(shape.kin),
              static_cast<long long>(shape.r), static_cast<long long>(shape.l),
              static_cast<long long>(tokens),
              pass == OSFT_FLINEAR_FORWARD ? "forward" : "backward",
              shape.cuda ? " (cuda)" : "", tf, f.bytes, td, d.bytes, th, h.bytes, w32, wb,
              name(s));
  return s;
}

PlanShape plan_shape(const Layer &l) {
  PlanShape p;
  p.n = l.n;
  p.kin = l.kin;
  p.r = l.r;
  p.l = l.l;
  p.factor_dtype = l.factor_dtype;
  p.strategy = l.strategy;
  p.cuda = on_cuda(*l.ctx);
  p.allow_tf32 = l.ctx->allow_tf32;
  const Backend &be = backend(*l.ctx);
  p.native_bf16 = be.native_bf16_gemm != nullptr && be.native_bf16_gemm(*l.ctx);
  p.kept = weight_kept(l);
  p.workspace_limit = l.ctx->workspace_limit;
  return p;
}

bool weight_kept(const Layer &l) {
  const bool fingerprints = backend(*l.ctx).fingerprint != nullptr && !l.fingerprints_off;
  return fingerprints || l.updates_reported;
}

bool updates_in_place(const Layer &l) {
  return weight_kept(l) && 2 * l.l * (l.n + l.kin) <= l.n * l.kin;
}

osft_flinear_strategy_t choose_strategy(const Layer &l, int64_t tokens,
                                        osft_flinear_pass_t pass, const GradRequest &want,
                                        osfti_dtype_t compute) {
  return choose_strategy(plan_shape(l), tokens, pass, want, compute);
}

}  // namespace osft

/* The planner without a layer or a device, for its unit test
 * (tests/c/test_flinear_plan.c): any device's choice on any machine. */
extern "C" int osfti_flinear_plan_choice(int cuda, int allow_tf32, int native_bf16,
                                         int kept, int64_t n, int64_t kin, int64_t r,
                                         int64_t l, int factor_bf16, int compute_bf16,
                                         int64_t tokens, int backward, unsigned want,
                                         size_t workspace_limit) {
  osft::PlanShape p;
  p.n = n;
  p.kin = kin;
  p.r = r;
  p.l = l;
  p.factor_dtype = factor_bf16 ? OSFTI_BF16 : OSFTI_F32;
  p.strategy = OSFT_FLINEAR_AUTO;
  p.cuda = cuda != 0;
  p.allow_tf32 = allow_tf32 != 0;
  p.native_bf16 = native_bf16 != 0;
  p.kept = kept != 0;
  p.workspace_limit = workspace_limit;
  osft::GradRequest g;
  g.x = (want & 1u) != 0;
  g.u = (want & 2u) != 0;
  g.s = (want & 4u) != 0;
  g.v = (want & 8u) != 0;
  g.bias = (want & 16u) != 0;
  return osft::choose_strategy(p, tokens,
                               backward ? OSFT_FLINEAR_BACKWARD : OSFT_FLINEAR_FORWARD, g,
                               compute_bf16 ? OSFTI_BF16 : OSFTI_F32);
}
