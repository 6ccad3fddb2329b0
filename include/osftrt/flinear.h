/*
 * libosftrt — factorized linear: the OSFT layer.
 *
 * A linear layer y = x W^T + b whose weight W (N x K, out x in) is kept as
 * its thin SVD W = U diag(S) V^T, k = min(N, K), split at rank r:
 *
 *   frozen     U_high (N x r), S_high (r), V_high (r x K)   never change
 *   trainable  U_low  (N x l), S_low  (l), V_low  (l x K)   l = k - r
 *
 * V is stored as rows (V_high is r x K, V_low is l x K). The forward is
 *   y = x V_high^T diag(S_high) U_high^T + x V_low^T diag(S_low) U_low^T + b
 * and the backward, with g = dL/dy and G = g^T x (never formed unless it is
 * the cheaper way):
 *   dU_low = G V_low^T diag(S_low)     dV_low = diag(S_low) U_low^T G
 *   dS_low = diag(U_low^T G V_low^T)   dx = g W     db = sum over rows of g
 *
 * Two strategies compute this, and by default a cost model picks the
 * cheaper per call (osft_flinear_choose_strategy() reports it):
 *   OSFT_FLINEAR_FACTORIZED  GEMMs on the factors, 2*M*k*(N+K) flops
 *     forward; cheapest for few tokens M. The S scaling is applied to the
 *     M x k intermediate; the high and low parts share one GEMM where the
 *     factors are adjacent in memory (always for runtime-owned factors).
 *   OSFT_FLINEAR_DENSE  rebuild W = W_high + U_low diag(S_low) V_low, where
 *     W_high = U_high diag(S_high) V_high is cached (it is frozen), then
 *     dense GEMMs: plain fine-tuning's cost plus O(N*K*l) per pass.
 * Only frozen data is cached; nothing computed from trainable factors is
 * kept between calls, so an optimizer may update them in place at any time.
 *
 * Precision. Factors are fp32 or bf16 (all six of one dtype); activations x,
 * y, grad_y, grad_x are fp32 or bf16 (one dtype per call, the "compute
 * dtype"). GEMMs take operands in the compute dtype and accumulate in fp32:
 * fp32 factors with bf16 activations are rounded to bf16 for the GEMMs
 * (as a bf16 autocast would). Intermediates of the factorized strategy
 * (M x k) are stored in the compute dtype; the dense strategy's W and G are
 * fp32. Factor gradients (grad_u_low, grad_s_low, grad_v_low) have the
 * factors' dtype, or fp32 (master gradients for bf16 factors); they are
 * accumulated in fp32 before the single rounding.
 * bias and grad_bias are fp32 or the compute dtype.
 *
 * Threading: a layer belongs to its context; use it from one thread at a
 * time (like the context). Different layers on different contexts are
 * independent.
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

/* An opaque factorized-linear layer. */
typedef struct osft_flinear_s *osft_flinear_t;

/* Values are fixed forever (ABI.md). */
typedef enum osft_flinear_strategy_e {
  OSFT_FLINEAR_AUTO = 0,       /* the cost model decides per call */
  OSFT_FLINEAR_FACTORIZED = 1, /* GEMMs on the factors */
  OSFT_FLINEAR_DENSE = 2       /* cached frozen product + rebuilt low part */
} osft_flinear_strategy_t;

/* The six factors, for osft_flinear_get_factor(). Values fixed forever. */
typedef enum osft_flinear_factor_e {
  OSFT_FACTOR_U_HIGH = 0,
  OSFT_FACTOR_S_HIGH = 1,
  OSFT_FACTOR_V_HIGH = 2,
  OSFT_FACTOR_U_LOW = 3,
  OSFT_FACTOR_S_LOW = 4,
  OSFT_FACTOR_V_LOW = 5
} osft_flinear_factor_t;

/* Which pass a strategy query is about. Values fixed forever. */
typedef enum osft_flinear_pass_e {
  OSFT_FLINEAR_FORWARD = 0,
  OSFT_FLINEAR_BACKWARD = 1
} osft_flinear_pass_t;

