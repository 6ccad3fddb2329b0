/* Factorized linear: creating layers (from a weight by SVD, or over
 * caller-owned factors), the factor views, merge, re-decomposition. */
#include <cmath>

#include "core/child_handle.h"
#include "core/error.h"
#include "core/handle.h"
#include "core/options.h"
#include "core/scratch.h"
#include "core/tensor_args.h"
#include "ops/flinear_ops.h"

namespace osft {
namespace {

constexpr size_t kOptionsV1Size = OSFTI_V1_SIZE(osft_flinear_options_t, factor_dtype);
constexpr osfti_dtype_t kFactorDtypes =
    static_cast<osfti_dtype_t>(OSFTI_F32 | OSFTI_BF16);

const char *const kFactorNames[6] = {"u_high", "s_high", "v_high",
                                     "u_low",  "s_low",  "v_low"};

/* A dense weight: fp32, fp64 or bf16, n x kin (OSFTI_ANY to learn them). */
Mat checked_weight(Context &ctx, const DLTensor *w, const char *name, int64_t n,
                   int64_t kin) {
  return checked_matrix(ctx, w, name, OSFTI_F32 | OSFTI_F64 | OSFTI_BF16, n, kin);
}

void require_finite(Context &ctx, const Mat &w, const char *name) {
  if (!backend(ctx).all_finite(ctx, w))
    raise(OSFT_STATUS_NUMERICAL_ERROR, "%s: contains NaN or Inf; cannot decompose it",
          name);
}

int64_t frozen_rank(double ratio, int64_t k) {
  const int64_t r = std::llround(ratio * static_cast<double>(k));
  if (r < 1 || r > k - 1)
    raise(OSFT_STATUS_INVALID_ARGUMENT,
          "opts->rank_ratio: %g of rank k = %lld gives r = %lld frozen; need 1 <= r <= "
          "k - 1",
          ratio, static_cast<long long>(k), static_cast<long long>(r));
  return r;
}

osfti_dtype_t factor_dtype_for(const osft_flinear_options_t &o, osfti_dtype_t weight) {
  if (o.factor_dtype.bits == 0) return weight == OSFTI_BF16 ? OSFTI_BF16 : OSFTI_F32;
  return osfti_dtype_from_dl(o.factor_dtype); /* validated with the options */
}

DLDataType dl_dtype(osfti_dtype_t dt) {
  DLDataType d;
  d.code = dt == OSFTI_BF16 ? kDLBfloat : kDLFloat;
  d.bits = static_cast<uint8_t>(8 * osfti_dtype_size(dt));
  d.lanes = 1;
  return d;
}

/* Points a factor descriptor at `data` with the given 1-D or 2-D layout. */
void set_factor(Layer &layer, int which, void *data, int ndim, int64_t rows, int64_t cols,
                int64_t ld) {
  FactorTensor &f = layer.factor[which];
  f.t = DLTensor{};
  f.t.data = data;
  f.t.device = dl_device(*layer.ctx);
  f.t.ndim = ndim;
  f.t.dtype = dl_dtype(layer.factor_dtype);
  f.shape[0] = ndim == 2 ? rows : cols;
  f.shape[1] = cols;
  f.strides[0] = ndim == 2 ? ld : 1;
  f.strides[1] = 1;
  f.t.shape = f.shape;
  f.t.strides = f.strides;
}

/* Runtime-owned storage: U (n x k), S (k), V^T (k x kin), high part first. */
void set_owned_views(Layer &layer) {
  const size_t e = osfti_dtype_size(layer.factor_dtype);
  const int64_t k = layer.r + layer.l;
  char *u = static_cast<char *>(layer.owned[0]);
  char *s = static_cast<char *>(layer.owned[1]);
  char *v = static_cast<char *>(layer.owned[2]);
  set_factor(layer, OSFT_FACTOR_U_HIGH, u, 2, layer.n, layer.r, k);
  set_factor(layer, OSFT_FACTOR_U_LOW, u + layer.r * e, 2, layer.n, layer.l, k);
  set_factor(layer, OSFT_FACTOR_S_HIGH, s, 1, 1, layer.r, 0);
  set_factor(layer, OSFT_FACTOR_S_LOW, s + layer.r * e, 1, 1, layer.l, 0);
  set_factor(layer, OSFT_FACTOR_V_HIGH, v, 2, layer.r, layer.kin, layer.kin);
  set_factor(layer, OSFT_FACTOR_V_LOW, v + layer.r * layer.kin * e, 2, layer.l, layer.kin,
             layer.kin);
}

void free_owned(Layer &layer) noexcept {
  for (int i = 0; i < 3; ++i) {
    memory_free(*layer.ctx, layer.owned[i], layer.owned_bytes[i]);
    layer.owned[i] = nullptr;
  }
}

void allocate_owned(Layer &layer) {
  const size_t e = osfti_dtype_size(layer.factor_dtype);
  const int64_t k = layer.r + layer.l;
  layer.owned_bytes[0] = static_cast<size_t>(layer.n * k) * e;
  layer.owned_bytes[1] = static_cast<size_t>(k) * e;
  layer.owned_bytes[2] = static_cast<size_t>(k * layer.kin) * e;
  static const char *const what[3] = {"flinear U", "flinear S", "flinear V"};
  try {
    for (int i = 0; i < 3; ++i)
      layer.owned[i] = memory_alloc(*layer.ctx, layer.owned_bytes[i], what[i]);
  } catch (...) {
    free_owned(layer);
    throw;
  }
}

/* Copies factor i's caller descriptor (shape, strides made explicit). */
void adopt_factor(Layer &layer, int which, const DLTensor *t) {
  FactorTensor &f = layer.factor[which];
  f.t = *t;
  for (int d = 0; d < t->ndim; ++d) f.shape[d] = t->shape[d];
  if (t->ndim == 2) {
    f.strides[0] = t->strides != nullptr ? t->strides[0] : t->shape[1];
    f.strides[1] = 1;
  } else {
    f.strides[0] = 1;
  }
  f.t.shape = f.shape;
  f.t.strides = f.strides;
}

/* Validates caller factors and learns n, kin, r, l and the dtype. */
void check_factors(Context &ctx, const osft_flinear_factors_t &f, Layer &layer) {
  const DLTensor *t[6] = {f.u_high, f.s_high, f.v_high, f.u_low, f.s_low, f.v_low};
  for (int i = 0; i < 6; ++i)
    if (t[i] == nullptr)
      raise(OSFT_STATUS_INVALID_ARGUMENT, "factors->%s: NULL tensor", kFactorNames[i]);
  checked_matrix(ctx, f.u_high, "factors->u_high", kFactorDtypes, OSFTI_ANY, OSFTI_ANY);
  checked_matrix(ctx, f.u_low, "factors->u_low", kFactorDtypes, f.u_high->shape[0],
                 OSFTI_ANY);
  checked_matrix(ctx, f.v_high, "factors->v_high", kFactorDtypes, f.u_high->shape[1],
                 OSFTI_ANY);
  layer.n = f.u_high->shape[0];
  layer.r = f.u_high->shape[1];
  layer.l = f.u_low->shape[1];
  layer.kin = f.v_high->shape[1];
  checked_vector(ctx, f.s_high, "factors->s_high", kFactorDtypes, layer.r);
  checked_vector(ctx, f.s_low, "factors->s_low", kFactorDtypes, layer.l);
  checked_matrix(ctx, f.v_low, "factors->v_low", kFactorDtypes, layer.l, layer.kin);
  for (int i = 1; i < 6; ++i) {
    char name[32];
    std::snprintf(name, sizeof name, "factors->%s", kFactorNames[i]);
    throw_if_error(osfti_check_same_dtype("factors->u_high", f.u_high, name, t[i]));
  }
  const int64_t k = std::min(layer.n, layer.kin);
  if (layer.r < 1 || layer.l < 1 || layer.r + layer.l > k)
    raise(
        OSFT_STATUS_SHAPE_MISMATCH,
        "factors: r = %lld frozen and l = %lld trainable; need r >= 1, l >= 1 and r + l "
        "<= min(N, K) = %lld",
        static_cast<long long>(layer.r), static_cast<long long>(layer.l),
        static_cast<long long>(k));
  for (int i = 0; i < 6; ++i)
    for (int j = i + 1; j < 6; ++j)
      check_no_overlap(kFactorNames[i], t[i], kFactorNames[j], t[j]);
  layer.factor_dtype = osfti_dtype_from_dl(f.u_high->dtype);
  for (int i = 0; i < 6; ++i) adopt_factor(layer, i, t[i]);
}

Mat factor_mat(const Layer &layer, int which) {
  return as_mat(&layer.factor[which].t);
}

Vec factor_vec(const Layer &layer, int which) {
  return as_vec(&layer.factor[which].t);
}

/* Writes an SVD (u: n x k, s: k, vt: k x kin, any k >= r + l) into the
 * layer's factors: triplets [0, r) frozen, [r, r + l) trainable. */
void store_triplets(Layer &layer, const Mat &u, const Vec &s, const Mat &vt) {
  const Backend &be = backend(*layer.ctx);
  const FactorViews f = factor_views(layer);
  auto copy = [&](const Mat &src, const Mat &dst) {
    be.scale_into(*layer.ctx, Axis::cols, src, nullptr, 0.0f, dst);
  };
  copy(cols_of(u, 0, layer.r), f.u_high);
  copy(cols_of(u, layer.r, layer.l), f.u_low);
  copy(rows_of(vt, 0, layer.r), f.v_high);
  copy(rows_of(vt, layer.r, layer.l), f.v_low);
  copy(cols_of(as_row(s), 0, layer.r), as_row(f.s_high));
  copy(cols_of(as_row(s), layer.r, layer.l), as_row(f.s_low));
}

Layer *new_layer(Context &ctx, const osft_flinear_options_t &opts) {
  Layer *layer = ctx.allocator.make<Layer>("flinear layer");
  layer->ctx = &ctx;
  layer->strategy = opts.strategy;
  layer->updates_reported = opts.trainable_updates == OSFT_FLINEAR_UPDATES_REPORTED;
  return layer;
}

Layer *register_layer(Layer *layer) {
  return register_child(layer, HandleKind::flinear, destroy_layer);
}

}  // namespace

osft_flinear_options_t read_flinear_options(const osft_flinear_options_t *user) {
  osft_flinear_options_t d{};
  d.struct_size = sizeof d;
  d.rank_ratio = 0.5;
  d.strategy = OSFT_FLINEAR_AUTO;
  if (user == nullptr) return d;
  osft_flinear_options_t o =
      read_struct(user, d, kOptionsV1Size, "opts", "osft_flinear_options_t");
  if (!(o.rank_ratio > 0.0 && o.rank_ratio < 1.0))
    raise(OSFT_STATUS_INVALID_ARGUMENT, "opts->rank_ratio: %g is outside (0, 1)",
          o.rank_ratio);
  const int strategy = raw_enum(o.strategy);
  if (strategy < OSFT_FLINEAR_AUTO || strategy > OSFT_FLINEAR_HYBRID)
    raise(OSFT_STATUS_INVALID_ARGUMENT,
          "opts->strategy: %d is not an osft_flinear_strategy_t", strategy);
  const int updates = raw_enum(o.trainable_updates);
  if (updates < OSFT_FLINEAR_UPDATES_DETECTED || updates > OSFT_FLINEAR_UPDATES_REPORTED)
    raise(OSFT_STATUS_INVALID_ARGUMENT,
          "opts->trainable_updates: %d is not an osft_flinear_updates_t", updates);
  if (o.factor_dtype.bits != 0 &&
      (osfti_dtype_from_dl(o.factor_dtype) & kFactorDtypes) == 0)
    raise(
        OSFT_STATUS_DTYPE_MISMATCH,
        "opts->factor_dtype: (code %d, %d bits, %d lanes); expected float32 or bfloat16",
        o.factor_dtype.code, o.factor_dtype.bits, o.factor_dtype.lanes);
  return o;
}

Layer *create_from_weight(Context &ctx, const DLTensor *weight,
                          const osft_flinear_options_t &opts) {
  const Mat w = checked_weight(ctx, weight, "weight", OSFTI_ANY, OSFTI_ANY);
  const int64_t k = std::min(w.rows, w.cols);
  if (k < 2)
    raise(OSFT_STATUS_SHAPE_MISMATCH,
          "weight: shape [%lld, %lld] has rank k = %lld < 2; nothing to split",
          static_cast<long long>(w.rows), static_cast<long long>(w.cols),
          static_cast<long long>(k));
  const int64_t r = frozen_rank(opts.rank_ratio, k);
  require_finite(ctx, w, "weight");
  Layer *layer = new_layer(ctx, opts);
  try {
    layer->n = w.rows;
    layer->kin = w.cols;
    layer->r = r;
    layer->l = k - r;
    layer->factor_dtype = factor_dtype_for(opts, w.dtype);
    allocate_owned(*layer);
    set_owned_views(*layer);
    const FactorViews f = factor_views(*layer);
    backend(ctx).svd(ctx, w, f.u_all, f.s_all, f.v_all);
  } catch (...) {
    destroy_layer(layer);
    throw;
  }
  return register_layer(layer);
}

Layer *create_from_factors(Context &ctx, const osft_flinear_factors_t &factors,
                           const osft_flinear_options_t &opts) {
  Layer *layer = new_layer(ctx, opts);
  try {
    check_factors(ctx, factors, *layer);
  } catch (...) {
    destroy_layer(layer);
    throw;
  }
  return register_layer(layer);
}

void destroy_layer(Layer *layer) noexcept {
  uncount_child(layer);
  refresh(*layer);
  free_owned(*layer);
  layer->ctx->allocator.destroy(layer);
}

Layer &checked_layer(osft_flinear_t layer, const char *arg) {
  return checked_child(layer, HandleKind::flinear, arg);
}

FactorViews factor_views(const Layer &layer) {
  FactorViews f;
  f.u_high = factor_mat(layer, OSFT_FACTOR_U_HIGH);
  f.u_low = factor_mat(layer, OSFT_FACTOR_U_LOW);
  f.v_high = factor_mat(layer, OSFT_FACTOR_V_HIGH);
  f.v_low = factor_mat(layer, OSFT_FACTOR_V_LOW);
  f.s_high = factor_vec(layer, OSFT_FACTOR_S_HIGH);
  f.s_low = factor_vec(layer, OSFT_FACTOR_S_LOW);
  const size_t e = osfti_dtype_size(layer.factor_dtype);
  const int64_t k = layer.r + layer.l;
  const char *u0 = static_cast<const char *>(f.u_high.data);
  const char *v0 = static_cast<const char *>(f.v_high.data);
  const char *s0 = static_cast<const char *>(f.s_high.data);
  f.u_fused = f.u_low.data == u0 + layer.r * e && f.u_low.ld == f.u_high.ld;
  f.v_fused = f.v_low.data == v0 + layer.r * f.v_high.ld * e && f.v_low.ld == f.v_high.ld;
  f.s_fused = f.s_low.data == s0 + layer.r * e;
  if (f.u_fused)
    f.u_all = Mat{f.u_high.data, layer.n, k, f.u_high.ld, layer.factor_dtype};
  if (f.v_fused)
    f.v_all = Mat{f.v_high.data, k, layer.kin, f.v_high.ld, layer.factor_dtype};
  if (f.s_fused) f.s_all = Vec{f.s_high.data, k, layer.factor_dtype};
  return f;
}

void get_factor(Layer &layer, int which, DLTensor *view) {
  if (which < OSFT_FACTOR_U_HIGH || which > OSFT_FACTOR_V_LOW)
    raise(OSFT_STATUS_INVALID_ARGUMENT, "which: %d is not an osft_flinear_factor_t",
          which);
  *view = layer.factor[which].t;
  /* a writable view of a trainable factor: the caller may change it */
  if (which >= OSFT_FACTOR_U_LOW) ++layer.trainable_version;
}

void merge(Layer &layer, const DLTensor *weight) {
  Context &ctx = *layer.ctx;
  const Mat w = checked_weight(ctx, weight, "weight", layer.n, layer.kin);
  for (int i = 0; i < 6; ++i)
    check_no_overlap(kFactorNames[i], &layer.factor[i].t, "weight", weight);
  ScratchPlan plan;
  const DenseSlots slots = plan_dense(layer, plan);
  const int w32 = w.dtype == OSFTI_F32 ? -1 : plan.add_mat(layer.n, layer.kin, OSFTI_F32);
  plan.allocate(ctx);
  build_dense(layer, w32 < 0 ? w : plan.mat(w32), plan, slots);
  if (w32 >= 0) backend(ctx).scale_into(ctx, Axis::cols, plan.mat(w32), nullptr, 0.0f, w);
}

void redecompose(Layer &layer, const DLTensor *weight) {
  Context &ctx = *layer.ctx;
  const int64_t k = std::min(layer.n, layer.kin);
  ScratchPlan plan;
  Mat w;
  int w32 = -1;
  DenseSlots slots;
  if (weight != nullptr) {
    w = checked_weight(ctx, weight, "weight", layer.n, layer.kin);
    require_finite(ctx, w, "weight");
  } else {
    slots = plan_dense(layer, plan);
    w32 = plan.add_mat(layer.n, layer.kin, OSFTI_F32);
  }
  const int u = plan.add_mat(layer.n, k, OSFTI_F32);
  const int s = plan.add_mat(1, k, OSFTI_F32);
  const int vt = plan.add_mat(k, layer.kin, OSFTI_F32);
  plan.allocate(ctx);
  if (w32 >= 0) {
    w = plan.mat(w32);
    build_dense(layer, w, plan, slots);
    require_finite(ctx, w, "the merged weight");
  }
  const Mat sm = plan.mat(s);
  const Vec sv{sm.data, k, OSFTI_F32};
  backend(ctx).svd(ctx, w, plan.mat(u), sv, plan.mat(vt));
  store_triplets(layer, plan.mat(u), sv, plan.mat(vt));
  refresh(layer);
}

void refresh(Layer &layer) noexcept {
  const size_t bytes = static_cast<size_t>(layer.n * layer.kin) * sizeof(float);
  for (void **cache : {&layer.w_high, &layer.w_cur}) {
    memory_free(*layer.ctx, *cache, bytes);
    *cache = nullptr;
  }
  memory_free(*layer.ctx, layer.w_low, low_snapshot_bytes(layer));
  layer.w_low = nullptr;
  layer.w_cur_valid = layer.w_low_valid = false;
}

}  // namespace osft
