/**
 * @file
 * @brief libosftrt — factorized linear: the OSFT layer.
 *
 * A linear layer y = x W^T + b whose weight W (N x K, out x in) is kept as
 * its thin SVD W = U diag(S) V^T, k = min(N, K), split at rank r:
 *
 * @code{.unparsed}
 *   frozen     U_high (N x r), S_high (r), V_high (r x K)   never change
 *   trainable  U_low  (N x l), S_low  (l), V_low  (l x K)   l = k - r
 * @endcode
 *
 * V is stored as rows (V_high is r x K, V_low is l x K). The forward is
 * @code{.unparsed}
 *   y = x V_high^T diag(S_high) U_high^T + x V_low^T diag(S_low) U_low^T + b
 * @endcode
 * and the backward, with g = dL/dy and G = g^T x (never formed unless it is
 * the cheaper way):
 * @code{.unparsed}
 *   dU_low = G V_low^T diag(S_low)     dV_low = diag(S_low) U_low^T G
 *   dS_low = diag(U_low^T G V_low^T)   dx = g W     db = sum over rows of g
 * @endcode
 *
 * Three strategies compute this, and by default a cost model picks the
 * cheapest per call (osft_flinear_choose_strategy() reports it):
 * @code{.unparsed}
 *   OSFT_FLINEAR_FACTORIZED  GEMMs on the factors, 2*M*k*(N+K) flops
 *     forward; cheapest for few tokens M. The S scaling is applied to the
 *     M x k intermediate; the high and low parts share one GEMM where the
 *     factors are adjacent in memory (always for runtime-owned factors).
 *   OSFT_FLINEAR_DENSE  rebuild W = W_high + U_low diag(S_low) V_low, where
 *     W_high = U_high diag(S_high) V_high is cached (it is frozen), then
 *     dense GEMMs: plain fine-tuning's cost plus O(N*K*l) per pass.
 *   OSFT_FLINEAR_HYBRID  (since 1.3) the dense forward and grad_x, the
 *     trainable factors' gradients from the factors: 4*M*l*(N+K) flops
 *     instead of G = g^T x's 2*M*N*K; the cheapest for many tokens when
 *     l < N*K/(2*(N+K)) (a square layer: frozen ratio above ~0.75).
 * @endcode
 * The frozen product is cached. The dense W rebuilt from the trainable
 * factors is kept between calls (the forward and backward of a step and
 * every micro-batch of a gradient accumulation share one rebuild) only
 * while the runtime knows the factors did not change: on the CPU it
 * fingerprints their values at every call (any write is seen); elsewhere
 * (CUDA, where a fingerprint would need a host sync) it keeps W only for a
 * layer created with trainable_updates = OSFT_FLINEAR_UPDATES_REPORTED,
 * whose caller reports every change (osft_flinear_mark_updated(); taking a
 * view of a trainable factor with osft_flinear_get_factor() counts as one),
 * and otherwise rebuilds W at every call. So an optimizer may update the
 * trainable factors in place at any time under the default.
 *
 * Memory: the kept W is N x K fp32, the frozen cache another N x K fp32,
 * except where W is kept and the trainable part is small,
 * 2*l*(N+K) <= N*K (a square layer: frozen ratio 0.75 and above): there no
 * frozen cache is held; W follows a change of the factors by the change of
 * its low product (W -= the previous U_low diag(S_low) V_low, kept as a
 * copy of its operands, l*(N+K) values; W += the current one: 4*N*K*l
 * flops instead of 2*N*K*l) and is built in full again every 64 such
 * updates, so that their roundings do not accumulate. The layer then holds
 * N*K + l*(N+K) values instead of 2*N*K; osft_flinear_info_t counts each
 * full build in frozen_builds and each update in rebuilds. Memory the
 * layer keeps comes from the context's allocator and shows in
 * osft_context_get_memory_stats().
 *
 * @par Saving a layer and resuming it exactly
 * A layer is its six factors. A checkpoint from which training resumes
 * must hold all six, read through osft_flinear_get_factor() views (on
 * CUDA they are device memory: copy them to the host), with the dims of
 * osft_flinear_get_dims() and the dtype; the trainable factors' optimizer
 * state refers to exactly these U_low, S_low, V_low. The merged weight
 * (osft_flinear_merge()) is not enough: re-decomposing it
 * (osft_flinear_create_from_weight() or osft_flinear_redecompose()) splits
 * the spectrum of the trained W at rank r, and its top r singular vectors
 * are not the frozen U_high and V_high (training moved the trainable
 * singular values relative to the frozen ones, and the SVD mixes vectors of
 * close singular values), so the resumed run would protect another
 * subspace, and the optimizer's state would describe other vectors.
 * Give the factors back in either of two ways:
 * @code{.unparsed}
 *   caller-owned   osft_flinear_create_from_factors() over memory holding
 *                  the saved values; laid out as the runtime lays out its
 *                  own (U one N x k matrix, V^T one k x K matrix, S one
 *                  vector, the high part first; the six tensors are views
 *                  of these), the layer fuses the same GEMMs as a
 *                  runtime-owned one.
 *   runtime-owned  create the layer as before (e.g.
 *                  osft_flinear_create_from_weight() of the weight the run
 *                  started from, or of any finite weight of that shape,
 *                  with the same rank_ratio: its SVD is overwritten), write
 *                  each saved factor through its view, then call
 *                  osft_flinear_refresh() (the frozen factors changed); a
 *                  projector with V_ROWS targets of the layer needs
 *                  osft_projector_invalidate().
 * @endcode
 * Bit for bit: from its creation, and from each osft_flinear_refresh(), a
 * layer's results depend on its factors, options and inputs alone, until a
 * kept W is updated in place (Memory, above): each such update adds its
 * own roundings, which a layer restored from the same factors has not
 * seen, so its outputs would differ in the last bits. A trainer that wants
 * a resumed run's losses to be those of a run never stopped calls
 * osft_flinear_refresh() on every layer right after each save: the saving
 * run's next call then builds W from the factors, as the restored layer's
 * first call does. Where no W is updated in place the refresh only costs
 * the rebuild of the frozen cache (2*N*K*r flops).
 *
 * @par Precision
 * Factors are fp32 or bf16 (all six of one dtype); activations x,
 * y, grad_y, grad_x are fp32 or bf16 (one dtype per call, the "compute
 * dtype"). GEMMs take operands in the compute dtype and accumulate in fp32:
 * fp32 factors with bf16 activations are rounded to bf16 for the GEMMs
 * (as a bf16 autocast would). Intermediates of the factorized strategy
 * (M x k) are stored in the compute dtype; the dense strategy's W and G are
 * fp32. With bf16 factors and activations on an engine that multiplies
 * bf16 itself (CUDA; oneMKL on AMX), the dense strategy's rebuild and
 * factor-gradient products take bf16 operands (U_low diag(S_low) rounded
 * to bf16, accumulated into the fp32 W; G split into two bf16 halves for
 * grad_v_low and grad_s_low, so that those keep G's fp32 precision), as a
 * bf16 PyTorch rebuild of W does. Factor gradients (grad_u_low,
 * grad_s_low, grad_v_low) have the factors' dtype, or fp32 (master
 * gradients for bf16 factors); they are accumulated in fp32 before the
 * single rounding.
 * bias and grad_bias are fp32 or the compute dtype.
 *
 * @par Thread safety
 * Threading: a layer belongs to its context; use it from one thread at a
 * time (like the context). Different layers on different contexts are
 * independent.
 *
 * @code
 *   osft_flinear_options_t o;
 *   OSFT_FLINEAR_OPTIONS_INIT(&o);
 *   o.rank_ratio = 0.75;  // freeze the top 3/4 of the singular values
 *   osft_flinear_t layer;
 *   osft_flinear_create_from_weight(ctx, &w, &o, &layer);  // w: N x K
 *   osft_flinear_forward(layer, &x, NULL, &y);            // y = x W^T
 *   osft_flinear_grads_t g;
 *   OSFT_FLINEAR_GRADS_INIT(&g);
 *   g.grad_x = &dx;  g.grad_u_low = &du;  g.grad_s_low = &ds;  g.grad_v_low = &dv;
 *   osft_flinear_backward(layer, &x, &dy, &g);
 *   osft_flinear_destroy(layer);
 * @endcode
 *
 * @par Non-finite values (NaN, Inf)
 * osft_flinear_create_from_weight and osft_flinear_redecompose refuse a weight
 * with NaN or Inf (with weight = NULL: the merged weight, i.e. non-finite
 * factors) with OSFT_STATUS_NUMERICAL_ERROR and change nothing.
 * opts->rank_ratio NaN is refused (OSFT_STATUS_INVALID_ARGUMENT).
 * osft_flinear_create_from_factors does not read the factor values: non-finite
 * factors are accepted. osft_flinear_forward, osft_flinear_backward and
 * osft_flinear_merge propagate: a NaN/Inf in x, grad_y, bias or a factor makes
 * the affected rows/columns of y, the gradients or the merged weight NaN/Inf
 * (both strategies), and the call succeeds. Values that overflow the output
 * dtype (e.g. bf16 beyond 3.39e38) become Inf.
 */
