/**
 * @file
 * @brief libosftrt — tiled MLP with exact fp32 gradient accumulation.
 *
 * The transformer MLP block, y = down(act(gate x) * up x) (gated) or
 * y = down(act(up x)) (plain), computed over tiles of tokens so that the
 * tokens x intermediate activations never exist for all tokens at once:
 *
 * @code{.unparsed}
 *   forward   tile by tile; nothing is kept after the call.
 *   backward  per tile: recompute that tile's forward, back-propagate it.
 *             grad_x rows come from their own tile only (exact); weight and
 *             bias gradients are the plain SUM of the tiles' contributions
 *             (never divided by the number of tiles: the loss normalization
 *             already sits in grad_y), each tile counted once.
 * @endcode
 *
 * Tiles are cut from the flattened tokens: x may have any leading dims
 * (batch x sequence x hidden, ...), all flattened into M rows, so a batch of
 * several sequences is tiled exactly like one long sequence. T tiles split M
 * rows into T contiguous, near-equal tiles (sizes differ by at most one; with
 * T > M the last T - M tiles are empty).
 *
 * Shapes (H = hidden, I = intermediate; W is out x in, as in torch.nn.Linear):
 * @code{.unparsed}
 *   gate  I x H (gated variants only)    up  I x H    down  H x I
 *   gate_bias, up_bias  I                down_bias  H          (all optional)
 * @endcode
 * Any of the three projections may instead be a factorized-linear (OSFT)
 * layer (osftrt/flinear.h) with the same out x in shape: its factors are
 * used (and their gradients computed) exactly as osft_flinear_forward /
 * osft_flinear_backward would, tile by tile.
 *
 * Variants and their activations (fp32 math in every dtype):
 * @code{.unparsed}
 *   silu(z)      = z * sigmoid(z)
 *   gelu_tanh(z) = 0.5 z (1 + tanh(sqrt(2/pi) (z + 0.044715 z^3)))
 *                  (PyTorch gelu(approximate="tanh"); HF "gelu_pytorch_tanh")
 *   gelu_erf(z)  = 0.5 z (1 + erf(z / sqrt(2)))
 *                  (PyTorch's default nn.GELU(); HF "gelu")
 *   relu(z)      = max(z, 0), with derivative 0 at z = 0 (as PyTorch).
 * @endcode
 *
 * @par Precision
 * Activations x, y, grad_y, grad_x share the MLP's compute dtype
 * (fp32 or bf16); dense weights have that dtype too; biases are fp32 or the
 * compute dtype. GEMMs take operands in the compute dtype and accumulate in
 * fp32. Per-tile intermediates are stored in the compute dtype. Gradients:
 *   - weight and bias gradients are fp32 or bf16 (each its own choice). They
 *     are accumulated over the tiles in fp32 by the GEMMs (and the bias
 *     column sums) themselves (beta = 1): directly in the caller's tensor
 *     when it is fp32, else in an fp32 scratch accumulator that is rounded
 *     once, at the end, to bf16 (added to the existing values in fp32 first
 *     when accumulating). With a single tile a bf16 gradient is written by
 *     its GEMM directly (one rounding as well).
 *   - a factorized projection's factor gradients have the factors' dtype.
 *     For fp32 factors they accumulate in the caller's tensors; for bf16
 *     factors and more than one tile, the layer's backward runs on fp32
 *     copies of its factors into fp32 scratch gradients, rounded once at the
 *     end (this costs (N + K + 1) * (r + l) * 4 bytes of fp32 factor copies
 *     plus the fp32 gradients per such projection, per call).
 *   - grad_x (compute dtype): for bf16 gated MLPs with dense gate and up
 *     projections, the two contributions dz_gate W_gate + dz_up W_up are
 *     summed in fp32 and rounded once; where gate or up is a factorized
 *     layer, each projection's contribution is added to grad_x by that
 *     layer's backward (bf16: rounded after each of the two).
 *
 * @par Memory
 * One tile of t tokens needs, in the compute dtype (e bytes),
 * @code{.unparsed}
 *   backward  t * I * e * (3 gated, 2 plain; + 1 if down is factorized)
 *             (+ t * H * 4 for the fp32 grad_x sum described above)
 *   forward   t * I * e * (2 gated, 1 plain)
 * @endcode
 * plus, when accumulating bf16 gradients over several tiles, an fp32 copy of
 * each (I * H * 4 bytes per weight). Dense-only MLPs take all of it from the
 * context's workspace. An MLP with a factorized projection allocates it for
 * the call (through the context's allocator, freed before the call returns),
 * because the layer's own scratch (see osftrt/flinear.h) takes the context's
 * workspace, which the call grows for it before writing anything. Nothing
 * is kept between calls, except where the budget allows it (since 1.3):
 * with OSFT_MLP_TILING_BUDGET, where memory_budget holds every tile's
 * intermediates (M times the per-token backward bytes above), the forward
 * keeps its gate and up outputs, M * I * e bytes each (the up output alone
 * for plain variants), allocated through the context's allocator, and the
 * backward of the same x (same data, rows and dtype; on the CPU also the
 * same values, fingerprinted) uses them instead of recomputing that
 * forward: the recompute's extra GEMMs (about 1/3 of the backward's) are
 * dropped. The backward frees them; so do the next forward (which keeps
 * its own) and osft_mlp_destroy(). osft_mlp_get_plan() reports which
 * applies.
 *
 * @par Tiling
 * Tiling: see osft_mlp_options_t and osft_mlp_get_tile_count(). Every call
 * also takes `num_tiles`: 0 lets the MLP decide from its options; a positive
 * value forces exactly that many tiles, e.g. the maximum over ranks of
 * osft_mlp_get_tile_count(), when every data- or sequence-parallel rank must
 * run the same number of tiles.
 *
 * @par Thread safety
 * Threading: an MLP belongs to its context; use it from one thread at a time
 * (like the context). On CUDA, work is enqueued on the context's stream.
 *
 * @code
 *   osft_mlp_weights_t w;
 *   OSFT_MLP_WEIGHTS_INIT(&w);
 *   w.gate = &gate;  w.up = &up;  w.down = &down;  // I x H, I x H, H x I
 *   osft_mlp_t mlp;
 *   osft_mlp_create(ctx, OSFT_MLP_SWIGLU, H, I, &w, NULL, &mlp);
 *   osft_mlp_forward(mlp, &x, &y, 0);  // 0: the MLP picks the tiles
 *   osft_mlp_grads_t g;
 *   OSFT_MLP_GRADS_INIT(&g);
 *   g.grad_x = &dx;  g.grad_gate = &dgate;  g.grad_up = &dup;  g.grad_down = &ddown;
 *   osft_mlp_backward(mlp, &x, &dy, &g, 0);
 *   osft_mlp_destroy(mlp);
 * @endcode
 *
 * @par Non-finite values (NaN, Inf)
 * Propagates: NaN/Inf in x, grad_y, a weight, a bias or a layer's factors make
 * the affected token rows (and the weight/bias gradients they contribute to)
 * non-finite; the call succeeds. Every activation maps NaN to NaN (relu as
 * torch.relu); for infinite pre-activations the activations give their limits
 * where those exist (relu(+-inf) = +inf/0, gelu_tanh beyond |z| > 10 = z or
 * 0), and 0 * Inf products in the GEMMs give NaN.
 */
