/* Tiled MLP: the forward and the backward over tiles of the flattened
 * tokens. Every argument is validated and every buffer planned and placed
 * before the first write, so a failure leaves the caller's tensors intact.
 *
 * Per tile of t tokens (G = gate x, U = up x, H = act(G) * U, all t x I):
 *   forward   G, U; H over U; y = down(H)
 *   backward  G, U (recomputed); dH = dy W_down; one fused pass gives
 *             dG over G, dU over dH and H over U; dW_down += dy^T H;
 *             dW_gate += dG^T x, dW_up += dU^T x; dx = dG W_gate + dU W_up.
 * Weight and bias gradients are summed by their GEMMs / reductions with
 * beta = 1 from the second tile on: the plain sum, each tile once. Where
 * the budget holds every tile's intermediates (keeps_outputs), the forward
 * keeps G and U for the backward of the same x, which then skips their
 * recompute. */
#include <algorithm>
#include <optional>

#include "core/error.h"
#include "core/logging.h"
#include "core/options.h"
#include "core/tensor_args.h"
#include "ops/mlp_ops.h"

namespace osft::mlp {
namespace {

constexpr unsigned kGradDtypes = OSFTI_F32 | OSFTI_BF16;
constexpr size_t kFactorGradsV1 = OSFTI_V1_SIZE(osft_flinear_grads_t, accumulate);

/* Named tensors, for the overlap checks. */
class Operands {
 public:
  void add(const char *name, const DLTensor *t) {
    if (t == nullptr) return;
    if (n_ == kMax) raise(OSFT_STATUS_INTERNAL_ERROR, "mlp: too many operands");
    items_[n_++] = {name, t};
  }
  /* Every output clear of every input and of the outputs before it. */
  void check_outputs_clear_of(const Operands &ins) const {
    for (int o = 0; o < n_; ++o) {
      for (int i = 0; i < ins.n_; ++i)
        check_no_overlap(ins.items_[i].name, ins.items_[i].t, items_[o].name,
                         items_[o].t);
      for (int p = 0; p < o; ++p)
        check_no_overlap(items_[p].name, items_[p].t, items_[o].name, items_[o].t);
    }
  }