/* Options for creating a layer. Initialize with OSFT_FLINEAR_OPTIONS_INIT. */
typedef struct osft_flinear_options_s {
  size_t struct_size; /* sizeof(osft_flinear_options_t) as compiled */
  /* The frozen fraction of the rank: r = round(rank_ratio * k), which must
   * satisfy 1 <= r <= k - 1. Used when decomposing a dense weight. Must lie
   * in (0, 1). Default 0.5. */
  double rank_ratio;
  /* Strategy for every call (AUTO: the cost model). Default AUTO. */
  osft_flinear_strategy_t strategy;
  /* dtype of the runtime-owned factors when decomposing a weight:
   * kDLFloat/32 or kDLBfloat/16. bits == 0 (the default) means the
   * weight's own dtype (an fp64 weight gives fp32 factors). */
  DLDataType factor_dtype;
} osft_flinear_options_t;

/* Fills *opts with the defaults above for a struct of struct_size bytes.
 * Errors: OSFT_STATUS_INVALID_ARGUMENT (NULL), OSFT_STATUS_INVALID_STRUCT_SIZE. */
OSFT_API osft_status_t osft_flinear_options_init(osft_flinear_options_t *opts,
                                                 size_t struct_size);
#define OSFT_FLINEAR_OPTIONS_INIT(o) osft_flinear_options_init((o), sizeof(*(o)))

/*
 * Decomposes the dense weight W (N x K; fp32, fp64 or bf16; compact or with
 * padded rows; on the context's device) into runtime-owned factors and
 * creates a layer over them. The SVD runs in fp64 (LAPACK dgesdd on the
 * CPU, cuSOLVER on CUDA). The factors are stored U as one N x k matrix and
 * V^T as one k x K matrix, the high part first, and can be read or updated
 * in place through osft_flinear_get_factor(). `opts` may be NULL (defaults).
 *
 * Errors (nothing is created, *layer untouched):
 *   OSFT_STATUS_INVALID_HANDLE (ctx), OSFT_STATUS_INVALID_ARGUMENT (NULL
 *   weight or layer; rank_ratio outside (0, 1) or giving r = 0 or r = k;
 *   N or K < 2), OSFT_STATUS_INVALID_STRUCT_SIZE, OSFT_STATUS_DTYPE_MISMATCH,
 *   OSFT_STATUS_SHAPE_MISMATCH, OSFT_STATUS_BAD_LAYOUT,
 *   OSFT_STATUS_DEVICE_MISMATCH, OSFT_STATUS_NUMERICAL_ERROR (W has NaN or
 *   Inf, or the SVD did not converge), OSFT_STATUS_OUT_OF_MEMORY.
 */
OSFT_API osft_status_t osft_flinear_create_from_weight(osft_context_t ctx,
                                                       const DLTensor *weight,
                                                       const osft_flinear_options_t *opts,
                                                       osft_flinear_t *layer);

/*
 * Caller-owned factors (e.g. a framework's parameters, updated in place by
 * its optimizer). All six are required, share one dtype (fp32 or bf16) and
 * the context's device; U_* and V_* are row-major (compact or with padded
 * rows), S_* compact vectors. Shapes: u_high N x r, s_high r, v_high r x K,
 * u_low N x l, s_low l, v_low l x K, with r >= 1, l >= 1, r + l <= min(N, K).
 */
typedef struct osft_flinear_factors_s {
  size_t struct_size; /* sizeof(osft_flinear_factors_t) as compiled */
  const DLTensor *u_high, *s_high, *v_high;
  const DLTensor *u_low, *s_low, *v_low;
} osft_flinear_factors_t;

/* Fills *factors with NULL tensors for a struct of struct_size bytes. */
OSFT_API osft_status_t osft_flinear_factors_init(osft_flinear_factors_t *factors,
                                                 size_t struct_size);
#define OSFT_FLINEAR_FACTORS_INIT(f) osft_flinear_factors_init((f), sizeof(*(f)))

