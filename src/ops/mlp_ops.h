/* Internal: the tiled MLP behind osft_mlp_t — the handle and its tiling rule
 * (mlp_handle.cpp), one projection's forward and backward on a tile, dense
 * or factorized (mlp_proj.cpp), and the tiled forward and backward
 * (mlp_compute.cpp), written once on the backend primitives and the MLP
 * kernels (backend/mlp_backend.h). */
#ifndef OSFTRT_SRC_OPS_MLP_OPS_H
#define OSFTRT_SRC_OPS_MLP_OPS_H

#include <optional>

#include "backend/linalg_backend.h"
#include "backend/mlp_backend.h"
#include "ops/flinear_ops.h"
#include "osftrt/mlp.h"

/* The MLP's internals live in osft::mlp, apart from other capabilities. */
namespace osft::mlp {

/* A DLTensor descriptor with its own shape/strides storage (rank 1 or 2);
 * copies point at their own arrays. */
struct HeldTensor {
  DLTensor t{};
  int64_t shape[2] = {0, 0};
  int64_t strides[2] = {0, 0};
  HeldTensor() noexcept { repoint(); }
  HeldTensor(const HeldTensor &o) noexcept { *this = o; }
  HeldTensor &operator=(const HeldTensor &o) noexcept {
    t = o.t;
    for (int d = 0; d < 2; ++d) {
      shape[d] = o.shape[d];
      strides[d] = o.strides[d];
    }
    repoint();
    return *this;
  }
  void repoint() noexcept {
    t.shape = shape;
    t.strides = strides;
  }
};

/* A copy of a caller's 1-D or 2-D descriptor (strides made explicit). */
HeldTensor hold(const DLTensor *t);
/* A 2-D view of a matrix on the context's device (1-D when `vector`, for a
 * 1 x n matrix). */
HeldTensor view_of(const Context &ctx, const Mat &m, bool vector = false);

enum ProjIndex { kGate = 0, kUp = 1, kDown = 2 };

/* One of the three projections: W is out x in, dense or a layer. */
struct Projection {
  const char *name = "";
  bool present = false; /* gated variants have a gate */
  int64_t out = 0, in = 0;
  Mat weight; /* dense: weight.data != nullptr */
  HeldTensor weight_t;
  osft_flinear_t layer = nullptr;
  bool has_bias = false;
  Vec bias;
  HeldTensor bias_t;
};

}  // namespace osft::mlp

struct osft_mlp_s {
  osft::Context *ctx = nullptr;
  osft_mlp_variant_t variant = OSFT_MLP_SWIGLU;
  bool gated = true;
  osft::mlp::Activation act = osft::mlp::Activation::silu;
  int64_t hidden = 0, inter = 0;
  osfti_dtype_t dtype = OSFTI_DTYPE_INVALID; /* compute dtype */
  osft::mlp::Projection proj[3];             /* indexed by ProjIndex */
  osft_mlp_tiling_t tiling = OSFT_MLP_TILING_AUTO;
  int64_t tile_tokens = 0;
  size_t memory_budget = 0;
  /* The forward's gate and up outputs kept for the backward of the same x
   * (keeps_outputs()): M x I each, gate first; valid while kept_valid and
   * the backward's x matches the key. */
  void *kept = nullptr;
  size_t kept_bytes = 0;
  bool kept_valid = false;
  const void *kept_x = nullptr;
  int64_t kept_rows = 0, kept_ld = 0;
  osfti_dtype_t kept_dtype = OSFTI_DTYPE_INVALID;
  uint64_t kept_fingerprint = 0;
  bool counted = false; /* registered, and counted in ctx->live_children */
};

namespace osft::mlp {

using Mlp = osft_mlp_s;

/* ---- handle (mlp_handle.cpp) */
Mlp *create_mlp(Context &ctx, int variant, int64_t hidden, int64_t intermediate,
                const osft_mlp_weights_t &weights, const osft_mlp_options_t &opts);
void destroy_mlp(Mlp *mlp) noexcept;
/* Throws unless `mlp` and every layer it uses are alive. */
Mlp &checked_mlp(osft_mlp_t mlp, const char *arg);
osft_mlp_options_t read_mlp_options(const osft_mlp_options_t *user);

inline bool is_layer(const Projection &p) noexcept {
  return p.layer != nullptr;
}
bool has_layer(const Mlp &mlp) noexcept;
/* Whether grad_x sums the gate and up contributions in fp32 scratch. */
bool fp32_grad_x_sum(const Mlp &mlp) noexcept;
/* Bytes of one token's backward intermediates (the header's formula). */
size_t bytes_per_token(const Mlp &mlp) noexcept;

/* T tiles over `rows` tokens: tile t covers [begin(t), begin(t) + rows(t)). */
struct Tiling {
  int64_t tokens = 0, count = 0, max_rows = 0;
  int64_t begin(int64_t t) const noexcept {
    const int64_t base = tokens / count, rem = tokens % count;
    return t * base + (t < rem ? t : rem);
  }
  int64_t rows(int64_t t) const noexcept {
    return tokens / count + (t < tokens % count ? 1 : 0);
  }
  /* Tiles with at least one token (they come first). */
  int64_t nonempty() const noexcept { return count < tokens ? count : tokens; }
};
/* forced == 0: the MLP's rule; else exactly `forced` tiles. */
Tiling plan_tiles(const Mlp &mlp, int64_t tokens, int64_t forced);
/* Whether a forward over `tokens` keeps its gate and up outputs for the
 * backward: the budget holds every tile's intermediates. */
bool keeps_outputs(const Mlp &mlp, int64_t tokens) noexcept;
/* The bytes kept: tokens x I in the compute dtype, twice for gated MLPs. */
size_t kept_bytes_for(const Mlp &mlp, int64_t tokens) noexcept;
/* Frees what the forward kept. */
void drop_kept(Mlp &mlp) noexcept;

/* Where the buffers of a call are placed: the context's workspace for
 * dense-only MLPs; the context's outer workspace when a layer is involved,
 * because the layer's own scratch takes the workspace, which must then stay
 * free to grow. Both are kept between calls, so calls with the same shapes
 * allocate nothing after the first. Buffers are planned first and placed at
 * once, before anything is written. */
class BufferPlan {
 public:
  static constexpr size_t alignment = 256;
  BufferPlan() = default;
  ~BufferPlan() = default;
  BufferPlan(const BufferPlan &) = delete;
  BufferPlan &operator=(const BufferPlan &) = delete;
  /* Reserves a rows x cols matrix; returns its slot. */
  int add(int64_t rows, int64_t cols, osfti_dtype_t dtype);
  size_t bytes() const noexcept { return total_; }
  void place(const Mlp &mlp);
  Mat mat(int slot) const noexcept;

