/* Tiled MLP: one projection on one tile, forward and backward, whether it
 * is a dense weight (backend GEMMs) or a factorized layer (the layer's own
 * forward and backward, on DLTensor views of the tile); the fp32 shadow of a
 * bf16 layer; the bound on a layer's workspace. */
#include <algorithm>

#include "core/error.h"
#include "ops/mlp_ops.h"

namespace osft::mlp {
namespace {

uint32_t bit_if(float beta, uint32_t bit) {
  return beta != 0.0f ? bit : 0u;
}

void backprop_layer(Context &ctx, Layer &layer, const Mat &in, const Mat &grad_out,
                    const Mat *dx, float beta_x, const ProjGrads &g, bool first) {
  if (dx == nullptr && !g.any_factor()) return;
  const HeldTensor x = view_of(ctx, in), gy = view_of(ctx, grad_out);
  HeldTensor dxv, f[3];
  osft_flinear_grads_t gr{};
  gr.struct_size = sizeof gr;
  if (dx != nullptr) {
    dxv = view_of(ctx, *dx);
    gr.grad_x = &dxv.t;
    gr.accumulate |= bit_if(beta_x, OSFT_FLINEAR_ACCUMULATE_GRAD_X);
  }
  DLTensor **slots[3] = {&gr.grad_u_low, &gr.grad_s_low, &gr.grad_v_low};
  const uint32_t bits[3] = {OSFT_FLINEAR_ACCUMULATE_GRAD_U_LOW,
                            OSFT_FLINEAR_ACCUMULATE_GRAD_S_LOW,
                            OSFT_FLINEAR_ACCUMULATE_GRAD_V_LOW};
  for (int i = 0; i < 3; ++i) {
    if (!g.f[i].active) continue;
    f[i] = view_of(ctx, g.f[i].acc, g.f[i].vector);
    *slots[i] = &f[i].t;
    gr.accumulate |= bit_if(g.f[i].beta(first), bits[i]);
  }
  backward(layer, &x.t, &gy.t, gr);
}

}  // namespace

void project(Context &ctx, const Projection &p, const Mat &in, const Mat &out,
             const PackedB *w) {
  if (is_layer(p)) {
    const HeldTensor x = view_of(ctx, in);
    HeldTensor y = view_of(ctx, out);
    return forward(*p.layer, &x.t, p.has_bias ? &p.bias_t.t : nullptr, &y.t);
  }
  const Backend &be = backend(ctx);
  float beta = 0.0f;
  if (p.has_bias) {
    be.broadcast_rows(ctx, p.bias, out);
    beta = 1.0f;
  }
  gemm_with_packed(ctx, w, Op::N, in, Op::T, p.weight, 1.0f, beta, out);
}

void finish(Context &ctx, const Accum &a) {
  if (a.active && a.staged)
    backend(ctx).scale_into(ctx, Axis::cols, a.acc, nullptr, a.beta_out, a.out);
}

void backprop(Context &ctx, const Projection &p, Layer *layer, const Mat &in,
              const Mat &grad_out, const Mat *dx, float beta_x, const ProjGrads &g,
              bool first, const PackedB *w_n) {
  const Backend &be = backend(ctx);
  if (g.bias.active) {
    const Vec sum{g.bias.acc.data, g.bias.acc.cols, g.bias.acc.dtype};
    be.reduce(ctx, Axis::cols, grad_out, nullptr, g.bias.beta(first), sum);
  }
  if (layer != nullptr)
    return backprop_layer(ctx, *layer, in, grad_out, dx, beta_x, g, first);
  /* dW (out x in) += grad_out^T in: the GEMM sums the tiles (beta = 1). */
  if (g.w.active)
    be.gemm(ctx, Op::T, grad_out, Op::N, in, 1.0f, g.w.beta(first), g.w.acc);
  if (dx != nullptr)
    gemm_with_packed(ctx, w_n, Op::N, grad_out, Op::N, p.weight, 1.0f, beta_x, *dx);
}

/* What flinear_compute.cpp plans for the strategy, every optional buffer
 * included, plus the alignment of each slot. */
size_t layer_scratch_bound(const Layer &l, osfti_dtype_t factor_dtype,
                           osfti_dtype_t compute, int64_t rows, bool dense) noexcept {
  /* flinear_compute.cpp: plan_convert + the factorized intermediates (M x k,
   * M x l); plan_weight (U S, widened V, W, W in the compute dtype) + the
   * backward's widened U_low, V_low, P and Q. */
  const double n = static_cast<double>(l.n), kin = static_cast<double>(l.kin);
  const double lo = static_cast<double>(l.l), k = static_cast<double>(l.r + l.l);
  const double m = static_cast<double>(rows), w = static_cast<double>(std::max(l.r, l.l));
  const double ec = static_cast<double>(osfti_dtype_size(compute));
  const double convert = factor_dtype != compute ? (n * k + k * kin) * ec : 0.0;
  const double bytes =
      dense ? n * w * 4 + w * kin * 4 + n * kin * (4 + ec) + 2 * (n + kin) * lo * 4
            : convert + m * (k + lo) * ec;
  return static_cast<size_t>(bytes) + 16 * BufferPlan::alignment;
}

Fp32Shadow::Slots Fp32Shadow::plan(const Layer &src, BufferPlan &plan) {
  const int64_t k = src.r + src.l;
  Slots s;
  s.u = plan.add(src.n, k, OSFTI_F32);
  s.s = plan.add(1, k, OSFTI_F32);
  s.v = plan.add(k, src.kin, OSFTI_F32);
  return s;
}

namespace {

void point_factor(const Context &ctx, FactorTensor &f, const Mat &m, bool vector) {
  const HeldTensor h = view_of(ctx, m, vector);
  f.t = h.t;
  for (int d = 0; d < 2; ++d) {
    f.shape[d] = h.shape[d];
    f.strides[d] = h.strides[d];
  }
  f.t.shape = f.shape;
  f.t.strides = f.strides;
}

}  // namespace

Fp32Shadow::Fp32Shadow(Layer &src, const BufferPlan &plan, const Slots &slots) {
  Context &ctx = *src.ctx;
  layer_.ctx = src.ctx;
  layer_.n = src.n;
  layer_.kin = src.kin;
  layer_.r = src.r;
  layer_.l = src.l;
  layer_.factor_dtype = OSFTI_F32;
  layer_.strategy = src.strategy;
  const Mat u = plan.mat(slots.u), s = plan.mat(slots.s), v = plan.mat(slots.v);
  const FactorViews f = factor_views(src);
  const Backend &be = backend(ctx);
  auto widen = [&](const Mat &from, const Mat &to) {
    be.scale_into(ctx, Axis::cols, from, nullptr, 0.0f, to);
  };
  const int64_t r = src.r, l = src.l;
  widen(f.u_high, cols_of(u, 0, r));
  widen(f.u_low, cols_of(u, r, l));
  widen(as_row(f.s_high), cols_of(s, 0, r));
  widen(as_row(f.s_low), cols_of(s, r, l));
  widen(f.v_high, rows_of(v, 0, r));
  widen(f.v_low, rows_of(v, r, l));
  point_factor(ctx, layer_.factor[OSFT_FACTOR_U_HIGH], cols_of(u, 0, r), false);
  point_factor(ctx, layer_.factor[OSFT_FACTOR_U_LOW], cols_of(u, r, l), false);
  point_factor(ctx, layer_.factor[OSFT_FACTOR_S_HIGH], cols_of(s, 0, r), true);
  point_factor(ctx, layer_.factor[OSFT_FACTOR_S_LOW], cols_of(s, r, l), true);
  point_factor(ctx, layer_.factor[OSFT_FACTOR_V_HIGH], rows_of(v, 0, r), false);
  point_factor(ctx, layer_.factor[OSFT_FACTOR_V_LOW], rows_of(v, r, l), false);
}

}  // namespace osft::mlp
