/* Fused linear cross-entropy: validating a call's tensors (before anything
 * is written) and choosing the chunk size from the memory budget. */
#include <algorithm>
#include <cstdint>
#include <cstdio>

#include "core/error.h"
#include "core/logging.h"
#include "core/tensor_args.h"
#include "comm/communicator.h"
#include "ops/flce_ops.h"

namespace osft {
namespace {

constexpr unsigned kComputeDtypes = OSFTI_F32 | OSFTI_BF16;
/* Chunk buffers when the caller sets no budget: logits of at most
 * kDefaultLogitsPerX x x's elements (as Liger-Kernel's chunks, which hold
 * logits of about x's size), so that the scratch grows no faster than x;
 * but at least kDefaultFloorRows rows (GEMMs at full speed, few V x H
 * read-modify-writes of grad_W), and at most kDefaultChunkBytes (the
 * default before 1.3). Measured in bench/results/flce_default_budget_cpu.md. */
constexpr size_t kDefaultChunkBytes = size_t{1} << 30;
constexpr size_t kDefaultLogitsPerX = 4;
constexpr size_t kDefaultFloorRows = 512;
/* The default chunk buffers on the CPU (after 1.3.0): the 1.3.0 default
 * above, but where the in-place plan applies or no gradient is asked for,
 * at most kDefaultXMultiple x x's bytes or kDefaultMinChunkBytes, whichever
 * is larger. Small batches then take the
 * in-place plan (their logits in grad_weight's buffer: no chunk buffers)
 * or small chunks; large ones what they took. 16 x x's bytes left GPT-2
 * and SmolLM2 at 1024 tokens 5% slower than the whole logits block (one
 * token chunk after the kept rows), 32 x lets the kept rows take them all
 * (bench/results/flce_default_cpu.md). */
constexpr size_t kDefaultMinChunkBytes = size_t{8} << 20;
constexpr size_t kDefaultXMultiple = 32;
/* In-place plans: logits per slice (M x S fp32) of about kInPlaceTileBytes,
 * L2-sized, so that the row passes read what the GEMM just wrote from
 * cache (or x's kept rows' bytes, where larger); but at least
 * kInPlaceMinCols classes: each slice reads x in all
 * three GEMMs and reads and writes grad_x (M x H) once, traffic that
 * slices of S classes weigh against 6 M S H flops. */
constexpr size_t kInPlaceTileBytes = size_t{1} << 20;
constexpr int64_t kInPlaceMinCols = 1024;
/* Data the cost model takes to stay in the last-level cache between the
 * slices of one tile (x's rows and their grad_x): a part of a server CPU's
 * L3 (32 MiB on the Zen 4 the CPU plans were measured on). */
constexpr double kCachedBytes = 8.0 * (1 << 20);
/* Below this many rows per chunk the GEMMs run visibly slower (measured on
 * OpenBLAS; cuBLAS wants more). */
constexpr int64_t kEfficientRows = 128;
/* Hold plans with bf16 gradients stage the fp32 logits of at most this many
 * rows at a time: enough for full-speed GEMMs (1024 rows of 128x128 tiles
 * fill two waves of an H100's 132 SMs at H = 4096), and a quarter of the
 * held gradients' bytes at M = 8192. */
constexpr int64_t kHoldStageRows = 1024;

void check(osft_status_t status) {
  throw_if_error(status);
}

/* The tensor shapes every argument is checked against. */
struct Shapes {
  const DLTensor *x = nullptr;       /* (..., H) */
  const DLTensor *targets = nullptr; /* (...): the per-token shape */
  int64_t v = 0, h = 0;
  unsigned x_dtype = 0;
  bool per_token_loss = false; /* reduction NONE */
};

/* A compact tensor of exactly `shape` (rank n). */
void check_exact(Context &ctx, const DLTensor *t, const char *name, unsigned dtypes,
                 int n, const int64_t *shape) {
  osfti_tensor_spec sp{};
  sp.name = name;
  sp.dtypes = dtypes;
  sp.min_rank = sp.max_rank = sp.n_dims = n;
  for (int d = 0; d < n; ++d) sp.dims[d] = shape[d];
  sp.layout = OSFTI_LAYOUT_CONTIGUOUS;
  check(osfti_check_tensor(&ctx, t, &sp));
}

/* A tensor shaped like the targets (one value per token), compact. */
void check_per_token(Context &ctx, const DLTensor *t, const char *name, unsigned dtypes,
                     const Shapes &s) {
  check_exact(ctx, t, name, dtypes, s.targets->ndim, s.targets->shape);
}

/* One fp32 element: shape [] or [1]. */
void check_scalar(Context &ctx, const DLTensor *t, const char *name) {
  const int64_t one = 1;
  check_exact(ctx, t, name, OSFTI_F32, t != nullptr && t->ndim == 0 ? 0 : 1, &one);
}

/* The loss and the z-loss: a scalar, or per token for reduction NONE. */
void check_loss_like(Context &ctx, const DLTensor *t, const char *name, const Shapes &s) {
  if (s.per_token_loss)
    check_per_token(ctx, t, name, OSFTI_F32, s);
  else
    check_scalar(ctx, t, name);
}

/* x, weight and targets fix M, V, H and the dtype. */
Shapes check_required(Context &ctx, const osft_flce_inputs_t &in, bool per_token) {
  Shapes s;
  checked_rows(ctx, in.x, "in->x", kComputeDtypes, OSFTI_ANY);
  s.x = in.x;
  s.h = in.x->shape[in.x->ndim - 1];
  s.x_dtype = osfti_dtype_from_dl(in.x->dtype);
  s.per_token_loss = per_token;
  checked_matrix(ctx, in.weight, "in->weight", kComputeDtypes, OSFTI_ANY, s.h);
  check(osfti_check_same_dtype("in->x", in.x, "in->weight", in.weight));
  s.v = in.weight->shape[0];
  if (s.v < 1)
    raise(OSFT_STATUS_SHAPE_MISMATCH, "in->weight: shape [0, %lld] has no classes",
          static_cast<long long>(s.h));
  check_exact(ctx, in.targets, "in->targets", OSFTI_I32 | OSFTI_I64, in.x->ndim - 1,
              in.x->shape);
  s.targets = in.targets;
  return s;
}

void check_optional_inputs(Context &ctx, const osft_flce_inputs_t &in, const Shapes &s) {
  if (in.bias != nullptr)
    checked_vector(ctx, in.bias, "in->bias", OSFTI_F32 | s.x_dtype, s.v);
  if (in.class_weight != nullptr)
    checked_vector(ctx, in.class_weight, "in->class_weight", OSFTI_F32, s.v);
  if (in.grad_loss != nullptr) check_loss_like(ctx, in.grad_loss, "in->grad_loss", s);
}

void check_outputs(Context &ctx, const osft_flce_inputs_t &in,
                   const osft_flce_outputs_t &out, const Shapes &s) {
  if (out.loss != nullptr) check_loss_like(ctx, out.loss, "out->loss", s);
  if (out.grad_x != nullptr)
    checked_rows(ctx, out.grad_x, "out->grad_x", s.x_dtype, s.h, in.x, "in->x");
  if (out.grad_weight != nullptr)
    checked_matrix(ctx, out.grad_weight, "out->grad_weight", OSFTI_F32 | s.x_dtype, s.v,
                   s.h);
  if (out.grad_bias != nullptr)
    checked_vector(ctx, out.grad_bias, "out->grad_bias", OSFTI_F32 | s.x_dtype, s.v);
  if (out.z_loss != nullptr) check_loss_like(ctx, out.z_loss, "out->z_loss", s);
  if (out.accuracy != nullptr) check_scalar(ctx, out.accuracy, "out->accuracy");
  if (out.argmax != nullptr)
    check_per_token(ctx, out.argmax, "out->argmax", OSFTI_I32 | OSFTI_I64, s);
  if (out.token_loss != nullptr)
    check_per_token(ctx, out.token_loss, "out->token_loss", OSFTI_F32, s);
}

struct Named {
  const char *name;
  const DLTensor *t;
};

/* Outputs overlap neither an input nor each other. */
void check_disjoint(const osft_flce_inputs_t &in, const osft_flce_outputs_t &out) {
  const Named ins[6] = {{"in->x", in.x},
                        {"in->weight", in.weight},
                        {"in->targets", in.targets},
                        {"in->bias", in.bias},
                        {"in->class_weight", in.class_weight},
                        {"in->grad_loss", in.grad_loss}};
  const Named outs[8] = {{"out->loss", out.loss},
                         {"out->grad_x", out.grad_x},
                         {"out->grad_weight", out.grad_weight},
                         {"out->grad_bias", out.grad_bias},
                         {"out->z_loss", out.z_loss},
                         {"out->accuracy", out.accuracy},
                         {"out->argmax", out.argmax},
                         {"out->token_loss", out.token_loss}};
  for (int o = 0; o < 8; ++o) {
    if (outs[o].t == nullptr) continue;
    for (const Named &i : ins) check_no_overlap(i.name, i.t, outs[o].name, outs[o].t);
    for (int p = 0; p < o; ++p)
      check_no_overlap(outs[p].name, outs[p].t, outs[o].name, outs[o].t);
  }
}

/* Any checked tensor as a flat vector of all its elements. */
Vec flat(const DLTensor *t) {
  /* NULL data (an empty tensor) stays NULL: no arithmetic on a null pointer. */
  return Vec{t->data != nullptr ? static_cast<char *>(t->data) + t->byte_offset : nullptr,
             osfti_numel(t), osfti_dtype_from_dl(t->dtype)};
}

Vec optional_vec(const DLTensor *t) {
  return t != nullptr ? flat(t) : Vec{};
}

Mat optional_mat(const DLTensor *t) {
  return t != nullptr ? as_mat(t) : Mat{};
}

float beta_for(uint32_t accumulate, uint32_t bit) {
  return (accumulate & bit) != 0 ? 1.0f : 0.0f;
}

/* Without bf16 GEMMs (the CPU) bf16 x and W are widened to fp32 in scratch. */
bool widens(const Flce &f, const FlceCall &c) {
  return !flce_kernels(*f.ctx).bf16_gemm && c.x.dtype != OSFTI_F32;
}

/* The dtype of the gradient g the row pass writes: the GEMMs' operand dtype. */
osfti_dtype_t grad_dtype_of(const Flce &f, const FlceCall &c) {
  return flce_kernels(*f.ctx).bf16_gemm ? c.w.dtype : OSFTI_F32;
}

/* The totals and the per-token results: every plan has them. */
void add_token_slots(const FlceCall &c, ScratchPlan &p, FlceSlots &s) {
  static_assert(sizeof(FlceTotals) % sizeof(int64_t) == 0, "totals are 8-byte words");
  s.totals = p.add_mat(1, sizeof(FlceTotals) / sizeof(int64_t), OSFTI_I64);
  s.token_loss = p.add_mat(1, c.m, OSFTI_F32);
  s.token_z = p.add_mat(1, c.m, OSFTI_F32);
  s.token_argmax = p.add_mat(1, c.m, OSFTI_I64);
}

/* Adds every scratch buffer of a call with `rows` rows per chunk; the fp32
 * gradient accumulators only when `accumulators` (several chunks); with
 * `hold`, the gradients of all M rows (and x widened for all of them)
 * instead of the accumulators, and the logits chunk only where the
 * gradients are narrower than the fp32 logits. */
FlceSlots add_slots(const Flce &f, const FlceCall &c, int64_t rows, ScratchPlan &p,
                    bool accumulators, bool hold = false) {
  FlceSlots s;
  add_token_slots(c, p, s);
  const bool widen = widens(f, c);
  const bool fp32_acc =
      !hold && accumulators && f.opts.accumulator == OSFT_FLCE_ACCUMULATOR_FP32;
  if (widen) s.w32 = p.add_mat(c.v, c.h, OSFTI_F32);
  if (c.grad_w.data != nullptr && c.grad_w.dtype != OSFTI_F32 && fp32_acc)
    s.gw32 = p.add_mat(c.v, c.h, OSFTI_F32);
  if (c.grad_b.data != nullptr && c.grad_b.dtype != OSFTI_F32 && fp32_acc)
    s.gb32 = p.add_mat(1, c.v, OSFTI_F32);
  const int ranks = vocab_ranks(f);
  if (ranks > 1) {
    s.records = p.add_mat(rows, kFlceRecordWords, OSFTI_F32);
    s.gathered = p.add_mat(ranks * rows, kFlceRecordWords, OSFTI_F32);
  }
  const osfti_dtype_t gd = grad_dtype_of(f, c);
  if (hold) s.hold = p.add_mat(c.m, padded_vocab(c.v), gd);
  if (!hold || gd != OSFTI_F32) s.logits = p.add_mat(rows, padded_vocab(c.v), OSFTI_F32);
  if (widen) s.x32 = p.add_mat(hold ? c.m : rows, c.h, OSFTI_F32);
  return s;
}

/* Rows per chunk for at most `cap` rows: the caller's chunk_rows if it
 * fits, else as few chunks as fit, balanced, rounded up to a multiple of 64
 * rows (friendlier GEMM shapes) where that still fits. */
int64_t choose_rows(int64_t m, int64_t cap, int64_t wanted) {
  if (wanted > 0 && wanted <= cap) return std::min(wanted, m);
  cap = std::min(cap, m);
  const int64_t chunks = (m + cap - 1) / cap;
  int64_t rows = (m + chunks - 1) / chunks;
  const int64_t rounded = (rows + 63) / 64 * 64;
  if (rounded <= cap) rows = rounded;
  return std::min(rows, m);
}

}  // namespace

int vocab_ranks(const Flce &f) noexcept {
  return f.opts.comm != nullptr ? f.opts.comm->size : 1;
}

int64_t padded_vocab(int64_t v) noexcept {
  return (v + 15) / 16 * 16;
}

FlceCall check_call(const Flce &f, const osft_flce_inputs_t &in,
                    const osft_flce_outputs_t &out) {
  Context &ctx = *f.ctx;
  const Shapes s = check_required(ctx, in, f.opts.reduction == OSFT_FLCE_NONE);
  check_optional_inputs(ctx, in, s);
  check_outputs(ctx, in, out, s);
  const DLTensor *outs[8] = {out.loss,   out.grad_x,   out.grad_weight, out.grad_bias,
                             out.z_loss, out.accuracy, out.argmax,      out.token_loss};
  if (std::all_of(outs, outs + 8, [](const DLTensor *t) { return t == nullptr; }))
    raise(OSFT_STATUS_INVALID_ARGUMENT, "out: no output requested");
  check_disjoint(in, out);
  /* Multi-rank shard bounds are checked collectively (every rank fails
   * alike); a one-rank comm holds all of W. */
  if (f.opts.comm != nullptr && vocab_ranks(f) == 1 && f.opts.vocab_size_global != 0 &&
      f.opts.vocab_size_global != s.v)
    raise(OSFT_STATUS_SHAPE_MISMATCH,
          "opts->vocab_size_global: %lld, but the one-rank opts->comm's in->weight has "
          "%lld rows (the whole vocabulary)",
          static_cast<long long>(f.opts.vocab_size_global), static_cast<long long>(s.v));

  FlceCall c;
  c.x = as_mat(in.x);
  c.w = as_mat(in.weight);
  c.m = c.x.rows;
  c.v = s.v;
  c.h = s.h;
  c.targets =
      FlceTargets{flat(in.targets).data, c.m, osfti_dtype_from_dl(in.targets->dtype)};
  c.bias = optional_vec(in.bias);
  c.class_weight = optional_vec(in.class_weight);
  c.grad_x = optional_mat(out.grad_x);
  c.grad_w = optional_mat(out.grad_weight);
  c.grad_b = optional_vec(out.grad_bias);
  if (c.want_grad() && in.grad_loss != nullptr)
    c.grad_loss = static_cast<const float *>(flat(in.grad_loss).data);
  c.loss = optional_vec(out.loss);
  c.z_loss = optional_vec(out.z_loss);
  c.accuracy = optional_vec(out.accuracy);
  c.argmax = optional_vec(out.argmax);
  c.token_loss = optional_vec(out.token_loss);
  c.beta_x = beta_for(out.accumulate, OSFT_FLCE_ACCUMULATE_GRAD_X);
  c.beta_w = beta_for(out.accumulate, OSFT_FLCE_ACCUMULATE_GRAD_WEIGHT);
  c.beta_b = beta_for(out.accumulate, OSFT_FLCE_ACCUMULATE_GRAD_BIAS);
  return c;
}

namespace {

/* The fixed scratch of a call (every buffer but the chunk's), with each
 * chunk buffer's alignment slack. */
size_t fixed_bytes(const Flce &f, const FlceCall &c, bool accumulators) {
  ScratchPlan fixed_plan;
  add_slots(f, c, 0, fixed_plan, accumulators);
  return fixed_plan.bytes() + (vocab_ranks(f) > 1 ? 4 : 2) * ScratchPlan::alignment;
}

/* One chunk of all M rows needs no fp32 gradient accumulator: the backward
 * GEMM sums the M rows in fp32 and rounds once into grad_weight, as the
 * accumulator would (it too rounds once, at the end). Saves 4 V H bytes.
 * Not under vocab parallelism, where the ranks agree on the fewest rows and
 * may chunk after all. */
bool fits_one_chunk(const Flce &f, const FlceCall &c, size_t budget, size_t per_row) {
  if (c.m == 0 || vocab_ranks(f) > 1) return false;
  if (f.opts.chunk_rows != 0 && f.opts.chunk_rows < c.m) return false;
  const size_t fixed = fixed_bytes(f, c, false);
  return budget >= fixed && (budget - fixed) / static_cast<size_t>(c.m) >= per_row;
}

/* The scratch of one more row of a token chunk. */
size_t token_row_bytes(const Flce &f, const FlceCall &c) {
  const int ranks = vocab_ranks(f);
  return static_cast<size_t>(padded_vocab(c.v)) * sizeof(float) +
         (ranks > 1 ? (ranks + 1) * kFlceRecordWords * sizeof(float) : 0) +
         (widens(f, c) ? static_cast<size_t>(c.h) * sizeof(float) : 0);
}

/* The chunk buffers of the default budget: see kDefaultChunkBytes, and on
 * the CPU kDefaultMinChunkBytes. */
bool in_place_fits(const Flce &f, const FlceCall &c);

size_t default_chunk_bytes(const Flce &f, const FlceCall &c, size_t per_row) {
  const size_t m = static_cast<size_t>(c.m), h = static_cast<size_t>(c.h);
  const size_t by_x = kDefaultLogitsPerX * m * h * sizeof(float);
  const size_t floor = kDefaultFloorRows * per_row;
  const size_t former = std::min(kDefaultChunkBytes, std::max(by_x, floor));
  /* the cap where small scratch costs no time: the logits kept in
   * grad_weight, or a call without gradients (vocabulary slices, each
   * slice's logits computed once); not for a frozen head's grad_x alone
   * (GPT-2 at 256 tokens: 3 token chunks, 1.195x the whole block) nor an
   * accumulated or bf16 grad_weight, nor token chunks forced */
  if (on_cuda(*f.ctx) ||
      (c.want_grad() &&
       (!in_place_fits(f, c) || f.opts.chunking == OSFT_FLCE_CHUNKING_TOKENS)))
    return former;
  const size_t x_bytes = m * h * osfti_dtype_size(c.x.dtype);
  return std::min(former, std::max(kDefaultMinChunkBytes, kDefaultXMultiple * x_bytes));
}

/* The budget of a call: the handle's (default: the fixed scratch plus
 * default_chunk_bytes), capped by the context's workspace_limit. */
size_t call_budget(const Flce &f, const FlceCall &c, size_t fixed, const char **bound) {
  const Context &ctx = *f.ctx;
  *bound = "opts->memory_budget";
  size_t budget = f.opts.memory_budget != 0
                      ? f.opts.memory_budget
                      : fixed + default_chunk_bytes(f, c, token_row_bytes(f, c));
  if (ctx.workspace_limit != 0 && ctx.workspace_limit < budget) {
    budget = ctx.workspace_limit;
    *bound = "the context's workspace_limit";
  }
  return budget;
}

/* Rows per chunk within the budget, with the accumulators' fixed scratch;
 * false if not even one row fits. */
bool choose_chunks(const Flce &f, const FlceCall &c, size_t fixed, size_t per_row,
                   FlcePlan &plan) {
  if (plan.budget < fixed + (c.m > 0 ? per_row : 0)) return false;
  if (c.m == 0) return true;
  const int64_t cap = static_cast<int64_t>(
      std::min<size_t>((plan.budget - fixed) / per_row, static_cast<size_t>(c.m)));
  plan.chunk_rows = choose_rows(c.m, cap, f.opts.chunk_rows);
  plan.chunks = (c.m + plan.chunk_rows - 1) / plan.chunk_rows;
  return true;
}

/* A plan in several chunks sums grad_W per chunk into a V x H buffer (the
 * caller's fp32 gradient, the fp32 accumulator, or a bf16 gradient that a
 * CPU GEMM widens and narrows again), a read-modify-write of all of it per
 * chunk: that, not the GEMMs, is what makes small chunks slow. Holding every
 * chunk's gradient g instead (M x Vp in the GEMM dtype) lets one GEMM of K
 * = M rows write grad_W at the end, rounding once, and one reduction
 * grad_b. Adopted where it fits the budget and takes no more scratch than
 * the accumulator plan (`compare`; or where that plan does not fit at
 * all): e.g. bf16 on CUDA at M <= 2 H, where 2 M Vp bytes of held bf16
 * gradients replace the 4 V H bytes of the fp32 accumulator.
 * Single rank only (the ranks of vocab parallelism agree on their chunks). */
bool try_hold(const Flce &f, const FlceCall &c, FlcePlan &plan, bool compare) {
  if (vocab_ranks(f) > 1 || c.m == 0 || c.grad_w.data == nullptr) return false;
  ScratchPlan base;
  add_slots(f, c, 0, base, false, true);
  const size_t fixed = base.bytes() + 2 * ScratchPlan::alignment;
  if (plan.budget < fixed) return false;
  int64_t rows = c.m; /* fp32 gradients: the logits go straight into the hold */
  if (grad_dtype_of(f, c) != OSFTI_F32) {
    const size_t per_row = static_cast<size_t>(padded_vocab(c.v)) * sizeof(float);
    const int64_t cap = static_cast<int64_t>(
        std::min<size_t>((plan.budget - fixed) / per_row, static_cast<size_t>(c.m)));
    if (cap < 1) return false;
    rows = choose_rows(c.m, f.opts.chunk_rows > 0 ? cap : std::min(cap, kHoldStageRows),
                       f.opts.chunk_rows);
  } else if (f.opts.chunk_rows > 0) {
    rows = std::min(f.opts.chunk_rows, c.m);
  }
  ScratchPlan held;
  const FlceSlots slots = add_slots(f, c, rows, held, false, true);
  if (held.bytes() > plan.budget || (compare && held.bytes() > plan.scratch.bytes()))
    return false;
  plan.hold = true;
  plan.chunk_rows = rows;
  plan.chunks = (c.m + rows - 1) / rows;
  plan.scratch = held;
  plan.slots = slots;
  return true;
}

/* The token plan: one chunk, held gradients, or chunks summing grad_W;
 * false if not even one row fits the budget. */
bool plan_tokens(const Flce &f, const FlceCall &c, FlcePlan &plan) {
  const size_t fixed = fixed_bytes(f, c, true);
  const size_t per_row = token_row_bytes(f, c);
  if (fits_one_chunk(f, c, plan.budget, per_row)) {
    plan.chunk_rows = c.m;
    plan.chunks = 1;
    plan.slots = add_slots(f, c, plan.chunk_rows, plan.scratch, false);
  } else if (plan.budget < fixed + per_row && try_hold(f, c, plan, false)) {
    /* the accumulators do not fit, the held gradients do */
  } else {
    if (!choose_chunks(f, c, fixed, per_row, plan)) return false;
    plan.slots = add_slots(f, c, plan.chunk_rows, plan.scratch, true);
    try_hold(f, c, plan, true);
  }
  plan.slice_cols = c.v;
  return true;
}

/* ---- the vocabulary plan */

/* Scratch of a vocabulary plan: tiles of `rows` tokens x `cols` classes,
 * `sliced` when cols < V (grad_x is then summed over the slices), `chunked`
 * when the tokens run in several tiles (or may, under vocab parallelism:
 * the ranks take the fewest rows; grad_W is then summed over them). */
FlceSlots add_vocab_slots(const Flce &f, const FlceCall &c, int64_t rows, int64_t cols,
                          bool sliced, bool chunked, ScratchPlan &p) {
  FlceSlots s;
  add_token_slots(c, p, s);
  const bool widen = widens(f, c);
  const bool fp32_acc = f.opts.accumulator == OSFT_FLCE_ACCUMULATOR_FP32;
  if (widen) s.w32 = p.add_mat(cols, c.h, OSFTI_F32); /* W's slice, per use */
  if (chunked && fp32_acc && c.grad_w.data != nullptr && c.grad_w.dtype != OSFTI_F32)
    s.gw32 = p.add_mat(c.v, c.h, OSFTI_F32);
  if (chunked && fp32_acc && c.grad_b.data != nullptr && c.grad_b.dtype != OSFTI_F32)
    s.gb32 = p.add_mat(1, c.v, OSFTI_F32);
  if (sliced && fp32_acc && c.grad_x.data != nullptr && c.grad_x.dtype != OSFTI_F32)
    s.gx32 = p.add_mat(rows, c.h, OSFTI_F32);
  s.records = p.add_mat(2 * rows, kFlceRecordWords, OSFTI_F32);
  const int ranks = vocab_ranks(f);
  if (ranks > 1) s.gathered = p.add_mat(ranks * rows, kFlceRecordWords, OSFTI_F32);
  s.logits = p.add_mat(rows, padded_vocab(cols), OSFTI_F32);
  if (widen) s.x32 = p.add_mat(rows, c.h, OSFTI_F32);
  return s;
}

/* The widest slice (a multiple of 16 classes, or V) whose tiles of `rows`
 * tokens fit the budget; 0 if none does. */
int64_t widest_slice(const Flce &f, const FlceCall &c, int64_t rows, bool chunked,
                     size_t budget) {
  const auto bytes = [&](int64_t cols) {
    ScratchPlan p;
    add_vocab_slots(f, c, rows, cols, cols < c.v, chunked, p);
    return p.bytes();
  };
  if (bytes(c.v) <= budget) return c.v;
  const size_t fixed = bytes(0) + 2 * ScratchPlan::alignment;
  const size_t per16 =
      16 * (static_cast<size_t>(rows) * sizeof(float) +
            (widens(f, c) ? static_cast<size_t>(c.h) * sizeof(float) : 0));
  if (budget < fixed + per16) return 0;
  int64_t cols = static_cast<int64_t>((budget - fixed) / per16) * 16;
  while (cols > 0 && bytes(cols) > budget) cols -= 16; /* alignment slack */
  return std::min(cols, c.v);
}

/* Classes per slice: the caller's slice_cols if it fits, else as few slices
 * as fit, balanced, rounded up to 16 classes where that still fits. */
int64_t choose_cols(int64_t v, int64_t cap, int64_t wanted) {
  if (wanted > 0 && wanted <= cap) return std::min(wanted, v);
  const int64_t slices = (v + cap - 1) / cap;
  int64_t cols = (v + slices - 1) / slices;
  const int64_t rounded = (cols + 15) / 16 * 16;
  if (rounded <= cap) cols = rounded;
  return std::min(cols, v);
}

/* The cost model: a plan's time in flop-equivalents, every GEMM its flops
 * plus the bytes it moves times the backend's flops per byte, every other
 * pass its bytes alike. It assumes no overlap of the two, so it ranks plans
 * (their GEMM shapes, and the traffic of small chunks: W read per chunk, a
 * V x H read-modify-write per chunk, grad_x per slice) rather than predict
 * times. */
class Cost {
 public:
  Cost(const Flce &f, const FlceCall &c)
      : balance_(flce_kernels(*f.ctx).flops_per_byte),
        m_(static_cast<double>(c.m)),
        v_(static_cast<double>(c.v)),
        h_(static_cast<double>(c.h)) {
    const bool bf16_ops = flce_kernels(*f.ctx).bf16_gemm && c.x.dtype == OSFTI_BF16;
    op_ = bf16_ops ? 2.0 : 4.0;
    g_ = grad_dtype_of(f, c) == OSFTI_F32 ? 4.0 : 2.0;
    gx_ = c.grad_x.data == nullptr ? 0.0 : c.grad_x.dtype == OSFTI_F32 ? 4.0 : 2.0;
    /* a bf16 C the GEMM cannot write (no bf16 GEMMs) is widened and narrowed */
    gw_ = c.grad_w.data == nullptr                                         ? 0.0
          : c.grad_w.dtype == OSFTI_F32 || !flce_kernels(*f.ctx).bf16_gemm ? 4.0
                                                                           : 2.0;
    widen_ = widens(f, c);
    gemms_ = 1 + (gx_ > 0.0 ? 1 : 0) + (gw_ > 0.0 ? 1 : 0);
    beta_x_ = c.beta_x != 0.0f;
    beta_w_ = c.beta_w != 0.0f;
  }

