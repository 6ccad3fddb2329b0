/**
 * @file
 * @brief libosftrt — OSFT gradient projection with batched collectives.
 *
 * OSFT trains only the low part of each factorized weight (osftrt/flinear.h)
 * and must keep every update orthogonal to the frozen high subspace. For a
 * target with frozen U_high (N x r, orthonormal columns) and V_high (r x K,
 * orthonormal rows, V stored as rows) and trainable U_low (N x l), V_low
 * (l x K), the projector applies, to every registered target at once,
 *
 * @code{.unparsed}
 *   U:  C_U = U_high^T dU_low   (r x l)     dU_low -= U_high C_U
 *   V:  C_V = dV_low V_high^T   (l x r)     dV_low -= C_V V_high
 * @endcode
 *
 * osft_projector_project() does it to the gradients, and
 * osft_projector_project_params() to the parameters U_low, V_low after the
 * optimizer step, so that an optimizer's per-element scaling (Adam) cannot
 * leak into the frozen subspace. S is never projected. Coefficients are
 * accumulated in fp32 (and all-reduced in fp32); the update's arithmetic
 * follows the storage of what it updates (osft_projection_arithmetic_t):
 * an fp32 gradient or factor gets the exact update (C to fp32 accuracy);
 * a bf16 one, which keeps 8 mantissa bits when the update is stored, gets
 * one bf16 GEMM against C rounded to bf16 where bf16 GEMMs are native (the
 * orthogonality it reaches is that of the exact update within 2x, measured
 * in bench/results/projection_orthogonality.md). Every GEMM accumulates in
 * fp32 and the result is rounded once to the tensor's dtype.
 *
 * @par Sharding
 * Across P ranks (an osft_comm_t) each part of a target has a
 * layout, and the projector uses the collective that is right for it:
 *
 * @code{.unparsed}
 *   OSFT_SHARD_REPLICATED  every rank holds the whole part. No collective.
 *   OSFT_SHARD_U_ROWS      U_high, dU_low, U_low sharded by rows (over N):
 *                          C_U = sum_p U_p^T dU_p is a sum of partial
 *                          products -> all-reduce of C_U, local update.
 *   OSFT_SHARD_V_COLS      V_high, dV_low, V_low sharded by columns (over
 *                          K): C_V = sum_p dV_p V_p^T -> all-reduce of C_V.
 *   OSFT_SHARD_V_ROWS      row-wise (FSDP) sharding of the r x K matrix:
 *                          V_high sharded over the singular-vector index r,
 *                          and dV_low, V_low over their rows (l). Here
 *                          dV_p V_p^T is ONE BLOCK of C_V, not a partial
 *                          sum: all-reducing it is wrong for P > 1. The
 *                          projector all-gathers V_high once (it is frozen),
 *                          caches it, and projects each rank's rows of
 *                          dV_low locally against the whole V_high; no
 *                          collective per step. The cache is gathered again
 *                          only after osft_projector_invalidate().
 * @endcode
 * Shards may be uneven (P need not divide the dimension; a rank may hold
 * zero rows). The caller states each rank's shard size (`*_shards`).
 *
 * @par Batching
 * Every U_ROWS and V_COLS coefficient block lives in one
 * persistent fp32 buffer at a fixed offset (given at registration): the
 * GEMMs write their slices, ONE all-reduce sums the whole buffer, the
 * GEMMs read their slices back. So each project call (for 1 or 224
 * targets) makes exactly one collective launch if any part is U_ROWS or
 * V_COLS, and none otherwise. Nothing is written to a gradient before that
 * collective has succeeded: on a communication error no gradient changes.
 * Targets whose parts have the same shapes, dtypes and arithmetic share
 * their GEMMs: each step of their update is one batched GEMM (one launch on
 * CUDA; osft_projector_info_t counts them), in batches whose scratch stays
 * under 64 MiB (half the context's workspace_limit, if set, and at least
 * one part). On CUDA a call enqueues on the context's stream and never
 * waits for the device, unless its communicator does (a finite timeout).
 *
 * @par One-time setup ("prepare")
 * The first call after a registration (or
 * after osft_projector_invalidate()) also runs the setup collectives:
 * a consistency check (every rank registered the same targets, layouts,
 * ranks r, l and shard sizes, else OSFT_STATUS_INVALID_ARGUMENT on every
 * rank) and the V_high all-gather of the V_ROWS targets (one all-gather per
 * V_high dtype, for all targets together). osft_projector_prepare() runs it
 * explicitly, e.g. before timing or counting collectives.
 *
 * All projector calls that communicate are collective: every rank calls
 * them in the same order. Tensors are borrowed by descriptor (data
 * pointers, shapes, strides are copied at registration; the memory must
 * stay valid at the same address until the projector is destroyed or the
 * tensor is rebound with osft_projector_set_grads()).
 *
 * @par Thread safety
 * Threading: a projector is used by one thread at a time, like its context.
 *
 * @code
 *   osft_projector_t proj;
 *   osft_projector_create(ctx, comm, NULL, &proj);  // comm NULL: one rank
 *   for (int i = 0; i < n_layers; ++i)              // once, at setup
 *     osft_projector_add_layer(proj, layers[i], &du[i], &dv[i], NULL);
 *   // every step, after the backward and before the optimizer:
 *   osft_projector_project(proj);
 *   // and after the optimizer step:
 *   osft_projector_project_params(proj);
 *   osft_projector_destroy(proj);
 * @endcode
 *
 * @par Non-finite values (NaN, Inf)
 * osft_projector_project and osft_projector_project_params propagate: a
 * NaN/Inf in a gradient or trainable factor spreads over the coefficient it
 * enters (e.g. a NaN in dU_low makes that column of the projected dU_low NaN),
 * frozen factors with NaN/Inf make every projected tensor of their part non-
 * finite; the call succeeds. osft_projector_orthogonality reports NaN in
 * *max_u / *max_v when any coefficient of that part is NaN (NaN wins over
 * every finite value), so a caller can use it as a finiteness check of the
 * trainable factors.
 */
