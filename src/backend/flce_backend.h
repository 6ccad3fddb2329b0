/* Internal: the kernels of fused linear cross-entropy that the generic
 * primitives (src/backend/linalg_backend.h) do not cover: the target check, the row
 * pass over a logits chunk, and the final per-token reductions. The
 * operation (src/ops/flce*) plans and validates once for both backends;
 * src/cpu/flce_cpu.cpp and src/cuda/flce_cuda.cpp implement this table. Kernels never
 * validate: arguments arrive checked. */
#ifndef OSFTRT_SRC_BACKEND_FLCE_BACKEND_H
#define OSFTRT_SRC_BACKEND_FLCE_BACKEND_H

#include <cmath>
#include <cstdint>

#include "backend/linalg_backend.h"
#include "core/context_impl.h"

namespace osft {

#ifdef __CUDACC__
#define OSFT_FLCE_HD __host__ __device__
#else
#define OSFT_FLCE_HD
#endif

/* The loss settings, as the kernels use them. */
struct FlceLoss {
  int64_t vocab = 0;        /* V: this rank's classes (all of them, single rank) */
  int64_t vocab_offset = 0; /* the global id of local class 0 */
  int64_t vocab_global = 0; /* the global V (targets range over it) */
  int64_t ignore_index = -100;
  float smoothing = 0.0f; /* a */
  float eps = 0.0f;       /* a / V (the global V) */
  float z_scale = 0.0f;   /* lambda */
  float softcap = 0.0f;   /* 0: off */
  /* reduction MEAN: the cross-entropy part over the totals' denominator D,
   * the z-loss part over their count of tokens not ignored (valid) */
  bool mean = true;
  bool per_token = false; /* reduction NONE: grad_loss and loss per token */
};

/* The targets of all tokens of the call: a compact int32 or int64 vector. */
struct FlceTargets {
  const void *data = nullptr;
  int64_t n = 0;
  osfti_dtype_t dtype = OSFTI_DTYPE_INVALID;
};

/* Vocab parallelism: the per-row record of one rank's shard, 8 floats,
 * all-gathered once per chunk and combined on every rank in rank order. */
enum FlceRecordWord {
  kRecMax,    /* the local max logit m_p */
  kRecSum,    /* sum over the shard of e^(z - m_p) */
  kRecTarget, /* z_y if the target is in this shard, else 0 */
  kRecWeight, /* w_y if the target is in this shard (and not ignored), else 0 */
  kRecSmooth, /* sum_j w_j z_j over the shard (with label smoothing) */
  kRecBest,   /* the largest logit of the shard */
  kRecBestHi, /* its global index, bits 16 and up (exact in a float) */
  kRecBestLo, /* its global index, the low 16 bits */
  kFlceRecordWords
};

/* A row's statistics over all ranks. */
struct FlceCombined {
  float max, sum, target, weight, smooth, best;
  int64_t best_j;
};

OSFT_FLCE_HD inline void flce_pack_record(float *rec, float max, float sum, float target,
                                          float weight, float smooth, float best,
                                          int64_t best_global) {
  rec[kRecMax] = max;
  rec[kRecSum] = sum;
  rec[kRecTarget] = target;
  rec[kRecWeight] = weight;
  rec[kRecSmooth] = smooth;
  rec[kRecBest] = best;
  rec[kRecBestHi] = static_cast<float>(best_global >> 16);
  rec[kRecBestLo] = static_cast<float>(best_global & 0xffff);
}

/* Combines row `row` of the gathered records (rank r's block of `rows`
 * records first at r * rows * kFlceRecordWords): M = max_p m_p, S = sum_p
 * s_p e^(m_p - M); the other sums add (one rank holds the target); the
 * argmax is the largest value, the lowest global index on ties. */
OSFT_FLCE_HD inline FlceCombined flce_combine(const float *gathered, int ranks,
                                              int64_t rows, int64_t row) {
  FlceCombined c{-INFINITY, 0.0f, 0.0f, 0.0f, 0.0f, -INFINITY, 0};
  const int64_t stride = rows * kFlceRecordWords;
  for (int r = 0; r < ranks; ++r) {
    const float m = gathered[r * stride + row * kFlceRecordWords + kRecMax];
    c.max = m > c.max ? m : c.max;
  }
  bool first = true;
  for (int r = 0; r < ranks; ++r) {
    const float *rec = gathered + r * stride + row * kFlceRecordWords;
    if (rec[kRecSum] != 0.0f) c.sum += rec[kRecSum] * expf(rec[kRecMax] - c.max);
    c.target += rec[kRecTarget];
    c.weight += rec[kRecWeight];
    c.smooth += rec[kRecSmooth];
    const int64_t j = static_cast<int64_t>(rec[kRecBestHi]) * 65536 +
                      static_cast<int64_t>(rec[kRecBestLo]);
    if (first || rec[kRecBest] > c.best || (rec[kRecBest] == c.best && j < c.best_j)) {
      c.best = rec[kRecBest];
      c.best_j = j;
      first = false;
    }
  }
  return c;
}

/* Per-call totals, written by prepare() into scratch on the context's
 * device and read there by the row pass and finalize(). */
struct FlceTotals {
  /* prepare() sums over this rank's classes and the targets in them; the
   * operation combines the ranks' partial sums (vocab parallelism). */
  double weight_sum = 0.0;  /* sum_j w_j over the classes (V without weights) */
  double denominator = 0.0; /* sum of w_y over tokens not ignored (their count) */
  /* Tokens not ignored: the z-loss denominator of MEAN and the accuracy's.
   * Every rank counts all tokens (targets are replicated), so it is the
   * global count on every rank without combining. */
  int64_t valid = 0;
  int64_t first_bad = -1; /* first token whose target is out of range, or -1 */
  int64_t bad_value = 0;  /* its target */
};

/* Per-token results of the row pass, indexed by token (scratch). */
struct FlceTokens {
  float *loss = nullptr;     /* loss_i (0 for ignored tokens) */
  float *z = nullptr;        /* lambda lse_i^2 (0 for ignored tokens) */
  int64_t *argmax = nullptr; /* argmax_j z_ij */
};

/* The sticky record of device_target_check: {call, token, target}, call 0
 * when clear. */
constexpr int kFlceTargetRecordWords = 3;

struct FlcePrepare {
  FlceLoss loss;
  FlceTargets targets;
  Vec class_weight;   /* data nullptr: none */
  FlceTotals *totals; /* scratch on the device */
  /* wait: prepare() returns the totals on the host (one wait on CUDA);
   * otherwise it returns default totals without waiting, and the check's
   * result stays on the device, in *totals and, where `record` is set, in
   * the sticky record (kFlceTargetRecordWords words, written only while
   * clear) with `call` as the call's number. */
  bool wait = true;
  int64_t *record = nullptr;
  int64_t call = 0;
};

/* What a row pass does: everything (single rank), or, with vocab
 * parallelism or vocabulary slices, the per-row records only, then (after
 * the all-gather, or the last slice) the per-token results and the
 * gradient from the combined records. merge: no logits; combines the
 * `ranks` blocks of `gathered` row by row (flce_combine) into one record
 * per row in `records`, which may be the first block itself (the
 * vocabulary plan merges each slice's records into the running ones). */
enum class FlceRowPhase { full, records, finish, merge };

/* One chunk of rows [first_token, first_token + logits.rows). */
struct FlceRowPass {
  FlceLoss loss;
  FlceRowPhase phase = FlceRowPhase::full;
  float *records = nullptr;        /* records: rows x kFlceRecordWords (written) */
  const float *gathered = nullptr; /* finish: ranks blocks of records (read) */
  int ranks = 1;
  /* fp32 logits x_c W^T (bias not yet added), rows x V with ld >= V, rows
   * 16-byte aligned; V is loss.vocab: this rank's classes, or one slice of
   * them (then bias and class_weight below start at the slice's first
   * class, and loss.vocab_offset is its global id). With want_grad, overwritten in place
   * by g, of grad_dtype: fp32 with the same ld, or bf16 (CUDA only) with ld 2 *
   * logits.ld, i.e. row i starts where logits row i starts. */
  Mat logits;
  bool want_grad = false;
  osfti_dtype_t grad_dtype = OSFTI_F32;
  /* Where the gradient goes instead of in place (data nullptr: in place):
   * logits.rows rows of grad_dtype, ld >= V, rows 16-byte aligned. The
   * operation keeps every chunk's gradient this way when it sums grad_W in
   * one GEMM at the end (FlcePlan::hold). */
  Mat grad;
  int64_t first_token = 0;
  FlceTargets targets; /* all tokens */
  Vec bias;            /* fp32 or bf16; data nullptr: none */
  Vec class_weight;    /* fp32; data nullptr: none */
  /* Upstream gradient: one float (MEAN, SUM) or one per token (NONE);
   * nullptr: 1. */
  const float *grad_loss = nullptr;
  const FlceTotals *totals = nullptr; /* from prepare(), on the device */
  FlceTokens tokens;
};

/* Reduces the per-token results into the caller's outputs (any may have
 * data nullptr: not requested). */
struct FlceFinalize {
  FlceLoss loss;
  FlceTargets targets;
  const FlceTotals *totals = nullptr;
  FlceTokens tokens;  /* read only */
  Vec out_loss;       /* fp32: one element, or one per token (NONE) */
  Vec out_z;          /* like out_loss */
  Vec out_accuracy;   /* fp32, one element */
  Vec out_argmax;     /* int32 or int64, per token */
  Vec out_token_loss; /* fp32, per token */
};

struct FlceKernels {
  /* GEMMs take bf16 operands natively (else the operation widens them to
   * fp32 in scratch first, and the row pass writes fp32 gradients). */
  bool bf16_gemm;

  /* The planner's machine balance: GEMM flops per byte of memory traffic
   * (a large GEMM's flop rate over the memory bandwidth), with which its
   * cost model weighs the bytes a plan moves against its flops. */
  double flops_per_byte;

  /* Checks every target against [0, V) and ignore_index and computes the
   * totals into args.totals; returns a host copy (waits on CUDA). */
  FlceTotals (*prepare)(Context &ctx, const FlcePrepare &args);

  /* The row pass over one chunk: row statistics, per-token results and,
   * with want_grad, the gradient in place of the logits. */
  void (*rows)(Context &ctx, const FlceRowPass &args);

  /* Writes the requested outputs from the per-token results. */
  void (*finalize)(Context &ctx, const FlceFinalize &args);
};

const FlceKernels &cpu_flce_kernels() noexcept;
/* Throws OSFT_STATUS_NOT_SUPPORTED in builds without CUDA. */
const FlceKernels &cuda_flce_kernels();

inline const FlceKernels &flce_kernels(Context &ctx) {
  return on_cuda(ctx) ? cuda_flce_kernels() : cpu_flce_kernels();
}

}  // namespace osft

#endif