  /* Reads and writes of C per GEMM over `n` GEMMs summing into it: the
   * first reads it only when accumulating onto the caller's values. */
  static double rmw(double n, bool beta) { return beta ? 2.0 : 2.0 - 1.0 / n; }

  /* `count` GEMMs of m x n x k moving `bytes` each */
  void gemm(double count, double m, double n, double k, double bytes) {
    t_ += count * (2.0 * m * n * k + balance_ * bytes);
  }
  void pass(double count, double bytes) { t_ += count * balance_ * bytes; }
  double over_floor() const { return t_ / (gemms_ * 2.0 * m_ * v_ * h_); }

  /* A token plan of `chunks` chunks, holding g or summing grad_W per chunk. */
  double tokens(const FlcePlan &p, bool want_grad, bool acc_in_scratch) {
    const double n = static_cast<double>(p.chunks), r = m_ / n, m = m_, v = v_, h = h_;
    if (widen_) pass(1, v * h * 6 + m * h * 6);
    gemm(n, r, v, h, (r * h + v * h) * op_ + r * v * 4);
    pass(n, r * v * (want_grad ? 8 + g_ : 4));
    if (gx_ > 0.0)
      gemm(n, r, h, v, r * v * g_ + v * h * op_ + r * h * gx_ * rmw(1, beta_x_));
    const double c_w = v * h * gw_;
    if (gw_ > 0.0 && p.hold)
      gemm(1, v, h, m, m * v * g_ + m * h * op_ + c_w * rmw(1, beta_w_));
    if (gw_ > 0.0 && !p.hold)
      gemm(n, v, h, r, r * v * g_ + r * h * op_ + c_w * rmw(n, beta_w_));
    if (acc_in_scratch) pass(1, v * h * 6);
    return over_floor();
  }