 private:
  struct Named {
    const char *name;
    const DLTensor *t;
  };
  static constexpr int kMax = 32;
  Named items_[kMax] = {};
  int n_ = 0;
};

const char *const kFactorNames[3][6] = {
    {"gate layer's u_high", "gate layer's s_high", "gate layer's v_high",
     "gate layer's u_low", "gate layer's s_low", "gate layer's v_low"},
    {"up layer's u_high", "up layer's s_high", "up layer's v_high", "up layer's u_low",
     "up layer's s_low", "up layer's v_low"},
    {"down layer's u_high", "down layer's s_high", "down layer's v_high",
     "down layer's u_low", "down layer's s_low", "down layer's v_low"}};
const char *const kWeightNames[3] = {"weights->gate", "weights->up", "weights->down"};
const char *const kBiasNames[3] = {"weights->gate_bias", "weights->up_bias",
                                   "weights->down_bias"};

/* The MLP's weights, biases and factors: what no output may overlap. */
void add_parameters(const Mlp &m, Operands &ins) {
  for (int i = 0; i < 3; ++i) {
    const Projection &p = m.proj[i];
    if (!p.present) continue;
    if (p.has_bias) ins.add(kBiasNames[i], &p.bias_t.t);
    if (!is_layer(p)) {
      ins.add(kWeightNames[i], &p.weight_t.t);
      continue;
    }
    for (int f = 0; f < 6; ++f) ins.add(kFactorNames[i][f], &p.layer->factor[f].t);
  }
}

/* num_tiles and x, checked; x and the MLP's parameters added to `ins`. */
Mat checked_input(const Mlp &m, const DLTensor *x, int64_t num_tiles, Operands &ins) {
  if (num_tiles < 0)
    raise(OSFT_STATUS_INVALID_ARGUMENT, "num_tiles: %lld is negative (0: automatic)",
          static_cast<long long>(num_tiles));
  const Mat xm = checked_rows(*m.ctx, x, "x", m.dtype, m.hidden);
  ins.add("x", x);
  add_parameters(m, ins);
  return xm;
}

const Mat *opt(const Mat &m, bool present) {
  return present ? &m : nullptr;
}

/* ------------------------------------------------------------- gradients */

/* A validated gradient output: active when requested. */
Accum requested(Context &ctx, const DLTensor *t, const char *name, unsigned dtypes,
                int64_t rows, int64_t cols, bool vector, float beta_out) {
  Accum a;
  if (t == nullptr) return a;
  a.active = true;
  a.vector = vector;
  a.out = vector ? as_row(checked_vector(ctx, t, name, dtypes, cols))
                 : checked_matrix(ctx, t, name, dtypes, rows, cols);
  a.acc = a.out;
  a.beta_out = beta_out;
  return a;
}

float bit(uint32_t accumulate, uint32_t b) {
  return (accumulate & b) != 0 ? 1.0f : 0.0f;
}

struct GradNames {
  const char *grad, *bias, *factors, *factor[3];
};
const GradNames kGradNames[3] = {
    {"grads->grad_gate",
     "grads->grad_gate_bias",
     "grads->gate_factors",
     {"grads->gate_factors->grad_u_low", "grads->gate_factors->grad_s_low",
      "grads->gate_factors->grad_v_low"}},
    {"grads->grad_up",
     "grads->grad_up_bias",
     "grads->up_factors",
     {"grads->up_factors->grad_u_low", "grads->up_factors->grad_s_low",
      "grads->up_factors->grad_v_low"}},
    {"grads->grad_down",
     "grads->grad_down_bias",
     "grads->down_factors",
     {"grads->down_factors->grad_u_low", "grads->down_factors->grad_s_low",
      "grads->down_factors->grad_v_low"}}};

/* The factor gradients of a layer projection, from the caller's struct. */
void factor_grads(Context &ctx, const Projection &p, const GradNames &nm,
                  const osft_flinear_grads_t *user, ProjGrads &g, Operands &outs) {
  if (user == nullptr) return;
  if (!p.present || !is_layer(p))
    raise(OSFT_STATUS_INVALID_ARGUMENT,
          "%s: the %s projection is %s; it has no factor gradients", nm.factors, p.name,
          p.present ? "a dense weight" : "absent (plain variant)");
  const osft_flinear_grads_t fg = read_struct(
      user, osft_flinear_grads_t{}, kFactorGradsV1, nm.factors, "osft_flinear_grads_t");
  if (fg.grad_x != nullptr || fg.grad_bias != nullptr)
    raise(OSFT_STATUS_INVALID_ARGUMENT,
          "%s: grad_x and grad_bias must be NULL (the MLP's grads->grad_x and "
          "grads->grad_%s_bias take them)",
          nm.factors, p.name);
  if ((fg.accumulate & ~OSFT_FLINEAR_ACCUMULATE_ALL) != 0)
    raise(OSFT_STATUS_INVALID_ARGUMENT, "%s->accumulate: unknown bits 0x%x", nm.factors,
          fg.accumulate & ~OSFT_FLINEAR_ACCUMULATE_ALL);
  const Layer &l = *p.layer;
  const unsigned fdt = l.factor_dtype;
  g.f[0] = requested(ctx, fg.grad_u_low, nm.factor[0], fdt, l.n, l.l, false,
                     bit(fg.accumulate, OSFT_FLINEAR_ACCUMULATE_GRAD_U_LOW));
  g.f[1] = requested(ctx, fg.grad_s_low, nm.factor[1], fdt, 1, l.l, true,
                     bit(fg.accumulate, OSFT_FLINEAR_ACCUMULATE_GRAD_S_LOW));
  g.f[2] = requested(ctx, fg.grad_v_low, nm.factor[2], fdt, l.l, l.kin, false,
                     bit(fg.accumulate, OSFT_FLINEAR_ACCUMULATE_GRAD_V_LOW));
  outs.add(nm.factor[0], fg.grad_u_low);
  outs.add(nm.factor[1], fg.grad_s_low);
  outs.add(nm.factor[2], fg.grad_v_low);
}

struct Requests {
  Accum dx; /* grad_x rows (never staged: each row comes from one tile) */
  ProjGrads p[3];
  bool need_dh = false; /* anything below the activation is wanted */
};

Requests check_grads(Context &ctx, const Mlp &m, const DLTensor *x,
                     const osft_mlp_grads_t &grads, Operands &outs) {
  if ((grads.accumulate & ~OSFT_MLP_ACCUMULATE_ALL) != 0)
    raise(OSFT_STATUS_INVALID_ARGUMENT, "grads->accumulate: unknown bits 0x%x",
          grads.accumulate & ~OSFT_MLP_ACCUMULATE_ALL);
  Requests r;
  if (grads.grad_x != nullptr) {
    r.dx.active = true;
    r.dx.out =
        checked_rows(ctx, grads.grad_x, "grads->grad_x", m.dtype, m.hidden, x, "x");
    r.dx.beta_out = bit(grads.accumulate, OSFT_MLP_ACCUMULATE_GRAD_X);
    outs.add("grads->grad_x", grads.grad_x);
  }
  DLTensor *const dense[3] = {grads.grad_gate, grads.grad_up, grads.grad_down};
  DLTensor *const bias[3] = {grads.grad_gate_bias, grads.grad_up_bias,
                             grads.grad_down_bias};
  const osft_flinear_grads_t *const factors[3] = {grads.gate_factors, grads.up_factors,
                                                  grads.down_factors};
  const uint32_t wbit[3] = {OSFT_MLP_ACCUMULATE_GRAD_GATE, OSFT_MLP_ACCUMULATE_GRAD_UP,
                            OSFT_MLP_ACCUMULATE_GRAD_DOWN};
  const uint32_t bbit[3] = {OSFT_MLP_ACCUMULATE_GRAD_GATE_BIAS,
                            OSFT_MLP_ACCUMULATE_GRAD_UP_BIAS,
                            OSFT_MLP_ACCUMULATE_GRAD_DOWN_BIAS};
  for (int i = 0; i < 3; ++i) {
    const Projection &p = m.proj[i];
    const GradNames &nm = kGradNames[i];
    if ((dense[i] != nullptr || bias[i] != nullptr) && !p.present)
      raise(OSFT_STATUS_INVALID_ARGUMENT,
            "%s: plain (ungated) variants have no gate projection",
            dense[i] != nullptr ? nm.grad : nm.bias);
    if (dense[i] != nullptr && is_layer(p))
      raise(OSFT_STATUS_INVALID_ARGUMENT,
            "%s: the %s projection is a factorized layer; its gradients go to %s",
            nm.grad, p.name, nm.factors);
    ProjGrads &g = r.p[i];
    g.w = requested(ctx, dense[i], nm.grad, kGradDtypes, p.out, p.in, false,
                    bit(grads.accumulate, wbit[i]));
    g.bias = requested(ctx, bias[i], nm.bias, kGradDtypes, 1, p.out, true,
                       bit(grads.accumulate, bbit[i]));
    outs.add(nm.grad, dense[i]);
    outs.add(nm.bias, bias[i]);
    factor_grads(ctx, p, nm, factors[i], g, outs);
  }
  r.need_dh = r.dx.active;
  for (int i : {kGate, kUp})
    r.need_dh = r.need_dh || r.p[i].w.active || r.p[i].bias.active || r.p[i].any_factor();
  return r;
}

/* Every sink of a request, for the steps that treat them alike. */
template <class F>
void for_each_sink(Requests &r, F &&f) {
  for (ProjGrads &g : r.p) {
    f(g.w);
    f(g.bias);
    for (Accum &a : g.f) f(a);
  }
}

/* With no tokens, the sums are empty: overwritten gradients become 0. */
void zero_empty_sums(Context &ctx, Requests &r) {
  for_each_sink(r, [&](const Accum &a) {
    if (a.active && a.beta_out == 0.0f) backend(ctx).fill_zero(ctx, a.out);
  });
}

/* ------------------------------------------------------- layer scratch */

/* The layer calls one tile makes: passes and, for the backward, what it
 * requests (as flinear's cost model needs it to pick the same strategy). */
struct LayerCalls {
  bool forward = false, backward = false;
  GradRequest want;
};

LayerCalls layer_calls(int proj, const Requests *r, bool recompute) {
  LayerCalls c;
  if (r == nullptr) {
    c.forward = true; /* the MLP's forward */
    return c;
  }
  const ProjGrads &g = r->p[proj];
  /* the recompute; the down projection is not redone */
  c.forward = proj != kDown && recompute;
  c.want.x = proj == kDown ? r->need_dh : r->dx.active;
  c.want.u = g.f[0].active;
  c.want.s = g.f[1].active;
  c.want.v = g.f[2].active;
  c.want.bias = false; /* the MLP sums bias gradients itself */
  c.backward = c.want.x || c.want.u || c.want.s || c.want.v;
  return c;
}

/* Grows the workspace for the layers' own scratch before anything is
 * written, so that no layer call runs out of memory halfway: for both tile
 * sizes (full, one short) and every layer call, the bound of the strategy
 * the layer will pick. Above the context's workspace limit the call fails
 * here, before anything is written. `r`: the backward's requests (nullptr
 * for the forward); shadowed[i]: projection i runs on fp32 factor copies. */
size_t reserve_layer_scratch(const Mlp &m, const Tiling &tiles, const Requests *r,
                             const bool *shadowed, bool recompute = true) {
  size_t bytes = 0;
  const char *who = nullptr;
  const int64_t sizes[2] = {tiles.max_rows, std::max<int64_t>(1, tiles.max_rows - 1)};
  for (int i = 0; i < 3; ++i) {
    const Projection &p = m.proj[i];
    if (!is_layer(p)) continue;
    Layer probe = *p.layer; /* for the cost model: dims, strategy, factor dtype */
    if (shadowed != nullptr && shadowed[i]) probe.factor_dtype = OSFTI_F32;
    const LayerCalls calls = layer_calls(i, r, recompute);
    for (int64_t rows : sizes)
      for (osft_flinear_pass_t pass : {OSFT_FLINEAR_FORWARD, OSFT_FLINEAR_BACKWARD}) {
        if (!(pass == OSFT_FLINEAR_FORWARD ? calls.forward : calls.backward)) continue;
        const osft_flinear_strategy_t s =
            choose_strategy(probe, rows, pass, calls.want, m.dtype);
        auto bound = [&](bool dense) {
          return layer_scratch_bound(probe, probe.factor_dtype, m.dtype, rows, dense);
        };
        /* the hybrid form plans the dense weight and the factorized low part */
        const size_t need = s == OSFT_FLINEAR_HYBRID ? bound(true) + bound(false)
                                                     : bound(s == OSFT_FLINEAR_DENSE);
        if (need > bytes) {
          bytes = need;
          who = p.name;
        }
      }
  }
  const size_t limit = m.ctx->workspace_limit;
  if (limit != 0 && bytes > limit)
    raise(OSFT_STATUS_OUT_OF_MEMORY,
          "workspace: the factorized %s projection needs up to %zu bytes of scratch for "
          "tiles of %lld tokens, above the context's workspace_limit (%zu bytes); raise "
          "the limit or use more tiles",
          who, bytes, static_cast<long long>(tiles.max_rows), limit);
  if (bytes > 0) workspace(*m.ctx, bytes);
  return m.ctx->workspace_bytes;
}

/* The bound above is this file's reading of flinear_compute.cpp's plans:
 * say so if a layer grew the workspace anyway (results are still right). */
void check_reserved(const Mlp &m, size_t reserved) {
  if (has_layer(m) && m.ctx->workspace_bytes > reserved)
    log_message(OSFT_LOG_WARN,
                "mlp: a factorized projection grew the workspace from %zu to %zu bytes "
                "during the tiles (the reserved bound is too small)",
                reserved, m.ctx->workspace_bytes);
}

/* ---------------------------------------------------------- the backward */

/* Everything one backward call needs besides the caller's tensors. */
struct BackwardPlan {
  BufferPlan buffers;
  bool kept = false; /* G and U come from the forward (mlp.kept) */
  Mat kept_g, kept_u;
  int g = -1, u = -1, dh = -1, h = -1, dx32 = -1;
  bool shadowed[3] = {false, false, false};
  Fp32Shadow::Slots shadow_slots[3];
};

void plan_backward(const Mlp &m, Requests &r, const Tiling &tiles, BackwardPlan &bp) {
  BufferPlan &b = bp.buffers;
  const int64_t rows = tiles.max_rows;
  const bool down_layer = is_layer(m.proj[kDown]);
  if (!bp.kept) {
    if (m.gated) bp.g = b.add(rows, m.inter, m.dtype);
    bp.u = b.add(rows, m.inter, m.dtype);
  }
  if (r.need_dh) bp.dh = b.add(rows, m.inter, m.dtype);
  if (down_layer) bp.h = b.add(rows, m.inter, m.dtype);
  if (r.dx.active && fp32_grad_x_sum(m)) bp.dx32 = b.add(rows, m.hidden, OSFTI_F32);
  /* Several tiles sum a non-fp32 gradient in an fp32 copy. */
  const bool several = tiles.nonempty() > 1;
  for_each_sink(r, [&](Accum &a) {
    if (!a.active || !several || a.out.dtype == OSFTI_F32) return;
    a.staged = true;
    a.slot = b.add(a.out.rows, a.out.cols, OSFTI_F32);
  });
  for (int i = 0; i < 3; ++i) {
    const Projection &p = m.proj[i];
    if (!is_layer(p) || !several || p.layer->factor_dtype == OSFTI_F32 ||
        !r.p[i].any_factor())
      continue;
    bp.shadowed[i] = true;
    bp.shadow_slots[i] = Fp32Shadow::plan(*p.layer, b);
  }
}

/* One tile's views. */
struct TileViews {
  Mat x, gy, dx, dx32, g, u, dh, h;
};

TileViews tile_views(const Mat &xm, const Mat &gy, const Requests &r,
                     const BackwardPlan &bp, int64_t begin, int64_t rows) {
  TileViews v;
  v.x = rows_of(xm, begin, rows);
  v.gy = rows_of(gy, begin, rows);
  if (r.dx.active) v.dx = rows_of(r.dx.out, begin, rows);
  auto buf = [&](int slot) {
    return slot >= 0 ? rows_of(bp.buffers.mat(slot), 0, rows) : Mat{};
  };
  v.g = bp.kept ? (bp.kept_g.data != nullptr ? rows_of(bp.kept_g, begin, rows) : Mat{})
                : buf(bp.g);
  v.u = bp.kept ? rows_of(bp.kept_u, begin, rows) : buf(bp.u);
  v.dh = buf(bp.dh);
  v.h = buf(bp.h);
  v.dx32 = buf(bp.dx32);
  return v;
}

/* gate and up on the tile: their gradients, and dx = dG W_gate + dU W_up
 * (in fp32 scratch and rounded once where bf16 dense projections allow). */
void backprop_inputs(Context &ctx, const Mlp &m, Layer *const *layers, const Requests &r,
                     const TileViews &v, bool first, const PackedWeights &wn) {
  const Mat *dx = nullptr;
  float beta = 0.0f;
  if (r.dx.active) {
    dx = v.dx32.data != nullptr ? &v.dx32 : &v.dx;
    beta = v.dx32.data != nullptr ? 0.0f : r.dx.beta_out;
  }
  if (m.gated) {
    backprop(ctx, m.proj[kGate], layers[kGate], v.x, v.g, dx, beta, r.p[kGate], first,
             wn[kGate]);
    beta = 1.0f;
  }
  backprop(ctx, m.proj[kUp], layers[kUp], v.x, v.dh, dx, beta, r.p[kUp], first, wn[kUp]);
  if (v.dx32.data != nullptr)
    backend(ctx).scale_into(ctx, Axis::cols, v.dx32, nullptr, r.dx.beta_out, v.dx);
}

/* wt, wn: the dense weights packed for op T and op N. */
void backward_tile(Context &ctx, const Mlp &m, Layer *const *layers, const Requests &r,
                   const TileViews &v, bool first, bool recompute,
                   const PackedWeights &wt, const PackedWeights &wn) {
  const MlpKernels &k = mlp_kernels(ctx);
  const Projection &down = m.proj[kDown];
  const ProjGrads &gd = r.p[kDown];
  const Mat *g = opt(v.g, m.gated);
  if (recompute) {
    if (m.gated) project(ctx, m.proj[kGate], v.x, v.g, wt[kGate]);
    project(ctx, m.proj[kUp], v.x, v.u, wt[kUp]);
  }
  const bool want_h =
      is_layer(down) ? r.need_dh || gd.any_factor() || gd.bias.active : gd.w.active;
  if (is_layer(down)) {
    /* The layer's backward takes its input H and gives dH. */
    if (want_h) {
      k.activate(ctx, m.act, g, v.u, v.h);
      backprop(ctx, down, layers[kDown], v.h, v.gy, opt(v.dh, r.need_dh), 0.0f, gd,
               first);
    }
  } else if (r.need_dh) {
    gemm_with_packed(ctx, wn[kDown], Op::N, v.gy, Op::N, down.weight, 1.0f, 0.0f, v.dh);
  }
  const Mat *h_dense = opt(v.u, !is_layer(down) && want_h);
  if (r.need_dh)
    k.activate_backward(ctx, m.act, g, v.u, v.dh, h_dense, g != nullptr ? &v.g : nullptr,
                        v.dh);
  else if (h_dense != nullptr)
    k.activate(ctx, m.act, g, v.u, v.u);
  if (!is_layer(down) && (gd.w.active || gd.bias.active))
    backprop(ctx, down, nullptr, v.u, v.gy, nullptr, 0.0f, gd, first);
  if (r.need_dh) backprop_inputs(ctx, m, layers, r, v, first, wn);
}

/* What identifies the forward's input for the kept outputs: its address,
 * rows, row stride and dtype, and on a backend that fingerprints cheaply
 * (the CPU) its values. */
uint64_t input_fingerprint(Context &ctx, const Mat &x) {
  const Backend &be = backend(ctx);
  return be.fingerprint != nullptr ? be.fingerprint(ctx, x) : 0;
}

bool kept_matches(Mlp &m, const Mat &x) {
  return m.kept_valid && m.kept_x == x.data && m.kept_rows == x.rows &&
         m.kept_ld == x.ld && m.kept_dtype == x.dtype &&
         m.kept_fingerprint == input_fingerprint(*m.ctx, x);
}

/* The kept G (gated) and U, M x I each, over mlp.kept. */
void kept_views(const Mlp &m, int64_t rows, Mat &g, Mat &u) {
  const size_t half = static_cast<size_t>(rows * m.inter) * osfti_dtype_size(m.dtype);
  char *base = static_cast<char *>(m.kept);
  g = m.gated ? Mat{base, rows, m.inter, m.inter, m.dtype} : Mat{};
  u = Mat{base + (m.gated ? half : 0), rows, m.inter, m.inter, m.dtype};
}

/* The kept buffer for a forward over `rows` tokens (before anything is
 * written: a failed allocation leaves the outputs intact). */
void reserve_kept(Mlp &m, int64_t rows) {
  m.kept_valid = false;
  const size_t bytes = kept_bytes_for(m, rows);
  if (m.kept != nullptr && m.kept_bytes == bytes) return;
  drop_kept(m);
  m.kept = memory_alloc(*m.ctx, bytes, "mlp kept forward outputs");
  m.kept_bytes = bytes;
}

}  // namespace

void mlp_forward(Mlp &m, const DLTensor *x, DLTensor *y, int64_t num_tiles) {
  Context &ctx = *m.ctx;
  Operands ins, outs;
  const Mat xm = checked_input(m, x, num_tiles, ins);
  const Mat ym = checked_rows(ctx, y, "y", m.dtype, m.hidden, x, "x");
  outs.add("y", y);
  outs.check_outputs_clear_of(ins);
  const Tiling tiles = plan_tiles(m, xm.rows, num_tiles);
  m.kept_valid = false; /* a new forward: what an earlier one kept is stale */
  if (tiles.nonempty() == 0) return;
  const bool keep = keeps_outputs(m, xm.rows);
  BufferPlan b;
  const int gs = m.gated && !keep ? b.add(tiles.max_rows, m.inter, m.dtype) : -1;
  const int us = b.add(tiles.max_rows, m.inter, m.dtype); /* U, or H where kept */
  const size_t reserved = reserve_layer_scratch(m, tiles, nullptr, nullptr);
  b.place(m);
  if (keep) reserve_kept(m, xm.rows);
  Mat kg, ku;
  if (keep) kept_views(m, xm.rows, kg, ku);
  const MlpKernels &k = mlp_kernels(ctx);
  const PackedWeights w(ctx, m.proj, tiles, Op::T, 7u);
  for (int64_t t = 0; t < tiles.nonempty(); ++t) {
    const int64_t begin = tiles.begin(t), rows = tiles.rows(t);
    const Mat xt = rows_of(xm, begin, rows);
    const Mat scratch = rows_of(b.mat(us), 0, rows);
    Mat g = gs >= 0 ? rows_of(b.mat(gs), 0, rows) : Mat{};
    Mat u = scratch;
    if (keep) {
      g = m.gated ? rows_of(kg, begin, rows) : Mat{};
      u = rows_of(ku, begin, rows);
    }
    if (m.gated) project(ctx, m.proj[kGate], xt, g, w[kGate]);
    project(ctx, m.proj[kUp], xt, u, w[kUp]);
    k.activate(ctx, m.act, opt(g, m.gated), u, scratch); /* H; in place unless kept */
    project(ctx, m.proj[kDown], scratch, rows_of(ym, begin, rows), w[kDown]);
  }
  if (keep) {
    m.kept_x = xm.data;
    m.kept_rows = xm.rows;
    m.kept_ld = xm.ld;
    m.kept_dtype = xm.dtype;
    m.kept_fingerprint = input_fingerprint(ctx, xm);
    m.kept_valid = true;
  }
  check_reserved(m, reserved);
}

void mlp_backward(Mlp &m, const DLTensor *x, const DLTensor *grad_y,
                  const osft_mlp_grads_t &grads, int64_t num_tiles) {
  Context &ctx = *m.ctx;
  Operands ins, outs;
  const Mat xm = checked_input(m, x, num_tiles, ins);
  const Mat gy = checked_rows(ctx, grad_y, "grad_y", m.dtype, m.hidden, x, "x");
  ins.add("grad_y", grad_y);
  Requests r = check_grads(ctx, m, x, grads, outs);
  outs.check_outputs_clear_of(ins);
  const Tiling tiles = plan_tiles(m, xm.rows, num_tiles);
  if (tiles.nonempty() == 0) return zero_empty_sums(ctx, r);

  BackwardPlan bp;
  bp.kept = kept_matches(m, xm);
  if (bp.kept) kept_views(m, xm.rows, bp.kept_g, bp.kept_u);
  plan_backward(m, r, tiles, bp);
  const size_t reserved = reserve_layer_scratch(m, tiles, &r, bp.shadowed, !bp.kept);
  bp.buffers.place(m);
  m.kept_valid = false; /* consumed: the tiles below overwrite G and U */
  for_each_sink(r, [&](Accum &a) {
    if (a.staged) a.acc = bp.buffers.mat(a.slot);
  });
  std::optional<Fp32Shadow> shadows[3];
  Layer *layers[3] = {nullptr, nullptr, nullptr};
  for (int i = 0; i < 3; ++i) {
    if (!is_layer(m.proj[i])) continue;
    layers[i] = m.proj[i].layer;
    if (!bp.shadowed[i]) continue;
    shadows[i].emplace(*m.proj[i].layer, bp.buffers, bp.shadow_slots[i]);
    layers[i] = &shadows[i]->layer();
  }
  /* gate and up forward again (op T; not where kept); dH = dY W_down and
   * dx = dG W_gate + dU W_up (op N) */
  const unsigned in_bits = (1u << kGate) | (1u << kUp);
  const PackedWeights wt(ctx, m.proj, tiles, Op::T, bp.kept ? 0u : in_bits);
  const PackedWeights wn(ctx, m.proj, tiles, Op::N,
                         (r.need_dh ? 1u << kDown : 0u) | (r.dx.active ? in_bits : 0u));
  for (int64_t t = 0; t < tiles.nonempty(); ++t) {
    const TileViews v = tile_views(xm, gy, r, bp, tiles.begin(t), tiles.rows(t));
    backward_tile(ctx, m, layers, r, v, t == 0, !bp.kept, wt, wn);
  }
  for_each_sink(r, [&](const Accum &a) { finish(ctx, a); });
  if (bp.kept) drop_kept(m);
  check_reserved(m, reserved);
}

}  // namespace osft::mlp
