/*
 * libosftrt — OSFT gradient projection with batched collectives.
 *
 * OSFT trains only the low part of each factorized weight (osftrt/flinear.h)
 * and must keep every update orthogonal to the frozen high subspace. For a
 * target with frozen U_high (N x r, orthonormal columns) and V_high (r x K,
 * orthonormal rows, V stored as rows) and trainable U_low (N x l), V_low
 * (l x K), the projector applies, to every registered target at once,
 *
 *   U:  C_U = U_high^T dU_low   (r x l)     dU_low -= U_high C_U
 *   V:  C_V = dV_low V_high^T   (l x r)     dV_low -= C_V V_high
 *
 * osft_projector_project() does it to the gradients, and
 * osft_projector_project_params() to the parameters U_low, V_low after the
 * optimizer step, so that an optimizer's per-element scaling (Adam) cannot
 * leak into the frozen subspace. S is never projected. Coefficients are
 * fp32 and every update is computed in fp32 (GEMMs accumulate in fp32, the
 * result is rounded once to the tensor's dtype), also for bf16 tensors.
 *
 * Sharding. Across P ranks (an osft_comm_t) each part of a target has a
 * layout, and the projector uses the collective that is right for it:
 *
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
 * Shards may be uneven (P need not divide the dimension; a rank may hold
 * zero rows). The caller states each rank's shard size (`*_shards`).
 *
 * Batching. Every U_ROWS and V_COLS coefficient block lives in one
 * persistent fp32 buffer at a fixed offset (given at registration): the
 * GEMMs write their slices, ONE all-reduce sums the whole buffer, the
 * GEMMs read their slices back. So each project call (for 1 or 224
 * targets) makes exactly one collective launch if any part is U_ROWS or
 * V_COLS, and none otherwise. Nothing is written to a gradient before that
 * collective has succeeded: on a communication error no gradient changes.
 *
 * One-time setup ("prepare"). The first call after a registration (or
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
 * Threading: a projector is used by one thread at a time, like its context.
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

/* An opaque projector handle. */
typedef struct osft_projector_s *osft_projector_t;

/* How one part (U or V) of a target is spread over the ranks. Values fixed
 * forever (ABI.md). */
typedef enum osft_shard_layout_e {
  OSFT_SHARD_REPLICATED = 0, /* U or V: every rank holds the whole part */
  OSFT_SHARD_U_ROWS = 1,     /* U only: rows (N) sharded */
  OSFT_SHARD_V_ROWS = 2,     /* V only: V_high rows (r) and V_low rows (l) */
  OSFT_SHARD_V_COLS = 3      /* V only: columns (K) sharded */
} osft_shard_layout_t;

/* Options for osft_projector_create(). Initialize with
 * OSFT_PROJECTOR_OPTIONS_INIT(&o). */
typedef struct osft_projector_options_s {
  size_t struct_size; /* sizeof(osft_projector_options_t) as compiled */
  /* 1: the setup collectives check that every rank registered the same
   * targets (one small all-gather per setup). 0: skip the check. Default 1. */
  int check_consistency;
} osft_projector_options_t;

OSFT_API osft_status_t osft_projector_options_init(osft_projector_options_t *opts,
                                                   size_t struct_size);
#define OSFT_PROJECTOR_OPTIONS_INIT(o) osft_projector_options_init((o), sizeof(*(o)))

/*
 * Creates a projector on `ctx` whose collectives run on `comm` (a
 * communicator of the same context; NULL: one rank, no collectives). The
 * communicator must outlive the projector. `opts` may be NULL.
 *
 * Errors: OSFT_STATUS_INVALID_HANDLE (ctx, comm), OSFT_STATUS_INVALID_ARGUMENT
 * (projector NULL; comm of another context), OSFT_STATUS_INVALID_STRUCT_SIZE,
 * OSFT_STATUS_OUT_OF_MEMORY.
 */
OSFT_API osft_status_t osft_projector_create(osft_context_t ctx, osft_comm_t comm,
                                             const osft_projector_options_t *opts,
                                             osft_projector_t *projector);

/* Destroys a projector and its buffers (coefficients, gathered V_high).
 * NULL is accepted. Not collective. Errors: OSFT_STATUS_INVALID_HANDLE. */
OSFT_API osft_status_t osft_projector_destroy(osft_projector_t projector);