  /* The in-place plan: one tile of the kept rows (in grad_weight and in
   * scratch) over slices of w classes, each slice's logits computed once;
   * grad_x summed over the slices, grad_W written once (the scratch rows'
   * share added while the slice's rows are still in cache); then the
   * other rows in token chunks summing into grad_W. */
  double in_place(const FlcePlan &p) {
    const double ns = static_cast<double>(p.kept_slices);
    const double k = static_cast<double>(p.kept_rows + p.extra_rows);
    const double w = v_ / ns, v = v_, h = h_;
    const double parts = p.extra_rows > 0 ? 2.0 : 1.0; /* GEMMs per slice and kind */
    /* x's kept rows and their grad_x, read (and written) by every slice,
     * come from memory once where they fit the last-level cache */
    const double xs = k * h * 4 <= kCachedBytes ? 1.0 / ns : 1.0;
    gemm(ns, k, w, h, (xs * k * h + parts * w * h) * op_ + k * w * 4);
    pass(ns, k * w * 4);        /* the records pass */
    pass(ns, k * w * (4 + g_)); /* the gradient pass */
    if (gx_ > 0.0)
      gemm(ns, k, h, w,
           k * w * g_ + parts * w * h * op_ + xs * k * h * gx_ * rmw(ns, beta_x_));
    gemm(ns, w, h, k, k * w * g_ + xs * k * h * op_ + w * h * gw_);
    if (p.rest_rows > 0) {
      const double n = static_cast<double>(p.chunks - 1), r = (m_ - k) / n;
      gemm(n, r, v, h, (r * h + v * h) * op_ + r * v * 4);
      pass(n, r * v * (8 + g_));
      if (gx_ > 0.0)
        gemm(n, r, h, v, r * v * g_ + v * h * op_ + r * h * gx_ * rmw(1, beta_x_));
      gemm(n, v, h, r, r * v * g_ + r * h * op_ + v * h * gw_ * 2.0);
    }
    return over_floor();
  }