/*
 * Creates a layer over caller-owned factors. The layer copies the six
 * DLTensor descriptors (data pointers, shapes, strides) but not the data:
 * the memory must stay valid, at the same address, until the layer is
 * destroyed. Values may change between calls (the trainable ones, freely;
 * the frozen ones only followed by osft_flinear_refresh()). Where the high
 * and low parts are adjacent in memory (views of one U or one V^T), the
 * layer fuses their GEMMs. rank_ratio and factor_dtype of `opts` are not
 * used; `opts` may be NULL.
 *
 * Errors: as for osft_flinear_create_from_weight, with the shape rules
 * above (a message names the factor).
 */
OSFT_API osft_status_t osft_flinear_create_from_factors(
    osft_context_t ctx, const osft_flinear_factors_t *factors,
    const osft_flinear_options_t *opts, osft_flinear_t *layer);

/* Destroys a layer: frees its caches and any runtime-owned factors. NULL is
 * accepted. Errors: OSFT_STATUS_INVALID_HANDLE (not a live layer). */
OSFT_API osft_status_t osft_flinear_destroy(osft_flinear_t layer);

/* Writes N (out features), K (in features), r (frozen rank), l (trainable
 * rank); any out-pointer may be NULL. Errors: OSFT_STATUS_INVALID_HANDLE. */
OSFT_API osft_status_t osft_flinear_get_dims(osft_flinear_t layer, int64_t *out_features,
                                             int64_t *in_features, int64_t *frozen_rank,
                                             int64_t *trainable_rank);

/*
 * Describes one factor as a DLTensor *view (data, device, dtype, shape,
 * strides; byte_offset 0). The shape and strides arrays belong to the
 * layer and stay valid until it is destroyed or re-decomposed. Writing
 * through the view updates the layer (frozen factors: call
 * osft_flinear_refresh() afterwards). Errors: OSFT_STATUS_INVALID_HANDLE,
 * OSFT_STATUS_INVALID_ARGUMENT (view NULL, unknown factor).
 */
OSFT_API osft_status_t osft_flinear_get_factor(osft_flinear_t layer,
                                               osft_flinear_factor_t which,
                                               DLTensor *view);

/* Sets the strategy for later calls (AUTO: the cost model). Errors:
 * OSFT_STATUS_INVALID_HANDLE, OSFT_STATUS_INVALID_ARGUMENT (unknown value). */
OSFT_API osft_status_t osft_flinear_set_strategy(osft_flinear_t layer,
                                                 osft_flinear_strategy_t strategy);

/*
 * Reports which strategy a call with `tokens` rows (M) would use for
 * `pass`: the override if one is set, else the cheaper by the cost model
 * (flops of each, with the dense strategy ruled out when its scratch would
 * exceed the context's workspace_limit). For the backward the cost assumes
 * every gradient is requested. Errors: OSFT_STATUS_INVALID_HANDLE,
 * OSFT_STATUS_INVALID_ARGUMENT (chosen NULL, tokens < 0, unknown pass).
 */
OSFT_API osft_status_t osft_flinear_choose_strategy(osft_flinear_t layer, int64_t tokens,
                                                    osft_flinear_pass_t pass,
                                                    osft_flinear_strategy_t *chosen);

/*
 * Forward: y = x W^T + bias.
 *   x     (..., K)  fp32 or bf16; any leading dims (flattened to M rows);
 *                   rows may be padded.
 *   bias  (N)       optional (NULL): fp32 or x's dtype.
 *   y     (..., N)  x's dtype, same leading dims; rows may be padded; must
 *                   not overlap x, bias or the factors. Overwritten.
 * Errors: OSFT_STATUS_INVALID_HANDLE, OSFT_STATUS_INVALID_ARGUMENT,
 * OSFT_STATUS_DTYPE_MISMATCH, OSFT_STATUS_SHAPE_MISMATCH,
 * OSFT_STATUS_BAD_LAYOUT, OSFT_STATUS_DEVICE_MISMATCH, OSFT_STATUS_ALIASING,
 * OSFT_STATUS_OUT_OF_MEMORY (workspace), OSFT_STATUS_BACKEND_ERROR.
 * Nothing is written on failure.
 */