#ifndef OSFTRT_FLINEAR_H
#define OSFTRT_FLINEAR_H

#include <stddef.h>
#include <stdint.h>

#include "osftrt/context.h"
#include "osftrt/export.h"
#include "osftrt/status.h"
#include "osftrt/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/**
 * @defgroup osftrt_flinear Factorized linear (the OSFT layer)
 * @brief A linear layer kept as its SVD split into a frozen and a trainable
 * part, with forward, backward and merge (osftrt/flinear.h).
 * @{
 */

/** @brief An opaque factorized-linear layer. */
typedef struct osft_flinear_s *osft_flinear_t;

/** @brief How a layer computes. Values are fixed forever (ABI.md). */
typedef enum osft_flinear_strategy_e {
  OSFT_FLINEAR_AUTO = 0,       /**< the cost model decides per call */
  OSFT_FLINEAR_FACTORIZED = 1, /**< GEMMs on the factors */
  OSFT_FLINEAR_DENSE = 2,      /**< dense W: frozen product + low part (Memory, above) */
  /** The forward and grad_x as OSFT_FLINEAR_DENSE (on the dense W), the
   * trainable factors' gradients from the factors as
   * OSFT_FLINEAR_FACTORIZED (g U_low, x V_low^T, then the products with g
   * and x: about 4*M*l*(N+K) flops where the dense form's G = g^T x costs
   * 2*M*N*K plus 4*N*K*l). Cheaper than both for many tokens and a small
   * trainable rank: for a square layer, l < K/4 (a frozen ratio above
   * about 0.75). Since library 1.3. */
  OSFT_FLINEAR_HYBRID = 3
} osft_flinear_strategy_t;

/** @brief The six factors, for osft_flinear_get_factor(). Values fixed forever. */
typedef enum osft_flinear_factor_e {
  OSFT_FACTOR_U_HIGH = 0, /**< U_high, N x r (frozen) */
  OSFT_FACTOR_S_HIGH = 1, /**< S_high, r (frozen) */
  OSFT_FACTOR_V_HIGH = 2, /**< V_high, r x K (frozen) */
  OSFT_FACTOR_U_LOW = 3,  /**< U_low, N x l (trainable) */
  OSFT_FACTOR_S_LOW = 4,  /**< S_low, l (trainable) */
  OSFT_FACTOR_V_LOW = 5   /**< V_low, l x K (trainable) */
} osft_flinear_factor_t;

/** @brief Which pass a strategy query is about. Values fixed forever. */
typedef enum osft_flinear_pass_e {
  OSFT_FLINEAR_FORWARD = 0, /**< osft_flinear_forward() */
  OSFT_FLINEAR_BACKWARD = 1 /**< osft_flinear_backward() */
} osft_flinear_pass_t;

/** @brief How a layer learns that its trainable factors changed, for
 * osft_flinear_options_t::trainable_updates (since 1.3). Values fixed
 * forever. */
typedef enum osft_flinear_updates_e {
  /** The runtime finds out by itself: it fingerprints the trainable factors'
   * values at every call where that is cheap (CPU) and keeps the rebuilt W
   * while they match; where it is not (CUDA) W is rebuilt at every call. */
  OSFT_FLINEAR_UPDATES_DETECTED = 0,
  /** The caller reports every change of the trainable factors made other
   * than through the runtime (osft_flinear_mark_updated(); taking a view
   * with osft_flinear_get_factor() of U_low, S_low or V_low counts as a
   * report), and the rebuilt W is kept until the next report on every
   * device. Where fingerprints are cheap (CPU) they are still checked, so
   * an unreported write is caught there; elsewhere it would leave W stale
   * (the caller's contract). */
  OSFT_FLINEAR_UPDATES_REPORTED = 1
} osft_flinear_updates_t;

/** @brief Options for creating a layer. Initialize with OSFT_FLINEAR_OPTIONS_INIT. */
typedef struct osft_flinear_options_s {
  size_t struct_size; /**< sizeof(osft_flinear_options_t) as compiled */
  /** The frozen fraction of the rank: r = round(rank_ratio * k), which must
   * satisfy 1 <= r <= k - 1. Used when decomposing a dense weight. Must lie
   * in (0, 1). Default 0.5. */
  double rank_ratio;
  /** Strategy for every call (AUTO: the cost model). Default AUTO. */
  osft_flinear_strategy_t strategy;
  /** dtype of the runtime-owned factors when decomposing a weight:
   * kDLFloat/32 or kDLBfloat/16. bits == 0 (the default) means the
   * weight's own dtype (an fp64 weight gives fp32 factors). */
  DLDataType factor_dtype;
  /** How the layer learns that its trainable factors changed (since 1.3;
   * osft_flinear_updates_t). Default OSFT_FLINEAR_UPDATES_DETECTED. */
  osft_flinear_updates_t trainable_updates;
} osft_flinear_options_t;

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
OSFT_API osft_status_t osft_flinear_options_init(osft_flinear_options_t *opts,
                                                 size_t struct_size);
#define OSFT_FLINEAR_OPTIONS_INIT(o) osft_flinear_options_init((o), sizeof(*(o)))

/**
 * @brief Decomposes the dense weight W (N x K; fp32, fp64 or bf16; compact or
 * with padded rows; on the context's device) into runtime-owned factors and
 * creates a layer over them.
 *
 * The SVD runs in fp64 (LAPACK dgesdd on the
 * CPU, cuSOLVER on CUDA). The factors are stored U as one N x k matrix and
 * V^T as one k x K matrix, the high part first, and can be read or updated
 * in place through osft_flinear_get_factor(). `opts` may be NULL (defaults).
 *
 * @param[in]  ctx     The context.
 * @param[in]  weight  The dense weight W, N x K; only read.
 * @param[in]  opts    The options, or NULL for the defaults.
 * @param[out] layer   Receives the new layer.
 * @return OSFT_STATUS_SUCCESS, or one of the errors below (nothing is
 * created, *layer untouched).
 * @retval OSFT_STATUS_SUCCESS  The layer was created.
 * @retval OSFT_STATUS_INVALID_HANDLE  (ctx)
 * @retval OSFT_STATUS_INVALID_ARGUMENT  (NULL weight or layer; rank_ratio
 *   outside (0, 1) or giving r = 0 or r = k; N or K < 2)
 * @retval OSFT_STATUS_INVALID_STRUCT_SIZE  opts->struct_size.
 * @retval OSFT_STATUS_DTYPE_MISMATCH  weight's dtype, or factor_dtype.
 * @retval OSFT_STATUS_SHAPE_MISMATCH  weight's shape.
 * @retval OSFT_STATUS_BAD_LAYOUT  weight's layout.
 * @retval OSFT_STATUS_DEVICE_MISMATCH  weight's device.
 * @retval OSFT_STATUS_NUMERICAL_ERROR  (W has NaN or Inf, or the SVD did not
 *   converge)
 * @retval OSFT_STATUS_OUT_OF_MEMORY  An allocation failed.
 * @retval OSFT_STATUS_BACKEND_ERROR  The SVD's backend library (LAPACK,
 *   cuSOLVER) failed.
 */
OSFT_API osft_status_t osft_flinear_create_from_weight(osft_context_t ctx,
                                                       const DLTensor *weight,
                                                       const osft_flinear_options_t *opts,
                                                       osft_flinear_t *layer);

/**
 * @brief Caller-owned factors (e.g. a framework's parameters, updated in
 * place by its optimizer).
 *
 * All six are required, share one dtype (fp32 or bf16) and
 * the context's device; U_* and V_* are row-major (compact or with padded
 * rows), S_* compact vectors. Shapes: u_high N x r, s_high r, v_high r x K,
 * u_low N x l, s_low l, v_low l x K, with r >= 1, l >= 1, r + l <= min(N, K).
 */
typedef struct osft_flinear_factors_s {
  size_t struct_size; /**< sizeof(osft_flinear_factors_t) as compiled */
  /** @{ */
  /** The frozen factors: u_high N x r, s_high r, v_high r x K. */
  const DLTensor *u_high, *s_high, *v_high;
  /** @} */
  /** @{ */
  /** The trainable factors: u_low N x l, s_low l, v_low l x K. */
  const DLTensor *u_low, *s_low, *v_low;
} osft_flinear_factors_t;

/**
 * @brief Fills *factors with NULL tensors for a struct of struct_size bytes.
 *
 * @param[out] factors      The struct to fill.
 * @param[in]  struct_size  sizeof(*factors) as the caller compiled it.
 * @retval OSFT_STATUS_SUCCESS  The defaults were written.
 * @retval OSFT_STATUS_INVALID_ARGUMENT  factors is NULL.
 * @retval OSFT_STATUS_INVALID_STRUCT_SIZE  struct_size below the 1.0 layout.
 */
OSFT_API osft_status_t osft_flinear_factors_init(osft_flinear_factors_t *factors,
                                                 size_t struct_size);
#define OSFT_FLINEAR_FACTORS_INIT(f) osft_flinear_factors_init((f), sizeof(*(f)))

/**
 * @brief Creates a layer over caller-owned factors.
 *
 * The layer copies the six
 * DLTensor descriptors (data pointers, shapes, strides) but not the data:
 * the memory must stay valid, at the same address, until the layer is
 * destroyed. Values may change between calls (the trainable ones, freely;
 * the frozen ones only followed by osft_flinear_refresh()). Where the high
 * and low parts are adjacent in memory (views of one U or one V^T), the
 * layer fuses their GEMMs. rank_ratio and factor_dtype of `opts` are not
 * used; `opts` may be NULL.
 *
 * @param[in]  ctx      The context.
 * @param[in]  factors  The six factors (osft_flinear_factors_t).
 * @param[in]  opts     The options (only strategy and trainable_updates
 *                      are used), or NULL.
 * @param[out] layer    Receives the new layer.
 * @return Errors: as for osft_flinear_create_from_weight, with the shape rules
 * above (a message names the factor).
 * @retval OSFT_STATUS_SUCCESS  The layer was created.
 * @retval OSFT_STATUS_INVALID_HANDLE  (ctx)
 * @retval OSFT_STATUS_INVALID_ARGUMENT  (NULL factors or layer, a NULL
 *   factor)
 * @retval OSFT_STATUS_INVALID_STRUCT_SIZE  factors or opts struct_size.
 * @retval OSFT_STATUS_DTYPE_MISMATCH  A factor's dtype.
 * @retval OSFT_STATUS_SHAPE_MISMATCH  A factor's shape (the rules above).
 * @retval OSFT_STATUS_BAD_LAYOUT  A factor's layout.
 * @retval OSFT_STATUS_DEVICE_MISMATCH  A factor's device.
 * @retval OSFT_STATUS_OUT_OF_MEMORY  An allocation failed.
 */
OSFT_API osft_status_t osft_flinear_create_from_factors(
    osft_context_t ctx, const osft_flinear_factors_t *factors,
    const osft_flinear_options_t *opts, osft_flinear_t *layer);

/**
 * @brief Destroys a layer: frees its caches and any runtime-owned factors.
 *
 * NULL is
 * accepted.
 *
 * @param[in] layer  The layer, or NULL.
 * @retval OSFT_STATUS_SUCCESS  Destroyed (or NULL).
 * @retval OSFT_STATUS_INVALID_HANDLE  (not a live layer)
 */
OSFT_API osft_status_t osft_flinear_destroy(osft_flinear_t layer);

/**
 * @brief Writes N (out features), K (in features), r (frozen rank), l
 * (trainable rank); any out-pointer may be NULL.
 *
 * @param[in]  layer           The layer.
 * @param[out] out_features    Receives N, or NULL.
 * @param[out] in_features     Receives K, or NULL.
 * @param[out] frozen_rank     Receives r, or NULL.
 * @param[out] trainable_rank  Receives l, or NULL.
 * @retval OSFT_STATUS_SUCCESS  The values were written.
 * @retval OSFT_STATUS_INVALID_HANDLE  layer is not a live layer.
 */
OSFT_API osft_status_t osft_flinear_get_dims(osft_flinear_t layer, int64_t *out_features,
                                             int64_t *in_features, int64_t *frozen_rank,
                                             int64_t *trainable_rank);

/**
 * @brief Describes one factor as a DLTensor *view (data, device, dtype,
 * shape, strides; byte_offset 0).
 *
 * The shape and strides arrays belong to the
 * layer and stay valid until it is destroyed or re-decomposed. Writing
 * through the view updates the layer (frozen factors: call
 * osft_flinear_refresh() afterwards). A view of U_low, S_low or V_low
 * counts as a report of a change (osft_flinear_mark_updated()): the next
 * call that needs the dense W rebuilds it.
 *
 * @param[in]  layer  The layer.
 * @param[in]  which  The factor.
 * @param[out] view   Receives the view.
 * @retval OSFT_STATUS_SUCCESS  *view was written.
 * @retval OSFT_STATUS_INVALID_HANDLE  layer is not a live layer.
 * @retval OSFT_STATUS_INVALID_ARGUMENT  (view NULL, unknown factor)
 */
OSFT_API osft_status_t osft_flinear_get_factor(osft_flinear_t layer,
                                               osft_flinear_factor_t which,
                                               DLTensor *view);

/**
 * @brief Sets the strategy for later calls (AUTO: the cost model).
 *
 * @param[in] layer     The layer.
 * @param[in] strategy  The strategy.
 * @retval OSFT_STATUS_SUCCESS  The strategy is set.
 * @retval OSFT_STATUS_INVALID_HANDLE  layer is not a live layer.
 * @retval OSFT_STATUS_INVALID_ARGUMENT  (unknown value)
 */
OSFT_API osft_status_t osft_flinear_set_strategy(osft_flinear_t layer,
                                                 osft_flinear_strategy_t strategy);

/**
 * @brief Reports which strategy a call with `tokens` rows (M) would use for
 * `pass`.
 *
 * The override if one is set, else the cheaper by the cost model
 * (flops of each, an fp32-operand GEMM's flops weighed by the device's
 * rate against the compute dtype's: on CUDA with bf16 compute 16x, 2x with
 * allow_tf32; on CUDA also the bytes its element-wise passes move, at 250
 * flops per byte; with the dense strategy ruled out when its scratch would
 * exceed the context's workspace_limit). For the backward the cost assumes
 * every gradient is requested.
 *
 * @param[in]  layer   The layer.
 * @param[in]  tokens  The number of rows M of the call, >= 0.
 * @param[in]  pass    The pass.
 * For the forward, OSFT_FLINEAR_HYBRID computes as OSFT_FLINEAR_DENSE, and
 * the cost model reports OSFT_FLINEAR_DENSE or OSFT_FLINEAR_FACTORIZED; for
 * the backward it picks any of the three.
 *
 * @param[out] chosen  Receives OSFT_FLINEAR_FACTORIZED, OSFT_FLINEAR_DENSE
 *                     or (since 1.3) OSFT_FLINEAR_HYBRID.
 * @retval OSFT_STATUS_SUCCESS  *chosen was written.
 * @retval OSFT_STATUS_INVALID_HANDLE  layer is not a live layer.
 * @retval OSFT_STATUS_INVALID_ARGUMENT  (chosen NULL, tokens < 0, unknown
 *   pass)
 */
OSFT_API osft_status_t osft_flinear_choose_strategy(osft_flinear_t layer, int64_t tokens,
                                                    osft_flinear_pass_t pass,
                                                    osft_flinear_strategy_t *chosen);

/**
 * @brief Forward: y = x W^T + bias.
 *
 * @param[in]  layer  The layer.
 * @param[in]  x      (..., K)  fp32 or bf16; any leading dims (flattened to
 *                    M rows); rows may be padded.
 * @param[in]  bias   (N)       optional (NULL): fp32 or x's dtype.
 * @param[out] y      (..., N)  x's dtype, same leading dims; rows may be
 *                    padded; must not overlap x, bias or the factors.
 *                    Overwritten.
 * @return OSFT_STATUS_SUCCESS, or one of the errors below.
 * Nothing is written on failure.
 * @retval OSFT_STATUS_SUCCESS  y was written (on CUDA: enqueued).
 * @retval OSFT_STATUS_INVALID_HANDLE  layer is not a live layer.
 * @retval OSFT_STATUS_INVALID_ARGUMENT  x or y NULL.
 * @retval OSFT_STATUS_DTYPE_MISMATCH  A tensor's dtype.
 * @retval OSFT_STATUS_SHAPE_MISMATCH  A tensor's shape.
 * @retval OSFT_STATUS_BAD_LAYOUT  A tensor's layout.
 * @retval OSFT_STATUS_DEVICE_MISMATCH  A tensor's device.
 * @retval OSFT_STATUS_ALIASING  y overlaps x, bias or a factor.
 * @retval OSFT_STATUS_OUT_OF_MEMORY  (workspace)
 * @retval OSFT_STATUS_NOT_SUPPORTED  On the CPU, a dimension beyond the
 *   32-bit BLAS interface.
 * @retval OSFT_STATUS_BACKEND_ERROR  A backend library failed.
 */
OSFT_API osft_status_t osft_flinear_forward(osft_flinear_t layer, const DLTensor *x,
                                            const DLTensor *bias, DLTensor *y);

/** @brief Gradient outputs of the backward; a NULL tensor is not computed. */
typedef struct osft_flinear_grads_s {
  size_t struct_size;   /**< sizeof(osft_flinear_grads_t) as compiled */
  DLTensor *grad_x;     /**< (..., K), x's dtype */
  DLTensor *grad_u_low; /**< N x l, the factors' dtype or fp32; compact or padded */
  DLTensor *grad_s_low; /**< l */
  DLTensor *grad_v_low; /**< l x K */
  DLTensor *grad_bias;  /**< N, fp32 or x's dtype */
  /** OR of OSFT_FLINEAR_ACCUMULATE_*: add into the existing values (beta =
   * 1, for micro-batches) instead of overwriting. Default 0. */
  uint32_t accumulate;
} osft_flinear_grads_t;

/** @brief osft_flinear_grads_t::accumulate bit: add into grad_x. */
#define OSFT_FLINEAR_ACCUMULATE_GRAD_X (1u << 0)
/** @brief osft_flinear_grads_t::accumulate bit: add into grad_u_low. */
#define OSFT_FLINEAR_ACCUMULATE_GRAD_U_LOW (1u << 1)
/** @brief osft_flinear_grads_t::accumulate bit: add into grad_s_low. */
#define OSFT_FLINEAR_ACCUMULATE_GRAD_S_LOW (1u << 2)
/** @brief osft_flinear_grads_t::accumulate bit: add into grad_v_low. */
#define OSFT_FLINEAR_ACCUMULATE_GRAD_V_LOW (1u << 3)
/** @brief osft_flinear_grads_t::accumulate bit: add into grad_bias. */
#define OSFT_FLINEAR_ACCUMULATE_GRAD_BIAS (1u << 4)
/** @brief Every osft_flinear_grads_t::accumulate bit. */
#define OSFT_FLINEAR_ACCUMULATE_ALL (0x1fu)

/**
 * @brief Fills *grads with NULL tensors and accumulate = 0.
 *
 * @param[out] grads        The struct to fill.
 * @param[in]  struct_size  sizeof(*grads) as the caller compiled it.
 * @retval OSFT_STATUS_SUCCESS  The defaults were written.
 * @retval OSFT_STATUS_INVALID_ARGUMENT  grads is NULL.
 * @retval OSFT_STATUS_INVALID_STRUCT_SIZE  struct_size below the 1.0 layout.
 */
OSFT_API osft_status_t osft_flinear_grads_init(osft_flinear_grads_t *grads,
                                               size_t struct_size);
#define OSFT_FLINEAR_GRADS_INIT(g) osft_flinear_grads_init((g), sizeof(*(g)))

/**
 * @brief Backward for one forward: x as given to the forward, grad_y = dL/dy
 * with y's shape and dtype.
 *
 * Writes (or accumulates into, per grads->accumulate)
 * each gradient that is not NULL. Outputs must not overlap the inputs, the
 * factors or each other.
 *
 * @param[in] layer   The layer.
 * @param[in] x       The forward's input.
 * @param[in] grad_y  dL/dy, with y's shape and dtype.
 * @param[in] grads   The gradients to write (osft_flinear_grads_t); the
 *                    struct is only read, the tensors it points to are
 *                    written.
 * @return Errors: as for the forward, plus
 * OSFT_STATUS_INVALID_STRUCT_SIZE (grads). Nothing is written on failure.
 * @retval OSFT_STATUS_SUCCESS  Every requested gradient was written (on CUDA:
 *   enqueued).
 * @retval OSFT_STATUS_INVALID_HANDLE  layer is not a live layer.
 * @retval OSFT_STATUS_INVALID_ARGUMENT  A NULL x, grad_y or grads; unknown
 *   accumulate bits.
 * @retval OSFT_STATUS_INVALID_STRUCT_SIZE  (grads)
 * @retval OSFT_STATUS_DTYPE_MISMATCH  A tensor's dtype.
 * @retval OSFT_STATUS_SHAPE_MISMATCH  A tensor's shape.
 * @retval OSFT_STATUS_BAD_LAYOUT  A tensor's layout.
 * @retval OSFT_STATUS_DEVICE_MISMATCH  A tensor's device.
 * @retval OSFT_STATUS_ALIASING  An output overlaps an input, a factor or
 *   another output.
 * @retval OSFT_STATUS_OUT_OF_MEMORY  (workspace)
 * @retval OSFT_STATUS_NOT_SUPPORTED  On the CPU, a dimension beyond the
 *   32-bit BLAS interface.
 * @retval OSFT_STATUS_BACKEND_ERROR  A backend library failed.
 */
OSFT_API osft_status_t osft_flinear_backward(osft_flinear_t layer, const DLTensor *x,
                                             const DLTensor *grad_y,
                                             const osft_flinear_grads_t *grads);

/**
 * @brief Writes the dense weight W = U_high diag(S_high) V_high + U_low
 * diag(S_low) V_low into `weight` (N x K, fp32, fp64 or bf16, compact or
 * padded rows), e.g. for saving.
 *
 * @param[in]  layer   The layer.
 * @param[out] weight  Receives W.
 * @return Errors: as for the forward.
 * @retval OSFT_STATUS_SUCCESS  weight was written (on CUDA: enqueued).
 * @retval OSFT_STATUS_INVALID_HANDLE  layer is not a live layer.
 * @retval OSFT_STATUS_INVALID_ARGUMENT  weight is NULL.
 * @retval OSFT_STATUS_DTYPE_MISMATCH  weight's dtype.
 * @retval OSFT_STATUS_SHAPE_MISMATCH  weight's shape.
 * @retval OSFT_STATUS_BAD_LAYOUT  weight's layout.
 * @retval OSFT_STATUS_DEVICE_MISMATCH  weight's device.
 * @retval OSFT_STATUS_ALIASING  weight overlaps a factor.
 * @retval OSFT_STATUS_OUT_OF_MEMORY  (workspace)
 * @retval OSFT_STATUS_NOT_SUPPORTED  On the CPU, a dimension beyond the
 *   32-bit BLAS interface.
 * @retval OSFT_STATUS_BACKEND_ERROR  A backend library failed.
 */
OSFT_API osft_status_t osft_flinear_merge(osft_flinear_t layer, DLTensor *weight);

/**
 * @brief Re-decomposes for a new task: takes the dense weight `weight` (N x K;
 * NULL: the layer's current merged weight), recomputes its SVD and splits it
 * at the layer's rank r: the current U S V^T becomes the new frozen part's
 * source.
 *
 * The factors are overwritten in place (runtime-owned or caller-owned; views
 * from osft_flinear_get_factor stay valid) and every cache is dropped.
 *
 * @param[in] layer   The layer.
 * @param[in] weight  The new dense weight, or NULL for the merged one.
 * @return Errors: as for osft_flinear_create_from_weight; nothing changes on
 * failure.
 * @retval OSFT_STATUS_SUCCESS  The factors were re-decomposed.
 * @retval OSFT_STATUS_INVALID_HANDLE  layer is not a live layer.
 * @retval OSFT_STATUS_DTYPE_MISMATCH  weight's dtype.
 * @retval OSFT_STATUS_SHAPE_MISMATCH  weight's shape.
 * @retval OSFT_STATUS_BAD_LAYOUT  weight's layout.
 * @retval OSFT_STATUS_DEVICE_MISMATCH  weight's device.
 * @retval OSFT_STATUS_NUMERICAL_ERROR  (W has NaN or Inf, or the SVD did not
 *   converge)
 * @retval OSFT_STATUS_OUT_OF_MEMORY  An allocation failed.
 * @retval OSFT_STATUS_BACKEND_ERROR  The SVD's backend library (LAPACK,
 *   cuSOLVER) failed.
 */
OSFT_API osft_status_t osft_flinear_redecompose(osft_flinear_t layer,
                                                const DLTensor *weight);

/**
 * @brief The frozen factors were changed by the caller: drop what was cached
 * from them.
 *
 * @param[in] layer  The layer.
 * @retval OSFT_STATUS_SUCCESS  The caches were dropped.
 * @retval OSFT_STATUS_INVALID_HANDLE  layer is not a live layer.
 */
OSFT_API osft_status_t osft_flinear_refresh(osft_flinear_t layer);

/**
 * @brief Reports that the trainable factors (U_low, S_low, V_low) changed:
 * the dense W kept from them is rebuilt at the next call that needs it
 * (since 1.3).
 *
 * Needed only for a layer created with trainable_updates =
 * OSFT_FLINEAR_UPDATES_REPORTED, after each change made other than through
 * the runtime (an optimizer step, a copy into the factors); harmless
 * otherwise. Cheap (no device work): call it once per optimizer step, not
 * per micro-batch.
 *
 * @param[in] layer  The layer.
 * @retval OSFT_STATUS_SUCCESS  The change is recorded.
 * @retval OSFT_STATUS_INVALID_HANDLE  layer is not a live layer.
 */
OSFT_API osft_status_t osft_flinear_mark_updated(osft_flinear_t layer);

/** @brief What a layer has done so far, for osft_flinear_get_info() (since
 * 1.3). Counters start at 0 when the layer is created. */
typedef struct osft_flinear_info_s {
  size_t struct_size; /**< sizeof(osft_flinear_info_t) as compiled */
  /** Rebuilds of the dense W from the trainable factors (the dense and
   * hybrid strategies' O(N*K*l) GEMM), kept or into scratch. */
  uint64_t rebuilds;
  /** Builds of the frozen product U_high diag(S_high) V_high (once, and
   * again after osft_flinear_refresh() or osft_flinear_redecompose(); a
   * layer that updates its kept W in place, see "Memory" above: at each
   * full build of W, every 65th rebuild, and at each osft_flinear_merge(),
   * which builds W in full into its weight). */
  uint64_t frozen_builds;
  /** Reports of a change of the trainable factors so far
   * (osft_flinear_mark_updated(), views of trainable factors). */
  uint64_t trainable_version;
  /** 1 while a rebuilt W is kept for the next call, else 0. */
  int weight_kept;
} osft_flinear_info_t;

/**
 * @brief Fills *info with zeros for a struct of struct_size bytes and sets
 * info->struct_size = struct_size, ready for osft_flinear_get_info().
 *
 * Pass sizeof(osft_flinear_info_t), or use OSFT_FLINEAR_INFO_INIT(&s).
 * Added in 1.3.0.
 *
 * @param[out] info  The struct to fill.
 * @param[in]  struct_size  sizeof(*info) as the caller compiled it.
 * @retval OSFT_STATUS_SUCCESS  The struct was filled.
 * @retval OSFT_STATUS_INVALID_ARGUMENT  info is NULL.
 * @retval OSFT_STATUS_INVALID_STRUCT_SIZE  struct_size below the 1.3 layout.
 * @par Thread safety
 * Thread-safe (touches only *info).
 */
OSFT_API osft_status_t osft_flinear_info_init(osft_flinear_info_t *info,
                                              size_t struct_size);
#define OSFT_FLINEAR_INFO_INIT(i) osft_flinear_info_init((i), sizeof(*(i)))

/**
 * @brief Writes what the layer has done so far (osft_flinear_info_t) into
 * *info, whose struct_size the caller sets (since 1.3).
 *
 * @param[in]  layer  The layer.
 * @param[out] info   Receives the counters; info->struct_size is read.
 * @retval OSFT_STATUS_SUCCESS  *info was written.
 * @retval OSFT_STATUS_INVALID_HANDLE  layer is not a live layer.
 * @retval OSFT_STATUS_INVALID_ARGUMENT  info is NULL.
 * @retval OSFT_STATUS_INVALID_STRUCT_SIZE  info->struct_size below the 1.3
 *   layout.
 */
OSFT_API osft_status_t osft_flinear_get_info(osft_flinear_t layer,
                                             osft_flinear_info_t *info);

/**
 * @def OSFT_FLINEAR_INFO_INIT(i)
 * @brief osft_flinear_info_init() with the struct's own size.
 * @param i  Pointer to an osft_flinear_info_t.
 */

/**
 * @def OSFT_FLINEAR_OPTIONS_INIT(o)
 * @brief osft_flinear_options_init() with the struct's own size.
 * @param o  Pointer to an osft_flinear_options_t.
 */

/**
 * @def OSFT_FLINEAR_FACTORS_INIT(f)
 * @brief osft_flinear_factors_init() with the struct's own size.
 * @param f  Pointer to an osft_flinear_factors_t.
 */

/**
 * @def OSFT_FLINEAR_GRADS_INIT(g)
 * @brief osft_flinear_grads_init() with the struct's own size.
 * @param g  Pointer to an osft_flinear_grads_t.
 */

/** @} */

#ifdef __cplusplus
}
#endif

#endif /* OSFTRT_FLINEAR_H */