  /* A vocabulary plan: tiles of r rows x w classes; the last slice of pass
   * 1 stays in the buffer for pass 2 (one logits GEMM less per chunk). */
  double vocab(const FlcePlan &p, bool want_grad) {
    const double nt = static_cast<double>(p.chunks), ns = static_cast<double>(p.slices);
    const double r = m_ / nt, w = v_ / ns, h = h_, tiles = nt * ns;
    const double logits = want_grad ? 2 * tiles - nt : tiles;
    gemm(logits, r, w, h, (r * h + w * h) * op_ + r * w * 4);
    if (widen_) pass(1, logits * w * h * 6 + m_ * h * 6);
    pass(tiles, r * w * 4); /* the records pass */
    if (!want_grad) return over_floor();
    pass(tiles, r * w * (4 + g_));
    const double gx_acc = p.slots.gx32 >= 0 ? 4.0 : gx_;
    if (gx_ > 0.0)
      gemm(tiles, r, h, w, r * w * g_ + w * h * op_ + r * h * gx_acc * rmw(ns, beta_x_));
    if (p.slots.gx32 >= 0) pass(nt, r * h * 6);
    if (gw_ > 0.0)
      gemm(tiles, w, h, r, r * w * g_ + r * h * op_ + w * h * gw_ * rmw(nt, beta_w_));
    return over_floor();
  }