#ifndef OSFTRT_PROJECTION_H
#define OSFTRT_PROJECTION_H

#include <stddef.h>
#include <stdint.h>

#include "osftrt/comm.h"
#include "osftrt/context.h"
#include "osftrt/export.h"
#include "osftrt/flinear.h"
#include "osftrt/status.h"
#include "osftrt/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/**
 * @defgroup osftrt_projection Gradient projection
 * @brief Keeps OSFT updates orthogonal to the frozen subspace, for many
 * targets and sharded layouts with one collective per step
 * (osftrt/projection.h).
 * @{
 */

/** @brief An opaque projector handle. */
typedef struct osft_projector_s *osft_projector_t;

/**
 * @brief How one part (U or V) of a target is spread over the ranks.
 *
 * Values fixed
 * forever (ABI.md).
 */
typedef enum osft_shard_layout_e {
  OSFT_SHARD_REPLICATED = 0, /**< U or V: every rank holds the whole part */
  OSFT_SHARD_U_ROWS = 1,     /**< U only: rows (N) sharded */
  OSFT_SHARD_V_ROWS = 2,     /**< V only: V_high rows (r) and V_low rows (l) */
  OSFT_SHARD_V_COLS = 3      /**< V only: columns (K) sharded */
} osft_shard_layout_t;

/**
 * @brief The arithmetic of the update x -= U_high C (U) or x -= C V_high
 * (V), x being a gradient or a trainable factor (added in 1.2.0).
 *
 * C = U_high^T x (or x V_high^T) is always accumulated in fp32; these
 * choose how C enters the update GEMM. Every choice accumulates the update
 * in fp32 and rounds x once to its dtype. Values fixed forever (ABI.md).
 *
 * @code{.unparsed}
 *   AUTO        the default: follows x's storage dtype. fp32 x: EXACT.
 *               bf16 x with a bf16 U_high / V_high: BF16 where the backend
 *               multiplies bf16 natively (CUDA tensor cores; the CPU with
 *               oneMKL), else FP32 (the cheaper one there). A bf16 x stores
 *               8 mantissa bits, so the 16 bits of the exact update buy no
 *               orthogonality (bench/results/projection_orthogonality.md).
 *   EXACT       C to about fp32 accuracy: with a bf16 U_high / V_high on a
 *               native-bf16 backend, two bf16 GEMMs against C split into
 *               bf16 halves (16 of C's 24 bits); otherwise FP32.
 *   FP32        one fp32 GEMM against fp32 C (a bf16 U_high / V_high
 *               widened to fp32 first); on CUDA it runs on TF32 tensor
 *               cores when the context allows TF32 (osft_context_options_t
 *               allow_tf32), else on the CUDA cores.
 *   BF16        one bf16 GEMM against C rounded once to bf16 (mini_trainer's
 *               arithmetic, with x rounded once instead of twice); needs a
 *               bf16 U_high / V_high: parts with fp32 ones use FP32.
 * @endcode
 */
typedef enum osft_projection_arithmetic_e {
  OSFT_PROJECTION_ARITHMETIC_AUTO = 0,  /**< follows x's dtype (see above) */
  OSFT_PROJECTION_ARITHMETIC_EXACT = 1, /**< C to fp32 accuracy */
  OSFT_PROJECTION_ARITHMETIC_FP32 = 2,  /**< one fp32 (or TF32) GEMM */
  OSFT_PROJECTION_ARITHMETIC_BF16 = 3   /**< one bf16 GEMM, C rounded to bf16 */
} osft_projection_arithmetic_t;

/**
 * @brief Options for osft_projector_create().
 *
 * Initialize with
 * OSFT_PROJECTOR_OPTIONS_INIT(&o).
 */
typedef struct osft_projector_options_s {
  size_t struct_size; /**< sizeof(osft_projector_options_t) as compiled */
  /** 1: the setup collectives check that every rank registered the same
   * targets (one small all-gather per setup). 0: skip the check. Default 1. */
  int check_consistency;
  /** The update's arithmetic for every target. Default
   * OSFT_PROJECTION_ARITHMETIC_AUTO (0): follows each gradient's or
   * factor's dtype. Any other value than the enumerators:
   * OSFT_STATUS_INVALID_ARGUMENT from osft_projector_create(). Added in
   * 1.2.0. */
  osft_projection_arithmetic_t arithmetic;
} osft_projector_options_t;

/**
 * @brief Fills *opts with the defaults above for a struct of struct_size
 * bytes.
 *
 * @param[out] opts         The struct to fill.
 * @param[in]  struct_size  sizeof(*opts) as the caller compiled it.
 * @retval OSFT_STATUS_SUCCESS  The defaults were written.
 * @retval OSFT_STATUS_INVALID_ARGUMENT  opts is NULL.
 * @retval OSFT_STATUS_INVALID_STRUCT_SIZE  struct_size below the 1.0 layout.
 */
OSFT_API osft_status_t osft_projector_options_init(osft_projector_options_t *opts,
                                                   size_t struct_size);
#define OSFT_PROJECTOR_OPTIONS_INIT(o) osft_projector_options_init((o), sizeof(*(o)))

/**
 * @brief Creates a projector on `ctx` whose collectives run on `comm` (a
 * communicator of the same context; NULL: one rank, no collectives).
 *
 * The
 * communicator must outlive the projector. `opts` may be NULL.
 *
 * @param[in]  ctx        The context.
 * @param[in]  comm       The communicator, or NULL.
 * @param[in]  opts       The options, or NULL for the defaults.
 * @param[out] projector  Receives the new projector.
 * @retval OSFT_STATUS_SUCCESS  The projector was created.
 * @retval OSFT_STATUS_INVALID_HANDLE  (ctx, comm)
 * @retval OSFT_STATUS_INVALID_ARGUMENT  (projector NULL; comm of another
 *   context; opts->check_consistency not 0 or 1; opts->arithmetic not an
 *   osft_projection_arithmetic_t)
 * @retval OSFT_STATUS_INVALID_STRUCT_SIZE  opts->struct_size.
 * @retval OSFT_STATUS_OUT_OF_MEMORY  The host allocator failed.
 */
OSFT_API osft_status_t osft_projector_create(osft_context_t ctx, osft_comm_t comm,
                                             const osft_projector_options_t *opts,
                                             osft_projector_t *projector);

/**
 * @brief Destroys a projector and its buffers (coefficients, gathered
 * V_high).
 *
 * NULL is accepted. Not collective.
 *
 * @param[in] projector  The projector, or NULL.
 * @retval OSFT_STATUS_SUCCESS  Destroyed (or NULL).
 * @retval OSFT_STATUS_INVALID_HANDLE  projector is not a live projector.
 */
OSFT_API osft_status_t osft_projector_destroy(osft_projector_t projector);

/**
 * @brief One target: a U part, a V part, or both, as this rank holds them.
 *
 * Matrices are row-major (compact or with padded rows), fp32 or bf16 (each
 * tensor may have its own dtype), on the context's device. A part is
 * present when its *_high tensor is set; it needs a gradient, a trainable
 * factor, or both:
 * @code{.unparsed}
 *   project()            projects every registered gradient;
 *   project_params()     projects every registered trainable factor;
 *   orthogonality()      needs the trainable factor of every part.
 * @endcode
 * Local shapes (N_p, K_p, r_p, l_p: this rank's share):
 *
 * @code{.unparsed}
 *   layout         u_high    grad_u_low, u_low   *_shards (entry p = rank p's)
 *   REPLICATED     N x r     N x l               NULL, 0
 *   U_ROWS         N_p x r   N_p x l             u_shards: N_p (rows of U)
 *
 *   layout         v_high    grad_v_low, v_low   v_shards
 *   REPLICATED     r x K     l x K               NULL, 0
 *   V_COLS         r x K_p   l x K_p             K_p (columns of V)
 *   V_ROWS         r_p x K   l_p x K             r_p (rows of V_high)
 * @endcode
 *
 * (For V_ROWS the rows of dV_low/V_low may be split any way, a rank may
 * hold none: each rank projects its own rows.) Every shard array has one
 * entry per rank of the communicator, the same array on every rank (checked
 * by the setup, see above); its entry for this rank must equal the local
 * size. r, l >= 1, and r + l <= N (U) or K (V), as far as one rank can tell
 * (for V_ROWS: r plus this rank's rows of V_low).
 */
typedef struct osft_projection_target_s {
  size_t struct_size;           /**< sizeof(osft_projection_target_t) as compiled */
  const DLTensor *u_high;       /**< U_high (see the table above); NULL: no U part */
  const DLTensor *grad_u_low;   /**< dU_low, projected by project(); or NULL */
  const DLTensor *u_low;        /**< U_low, projected by project_params(); or NULL */
  osft_shard_layout_t u_layout; /**< REPLICATED or U_ROWS */
  const int64_t *u_shards;      /**< U_ROWS: N_p of every rank; else NULL */
  int64_t n_u_shards;           /**< entries of u_shards (the ranks), or 0 */
  const DLTensor *v_high;       /**< V_high (see the table above); NULL: no V part */
  const DLTensor *grad_v_low;   /**< dV_low, projected by project(); or NULL */
  const DLTensor *v_low;        /**< V_low, projected by project_params(); or NULL */
  osft_shard_layout_t v_layout; /**< REPLICATED, V_COLS or V_ROWS */
  const int64_t *v_shards;      /**< V_COLS: K_p, V_ROWS: r_p of every rank; else NULL */
  int64_t n_v_shards;           /**< entries of v_shards (the ranks), or 0 */
} osft_projection_target_t;

/**
 * @brief Fills *target with NULL tensors, REPLICATED layouts and no shards.
 *
 * @param[out] target       The struct to fill.
 * @param[in]  struct_size  sizeof(*target) as the caller compiled it.
 * @retval OSFT_STATUS_SUCCESS  The defaults were written.
 * @retval OSFT_STATUS_INVALID_ARGUMENT  target is NULL.
 * @retval OSFT_STATUS_INVALID_STRUCT_SIZE  struct_size below the 1.0 layout.
 */
OSFT_API osft_status_t osft_projection_target_init(osft_projection_target_t *target,
                                                   size_t struct_size);
#define OSFT_PROJECTION_TARGET_INIT(t) osft_projection_target_init((t), sizeof(*(t)))

/**
 * @brief Registers a target (framework-owned tensors).
 *
 * Writes its index (0, 1, ...
 * in registration order) to *index unless index is NULL. No collective.
 * Tensors the projector writes (gradients, trainable factors) must not
 * overlap any tensor of any registered target.
 *
 * @param[in]  projector  The projector.
 * @param[in]  target     The target (copied; the tensors are borrowed).
 * @param[out] index      Receives the target's index, or NULL.
 * @return OSFT_STATUS_SUCCESS, or one of the errors below (nothing is
 * registered).
 * @retval OSFT_STATUS_SUCCESS  The target was registered.
 * @retval OSFT_STATUS_INVALID_HANDLE  projector is not a live projector.
 * @retval OSFT_STATUS_INVALID_ARGUMENT  (target NULL; a part without a
 *   gradient and a trainable factor, or a gradient without its *_high; a
 *   layout that does not apply to the part; a shard array whose count is not
 *   the communicator's size, or missing, or set for REPLICATED; a negative
 *   shard)
 * @retval OSFT_STATUS_INVALID_STRUCT_SIZE  target->struct_size.
 * @retval OSFT_STATUS_SHAPE_MISMATCH  (shapes that disagree between a
 *   target's pieces; a shard entry that is not this rank's local size; r or l
 *   of 0; r + l larger than N or K)
 * @retval OSFT_STATUS_DTYPE_MISMATCH  A tensor's dtype.
 * @retval OSFT_STATUS_BAD_LAYOUT  A tensor's layout.
 * @retval OSFT_STATUS_DEVICE_MISMATCH  A tensor's device.
 * @retval OSFT_STATUS_ALIASING  A tensor the projector writes overlaps a
 *   tensor of a registered target.
 * @retval OSFT_STATUS_OUT_OF_MEMORY  An allocation failed.
 */
OSFT_API osft_status_t osft_projector_add_target(osft_projector_t projector,
                                                 const osft_projection_target_t *target,
                                                 int64_t *index);

/**
 * @brief Registers a factorized-linear layer of the same context as a
 * REPLICATED target.
 *
 * Its U_high, V_high, U_low, V_low are read through the layer at
 * every call (so re-decomposition and the optimizer's in-place updates are
 * seen), with the gradients grad_u_low (N x l) and grad_v_low (l x K), each
 * optional (NULL: that part's gradient is not projected). The layer must
 * stay alive while it is registered; a call after it was destroyed fails
 * with OSFT_STATUS_INVALID_HANDLE.
 *
 * @param[in]  projector   The projector.
 * @param[in]  layer       The layer (osftrt/flinear.h).
 * @param[in]  grad_u_low  dU_low (N x l), or NULL.
 * @param[in]  grad_v_low  dV_low (l x K), or NULL.
 * @param[out] index       Receives the target's index, or NULL.
 * @return Errors: as for osft_projector_add_target (the layer's handle:
 * OSFT_STATUS_INVALID_HANDLE; another context: OSFT_STATUS_INVALID_ARGUMENT).
 * @retval OSFT_STATUS_SUCCESS  The layer was registered.
 * @retval OSFT_STATUS_INVALID_HANDLE  The projector's or the layer's handle.
 * @retval OSFT_STATUS_INVALID_ARGUMENT  As for osft_projector_add_target();
 *   a layer of another context.
 * @retval OSFT_STATUS_DTYPE_MISMATCH  As for osft_projector_add_target().
 * @retval OSFT_STATUS_SHAPE_MISMATCH  As for osft_projector_add_target().
 * @retval OSFT_STATUS_BAD_LAYOUT  As for osft_projector_add_target().
 * @retval OSFT_STATUS_DEVICE_MISMATCH  As for osft_projector_add_target().
 * @retval OSFT_STATUS_ALIASING  As for osft_projector_add_target().
 * @retval OSFT_STATUS_OUT_OF_MEMORY  An allocation failed.
 */
OSFT_API osft_status_t osft_projector_add_layer(osft_projector_t projector,
                                                osft_flinear_t layer,
                                                const DLTensor *grad_u_low,
                                                const DLTensor *grad_v_low,
                                                int64_t *index);

/**
 * @brief Rebinds the gradients of target `index` (e.g. a framework that
 * allocates new gradient tensors every step).
 *
 * The new tensors replace the old ones;
 * NULL means "no gradient for this part". Shapes must match the part. No
 * collective, no effect on the coefficient layout.
 *
 * @param[in] projector   The projector.
 * @param[in] index       The target's index.
 * @param[in] grad_u_low  The new dU_low, or NULL.
 * @param[in] grad_v_low  The new dV_low, or NULL.
 * @return OSFT_STATUS_SUCCESS, or one of the errors below. Nothing changes on
 * failure.
 * @retval OSFT_STATUS_SUCCESS  The gradients were rebound.
 * @retval OSFT_STATUS_INVALID_HANDLE  projector is not a live projector.
 * @retval OSFT_STATUS_INVALID_ARGUMENT  (index out of range; a gradient for
 *   an absent part; a part left with neither gradient nor trainable factor)
 * @retval OSFT_STATUS_DTYPE_MISMATCH  the tensor errors of
 *   osft_projector_add_target.
 * @retval OSFT_STATUS_SHAPE_MISMATCH  the tensor errors of
 *   osft_projector_add_target.
 * @retval OSFT_STATUS_BAD_LAYOUT  the tensor errors of
 *   osft_projector_add_target.
 * @retval OSFT_STATUS_DEVICE_MISMATCH  the tensor errors of
 *   osft_projector_add_target.
 * @retval OSFT_STATUS_ALIASING  the tensor errors of
 *   osft_projector_add_target.
 */
OSFT_API osft_status_t osft_projector_set_grads(osft_projector_t projector, int64_t index,
                                                const DLTensor *grad_u_low,
                                                const DLTensor *grad_v_low);

/**
 * @brief Runs the one-time setup collectives now (consistency check;
 * gathering V_high for V_ROWS targets), if they are pending; otherwise does
 * nothing.
 *
 * Collective.
 *
 * @param[in] projector  The projector.
 * @retval OSFT_STATUS_SUCCESS  The setup has run (or was not pending).
 * @retval OSFT_STATUS_INVALID_HANDLE  projector is not a live projector.
 * @retval OSFT_STATUS_INVALID_ARGUMENT  (registrations differ between ranks:
 *   the message names the first differing target)
 * @retval OSFT_STATUS_COMM_ERROR  A collective failed.
 * @retval OSFT_STATUS_TIMEOUT  A collective did not complete in time.
 * @retval OSFT_STATUS_OUT_OF_MEMORY  An allocation failed.
 */
OSFT_API osft_status_t osft_projector_prepare(osft_projector_t projector);

/**
 * @brief The frozen factors changed (e.g. a re-decomposition for a new task):
 * drops the gathered V_high, which the next call gathers again (so every
 * rank must invalidate together).
 *
 * Local, no collective. Layer targets need
 * no invalidation.
 *
 * @param[in] projector  The projector.
 * @retval OSFT_STATUS_SUCCESS  The setup is pending again.
 * @retval OSFT_STATUS_INVALID_HANDLE  projector is not a live projector.
 */
OSFT_API osft_status_t osft_projector_invalidate(osft_projector_t projector);

/**
 * @brief Projects every registered gradient out of its frozen subspace, in
 * place: dU_low -= U_high (U_high^T dU_low), dV_low -= (dV_low V_high^T)
 * V_high.
 *
 * Collective: at most one all-reduce (plus the pending setup, see above).
 *
 * @param[in] projector  The projector.
 * @return OSFT_STATUS_SUCCESS, or one of the errors below (no gradient is
 * modified), and the errors of osft_projector_prepare().
 * @retval OSFT_STATUS_SUCCESS  Every registered gradient was projected (on
 *   CUDA: enqueued).
 * @retval OSFT_STATUS_INVALID_HANDLE  (projector; a registered layer or the
 *   communicator was destroyed)
 * @retval OSFT_STATUS_INVALID_ARGUMENT  As for osft_projector_prepare().
 * @retval OSFT_STATUS_SHAPE_MISMATCH  (a registered layer changed shape)
 * @retval OSFT_STATUS_COMM_ERROR  A collective failed.
 * @retval OSFT_STATUS_TIMEOUT  A collective did not complete in time.
 * @retval OSFT_STATUS_OUT_OF_MEMORY  (workspace)
 * @retval OSFT_STATUS_NOT_SUPPORTED  On the CPU, a dimension beyond the
 *   32-bit BLAS interface.
 * @retval OSFT_STATUS_BACKEND_ERROR  A backend library failed.
 */
OSFT_API osft_status_t osft_projector_project(osft_projector_t projector);

/**
 * @brief The same projection applied to the parameters: U_low -= U_high
 * (U_high^T U_low), V_low -= (V_low V_high^T) V_high, for every registered
 * trainable factor (call after each optimizer step).
 *
 * @param[in] projector  The projector.
 * @return Errors: as for
 * osft_projector_project (no parameter is modified on failure).
 * @retval OSFT_STATUS_SUCCESS  Every registered trainable factor was
 *   projected (on CUDA: enqueued).
 * @retval OSFT_STATUS_INVALID_HANDLE  As for osft_projector_project().
 * @retval OSFT_STATUS_INVALID_ARGUMENT  As for osft_projector_project().
 * @retval OSFT_STATUS_SHAPE_MISMATCH  As for osft_projector_project().
 * @retval OSFT_STATUS_COMM_ERROR  As for osft_projector_project().
 * @retval OSFT_STATUS_TIMEOUT  As for osft_projector_project().
 * @retval OSFT_STATUS_OUT_OF_MEMORY  As for osft_projector_project().
 * @retval OSFT_STATUS_NOT_SUPPORTED  As for osft_projector_project().
 * @retval OSFT_STATUS_BACKEND_ERROR  As for osft_projector_project().
 */
OSFT_API osft_status_t osft_projector_project_params(osft_projector_t projector);

/**
 * @brief The orthogonality residual of the trainable factors, over all
 * targets and all ranks: *max_u = max |U_high^T U_low| and *max_v = max
 * |V_low V_high^T| (elements of the full, unsharded products; 0 where no
 * target has that part).
 *
 * Either pointer may be NULL. Collective: one all-reduce
 * (partial products of U_ROWS and V_COLS parts, and each rank's maximum of
 * the others). Reads the coefficients back to the host.
 *
 * @param[in]  projector  The projector.
 * @param[out] max_u      Receives max |U_high^T U_low|, or NULL.
 * @param[out] max_v      Receives max |V_low V_high^T|, or NULL.
 * @return Errors: OSFT_STATUS_INVALID_HANDLE, OSFT_STATUS_INVALID_ARGUMENT (a
 * part without its trainable factor), and those of osft_projector_project.
 * @retval OSFT_STATUS_SUCCESS  The residuals were written.
 * @retval OSFT_STATUS_INVALID_HANDLE  As for osft_projector_project().
 * @retval OSFT_STATUS_INVALID_ARGUMENT  (a part without its trainable factor)
 * @retval OSFT_STATUS_SHAPE_MISMATCH  As for osft_projector_project().
 * @retval OSFT_STATUS_COMM_ERROR  As for osft_projector_project().
 * @retval OSFT_STATUS_TIMEOUT  As for osft_projector_project().
 * @retval OSFT_STATUS_OUT_OF_MEMORY  As for osft_projector_project().
 * @retval OSFT_STATUS_NOT_SUPPORTED  As for osft_projector_project().
 * @retval OSFT_STATUS_BACKEND_ERROR  As for osft_projector_project().
 */
OSFT_API osft_status_t osft_projector_orthogonality(osft_projector_t projector,
                                                    double *max_u, double *max_v);

/** @brief What a projector holds and does per call. */
typedef struct osft_projector_info_s {
  size_t struct_size;              /**< set by the caller: sizeof as compiled */
  int64_t targets;                 /**< registered targets */
  int64_t reduced_elements;        /**< fp32 coefficients all-reduced per call */
  int64_t collectives_per_project; /**< 0 or 1 (setup collectives excluded) */
  uint64_t coefficient_bytes;      /**< persistent coefficient buffer */
  uint64_t gathered_bytes;         /**< cached V_high of V_ROWS targets */
  int setup_pending;               /**< 1 if the next call runs the setup */
  /* Added in 1.2.0: what the last osft_projector_project() or
   * osft_projector_project_params() call did (0 before the first). GEMMs
   * of targets with the same shapes and dtypes are issued together as one
   * batched call (one launch on CUDA), so gemm_calls <= gemms. */
  int64_t last_gemms;             /**< GEMMs computed by the last call */
  int64_t last_gemm_calls;        /**< backend GEMM calls (batched ones count 1) */
  int64_t last_elementwise_calls; /**< conversions, splits and adds */
  int64_t last_collectives;       /**< collectives it launched (setup too) */
  int64_t last_host_waits;        /**< times it waited for the device: 0 on the
                                     steady path (a CUDA call only enqueues) */
} osft_projector_info_t;

/**
 * @brief Fills *info with zeros for a struct of struct_size bytes and sets
 * info->struct_size = struct_size, ready for osft_projector_get_info().
 *
 * Pass sizeof(osft_projector_info_t), or use OSFT_PROJECTOR_INFO_INIT(&s). Added in 1.3.0
 * (before, callers set struct_size by hand).
 *
 * @param[out] info  The struct to fill.
 * @param[in]  struct_size  sizeof(*info) as the caller compiled it.
 * @retval OSFT_STATUS_SUCCESS  The struct was filled.
 * @retval OSFT_STATUS_INVALID_ARGUMENT  info is NULL.
 * @retval OSFT_STATUS_INVALID_STRUCT_SIZE  struct_size below the 1.0 layout.
 */
OSFT_API osft_status_t osft_projector_info_init(osft_projector_info_t *info,
                                                size_t struct_size);
#define OSFT_PROJECTOR_INFO_INIT(i) osft_projector_info_init((i), sizeof(*(i)))

/**
 * @brief Writes *info (fields up to info->struct_size).
 *
 * @param[in]     projector  The projector.
 * @param[in,out] info       In: struct_size set by the caller; out: the
 *                           information.
 * @retval OSFT_STATUS_SUCCESS  *info was written.
 * @retval OSFT_STATUS_INVALID_HANDLE  projector is not a live projector.
 * @retval OSFT_STATUS_INVALID_ARGUMENT  (info NULL)
 * @retval OSFT_STATUS_INVALID_STRUCT_SIZE  info->struct_size.
 */
OSFT_API osft_status_t osft_projector_get_info(osft_projector_t projector,
                                               osft_projector_info_t *info);

/**
 * @def OSFT_PROJECTOR_OPTIONS_INIT(o)
 * @brief osft_projector_options_init() with the struct's own size.
 * @param o  Pointer to an osft_projector_options_t.
 */

/**
 * @def OSFT_PROJECTION_TARGET_INIT(t)
 * @brief osft_projection_target_init() with the struct's own size.
 * @param t  Pointer to an osft_projection_target_t.
 */

/**
 * @def OSFT_PROJECTOR_INFO_INIT(i)
 * @brief osft_projector_info_init() with the struct's own size.
 * @param i  Pointer to an osft_projector_info_t.
 */

/** @} */

#ifdef __cplusplus
}
#endif

#endif /* OSFTRT_PROJECTION_H */
