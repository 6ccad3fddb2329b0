/* Internal: the factorized-linear (OSFT) layer behind osft_flinear_t —
 * factor storage and views, the cost model, and the two strategies, written
 * once on the backend primitives (src/backend/linalg_backend.h). */
#ifndef OSFTRT_SRC_OPS_FLINEAR_OPS_H
#define OSFTRT_SRC_OPS_FLINEAR_OPS_H

#include "backend/linalg_backend.h"
#include "core/scratch.h"
#include "osftrt/flinear.h"

/* One factor's DLTensor descriptor, with shape/strides stored alongside so
 * the layer owns them. */
struct FactorTensor {
  DLTensor t{};
  int64_t shape[2] = {0, 0};
  int64_t strides[2] = {0, 0};
};

struct osft_flinear_s {
  osft::Context *ctx = nullptr;
  int64_t n = 0;   /* out features (rows of W) */
  int64_t kin = 0; /* in features (columns of W) */
  int64_t r = 0;   /* frozen rank */
  int64_t l = 0;   /* trainable rank */
  osfti_dtype_t factor_dtype = OSFTI_DTYPE_INVALID;
  osft_flinear_strategy_t strategy = OSFT_FLINEAR_AUTO;
  FactorTensor factor[6]; /* indexed by osft_flinear_factor_t */
  /* Runtime-owned storage (create_from_weight): U (n x (r+l)), S, V^T. */
  void *owned[3] = {nullptr, nullptr, nullptr};
  size_t owned_bytes[3] = {0, 0, 0};
  /* Cache of the frozen product U_high diag(S_high) V_high, fp32 n x kin,
   * built on first use by the dense strategy. */
  void *w_high = nullptr;
  /* The last rebuilt dense W (fp32 n x kin), valid while the key of the
   * trainable factors it was built from (their fingerprint and/or the
   * reported version, weight_key() in flinear_compute.cpp) still matches. */
  void *w_cur = nullptr;
  bool w_cur_valid = false;
  uint64_t w_cur_key = 0;
  /* Where the layer updates its kept W in place (updates_in_place()): the
   * operands of the low product W holds, U_low diag(S_low) (n x l) then
   * V_low (l x kin), in w_low_dtype (fp32-sized buffer), and how many
   * updates W has had since it was last built in full. No w_high then. */
  void *w_low = nullptr;
  osfti_dtype_t w_low_dtype = OSFTI_F32;
  bool w_low_valid = false;
  int w_updates = 0;
  /* OSFT_FLINEAR_UPDATES_REPORTED: the caller reports changes of the
   * trainable factors, counted in trainable_version. */
  bool updates_reported = false;
  uint64_t trainable_version = 0;
  bool fingerprints_off = false;            /* test hook: as a backend without them */
  uint64_t rebuilds = 0, frozen_builds = 0; /* osft_flinear_info_t */
  bool counted = false; /* registered, and counted in ctx->live_children */
};