#ifndef OSFTRT_MLP_H
#define OSFTRT_MLP_H

#include <stddef.h>
#include <stdint.h>

#include "osftrt/context.h"
#include "osftrt/export.h"
#include "osftrt/flinear.h"
#include "osftrt/status.h"
#include "osftrt/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/**
 * @defgroup osftrt_mlp Tiled MLP
 * @brief The transformer MLP block over tiles of tokens, with exact fp32
 * gradient accumulation (osftrt/mlp.h).
 * @{
 */

/** @brief An opaque tiled MLP. */
typedef struct osft_mlp_s *osft_mlp_t;

/** @brief The MLP's structure. Values are fixed forever (ABI.md). */
typedef enum osft_mlp_variant_e {
  OSFT_MLP_SWIGLU = 0,     /**< down(silu(gate x) * up x): Llama, Mistral, Qwen */
  OSFT_MLP_GEGLU_TANH = 1, /**< down(gelu_tanh(gate x) * up x): Gemma */
  OSFT_MLP_GEGLU_ERF = 2,  /**< down(gelu_erf(gate x) * up x) */
  OSFT_MLP_GELU_TANH = 3,  /**< down(gelu_tanh(up x)): GPT-2 */
  OSFT_MLP_GELU_ERF = 4,   /**< down(gelu_erf(up x)): BERT, ViT */
  OSFT_MLP_SILU = 5,       /**< down(silu(up x)) */
  OSFT_MLP_RELU = 6        /**< down(relu(up x)): OPT, T5 */
} osft_mlp_variant_t;

/**
 * @brief How the tile size is chosen when a call passes num_tiles = 0.
 *
 * Values are
 * fixed forever.
 */
typedef enum osft_mlp_tiling_e {
  /** Tiles of at most H (hidden) tokens, ALST's rule: one tile's
   * intermediates are then about the size of a weight matrix or two. */
  OSFT_MLP_TILING_AUTO = 0,
  /** Tiles of at most opts->tile_tokens tokens. */
  OSFT_MLP_TILING_TOKENS = 1,
  /** The largest tiles whose backward intermediates (the per-token bytes in
   * the header comment, with the fp32 grad_x sum where it applies) fit in
   * opts->memory_budget bytes. */
  OSFT_MLP_TILING_BUDGET = 2
} osft_mlp_tiling_t;

/**
 * @brief The projections.
 *
 * For each of gate (gated variants only), up and down give
 * either a dense weight or a factorized layer, not both. Dense weights are
 * borrowed: the MLP copies the DLTensor descriptors (pointers, shapes,
 * strides) but not the data, which must stay valid at the same address until
 * osft_mlp_destroy; values may change between calls (an optimizer updating
 * them in place). Weights are row-major (compact or with padded rows), on
 * the context's device, all of one dtype (fp32 or bf16). Biases are compact
 * vectors, fp32 or the compute dtype, borrowed likewise. Layers must belong
 * to the same context and outlive the MLP.
 */
typedef struct osft_mlp_weights_s {
  size_t struct_size;   /**< sizeof(osft_mlp_weights_t) as compiled */
  const DLTensor *gate; /**< I x H; NULL for plain variants or with gate_layer */
  const DLTensor *up;   /**< I x H */
  const DLTensor *down; /**< H x I */
  /** @{ */
  /** instead of the above */
  osft_flinear_t gate_layer, up_layer, down_layer;
  /** @} */
  /** @{ */
  /** I, optional */
  const DLTensor *gate_bias, *up_bias;
  /** @} */
  /** H, optional */
  const DLTensor *down_bias;
} osft_mlp_weights_t;

/**
 * @brief Fills *weights with NULLs for a struct of struct_size bytes.
 *
 * @param[out] weights      The struct to fill.
 * @param[in]  struct_size  sizeof(*weights) as the caller compiled it.
 * @retval OSFT_STATUS_SUCCESS  The defaults were written.
 * @retval OSFT_STATUS_INVALID_ARGUMENT  (NULL)
 * @retval OSFT_STATUS_INVALID_STRUCT_SIZE  struct_size below the 1.0 layout.
 */
OSFT_API osft_status_t osft_mlp_weights_init(osft_mlp_weights_t *weights,
                                             size_t struct_size);
#define OSFT_MLP_WEIGHTS_INIT(w) osft_mlp_weights_init((w), sizeof(*(w)))

/** @brief Options for creating an MLP. Initialize with OSFT_MLP_OPTIONS_INIT. */
typedef struct osft_mlp_options_s {
  size_t struct_size; /**< sizeof(osft_mlp_options_t) as compiled */
  /** The tiling rule for calls with num_tiles = 0. Default AUTO. */
  osft_mlp_tiling_t tiling;
  /** With OSFT_MLP_TILING_TOKENS: tokens per tile, >= 1. Default 0 (unset). */
  int64_t tile_tokens;
  /** With OSFT_MLP_TILING_BUDGET: bytes for one tile's intermediates; must
   * hold at least one token's. Default 0 (unset). */
  size_t memory_budget;
  /** The compute dtype (activations): kDLFloat/32 or kDLBfloat/16. bits == 0
   * (the default) means the dense weights' dtype, or fp32 when every
   * projection is a factorized layer. */
  DLDataType dtype;
} osft_mlp_options_t;

/**
 * @brief Fills *opts with the defaults above for a struct of struct_size
 * bytes.
 *
 * @param[out] opts         The struct to fill.
 * @param[in]  struct_size  sizeof(*opts) as the caller compiled it.
 * @retval OSFT_STATUS_SUCCESS  The defaults were written.
 * @retval OSFT_STATUS_INVALID_ARGUMENT  (NULL)
 * @retval OSFT_STATUS_INVALID_STRUCT_SIZE  struct_size below the 1.0 layout.
 */
OSFT_API osft_status_t osft_mlp_options_init(osft_mlp_options_t *opts,
                                             size_t struct_size);
#define OSFT_MLP_OPTIONS_INIT(o) osft_mlp_options_init((o), sizeof(*(o)))

/**
 * @brief Creates a tiled MLP of `variant` with hidden size `hidden` (H) and
 * intermediate size `intermediate` (I) over `weights` (see
 * osft_mlp_weights_t).
 *
 * `opts` may be NULL (defaults). The workspace limit of
 * the context, if any, also caps the tile size: with num_tiles = 0, tiles are
 * made small enough that one tile's intermediates (the per-token bytes above)
 * fit in it. A factorized projection's own scratch must fit in it as well.
 *
 * @param[in]  ctx           The context.
 * @param[in]  variant       The MLP's structure.
 * @param[in]  hidden        H, >= 1.
 * @param[in]  intermediate  I, >= 1.
 * @param[in]  weights       The projections and biases (borrowed).
 * @param[in]  opts          The options, or NULL for the defaults.
 * @param[out] mlp           Receives the new MLP.
 * @return OSFT_STATUS_SUCCESS, or one of the errors below (nothing is
 * created, *mlp untouched).
 * @retval OSFT_STATUS_SUCCESS  The MLP was created.
 * @retval OSFT_STATUS_INVALID_HANDLE  ctx; a layer that is not a live flinear
 *   layer.
 * @retval OSFT_STATUS_INVALID_ARGUMENT  weights or mlp NULL; unknown variant
 *   or tiling; hidden or intermediate < 1; a projection with neither or both
 *   of a weight and a layer; a gate (weight, layer or bias) for a plain
 *   variant; a layer of another context; tile_tokens < 1 with TOKENS; a
 *   memory_budget below one token's intermediates with BUDGET.
 * @retval OSFT_STATUS_INVALID_STRUCT_SIZE  weights or opts.
 * @retval OSFT_STATUS_SHAPE_MISMATCH  a weight, bias or layer of the wrong
 *   shape.
 * @retval OSFT_STATUS_DTYPE_MISMATCH  a weight or bias of an unsupported
 *   dtype, dense weights of different dtypes, or weights other than
 *   opts->dtype.
 * @retval OSFT_STATUS_BAD_LAYOUT  a weight or bias.
 * @retval OSFT_STATUS_DEVICE_MISMATCH  a weight or bias.
 * @retval OSFT_STATUS_OUT_OF_MEMORY  the host allocator failed.
 */
OSFT_API osft_status_t osft_mlp_create(osft_context_t ctx, osft_mlp_variant_t variant,
                                       int64_t hidden, int64_t intermediate,
                                       const osft_mlp_weights_t *weights,
                                       const osft_mlp_options_t *opts, osft_mlp_t *mlp);

/**
 * @brief Destroys an MLP (not the weights or layers it uses).
 *
 * NULL is accepted.
 *
 * @param[in] mlp  The MLP, or NULL.
 * @retval OSFT_STATUS_SUCCESS  Destroyed (or NULL).
 * @retval OSFT_STATUS_INVALID_HANDLE  mlp is not a live MLP.
 */
OSFT_API osft_status_t osft_mlp_destroy(osft_mlp_t mlp);

/**
 * @brief The number of tiles a call over `tokens` rows (M, the product of x's
 * leading dims) makes with num_tiles = 0.
 *
 * ceil(M / t) for the tile size t of
 * the MLP's tiling rule (capped by the context's workspace limit), 0 for
 * M = 0. Writes it to *num_tiles and, if tile_tokens is not NULL, the
 * largest number of tokens in one tile to *tile_tokens. Forward and backward
 * use the same rule, so one query serves both; ranks that must agree pass
 * the maximum of their counts as num_tiles.
 *
 * @param[in]  mlp          The MLP.
 * @param[in]  tokens       M, >= 0.
 * @param[out] num_tiles    Receives the number of tiles.
 * @param[out] tile_tokens  Receives the most tokens in one tile, or NULL.
 * @retval OSFT_STATUS_SUCCESS  The values were written.
 * @retval OSFT_STATUS_INVALID_HANDLE  mlp is not a live MLP.
 * @retval OSFT_STATUS_INVALID_ARGUMENT  (num_tiles NULL, tokens < 0)
 */
OSFT_API osft_status_t osft_mlp_get_tile_count(osft_mlp_t mlp, int64_t tokens,
                                               int64_t *num_tiles, int64_t *tile_tokens);

/** @brief What a forward and backward over a number of tokens do, for
 * osft_mlp_get_plan() (since 1.3). */
typedef struct osft_mlp_plan_s {
  size_t struct_size;  /**< sizeof(osft_mlp_plan_t) as compiled */
  int64_t num_tiles;   /**< tiles of the calls */
  int64_t tile_tokens; /**< the most tokens in one tile */
  /** 1: the backward recomputes each tile's forward (gate and up); 0: the
   * forward keeps them for the backward (the budget holds every tile's
   * intermediates; see the header's Memory section). */
  int recompute;
  /** Bytes the forward keeps for the backward (0 where it recomputes). */
  size_t kept_bytes;
} osft_mlp_plan_t;

/**
 * @brief Fills *plan with zeros for a struct of struct_size bytes and sets
 * plan->struct_size = struct_size, ready for osft_mlp_get_plan().
 *
 * Pass sizeof(osft_mlp_plan_t), or use OSFT_MLP_PLAN_INIT(&s). Added in
 * 1.3.0.
 *
 * @param[out] plan  The struct to fill.
 * @param[in]  struct_size  sizeof(*plan) as the caller compiled it.
 * @retval OSFT_STATUS_SUCCESS  The struct was filled.
 * @retval OSFT_STATUS_INVALID_ARGUMENT  plan is NULL.
 * @retval OSFT_STATUS_INVALID_STRUCT_SIZE  struct_size below the 1.3 layout.
 * @par Thread safety
 * Thread-safe (touches only *plan).
 */
OSFT_API osft_status_t osft_mlp_plan_init(osft_mlp_plan_t *plan, size_t struct_size);
#define OSFT_MLP_PLAN_INIT(p) osft_mlp_plan_init((p), sizeof(*(p)))

/**
 * @brief Reports how calls over `tokens` rows are carried out: the tiling
 * (as osft_mlp_get_tile_count(), or exactly num_tiles tiles where
 * num_tiles > 0) and whether the backward recomputes the forward (since
 * 1.3).
 *
 * @param[in]  mlp        The MLP.
 * @param[in]  tokens     M, >= 0.
 * @param[in]  num_tiles  0: the MLP's rule; >= 1: exactly that many tiles.
 * @param[out] plan       Receives the plan; plan->struct_size is read.
 * @retval OSFT_STATUS_SUCCESS  *plan was written.
 * @retval OSFT_STATUS_INVALID_HANDLE  mlp is not a live MLP.
 * @retval OSFT_STATUS_INVALID_ARGUMENT  (plan NULL, tokens < 0,
 *   num_tiles < 0)
 * @retval OSFT_STATUS_INVALID_STRUCT_SIZE  plan->struct_size below the 1.3
 *   layout.
 */
OSFT_API osft_status_t osft_mlp_get_plan(osft_mlp_t mlp, int64_t tokens,
                                         int64_t num_tiles, osft_mlp_plan_t *plan);

/**
 * @brief Forward: y = MLP(x).
 *
 * @param[in]  mlp        The MLP.
 * @param[in]  x          (..., H)  the compute dtype; any leading dims
 *                        (flattened to M rows); rows may be padded.
 * @param[out] y          (..., H)  same dtype and leading dims; rows may be
 *                        padded; must not overlap x, a weight, a bias or a
 *                        factor. Overwritten.
 * @param[in]  num_tiles  0: the MLP's rule; >= 1: exactly that many tiles.
 * @return OSFT_STATUS_SUCCESS, or one of the errors below.
 * Nothing is written on failure (a backend error, e.g. a CUDA fault, may
 * leave y partly written).
 * @retval OSFT_STATUS_SUCCESS  y was written (on CUDA: enqueued).
 * @retval OSFT_STATUS_INVALID_HANDLE  (mlp, or one of its layers destroyed)
 * @retval OSFT_STATUS_INVALID_ARGUMENT  (NULL tensor, num_tiles < 0)
 * @retval OSFT_STATUS_DTYPE_MISMATCH  A tensor's dtype.
 * @retval OSFT_STATUS_SHAPE_MISMATCH  A tensor's shape.
 * @retval OSFT_STATUS_BAD_LAYOUT  A tensor's layout.
 * @retval OSFT_STATUS_DEVICE_MISMATCH  A tensor's device.
 * @retval OSFT_STATUS_ALIASING  y overlaps x, a weight, a bias or a factor.
 * @retval OSFT_STATUS_OUT_OF_MEMORY  (the workspace or the call's buffers;
 *   also when a factorized projection's own scratch for the tile size would
 *   exceed the context's workspace_limit: use more tiles)
 * @retval OSFT_STATUS_NOT_SUPPORTED  On the CPU, a dimension beyond the
 *   32-bit BLAS interface.
 * @retval OSFT_STATUS_BACKEND_ERROR  A backend library failed.
 */
OSFT_API osft_status_t osft_mlp_forward(osft_mlp_t mlp, const DLTensor *x, DLTensor *y,
                                        int64_t num_tiles);

/** @brief Gradient outputs of the backward; a NULL tensor is not computed. */
typedef struct osft_mlp_grads_s {
  size_t struct_size; /**< sizeof(osft_mlp_grads_t) as compiled */
  DLTensor *grad_x;   /**< (..., H), x's dtype and leading dims, rows may be padded */
  /** @{ */
  /** Dense weights' gradients, the weights' shapes, fp32 or bf16, compact or
   * with padded rows. Must be NULL for a projection that is a layer. */
  DLTensor *grad_gate, *grad_up, *grad_down;
  /** @} */
  /** @{ */
  /** Bias gradients (I, I, H; fp32 or bf16), for any projection (a layer's
   * bias is the MLP's, not the layer's). */
  DLTensor *grad_gate_bias, *grad_up_bias, *grad_down_bias;
  /** @} */
  /** @{ */
  /** The factor gradients of projections that are layers (NULL: none): only
   * grad_u_low, grad_s_low, grad_v_low and their accumulate bits are used;
   * grad_x and grad_bias must be NULL. Must be NULL for a dense projection. */
  const osft_flinear_grads_t *gate_factors, *up_factors, *down_factors;
  /** @} */
  /** OR of OSFT_MLP_ACCUMULATE_*: add into the existing values (e.g. over
   * micro-batches) instead of overwriting. Default 0. */
  uint32_t accumulate;
} osft_mlp_grads_t;

/** @brief osft_mlp_grads_t::accumulate bit: add into grad_x. */
#define OSFT_MLP_ACCUMULATE_GRAD_X (1u << 0)
/** @brief osft_mlp_grads_t::accumulate bit: add into grad_gate. */
#define OSFT_MLP_ACCUMULATE_GRAD_GATE (1u << 1)
/** @brief osft_mlp_grads_t::accumulate bit: add into grad_up. */
#define OSFT_MLP_ACCUMULATE_GRAD_UP (1u << 2)
/** @brief osft_mlp_grads_t::accumulate bit: add into grad_down. */
#define OSFT_MLP_ACCUMULATE_GRAD_DOWN (1u << 3)
/** @brief osft_mlp_grads_t::accumulate bit: add into grad_gate_bias. */
#define OSFT_MLP_ACCUMULATE_GRAD_GATE_BIAS (1u << 4)
/** @brief osft_mlp_grads_t::accumulate bit: add into grad_up_bias. */
#define OSFT_MLP_ACCUMULATE_GRAD_UP_BIAS (1u << 5)
/** @brief osft_mlp_grads_t::accumulate bit: add into grad_down_bias. */
#define OSFT_MLP_ACCUMULATE_GRAD_DOWN_BIAS (1u << 6)
/** @brief Every osft_mlp_grads_t::accumulate bit. */
#define OSFT_MLP_ACCUMULATE_ALL (0x7fu)

/**
 * @brief Fills *grads with NULLs and accumulate = 0 for a struct of
 * struct_size bytes.
 *
 * @param[out] grads        The struct to fill.
 * @param[in]  struct_size  sizeof(*grads) as the caller compiled it.
 * @retval OSFT_STATUS_SUCCESS  The defaults were written.
 * @retval OSFT_STATUS_INVALID_ARGUMENT  grads is NULL.
 * @retval OSFT_STATUS_INVALID_STRUCT_SIZE  struct_size below the 1.0 layout.
 */
OSFT_API osft_status_t osft_mlp_grads_init(osft_mlp_grads_t *grads, size_t struct_size);
#define OSFT_MLP_GRADS_INIT(g) osft_mlp_grads_init((g), sizeof(*(g)))

/**
 * @brief Backward for one forward: x as given to the forward, grad_y = dL/dy
 * with y's shape and dtype.
 *
 * Recomputes each tile's forward (unless the forward kept it: see the
 * Memory section and osft_mlp_get_plan()), then writes (or, per
 * grads->accumulate and the factor structs' own accumulate bits, adds into)
 * every gradient that is not NULL. With M = 0 tokens, overwritten weight and
 * bias gradients become zero. Outputs must not overlap the inputs, the
 * weights, biases or factors, or each other.
 *
 * @param[in] mlp        The MLP.
 * @param[in] x          The forward's input.
 * @param[in] grad_y     dL/dy, with y's shape and dtype.
 * @param[in] grads      The gradients to write (osft_mlp_grads_t); the struct
 *                       is only read, the tensors it points to are written.
 * @param[in] num_tiles  0: the MLP's rule; >= 1: exactly that many tiles.
 * @return Errors: as for the forward, plus OSFT_STATUS_INVALID_ARGUMENT
 * (grads NULL, unknown accumulate bits, a dense gradient for a layer or
 * factor gradients for a dense projection, grad_x or grad_bias set in a
 * factor struct) and OSFT_STATUS_INVALID_STRUCT_SIZE (grads or a factor
 * struct). Nothing is written on failure (a backend error may leave outputs
 * partly written).
 * @retval OSFT_STATUS_SUCCESS  Every requested gradient was written (on CUDA:
 *   enqueued).
 * @retval OSFT_STATUS_INVALID_HANDLE  (mlp, or one of its layers destroyed)
 * @retval OSFT_STATUS_INVALID_ARGUMENT  (NULL tensor, num_tiles < 0; grads
 *   NULL, unknown accumulate bits, a dense gradient for a layer or factor
 *   gradients for a dense projection, grad_x or grad_bias set in a factor
 *   struct)
 * @retval OSFT_STATUS_INVALID_STRUCT_SIZE  (grads or a factor struct)
 * @retval OSFT_STATUS_DTYPE_MISMATCH  A tensor's dtype.
 * @retval OSFT_STATUS_SHAPE_MISMATCH  A tensor's shape.
 * @retval OSFT_STATUS_BAD_LAYOUT  A tensor's layout.
 * @retval OSFT_STATUS_DEVICE_MISMATCH  A tensor's device.
 * @retval OSFT_STATUS_ALIASING  An output overlaps an input, a weight, a
 *   bias, a factor or another output.
 * @retval OSFT_STATUS_OUT_OF_MEMORY  As for osft_mlp_forward().
 * @retval OSFT_STATUS_NOT_SUPPORTED  On the CPU, a dimension beyond the
 *   32-bit BLAS interface.
 * @retval OSFT_STATUS_BACKEND_ERROR  A backend library failed.
 */
OSFT_API osft_status_t osft_mlp_backward(osft_mlp_t mlp, const DLTensor *x,
                                         const DLTensor *grad_y,
                                         const osft_mlp_grads_t *grads,
                                         int64_t num_tiles);

/**
 * @def OSFT_MLP_WEIGHTS_INIT(w)
 * @brief osft_mlp_weights_init() with the struct's own size.
 * @param w  Pointer to an osft_mlp_weights_t.
 */

/**
 * @def OSFT_MLP_PLAN_INIT(p)
 * @brief osft_mlp_plan_init() with the struct's own size.
 * @param p  Pointer to an osft_mlp_plan_t.
 */

/**
 * @def OSFT_MLP_OPTIONS_INIT(o)
 * @brief osft_mlp_options_init() with the struct's own size.
 * @param o  Pointer to an osft_mlp_options_t.
 */

/**
 * @def OSFT_MLP_GRADS_INIT(g)
 * @brief osft_mlp_grads_init() with the struct's own size.
 * @param g  Pointer to an osft_mlp_grads_t.
 */

/** @} */

#ifdef __cplusplus
}
#endif

#endif /* OSFTRT_MLP_H */
