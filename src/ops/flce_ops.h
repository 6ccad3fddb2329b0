/* Internal: fused linear cross-entropy behind osft_flce_t — the handle and
 * its options (flce_handle.cpp), validation and chunk planning
 * (flce_plan.cpp), and the chunked computation (flce_compute.cpp), written
 * once for both backends on src/backend/linalg_backend.h and src/backend/flce_backend.h.
 */
#ifndef OSFTRT_SRC_OPS_FLCE_OPS_H
#define OSFTRT_SRC_OPS_FLCE_OPS_H

#include "backend/linalg_backend.h"
#include "backend/flce_backend.h"
#include "core/scratch.h"
#include "osftrt/flce.h"

struct osft_flce_s {
  osft::Context *ctx = nullptr;
  osft_flce_options_t opts{};
  bool counted = false; /* registered, and counted in ctx->live_children */
  /* device_target_check: the sticky record in the context's memory,
   * kFlceTargetRecordWords int64 (FlcePrepare::record), zero when clear;
   * calls: the calls since creation or the last check. */
  int64_t *target_record = nullptr;
  int64_t calls = 0;
};

namespace osft {

using Flce = osft_flce_s;

/* ---- handle (flce_handle.cpp) */
osft_flce_options_t read_flce_options(const osft_flce_options_t *user);
Flce *create_flce(Context &ctx, const osft_flce_options_t &opts);
void destroy_flce(Flce *flce) noexcept;
Flce &checked_flce(osft_flce_t flce, const char *arg);
/* device_target_check: reads (waiting on CUDA) and clears the sticky
 * record; throws OSFT_STATUS_INDEX_OUT_OF_RANGE describing it if set. */
void check_targets_record(Flce &f);

/* ---- validation and planning (flce_plan.cpp) */

/* A validated call: the arguments as backend views. */
struct FlceCall {
  int64_t m = 0, v = 0, h = 0;
  Mat x, w;
  FlceTargets targets;
  Vec bias, class_weight; /* data nullptr: none */
  const float *grad_loss = nullptr;
  Mat grad_x, grad_w; /* data nullptr: not requested */
  Vec grad_b;
  Vec loss, z_loss, accuracy, argmax, token_loss;
  float beta_x = 0, beta_w = 0, beta_b = 0; /* 1: accumulate */
  bool want_grad() const noexcept {
    return grad_x.data != nullptr || grad_w.data != nullptr || grad_b.data != nullptr;
  }
};

/* Checks `in` and `out` against the handle and the context; throws naming
 * the argument. Reads no tensor data. */
FlceCall check_call(const Flce &f, const osft_flce_inputs_t &in,
                    const osft_flce_outputs_t &out);

/* Scratch slots of a call (-1: not needed). */
struct FlceSlots {
  int totals = -1, token_loss = -1, token_z = -1, token_argmax = -1;
  int logits = -1; /* chunk x Vp fp32 */
  int x32 = -1;    /* chunk x H fp32: x widened (no bf16 GEMM) */
  int w32 = -1;    /* V x H fp32: W widened (no bf16 GEMM) */
  int gw32 = -1;   /* V x H fp32: grad_weight accumulator */
  int gb32 = -1;   /* V fp32: grad_bias accumulator */
  /* hold plans: M x Vp in the gradient dtype, every chunk's g kept for one
   * grad_W GEMM (and one grad_b sum) at the end; with fp32 gradients the
   * logits are computed into it and `logits` is not needed */
  int hold = -1;
  /* vocab parallelism: chunk x kFlceRecordWords fp32; vocabulary plans: 2
   * blocks of that, the running records and a slice's */
  int records = -1;
  int gathered = -1; /* ranks x chunk x kFlceRecordWords fp32 */
  int gx32 = -1;     /* vocabulary plans: chunk x H fp32, grad_x over the slices */
  /* in-place plans: kept_rows x Sp fp32, the gradient of a slice whose
   * grad_W rows would overwrite logits not yet read (FlcePlan::in_place);
   * their `logits` holds the extra kept rows' tiles, then the chunks' */
  int tile_grad = -1;
};

struct FlcePlan {
  int64_t chunk_rows = 0, chunks = 0;
  size_t budget = 0;
  /* Several chunks, but grad_W (and grad_b) summed once over all M rows
   * from the held gradients instead of a read-modify-write of a V x H
   * accumulator per chunk: chosen where it takes no more scratch than the
   * accumulator plan would (single rank only). */
  bool hold = false;
  /* The vocabulary plan: tiles of chunk_rows tokens x slice_cols classes
   * (two passes over the slices of each token chunk, flce_compute.cpp);
   * otherwise slices = 1, slice_cols = V. */
  bool vocab = false;
  int64_t slice_cols = 0, slices = 1;
  /* The logits of the first kept_rows tokens are kept in the caller's
   * grad_weight (overwritten, fp32, compact: its V x H floats hold
   * kept_rows x Vp logits, kept_rows <= V H / Vp), those of the next
   * extra_rows in scratch (the logits slot), instead of a chunk's buffer:
   * their tile runs over kept_slices slices of kept_cols classes, each
   * slice's logits computed once (three GEMMs, no recomputation), then from
   * the last slice to the first its gradient, grad_x += g W_s and
   * grad_W_s = g^T x written once (the kept rows' share through tile_grad
   * where its rows would overwrite logits not yet read; the extra rows'
   * added at once). When that is all M rows, the plan is a vocabulary plan
   * of one tile (vocab, slices and slice_cols say so); otherwise the other
   * tokens follow in token chunks of rest_rows in the logits slot (chunks - 1
   * of them, summing into grad_W; chunk_rows reports the tile's rows). CPU,
   * single rank. */
  bool in_place = false;
  int64_t kept_rows = 0, extra_rows = 0, kept_slices = 0, kept_cols = 0;
  int64_t rest_rows = 0; /* rows per token chunk after the kept tile */
  /* The cost model's estimate of the call, in units of its floor (the
   * three GEMMs over all tokens; one without gradients). */
  double cost = 0.0;
  ScratchPlan scratch;
  FlceSlots slots;
};

/* Chooses the plan (token chunks or vocabulary tiles, opts.chunking) and
 * its sizes from the budget and lays out the scratch. Throws
 * OSFT_STATUS_OUT_OF_MEMORY if no plan fits. */
FlcePlan plan_call(const Flce &f, const FlceCall &call);

/* The number of ranks W is sharded over (1: the single-rank path). */
int vocab_ranks(const Flce &f) noexcept;

/* The logits row stride: V rounded up so rows stay 64-byte aligned. */
int64_t padded_vocab(int64_t v) noexcept;

/* ---- computation (flce_compute.cpp)
 * Vocab-parallel mode (opts.comm of more than one rank): W sharded over V,
 * each rank runs the same chunks over its classes. The row pass splits at
 * its statistics: a per-row record (FlceRecordWord) per rank, one
 * all-gather per chunk, every rank combining them into the global lse,
 * then the gradient pass with it; grad_x partial sums are all-reduced once
 * at the end; grad_W and grad_b stay sharded. */
void compute(Flce &f, const osft_flce_inputs_t &in, const osft_flce_outputs_t &out);

/* What one compute call did, counted as it ran (flce_compute.cpp) and
 * logged at OSFT_LOG_DEBUG as one line starting "flce: counts:", so that
 * tests and benchmarks can see the fixed cost of a chunk. */
struct FlceCounts {
  int64_t chunks = 0;
  int64_t calls = 0;       /* backend and kernel-table calls (launches on CUDA) */
  int64_t conversions = 0; /* dtype conversions, the GEMMs' hidden ones included */
  int64_t converted = 0;   /* elements they converted */
  int64_t vh_passes = 0;   /* reads or writes of a whole V x H gradient buffer */
  int64_t host_waits = 0;  /* waits for the device or the other ranks */
  int64_t allocations = 0; /* scratch plans allocated */
};

}  // namespace osft

#endif