namespace osft {

using Layer = osft_flinear_s;

/* The factors as backend views, with the high and low parts fused into
 * one matrix where they are adjacent in memory. */
struct FactorViews {
  Mat u_high, u_low, v_high, v_low;
  Vec s_high, s_low;
  bool u_fused = false, v_fused = false, s_fused = false;
  Mat u_all, v_all; /* valid when fused: n x (r+l), (r+l) x kin */
  Vec s_all;
};

/* ---- layer lifetime (flinear_layer.cpp) */
Layer *create_from_weight(Context &ctx, const DLTensor *weight,
                          const osft_flinear_options_t &opts);
Layer *create_from_factors(Context &ctx, const osft_flinear_factors_t &factors,
                           const osft_flinear_options_t &opts);
void destroy_layer(Layer *layer) noexcept;
Layer &checked_layer(osft_flinear_t layer, const char *arg);
FactorViews factor_views(const Layer &layer);
void get_factor(Layer &layer, int which, DLTensor *view);
void merge(Layer &layer, const DLTensor *weight);
void redecompose(Layer &layer, const DLTensor *weight);
void refresh(Layer &layer) noexcept;
osft_flinear_options_t read_flinear_options(const osft_flinear_options_t *user);

/* ---- cost model (flinear_plan.cpp) */
/* Which gradients a backward computes. */
struct GradRequest {
  bool x = true, u = true, s = true, v = true, bias = true;
};
/* What the cost model reads of a layer and its context. */
struct PlanShape {
  int64_t n = 0, kin = 0, r = 0, l = 0;
  osfti_dtype_t factor_dtype = OSFTI_F32;
  osft_flinear_strategy_t strategy = OSFT_FLINEAR_AUTO;
  bool cuda = false, allow_tf32 = false;
  bool native_bf16 = false; /* Backend::native_bf16_gemm: bf16 GEMMs on bf16 hardware */
  bool kept = false;        /* the rebuilt W is kept between calls (weight_kept()) */
  size_t workspace_limit = 0;
};
PlanShape plan_shape(const Layer &layer);
/* Whether the layer keeps its rebuilt W between calls: the backend
 * fingerprints the trainable factors, or the caller reports changes. */
bool weight_kept(const Layer &layer);
/* Whether a kept W follows a change of the trainable factors by adding the
 * change of the low product (a snapshot of its operands, l*(n+kin) values)
 * rather than by a rebuild over the cached frozen product (n*kin values):
 * where the snapshot is at most half that cache. */
bool updates_in_place(const Layer &layer);
/* The updates in place between two full builds of a kept W, which bound the
 * rounding the updates accumulate. */
constexpr int kUpdatesBetweenBuilds = 64;
/* The bytes of that snapshot's buffer (fp32-sized, whatever its dtype). */
inline size_t low_snapshot_bytes(const Layer &layer) {
  return static_cast<size_t>(layer.l * (layer.n + layer.kin)) * sizeof(float);
}
/* The relative cost of an fp32-operand GEMM flop next to a compute-dtype one. */
double fp32_gemm_weight(const PlanShape &shape, osfti_dtype_t compute) noexcept;
/* Whether the dense form runs its rebuild and factor-gradient GEMMs on bf16
 * operands (an engine with native bf16 GEMMs: CUDA, oneMKL on AMX; bf16
 * factors and activations) rather than fp32 ones. */
bool dense_bf16_products(const PlanShape &shape, osfti_dtype_t compute) noexcept;
osft_flinear_strategy_t choose_strategy(const PlanShape &shape, int64_t tokens,
                                        osft_flinear_pass_t pass, const GradRequest &want,
                                        osfti_dtype_t compute);
osft_flinear_strategy_t choose_strategy(const Layer &layer, int64_t tokens,
                                        osft_flinear_pass_t pass, const GradRequest &want,
                                        osfti_dtype_t compute);

/* ---- computation (flinear_compute.cpp) */
/* Scratch slots build_dense() needs, added to an operation's plan. */
struct DenseSlots {
  int us = -1;  /* n x max(r, l) fp32: U diag(S) */
  int v32 = -1; /* max(r, l) x kin fp32: V widened (bf16 factors only) */
};
DenseSlots plan_dense(const Layer &layer, ScratchPlan &plan);
/* W = W_high + U_low diag(S_low) V_low into an fp32 n x kin matrix; builds
 * the W_high cache on first use. */
void build_dense(Layer &layer, const Mat &w, const ScratchPlan &plan,
                 const DenseSlots &slots);
void forward(Layer &layer, const DLTensor *x, const DLTensor *bias, DLTensor *y);
void backward(Layer &layer, const DLTensor *x, const DLTensor *grad_y,
              const osft_flinear_grads_t &grads);

}  // namespace osft

/* The cost model's choice (an osft_flinear_strategy_t) for a layer shape on
 * a device, without a layer: for tests/c/test_flinear_plan.c. native_bf16:
 * the backend's native_bf16_gemm. want: bit 0 grad_x, 1 grad_u_low,
 * 2 grad_s_low, 3 grad_v_low, 4 grad_bias. */
extern "C" int osfti_flinear_plan_choice(int cuda, int allow_tf32, int native_bf16,
                                         int kept, int64_t n, int64_t kin, int64_t r,
                                         int64_t l, int factor_bf16, int compute_bf16,
                                         int64_t tokens, int backward, unsigned want,
                                         size_t workspace_limit);

#endif