 private:
  struct Slot {
    size_t offset;
    int64_t rows, cols;
    osfti_dtype_t dtype;
  };
  static constexpr int max_slots = 40;
  Slot slots_[max_slots] = {};
  int count_ = 0;
  size_t total_ = 0;
  char *base_ = nullptr;
};

/* ---- one projection on one tile (mlp_proj.cpp) */
/* out = in W^T + bias; w: W packed for op T (dense projections), or
 * nullptr. */
void project(Context &ctx, const Projection &p, const Mat &in, const Mat &out,
             const PackedB *w = nullptr);

/* The dense weights of an MLP packed once for the GEMMs of every tile with
 * op(W) = `op` (T: in W^T, N: grad_out W), where more than one tile takes
 * them: oneMKL's bf16 GEMM otherwise re-packs W per tile (15-44% of those
 * GEMMs on 2 Emerald Rapids cores). `which` has bit i for projection i. */
class PackedWeights {
 public:
  PackedWeights(Context &ctx, const Projection *proj, const Tiling &tiles, Op op,
                unsigned which) {
    if (tiles.nonempty() < 2) return;
    for (int i = 0; i < 3; ++i)
      if ((which >> i & 1u) != 0 && proj[i].present && proj[i].weight.data != nullptr)
        w_[i].emplace(ctx, op, proj[i].weight, tiles.max_rows);
  }
  /* Projection i's packed weight, or nullptr. */
  const PackedB *operator[](int i) const noexcept { return w_[i] ? &*w_[i] : nullptr; }

 private:
  std::optional<PackedB> w_[3];
};

/* One gradient summed over the tiles: the tiles add into `acc`, which is the
 * caller's tensor itself (fp32, or a single tile) or an fp32 scratch copy
 * (`staged`) rounded once into the caller's at the end. */
struct Accum {
  bool active = false, staged = false, vector = false;
  int slot = -1;      /* the scratch copy's buffer, when staged */
  Mat acc, out;       /* vectors as 1 x n */
  float beta_out = 0; /* the caller's accumulate bit */
  float beta(bool first) const noexcept {
    return !first ? 1.0f : staged ? 0.0f : beta_out;
  }
};
/* Staged: out = beta_out * out + acc (one rounding). */
void finish(Context &ctx, const Accum &a);

/* The gradient sinks of one projection. */
struct ProjGrads {
  Accum w, bias; /* dense weight (dense projections), bias */
  Accum f[3];    /* a layer's u_low, s_low, v_low */
  bool any_factor() const noexcept { return f[0].active || f[1].active || f[2].active; }
};

/* Backward of a tile through one projection: weight, bias and factor
 * gradients into their sinks (the first tile with each sink's beta), and
 * dx = beta_x dx + grad_out W when dx is given (w_n: W packed for op N, or
 * nullptr). `layer` is the projection's layer or its fp32 shadow. */
void backprop(Context &ctx, const Projection &p, Layer *layer, const Mat &in,
              const Mat &grad_out, const Mat *dx, float beta_x, const ProjGrads &g,
              bool first, const PackedB *w_n = nullptr);

/* An upper bound of the workspace a layer's forward or backward on `rows`
 * tokens takes with the dense or the factorized strategy (flinear_compute.cpp's
 * plans), for growing it up front. */
size_t layer_scratch_bound(const Layer &l, osfti_dtype_t factor_dtype,
                           osfti_dtype_t compute, int64_t rows, bool dense) noexcept;

/* A bf16 layer seen with fp32 copies of its factors (in the call's
 * buffers), so that its factor gradients accumulate in fp32 over the tiles.
 * Not registered; drops whatever it cached when it goes. */
class Fp32Shadow {
 public:
  struct Slots {
    int u = -1, s = -1, v = -1;
  };
  static Slots plan(const Layer &src, BufferPlan &plan);
  Fp32Shadow(Layer &src, const BufferPlan &plan, const Slots &slots);
  ~Fp32Shadow() { refresh(layer_); }
  Fp32Shadow(const Fp32Shadow &) = delete;
  Fp32Shadow &operator=(const Fp32Shadow &) = delete;
  Layer &layer() noexcept { return layer_; }

 private:
  Layer layer_;
};

/* ---- the tiled passes (mlp_compute.cpp) */
void mlp_forward(Mlp &mlp, const DLTensor *x, DLTensor *y, int64_t num_tiles);
void mlp_backward(Mlp &mlp, const DLTensor *x, const DLTensor *grad_y,
                  const osft_mlp_grads_t &grads, int64_t num_tiles);

}  // namespace osft::mlp

#endif
