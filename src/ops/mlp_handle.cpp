/* Tiled MLP: creating and destroying the handle (validating the weights,
 * biases and layers it borrows), the tiling rule, and where a call's buffers
 * live. */
#include <algorithm>
#include <cstdio>

#include "core/child_handle.h"
#include "core/error.h"
#include "core/handle.h"
#include "core/logging.h"
#include "core/options.h"
#include "core/tensor_args.h"
#include "ops/mlp_ops.h"

namespace osft::mlp {
namespace {

constexpr size_t kOptionsV1Size = OSFTI_V1_SIZE(osft_mlp_options_t, dtype);
constexpr unsigned kComputeDtypes = OSFTI_F32 | OSFTI_BF16;

struct VariantInfo {
  bool gated;
  Activation act;
};

VariantInfo variant_info(int variant) {
  switch (variant) {
    case OSFT_MLP_SWIGLU: return {true, Activation::silu};
    case OSFT_MLP_GEGLU_TANH: return {true, Activation::gelu_tanh};
    case OSFT_MLP_GEGLU_ERF: return {true, Activation::gelu_erf};
    case OSFT_MLP_GELU_TANH: return {false, Activation::gelu_tanh};
    case OSFT_MLP_GELU_ERF: return {false, Activation::gelu_erf};
    case OSFT_MLP_SILU: return {false, Activation::silu};
    case OSFT_MLP_RELU: return {false, Activation::relu};
    default:
      raise(OSFT_STATUS_INVALID_ARGUMENT, "variant: %d is not an osft_mlp_variant_t",
            variant);
  }
}

struct ProjArgs {
  const char *name, *weight_name, *layer_name, *bias_name;
  const DLTensor *weight;
  osft_flinear_t layer;
  const DLTensor *bias;
};

/* The weight or layer of one projection, validated (the weight's dtype is
 * checked against the others once all are known). */
void adopt_projection(Context &ctx, Projection &p, const ProjArgs &a) {
  p.name = a.name;
  if (!p.present) {
    const bool given = a.weight != nullptr || a.layer != nullptr || a.bias != nullptr;
    if (given)
      raise(OSFT_STATUS_INVALID_ARGUMENT,
            "weights->%s: plain (ungated) variants have no gate projection; leave "
            "gate, gate_layer and gate_bias NULL",
            a.weight != nullptr  ? a.weight_name
            : a.layer != nullptr ? a.layer_name
                                 : a.bias_name);
    return;
  }
  if ((a.weight != nullptr) == (a.layer != nullptr))
    raise(OSFT_STATUS_INVALID_ARGUMENT, "weights->%s / weights->%s: give exactly one",
          a.weight_name, a.layer_name);
  if (a.weight != nullptr) {
    char name[48];
    std::snprintf(name, sizeof name, "weights->%s", a.weight_name);
    p.weight = checked_matrix(ctx, a.weight, name, kComputeDtypes, p.out, p.in);
    p.weight_t = hold(a.weight);
  } else {
    char name[48];
    std::snprintf(name, sizeof name, "weights->%s", a.layer_name);
    const Layer &l = checked_layer(a.layer, name);
    if (l.ctx != &ctx)
      raise(OSFT_STATUS_INVALID_ARGUMENT, "%s: belongs to another context", name);
    if (l.n != p.out || l.kin != p.in)
      raise(OSFT_STATUS_SHAPE_MISMATCH,
            "%s: a %lld x %lld layer (out x in), expected %lld x %lld", name,
            static_cast<long long>(l.n), static_cast<long long>(l.kin),
            static_cast<long long>(p.out), static_cast<long long>(p.in));
    p.layer = a.layer;
  }
}

/* Biases may be fp32 or the compute dtype, known only after the weights. */
void adopt_bias(Context &ctx, Projection &p, const ProjArgs &a, osfti_dtype_t dtype) {
  if (a.bias == nullptr || !p.present) return;
  char name[48];
  std::snprintf(name, sizeof name, "weights->%s", a.bias_name);
  p.bias = checked_vector(ctx, a.bias, name, OSFTI_F32 | dtype, p.out);
  p.bias_t = hold(a.bias);
  p.has_bias = true;
}

/* The compute dtype: opts->dtype, else the dense weights' (which must
 * agree), else fp32. */
osfti_dtype_t compute_dtype(const Mlp &m, const osft_mlp_options_t &opts) {
  osfti_dtype_t dt =
      opts.dtype.bits != 0 ? osfti_dtype_from_dl(opts.dtype) : OSFTI_DTYPE_INVALID;
  const char *from = "opts->dtype";
  for (const Projection &p : m.proj) {
    if (p.weight.data == nullptr) continue;
    if (dt == OSFTI_DTYPE_INVALID) {
      dt = p.weight.dtype;
      from = p.name;
    } else if (p.weight.dtype != dt) {
      raise(OSFT_STATUS_DTYPE_MISMATCH,
            "weights->%s: %s, but %s is %s; dense weights have the compute dtype", p.name,
            osfti_dtype_name(p.weight.dtype), from, osfti_dtype_name(dt));
    }
  }
  return dt == OSFTI_DTYPE_INVALID ? OSFTI_F32 : dt;
}

void check_tiling(const Mlp &m) {
  if (m.tiling == OSFT_MLP_TILING_TOKENS && m.tile_tokens < 1)
    raise(OSFT_STATUS_INVALID_ARGUMENT,
          "opts->tile_tokens: %lld; OSFT_MLP_TILING_TOKENS needs at least 1 token "
          "per tile",
          static_cast<long long>(m.tile_tokens));
  if (m.tiling == OSFT_MLP_TILING_BUDGET && m.memory_budget < bytes_per_token(m))
    raise(OSFT_STATUS_INVALID_ARGUMENT,
          "opts->memory_budget: %zu bytes is less than one token's intermediates "
          "(%zu bytes)",
          m.memory_budget, bytes_per_token(m));
}

Mlp *register_mlp(Mlp *mlp) {
  return register_child(mlp, HandleKind::mlp, destroy_mlp);
}

void fill(Mlp &m, Context &ctx, int variant, int64_t hidden, int64_t inter,
          const osft_mlp_weights_t &w, const osft_mlp_options_t &opts) {
  const VariantInfo info = variant_info(variant);
  m.variant = static_cast<osft_mlp_variant_t>(variant);
  m.gated = info.gated;
  m.act = info.act;
  m.hidden = hidden;
  m.inter = inter;
  m.tiling = opts.tiling;
  m.tile_tokens = opts.tile_tokens;
  m.memory_budget = opts.memory_budget;
  const ProjArgs args[3] = {
      {"gate", "gate", "gate_layer", "gate_bias", w.gate, w.gate_layer, w.gate_bias},
      {"up", "up", "up_layer", "up_bias", w.up, w.up_layer, w.up_bias},
      {"down", "down", "down_layer", "down_bias", w.down, w.down_layer, w.down_bias}};
  const int64_t out[3] = {inter, inter, hidden}, in[3] = {hidden, hidden, inter};
  for (int i = 0; i < 3; ++i) {
    m.proj[i].present = i != kGate || m.gated;
    m.proj[i].out = out[i];
    m.proj[i].in = in[i];
    adopt_projection(ctx, m.proj[i], args[i]);
  }
  m.dtype = compute_dtype(m, opts);
  for (int i = 0; i < 3; ++i) adopt_bias(ctx, m.proj[i], args[i], m.dtype);
  check_tiling(m);
}

}  // namespace

HeldTensor hold(const DLTensor *t) {
  HeldTensor h;
  h.t = *t;
  for (int d = 0; d < t->ndim; ++d) h.shape[d] = t->shape[d];
  h.strides[t->ndim - 1] = 1;
  if (t->ndim == 2) h.strides[0] = t->strides != nullptr ? t->strides[0] : t->shape[1];
  h.repoint();
  return h;
}

HeldTensor view_of(const Context &ctx, const Mat &m, bool vector) {
  HeldTensor h;
  h.t.data = m.data;
  h.t.device = dl_device(ctx);
  h.t.dtype.code = m.dtype == OSFTI_BF16 ? kDLBfloat : kDLFloat;
  h.t.dtype.bits = static_cast<uint8_t>(8 * osfti_dtype_size(m.dtype));
  h.t.dtype.lanes = 1;
  h.t.ndim = vector ? 1 : 2;
  h.shape[0] = vector ? m.cols : m.rows;
  h.shape[1] = m.cols;
  h.strides[0] = vector ? 1 : m.ld;
  h.strides[1] = 1;
  h.repoint();
  return h;
}

osft_mlp_options_t read_mlp_options(const osft_mlp_options_t *user) {
  osft_mlp_options_t d{};
  d.struct_size = sizeof d;
  d.tiling = OSFT_MLP_TILING_AUTO;
  if (user == nullptr) return d;
  osft_mlp_options_t o =
      read_struct(user, d, kOptionsV1Size, "opts", "osft_mlp_options_t");
  const int tiling = raw_enum(o.tiling);
  if (tiling < OSFT_MLP_TILING_AUTO || tiling > OSFT_MLP_TILING_BUDGET)
    raise(OSFT_STATUS_INVALID_ARGUMENT, "opts->tiling: %d is not an osft_mlp_tiling_t",
          tiling);
  if (o.dtype.bits != 0 && (osfti_dtype_from_dl(o.dtype) & kComputeDtypes) == 0)
    raise(OSFT_STATUS_DTYPE_MISMATCH,
          "opts->dtype: (code %d, %d bits, %d lanes); expected float32 or bfloat16",
          o.dtype.code, o.dtype.bits, o.dtype.lanes);
  return o;
}

Mlp *create_mlp(Context &ctx, int variant, int64_t hidden, int64_t intermediate,
                const osft_mlp_weights_t &weights, const osft_mlp_options_t &opts) {
  if (hidden < 1 || intermediate < 1)
    raise(OSFT_STATUS_INVALID_ARGUMENT,
          "hidden = %lld, intermediate = %lld: both must be at least 1",
          static_cast<long long>(hidden), static_cast<long long>(intermediate));
  Mlp *mlp = ctx.allocator.make<Mlp>("mlp");
  mlp->ctx = &ctx;
  try {
    fill(*mlp, ctx, variant, hidden, intermediate, weights, opts);
  } catch (...) {
    destroy_mlp(mlp);
    throw;
  }
  return register_mlp(mlp);
}

void destroy_mlp(Mlp *mlp) noexcept {
  drop_kept(*mlp);
  uncount_child(mlp);
  mlp->ctx->allocator.destroy(mlp);
}

Mlp &checked_mlp(osft_mlp_t mlp, const char *arg) {
  checked_child(mlp, HandleKind::mlp, arg);
  for (const Projection &p : mlp->proj)
    if (p.layer != nullptr && !is_live_handle(p.layer, HandleKind::flinear))
      raise(OSFT_STATUS_INVALID_HANDLE,
            "%s: its %s layer was destroyed; destroy MLPs before their layers", arg,
            p.name);
  return *mlp;
}

bool has_layer(const Mlp &mlp) noexcept {
  for (const Projection &p : mlp.proj)
    if (is_layer(p)) return true;
  return false;
}

bool fp32_grad_x_sum(const Mlp &mlp) noexcept {
  return mlp.gated && mlp.dtype != OSFTI_F32 && !is_layer(mlp.proj[kGate]) &&
         !is_layer(mlp.proj[kUp]);
}

size_t bytes_per_token(const Mlp &mlp) noexcept {
  const size_t e = osfti_dtype_size(mlp.dtype);
  size_t buffers = mlp.gated ? 3 : 2;
  if (is_layer(mlp.proj[kDown])) ++buffers;
  size_t bytes = buffers * static_cast<size_t>(mlp.inter) * e;
  if (fp32_grad_x_sum(mlp)) bytes += static_cast<size_t>(mlp.hidden) * sizeof(float);
  return bytes;
}

/* A budget that holds every tile's intermediates holds the forward's gate
 * and up outputs until the backward, which then need not recompute them. */
bool keeps_outputs(const Mlp &mlp, int64_t tokens) noexcept {
  return mlp.tiling == OSFT_MLP_TILING_BUDGET && tokens > 0 &&
         static_cast<double>(tokens) * static_cast<double>(bytes_per_token(mlp)) <=
             static_cast<double>(mlp.memory_budget);
}

size_t kept_bytes_for(const Mlp &mlp, int64_t tokens) noexcept {
  return static_cast<size_t>(tokens * mlp.inter) * osfti_dtype_size(mlp.dtype) *
         (mlp.gated ? 2u : 1u);
}

void drop_kept(Mlp &mlp) noexcept {
  memory_free(*mlp.ctx, mlp.kept, mlp.kept_bytes);
  mlp.kept = nullptr;
  mlp.kept_bytes = 0;
  mlp.kept_valid = false;
}

Tiling plan_tiles(const Mlp &mlp, int64_t tokens, int64_t forced) {
  Tiling t;
  t.tokens = tokens;
  if (forced > 0) {
    t.count = forced;
  } else if (tokens > 0) {
    const int64_t per_token = static_cast<int64_t>(bytes_per_token(mlp));
    int64_t size = mlp.hidden;
    if (mlp.tiling == OSFT_MLP_TILING_TOKENS) size = mlp.tile_tokens;
    if (mlp.tiling == OSFT_MLP_TILING_BUDGET)
      size = static_cast<int64_t>(mlp.memory_budget / static_cast<size_t>(per_token));
    /* Within the workspace limit, with room for each buffer's alignment. */
    const size_t limit = mlp.ctx->workspace_limit, slack = 5 * BufferPlan::alignment;
    if (limit != 0)
      size = std::min(
          size, std::max<int64_t>(
                    1, static_cast<int64_t>(limit - std::min(limit, slack)) / per_token));
    t.count = tokens / size + (tokens % size != 0); /* ceil, without overflow */
  }
  t.max_rows = t.count > 0 ? tokens / t.count + (tokens % t.count != 0) : 0;
  log_message(OSFT_LOG_DEBUG, "mlp %lldx%lld: %lld tokens in %lld tiles of <= %lld",
              static_cast<long long>(mlp.hidden), static_cast<long long>(mlp.inter),
              static_cast<long long>(tokens), static_cast<long long>(t.count),
              static_cast<long long>(t.max_rows));
  return t;
}

int BufferPlan::add(int64_t rows, int64_t cols, osfti_dtype_t dtype) {
  if (count_ == max_slots) raise(OSFT_STATUS_INTERNAL_ERROR, "mlp: too many buffers");
  total_ = (total_ + alignment - 1) / alignment * alignment;
  slots_[count_] = Slot{total_, rows, cols, dtype};
  total_ += static_cast<size_t>(rows * cols) * osfti_dtype_size(dtype);
  return count_++;
}

void BufferPlan::place(const Mlp &mlp) {
  Context &ctx = *mlp.ctx;
  if (!has_layer(mlp)) {
    base_ = static_cast<char *>(workspace(ctx, total_));
  } else if (total_ > 0) {
    base_ = static_cast<char *>(outer_workspace(ctx, total_, "mlp tile buffers"));
  }
}

Mat BufferPlan::mat(int slot) const noexcept {
  const Slot &s = slots_[slot];
  return Mat{base_ + s.offset, s.rows, s.cols, s.cols, s.dtype};
}

}  // namespace osft::mlp