/*
 * One target: a U part, a V part, or both, as this rank holds them.
 * Matrices are row-major (compact or with padded rows), fp32 or bf16 (each
 * tensor may have its own dtype), on the context's device. A part is
 * present when its *_high tensor is set; it needs a gradient, a trainable
 * factor, or both:
 *   project()            projects every registered gradient;
 *   project_params()     projects every registered trainable factor;
 *   orthogonality()      needs the trainable factor of every part.
 * Local shapes (N_p, K_p, r_p, l_p: this rank's share):
 *
 *   layout         u_high    grad_u_low, u_low   *_shards (entry p = rank p's)
 *   REPLICATED     N x r     N x l               NULL, 0
 *   U_ROWS         N_p x r   N_p x l             u_shards: N_p (rows of U)
 *
 *   layout         v_high    grad_v_low, v_low   v_shards
 *   REPLICATED     r x K     l x K               NULL, 0
 *   V_COLS         r x K_p   l x K_p             K_p (columns of V)
 *   V_ROWS         r_p x K   l_p x K             r_p (rows of V_high)
 *
 * (For V_ROWS the rows of dV_low/V_low may be split any way, a rank may
 * hold none: each rank projects its own rows.) Every shard array has one
 * entry per rank of the communicator, the same array on every rank (checked
 * by the setup, see above); its entry for this rank must equal the local
 * size. r, l >= 1, and r + l <= N (U) or K (V), as far as one rank can tell
 * (for V_ROWS: r plus this rank's rows of V_low).
 */
typedef struct osft_projection_target_s {
  size_t struct_size; /* sizeof(osft_projection_target_t) as compiled */
  const DLTensor *u_high;
  const DLTensor *grad_u_low;
  const DLTensor *u_low;
  osft_shard_layout_t u_layout;
  const int64_t *u_shards;
  int64_t n_u_shards;
  const DLTensor *v_high;
  const DLTensor *grad_v_low;
  const DLTensor *v_low;
  osft_shard_layout_t v_layout;
  const int64_t *v_shards;
  int64_t n_v_shards;
} osft_projection_target_t;

/* Fills *target with NULL tensors, REPLICATED layouts and no shards. */
OSFT_API osft_status_t osft_projection_target_init(osft_projection_target_t *target,
                                                   size_t struct_size);
#define OSFT_PROJECTION_TARGET_INIT(t) osft_projection_target_init((t), sizeof(*(t)))

/*
 * Registers a target (framework-owned tensors). Writes its index (0, 1, ...
 * in registration order) to *index unless index is NULL. No collective.
 * Tensors the projector writes (gradients, trainable factors) must not
 * overlap any tensor of any registered target.
 *
 * Errors (nothing is registered): OSFT_STATUS_INVALID_HANDLE,
 * OSFT_STATUS_INVALID_ARGUMENT (target NULL; a part without a gradient and
 * a trainable factor, or a gradient without its *_high; a layout that does
 * not apply to the part; a shard array whose count is not the
 * communicator's size, or missing, or set for REPLICATED; a negative shard),
 * OSFT_STATUS_INVALID_STRUCT_SIZE, OSFT_STATUS_SHAPE_MISMATCH (shapes that
 * disagree between a target's pieces; a shard entry that is not this
 * rank's local size; r or l of 0; r + l larger than N or K),
 * OSFT_STATUS_DTYPE_MISMATCH, OSFT_STATUS_BAD_LAYOUT,
 * OSFT_STATUS_DEVICE_MISMATCH, OSFT_STATUS_ALIASING,
 * OSFT_STATUS_OUT_OF_MEMORY.
 */
OSFT_API osft_status_t osft_projector_add_target(osft_projector_t projector,
                                                 const osft_projection_target_t *target,
                                                 int64_t *index);

/*
 * Registers a factorized-linear layer of the same context as a REPLICATED
 * target: its U_high, V_high, U_low, V_low are read through the layer at
 * every call (so re-decomposition and the optimizer's in-place updates are
 * seen), with the gradients grad_u_low (N x l) and grad_v_low (l x K), each
 * optional (NULL: that part's gradient is not projected). The layer must
 * stay alive while it is registered; a call after it was destroyed fails
 * with OSFT_STATUS_INVALID_HANDLE.
 *
 * Errors: as for osft_projector_add_target (the layer's handle:
 * OSFT_STATUS_INVALID_HANDLE; another context: OSFT_STATUS_INVALID_ARGUMENT).
 */
OSFT_API osft_status_t osft_projector_add_layer(osft_projector_t projector,
                                                osft_flinear_t layer,
                                                const DLTensor *grad_u_low,
                                                const DLTensor *grad_v_low,
                                                int64_t *index);