OSFT_API osft_status_t osft_flinear_forward(osft_flinear_t layer, const DLTensor *x,
                                            const DLTensor *bias, DLTensor *y);

/* Gradient outputs of the backward; a NULL tensor is not computed. */
typedef struct osft_flinear_grads_s {
  size_t struct_size;   /* sizeof(osft_flinear_grads_t) as compiled */
  DLTensor *grad_x;     /* (..., K), x's dtype */
  DLTensor *grad_u_low; /* N x l, the factors' dtype or fp32; compact or padded */
  DLTensor *grad_s_low; /* l */
  DLTensor *grad_v_low; /* l x K */
  DLTensor *grad_bias;  /* N, fp32 or x's dtype */
  /* OR of OSFT_FLINEAR_ACCUMULATE_*: add into the existing values (beta =
   * 1, for micro-batches) instead of overwriting. Default 0. */
  uint32_t accumulate;
} osft_flinear_grads_t;

#define OSFT_FLINEAR_ACCUMULATE_GRAD_X (1u << 0)
#define OSFT_FLINEAR_ACCUMULATE_GRAD_U_LOW (1u << 1)
#define OSFT_FLINEAR_ACCUMULATE_GRAD_S_LOW (1u << 2)
#define OSFT_FLINEAR_ACCUMULATE_GRAD_V_LOW (1u << 3)
#define OSFT_FLINEAR_ACCUMULATE_GRAD_BIAS (1u << 4)
#define OSFT_FLINEAR_ACCUMULATE_ALL (0x1fu)

/* Fills *grads with NULL tensors and accumulate = 0. */
OSFT_API osft_status_t osft_flinear_grads_init(osft_flinear_grads_t *grads,
                                               size_t struct_size);
#define OSFT_FLINEAR_GRADS_INIT(g) osft_flinear_grads_init((g), sizeof(*(g)))

/*
 * Backward for one forward: x as given to the forward, grad_y = dL/dy with
 * y's shape and dtype. Writes (or accumulates into, per grads->accumulate)
 * each gradient that is not NULL. Outputs must not overlap the inputs, the
 * factors or each other. Errors: as for the forward, plus
 * OSFT_STATUS_INVALID_STRUCT_SIZE (grads). Nothing is written on failure.
 */
OSFT_API osft_status_t osft_flinear_backward(osft_flinear_t layer, const DLTensor *x,
                                             const DLTensor *grad_y,
                                             const osft_flinear_grads_t *grads);

/*
 * Writes the dense weight W = U_high diag(S_high) V_high + U_low diag(S_low)
 * V_low into `weight` (N x K, fp32, fp64 or bf16, compact or padded rows),
 * e.g. for saving. Errors: as for the forward.
 */
OSFT_API osft_status_t osft_flinear_merge(osft_flinear_t layer, DLTensor *weight);

/*
 * Re-decomposes for a new task: takes the dense weight `weight` (N x K; NULL:
 * the layer's current merged weight), recomputes its SVD and splits it at the
 * layer's rank r: the current U S V^T becomes the new frozen part's source.
 * The factors are overwritten in place (runtime-owned or caller-owned; views
 * from osft_flinear_get_factor stay valid) and every cache is dropped.
 * Errors: as for osft_flinear_create_from_weight; nothing changes on failure.
 */
OSFT_API osft_status_t osft_flinear_redecompose(osft_flinear_t layer,
                                                const DLTensor *weight);

/* The frozen factors were changed by the caller: drop what was cached from
 * them. Errors: OSFT_STATUS_INVALID_HANDLE. */
OSFT_API osft_status_t osft_flinear_refresh(osft_flinear_t layer);

#ifdef __cplusplus
}
#endif

#endif /* OSFTRT_FLINEAR_H */