 private:
  double balance_, m_, v_, h_;
  double op_ = 4, g_ = 4, gx_ = 0, gw_ = 0;
  bool widen_ = false;
  int gemms_ = 3;
  bool beta_x_ = false, beta_w_ = false;
  double t_ = 0.0;
};

/* ---- the in-place plan (FlcePlan::in_place) */

/* The most token rows whose fp32 logits (Vp floats each) fit in
 * grad_weight's V x H floats. */
int64_t kept_capacity(const FlceCall &c) {
  return c.v * c.h / padded_vocab(c.v);
}

/* Whether a call can keep logits in grad_weight's buffer: one rank on the
 * CPU; grad_weight requested, overwritten (not accumulated), fp32 and
 * compact, as are the logits and the gradient (no widening); no caller's
 * chunk_rows below M; a caller's slice_cols in whole rows of 16 classes
 * (the kept tiles lie one after another, Sp apart). */
bool in_place_fits(const Flce &f, const FlceCall &c) {
  const Mat &gw = c.grad_w;
  if (on_cuda(*f.ctx) || vocab_ranks(f) > 1 || c.m == 0 || gw.data == nullptr ||
      c.beta_w != 0.0f || gw.dtype != OSFTI_F32 || gw.ld != c.h || widens(f, c) ||
      grad_dtype_of(f, c) != OSFTI_F32 || kept_capacity(c) < 1)
    return false;
  if (f.opts.chunk_rows > 0 && f.opts.chunk_rows < c.m) return false;
  return f.opts.slice_cols == 0 || f.opts.slice_cols % 16 == 0 ||
         f.opts.slice_cols >= c.v;
}

/* Scratch of an in-place plan: the token results, the row records of the
 * M rows at most (running and a slice's), the stage of a slice's gradient
 * (`kept` x `cols` classes), and `rows` rows of fp32 logits (0: none): the
 * extra kept rows' tiles, then the token chunks'. */
FlceSlots add_in_place_slots(const FlceCall &c, int64_t kept, int64_t cols, int64_t rows,
                             ScratchPlan &p) {
  FlceSlots s;
  add_token_slots(c, p, s);
  s.records = p.add_mat(2 * c.m, kFlceRecordWords, OSFTI_F32);
  s.tile_grad = p.add_mat(kept, padded_vocab(cols), OSFTI_F32);
  if (rows > 0) s.logits = p.add_mat(rows, padded_vocab(c.v), OSFTI_F32);
  return s;
}

/* The in-place plan within the budget: the first R = min(M, capacity) rows
 * kept in grad_weight, in slices of about kInPlaceTileBytes of logits (the
 * caller's slice_cols if set; narrower where the budget asks), as many
 * more kept in scratch as the budget holds, the rest in token chunks of as
 * many rows; false where the call does not qualify or nothing fits. */
bool plan_in_place(const Flce &f, const FlceCall &c, FlcePlan &plan) {
  if (!in_place_fits(f, c)) return false;
  const int64_t kept = std::min(c.m, kept_capacity(c)), more = c.m - kept;
  const auto bytes = [&](int64_t cols, int64_t rows) {
    ScratchPlan p;
    add_in_place_slots(c, kept, cols, rows, p);
    return p.bytes();
  };
  const bool callers = f.opts.slice_cols > 0;
  int64_t cols = 0;
  if (callers) {
    cols = std::min(f.opts.slice_cols, c.v);
  } else {
    /* slices of logits as large as x's kept rows at least: each slice
     * re-reads them (measured: Llama-3 at 256 tokens, x 4 MiB, 1.036x the
     * whole block in slices of 1024 classes, 1.020x in slices of 4096) */
    const size_t x_bytes = sizeof(float) * static_cast<size_t>(kept * c.h);
    const int64_t tile = static_cast<int64_t>(std::max(kInPlaceTileBytes, x_bytes) /
                                              (sizeof(float) * kept));
    const int64_t wanted = std::max<int64_t>(kInPlaceMinCols, (tile + 15) / 16 * 16);
    cols = choose_cols(c.v, std::min(wanted, c.v), 0);
    if (cols < c.v) cols = (cols + 15) / 16 * 16; /* whole rows of 16 classes */
  }
  /* the stage and one row of logits at least, narrower slices if need be */
  while (bytes(cols, more > 0 ? 1 : 0) > plan.budget) {
    if (callers || cols <= 16) return false;
    cols = std::max<int64_t>(16, (cols / 2 + 15) / 16 * 16);
  }
  int64_t rows = 0; /* of scratch logits: the extra kept rows, then chunks */
  if (more > 0) {
    const size_t fixed = bytes(cols, 0) + 2 * ScratchPlan::alignment;
    const int64_t cap = static_cast<int64_t>(std::min<size_t>(
        (plan.budget - fixed) / token_row_bytes(f, c), static_cast<size_t>(more)));
    rows = std::max<int64_t>(cap, 1);
    while (rows > 1 && bytes(cols, rows) > plan.budget) --rows;
  }
  FlcePlan p;
  p.budget = plan.budget;
  p.in_place = true;
  p.kept_rows = kept;
  p.extra_rows = rows;
  p.kept_cols = cols;
  p.kept_slices = (c.v + cols - 1) / cols;
  const int64_t rest = more - rows;
  if (rest == 0) { /* one tile of all M rows: a vocabulary plan */
    p.vocab = true;
    p.chunk_rows = c.m;
    p.chunks = 1;
    p.slice_cols = cols;
    p.slices = p.kept_slices;
  } else {
    p.rest_rows = choose_rows(rest, rows, 0);
    p.chunks = 1 + (rest + p.rest_rows - 1) / p.rest_rows;
    p.chunk_rows = kept + rows;
    p.slice_cols = c.v;
    p.slices = 1;
  }
  p.slots = add_in_place_slots(c, kept, cols, rows, p.scratch);
  p.cost = Cost(f, c).in_place(p);
  plan = p;
  return true;
}

/* The cheapest vocabulary plan by the cost model over token tiles of M,
 * M / 2, M / 4, ... rows (the caller's chunk_rows only, if set); false if
 * none fits. `least` gets the smallest scratch any tile would take. */
bool plan_vocab(const Flce &f, const FlceCall &c, FlcePlan &plan, size_t *least) {
  *least = SIZE_MAX;
  const int ranks = vocab_ranks(f);
  bool found = false;
  const int64_t m = std::max<int64_t>(c.m, 1);
  /* the caller's chunk_rows: the first of them that fits */
  int64_t rows = f.opts.chunk_rows > 0 ? std::min(f.opts.chunk_rows, m) : m;
  for (;;) {
    const int64_t chunks = (c.m + rows - 1) / rows;
    const bool chunked = chunks > 1 || ranks > 1;
    ScratchPlan smallest;
    add_vocab_slots(f, c, rows, std::min<int64_t>(c.v, 16), c.v > 16, chunked, smallest);
    *least = std::min(*least, smallest.bytes());
    const int64_t cap = widest_slice(f, c, rows, chunked, plan.budget);
    if (cap > 0) {
      FlcePlan p;
      p.budget = plan.budget;
      p.vocab = true;
      p.chunk_rows = c.m > 0 ? rows : 0;
      p.chunks = chunks;
      p.slice_cols = choose_cols(c.v, cap, f.opts.slice_cols);
      p.slices = (c.v + p.slice_cols - 1) / p.slice_cols;
      p.slots =
          add_vocab_slots(f, c, rows, p.slice_cols, p.slices > 1, chunked, p.scratch);
      p.cost = c.m > 0 ? Cost(f, c).vocab(p, c.want_grad()) : 0.0;
      if (!found || p.cost < plan.cost) plan = p;
      found = true;
    }
    if ((found && f.opts.chunk_rows > 0) || rows == 1) break;
    rows = (rows + 1) / 2;
  }
  return found;
}

}  // namespace

FlcePlan plan_call(const Flce &f, const FlceCall &c) {
  FlcePlan tokens, vocab, in_place;
  const char *bound = nullptr;
  tokens.budget = vocab.budget = in_place.budget =
      call_budget(f, c, fixed_bytes(f, c, true), &bound);
  const osft_flce_chunking_t want = f.opts.chunking;
  const bool have_tokens = want != OSFT_FLCE_CHUNKING_VOCAB && plan_tokens(f, c, tokens);
  size_t least = SIZE_MAX;
  const bool have_vocab =
      want != OSFT_FLCE_CHUNKING_TOKENS && plan_vocab(f, c, vocab, &least);
  /* the in-place plan, where the call qualifies, is a vocabulary plan too */
  bool have_in_place = want != OSFT_FLCE_CHUNKING_TOKENS && plan_in_place(f, c, in_place);
  /* asked for vocabulary slices: only a kept tile of all M rows is one */
  if (want == OSFT_FLCE_CHUNKING_VOCAB && !in_place.vocab) have_in_place = false;
  if (have_tokens && c.m > 0)
    tokens.cost = Cost(f, c).tokens(tokens, c.want_grad(),
                                    tokens.slots.gw32 >= 0 || tokens.slots.gb32 >= 0);
  if (!have_tokens && !have_vocab && !have_in_place) {
    if (want == OSFT_FLCE_CHUNKING_TOKENS) {
      const size_t fixed = fixed_bytes(f, c, true), per_row = token_row_bytes(f, c);
      raise(OSFT_STATUS_OUT_OF_MEMORY,
            "%s: %zu bytes; this call needs at least %zu (%zu fixed + %zu per chunk row)",
            bound, tokens.budget, fixed + per_row, fixed, per_row);
    }
    raise(OSFT_STATUS_OUT_OF_MEMORY,
          "%s: %zu bytes; this call needs at least %zu (the smallest tile of the "
          "vocabulary plan)",
          bound, vocab.budget, least);
  }
  /* ties (e.g. one chunk either way) go to the token plan before the
   * two-pass vocabulary plan, */
  const FlcePlan *best = have_tokens ? &tokens : nullptr;
  if (have_vocab && (best == nullptr || vocab.cost < 0.98 * best->cost)) best = &vocab;
  /* and to the in-place plan where the model finds it 1% cheaper; under
   * the default budget, where the other plan takes more than
   * kDefaultMinChunkBytes, unless it finds it 1% costlier: it takes the
   * least scratch (Llama-3's V = 128256 at 256 tokens: 1 MiB against the
   * 125 MiB block at a tie), and the model rather underrates what each
   * token chunk's passes over V x H cost (bench/results/flce_default_cpu.md) */
  const bool lean = f.opts.memory_budget == 0 && best != nullptr &&
                    best->scratch.bytes() > kDefaultMinChunkBytes;
  const double margin = lean ? 1.01 : 0.99;
  if (have_in_place && (best == nullptr || in_place.cost < margin * best->cost ||
                        (best == &vocab && in_place.cost <= vocab.cost)))
    best = &in_place; /* (the two-pass plan's tie: the in-place one takes less) */
  const FlcePlan plan = *best;
  if (!plan.vocab && plan.chunk_rows < std::min<int64_t>(c.m, kEfficientRows) &&
      !plan.hold)
    log_message(OSFT_LOG_WARN,
                "flce: %s of %zu bytes allows only %lld rows per chunk; GEMMs lose "
                "efficiency below about %lld rows",
                bound, plan.budget, static_cast<long long>(plan.chunk_rows),
                static_cast<long long>(kEfficientRows));
  char slices[224] = "";
  if (plan.vocab)
    std::snprintf(
        slices, sizeof slices, " x %lld slice(s) of %lld classes (vocabulary%s)",
        static_cast<long long>(plan.slices), static_cast<long long>(plan.slice_cols),
        plan.in_place ? ", logits kept in grad_weight" : "");
  else if (plan.in_place)
    std::snprintf(
        slices, sizeof slices,
        " (the first %lld + %lld rows in %lld slice(s) of %lld classes, logits kept "
        "in grad_weight + scratch)",
        static_cast<long long>(plan.kept_rows), static_cast<long long>(plan.extra_rows),
        static_cast<long long>(plan.kept_slices), static_cast<long long>(plan.kept_cols));
  log_message(OSFT_LOG_DEBUG,
              "flce: M = %lld, V = %lld, H = %lld: %lld chunk(s) of %lld rows%s%s, %zu "
              "bytes of scratch (bound %zu); model %.3f x the GEMMs (tokens %.3f, "
              "vocabulary %.3f, in place %.3f)",
              static_cast<long long>(c.m), static_cast<long long>(c.v),
              static_cast<long long>(c.h), static_cast<long long>(plan.chunks),
              static_cast<long long>(plan.chunk_rows),
              plan.hold ? ", gradients held for one grad_W GEMM" : "", slices,
              plan.scratch.bytes(), plan.budget, plan.cost,
              have_tokens ? tokens.cost : -1.0, have_vocab ? vocab.cost : -1.0,
              have_in_place ? in_place.cost : -1.0);
  return plan;
}

}  // namespace osft