/*
 * Rebinds the gradients of target `index` (e.g. a framework that allocates
 * new gradient tensors every step): the new tensors replace the old ones;
 * NULL means "no gradient for this part". Shapes must match the part. No
 * collective, no effect on the coefficient layout.
 *
 * Errors: OSFT_STATUS_INVALID_HANDLE, OSFT_STATUS_INVALID_ARGUMENT (index
 * out of range; a gradient for an absent part; a part left with neither
 * gradient nor trainable factor), and the tensor errors of
 * osft_projector_add_target. Nothing changes on failure.
 */
OSFT_API osft_status_t osft_projector_set_grads(osft_projector_t projector, int64_t index,
                                                const DLTensor *grad_u_low,
                                                const DLTensor *grad_v_low);

/*
 * Runs the one-time setup collectives now (consistency check; gathering
 * V_high for V_ROWS targets), if they are pending; otherwise does nothing.
 * Collective. Errors: OSFT_STATUS_INVALID_HANDLE,
 * OSFT_STATUS_INVALID_ARGUMENT (registrations differ between ranks: the
 * message names the first differing target), OSFT_STATUS_COMM_ERROR,
 * OSFT_STATUS_TIMEOUT, OSFT_STATUS_OUT_OF_MEMORY.
 */
OSFT_API osft_status_t osft_projector_prepare(osft_projector_t projector);

/*
 * The frozen factors changed (e.g. a re-decomposition for a new task):
 * drops the gathered V_high, which the next call gathers again (so every
 * rank must invalidate together). Local, no collective. Layer targets need
 * no invalidation. Errors: OSFT_STATUS_INVALID_HANDLE.
 */
OSFT_API osft_status_t osft_projector_invalidate(osft_projector_t projector);

/*
 * Projects every registered gradient out of its frozen subspace, in place:
 * dU_low -= U_high (U_high^T dU_low), dV_low -= (dV_low V_high^T) V_high.
 * Collective: at most one all-reduce (plus the pending setup, see above).
 *
 * Errors (no gradient is modified): OSFT_STATUS_INVALID_HANDLE (projector;
 * a registered layer or the communicator was destroyed),
 * OSFT_STATUS_SHAPE_MISMATCH (a registered layer changed shape),
 * OSFT_STATUS_COMM_ERROR, OSFT_STATUS_TIMEOUT, OSFT_STATUS_OUT_OF_MEMORY
 * (workspace), OSFT_STATUS_BACKEND_ERROR, and the errors of
 * osft_projector_prepare().
 */
OSFT_API osft_status_t osft_projector_project(osft_projector_t projector);

/*
 * The same projection applied to the parameters: U_low -= U_high (U_high^T
 * U_low), V_low -= (V_low V_high^T) V_high, for every registered trainable
 * factor (call after each optimizer step). Errors: as for
 * osft_projector_project (no parameter is modified on failure).
 */
OSFT_API osft_status_t osft_projector_project_params(osft_projector_t projector);

/*
 * The orthogonality residual of the trainable factors, over all targets and
 * all ranks: *max_u = max |U_high^T U_low| and *max_v = max |V_low
 * V_high^T| (elements of the full, unsharded products; 0 where no target
 * has that part). Either pointer may be NULL. Collective: one all-reduce
 * (partial products of U_ROWS and V_COLS parts, and each rank's maximum of
 * the others). Reads the coefficients back to the host.
 *
 * Errors: OSFT_STATUS_INVALID_HANDLE, OSFT_STATUS_INVALID_ARGUMENT (a part
 * without its trainable factor), and those of osft_projector_project.
 */
OSFT_API osft_status_t osft_projector_orthogonality(osft_projector_t projector,
                                                    double *max_u, double *max_v);

/* What a projector holds and does per call. */
typedef struct osft_projector_info_s {
  size_t struct_size;              /* set by the caller: sizeof as compiled */
  int64_t targets;                 /* registered targets */
  int64_t reduced_elements;        /* fp32 coefficients all-reduced per call */
  int64_t collectives_per_project; /* 0 or 1 (setup collectives excluded) */
  uint64_t coefficient_bytes;      /* persistent coefficient buffer */
  uint64_t gathered_bytes;         /* cached V_high of V_ROWS targets */
  int setup_pending;               /* 1 if the next call runs the setup */
} osft_projector_info_t;

/* Writes *info (fields up to info->struct_size). Errors:
 * OSFT_STATUS_INVALID_HANDLE, OSFT_STATUS_INVALID_ARGUMENT (info NULL),
 * OSFT_STATUS_INVALID_STRUCT_SIZE. */
OSFT_API osft_status_t osft_projector_get_info(osft_projector_t projector,
                                               osft_projector_info_t *info);

#ifdef __cplusplus
}
#endif

#endif /* OSFTRT_PROJECTION_H */
