/* Fused linear cross-entropy: the chunked computation. Per chunk of tokens:
 * logits = x_c W^T into the reused scratch buffer (GEMM), the row pass
 * (statistics and the gradient in place), grad_x_c = g W, grad_W += g^T x_c
 * and grad_b += column sums of g (GEMM / reduce accumulating themselves).
 * The vocabulary plan runs each chunk over slices of W twice: the row
 * records of every slice merged, then per slice the logits again, the
 * gradient from the merged records, grad_x_c += g W_s, grad_W_s (+)= g^T x_c.
 * Nothing the caller passed is written before the targets have been
 * checked. */
#include <algorithm>
#include <cstdio>
#include <optional>
#include <vector>

#include "comm/communicator.h"
#include "core/error.h"
#include "core/logging.h"
#include "ops/flce_ops.h"

namespace osft {
namespace {

FlceLoss loss_params(const Flce &f, int64_t v) {
  const osft_flce_options_t &o = f.opts;
  FlceLoss p;
  p.vocab = v;
  const bool sharded = vocab_ranks(f) > 1;
  p.vocab_offset = sharded ? o.vocab_offset : 0;
  p.vocab_global = sharded ? o.vocab_size_global : v;
  p.ignore_index = o.ignore_index;
  p.smoothing = static_cast<float>(o.label_smoothing);
  p.eps = static_cast<float>(o.label_smoothing / static_cast<double>(p.vocab_global));
  p.z_scale = static_cast<float>(o.z_loss_scale);
  p.softcap = static_cast<float>(o.softcap);
  p.mean = o.reduction == OSFT_FLCE_MEAN;
  p.per_token = o.reduction == OSFT_FLCE_NONE;
  return p;
}

/* What each rank contributes to the call's totals, and what every rank
 * must agree on so that all make the same collectives (vocab parallelism). */
struct RankTotals {
  double weight_sum, denominator;
  int64_t first_bad, bad_value, offset, rows, global, m, h, chunk_rows;
  int64_t grad_x_dtype; /* -1: no grad_x */
  int64_t grad_x_compact;
};

/* Classes [first, first + cols) of this rank's shard. */
struct Slice {
  int64_t first = 0, cols = 0;
};

/* The records a row pass writes (out: the records phase, merge) and reads
 * (in: `ranks` blocks, the finish phase and merge). */
struct Records {
  float *out = nullptr;
  const float *in = nullptr;
  int ranks = 1;
};

/* Where a gradient is summed over the chunks: the caller's tensor, or an
 * fp32 scratch accumulator cast into it at the end. */
struct Accumulator {
  Mat target;        /* the caller's gradient */
  Mat acc;           /* what the GEMM / reduce writes */
  float beta = 0.0f; /* for the next chunk */
  bool in_scratch() const noexcept { return acc.data != target.data; }
};

class Run {
 public:
  Run(Flce &f, const FlceCall &call, const FlcePlan &plan)
      : f_(f),
        ctx_(*f.ctx),
        be_(backend(ctx_)),
        k_(flce_kernels(ctx_)),
        call_(call),
        plan_(plan),
        loss_(loss_params(f, call.v)),
        comm_(vocab_ranks(f) > 1 ? f.opts.comm : nullptr),
        chunk_rows_(plan.chunk_rows) {}

  void run() {
    counts_.allocations = 1; /* compute() took the plan's scratch */
    totals_ = static_cast<FlceTotals *>(mat(plan_.slots.totals).data);
    tokens_.loss = static_cast<float *>(mat(plan_.slots.token_loss).data);
    tokens_.z = static_cast<float *>(mat(plan_.slots.token_z).data);
    tokens_.argmax = static_cast<int64_t *>(mat(plan_.slots.token_argmax).data);
    check_targets(); /* the last check: outputs are written from here on */
    start_gradients();
    /* W for the logits GEMMs, packed once (oneMKL bf16, within the plan's
     * budget): 37-44% off that GEMM at V = 32000, H = 512 even for one chunk
     * (2 Emerald Rapids cores). Not for grad_x = g W (K = V: no gain). */
    const size_t used = plan_.scratch.bytes();
    if (!plan_.vocab) /* a vocabulary plan uses the whole budget for its tiles */
      logits_w_.emplace(ctx_, Op::T, weight_, chunk_rows_,
                        plan_.budget > used ? plan_.budget - used : 0);
    int64_t first = 0, step = chunk_rows_;
    if (plan_.in_place) { /* the kept tile, then token chunks of rest_rows */
      in_place_tile();
      ++counts_.chunks;
      first = plan_.kept_rows + plan_.extra_rows;
      step = plan_.rest_rows;
    }
    for (; first < call_.m; first += step) {
      const int64_t rows = std::min(step, call_.m - first);
      if (plan_.vocab)
        vocab_chunk(first, rows);
      else
        chunk(first, rows);
      ++counts_.chunks;
    }
    logits_w_.reset();
    finish_gradients();
    reduce_grad_x();
    finalize();
    log_counts();
  }

 private:
  Mat mat(int slot) const { return plan_.scratch.mat(slot); }

  /* ---- every backend call goes through these, counted */

  /* The elements of a V x H buffer (W, its fp32 copy, grad_W, its fp32
   * accumulator) that m covers: all of them, or a vocabulary slice's rows;
   * 0 for any other buffer. */
  int64_t vh_elems(const Mat &m) const noexcept {
    if (m.cols != call_.h || m.data == nullptr) return 0;
    /* a vocabulary plan's fp32 copy of W holds one slice (and is not counted) */
    const Mat bufs[4] = {
        call_.w, call_.grad_w, gw_.acc,
        plan_.slots.w32 >= 0 && !plan_.vocab ? mat(plan_.slots.w32) : Mat{}};
    const auto *p = static_cast<const char *>(m.data);
    for (const Mat &b : bufs) {
      const auto *lo = static_cast<const char *>(b.data);
      if (lo != nullptr && p >= lo &&
          p < lo + b.rows * b.ld * static_cast<int64_t>(osfti_dtype_size(b.dtype)))
        return m.rows * m.cols;
    }
    return 0;
  }

  void copy(const Mat &src, const Mat &dst) {
    be_.scale_into(ctx_, Axis::cols, src, nullptr, 0.0f, dst);
    ++counts_.calls;
    if (src.dtype != dst.dtype) {
      ++counts_.conversions;
      counts_.converted += src.rows * src.cols;
    }
    vh_elems_ += vh_elems(src) + vh_elems(dst); /* read one, write the other */
  }

  /* packed: b packed for op_b, or nullptr */
  void gemm(Op op_a, const Mat &a, Op op_b, const Mat &b, float beta, const Mat &c,
            const PackedB *packed = nullptr) {
    gemm_with_packed(ctx_, packed, op_a, a, op_b, b, 1.0f, beta, c);
    ++counts_.calls;
    const int64_t passes = beta != 0.0f ? 2 : 1; /* read-modify-write, or write */
    /* Without bf16 GEMMs (the CPU) a bf16 C is widened (when read) and
     * narrowed again by the GEMM itself. */
    if (!k_.bf16_gemm && c.dtype != OSFTI_F32) {
      counts_.conversions += passes;
      counts_.converted += passes * c.rows * c.cols;
    }
    vh_elems_ += passes * vh_elems(c);
  }

  void reduce_cols(const Mat &g, float beta, const Vec &y) {
    be_.reduce(ctx_, Axis::cols, g, nullptr, beta, y);
    ++counts_.calls;
  }

  void log_counts() {
    if (!log_enabled(OSFT_LOG_DEBUG)) return;
    /* whole passes: the slices of a sweep add up to one */
    const int64_t vh = call_.v * call_.h;
    counts_.vh_passes = vh > 0 ? (vh_elems_ + vh / 2) / vh : 0;
    char kind[64] = "";
    if (plan_.hold) std::snprintf(kind, sizeof kind, " (held)");
    if (plan_.vocab)
      std::snprintf(kind, sizeof kind, " x %lld vocabulary slices%s",
                    static_cast<long long>(plan_.slices),
                    plan_.in_place ? " (logits kept in grad_weight)" : "");
    else if (plan_.in_place)
      std::snprintf(kind, sizeof kind, " (the first: %lld rows, logits kept)",
                    static_cast<long long>(plan_.kept_rows + plan_.extra_rows));
    log_message(OSFT_LOG_DEBUG,
                "flce: counts: %lld chunk(s)%s: %lld calls, %lld conversions (%lld "
                "elements), %lld V x H passes, %lld host waits, %lld allocations",
                static_cast<long long>(counts_.chunks), kind,
                static_cast<long long>(counts_.calls),
                static_cast<long long>(counts_.conversions),
                static_cast<long long>(counts_.converted),
                static_cast<long long>(counts_.vh_passes),
                static_cast<long long>(counts_.host_waits),
                static_cast<long long>(counts_.allocations));
  }

  void check_targets() {
    FlcePrepare a;
    a.loss = loss_;
    a.targets = call_.targets;
    a.class_weight = call_.class_weight;
    a.totals = totals_;
    /* device_target_check (one rank): the check stays on the device and in
     * the handle's sticky record; nothing waits, nothing fails here. */
    const bool on_device = f_.target_record != nullptr && comm_ == nullptr;
    if (on_device) {
      a.wait = false;
      a.record = f_.target_record;
      a.call = ++f_.calls;
    }
    FlceTotals t = k_.prepare(ctx_, a);
    ++counts_.calls;
    if (a.wait) ++counts_.host_waits; /* CUDA: the totals come back to the host */
    if (comm_ != nullptr) t = combine_totals(t);
    if (!on_device && t.first_bad >= 0)
      raise(OSFT_STATUS_INDEX_OUT_OF_RANGE,
            "in->targets: token %lld has target %lld, outside [0, %lld) and not the "
            "ignore_index %lld",
            static_cast<long long>(t.first_bad), static_cast<long long>(t.bad_value),
            static_cast<long long>(loss_.vocab_global),
            static_cast<long long>(loss_.ignore_index));
  }

  /* Vocab parallelism: one exchange of every rank's partial totals and
   * shapes (exact bytes; every rank sums them in rank order, so all get the
   * same values and fail alike): the shards must tile [0, V), the ranks
   * agree on what decides their collectives, and chunk with the fewest rows
   * any rank's budget allows. The combined totals go back to the kernels. */
  FlceTotals combine_totals(FlceTotals t) {
    const Mat &gx = call_.grad_x;
    const RankTotals mine{t.weight_sum,
                          t.denominator,
                          t.first_bad,
                          t.bad_value,
                          loss_.vocab_offset,
                          call_.v,
                          loss_.vocab_global,
                          call_.m,
                          call_.h,
                          plan_.chunk_rows,
                          gx.data != nullptr ? static_cast<int64_t>(gx.dtype) : -1,
                          gx.data != nullptr && gx.ld == gx.cols ? 1 : 0};
    std::vector<RankTotals> all(static_cast<size_t>(comm_->size));
    comm_exchange_host(*comm_, &mine, sizeof mine, all.data());
    ++counts_.host_waits;
    check_agreement(all);
    check_shards(all);
    /* t.valid stays this rank's: it counts every token (targets are
     * replicated), so it is already the global count */
    t.weight_sum = t.denominator = 0.0;
    for (const RankTotals &r : all) {
      t.weight_sum += r.weight_sum;
      t.denominator += r.denominator;
      chunk_rows_ = std::min(chunk_rows_, r.chunk_rows);
      grad_x_compact_ = grad_x_compact_ && r.grad_x_compact != 0;
    }
    copy_from_host(ctx_, totals_, &t, sizeof t);
    ++counts_.calls;
    return t;
  }

  /* What decides the collectives (and V) must match rank 0's. */
  static void check_agreement(const std::vector<RankTotals> &all) {
    const RankTotals &r0 = all[0];
    for (size_t p = 1; p < all.size(); ++p) {
      const RankTotals &r = all[p];
      if (r.global != r0.global)
        raise(OSFT_STATUS_SHAPE_MISMATCH,
              "opts->vocab_size_global: %lld on rank %zu, %lld on rank 0",
              static_cast<long long>(r.global), p, static_cast<long long>(r0.global));
      if (r.m != r0.m || r.h != r0.h)
        raise(OSFT_STATUS_SHAPE_MISMATCH,
              "in->x: %lld x %lld on rank %zu, %lld x %lld on rank 0 (x is replicated)",
              static_cast<long long>(r.m), static_cast<long long>(r.h), p,
              static_cast<long long>(r0.m), static_cast<long long>(r0.h));
      if (r.grad_x_dtype != r0.grad_x_dtype)
        raise(OSFT_STATUS_INVALID_ARGUMENT,
              "out->grad_x: requested or typed differently on rank %zu and rank 0", p);
    }
  }

  /* The shards must tile [0, V): each inside it, none overlapping, all
   * rows accounted for. */
  static void check_shards(const std::vector<RankTotals> &all) {
    int64_t covered = 0;
    const int64_t global = all[0].global;
    for (const RankTotals &r : all) {
      covered += r.rows;
      if (r.offset + r.rows > global)
        raise(OSFT_STATUS_SHAPE_MISMATCH,
              "in->weight: %lld rows from opts->vocab_offset %lld exceed "
              "opts->vocab_size_global %lld",
              static_cast<long long>(r.rows), static_cast<long long>(r.offset),
              static_cast<long long>(global));
      for (const RankTotals &q : all)
        if (&q != &r && q.offset < r.offset + r.rows && r.offset < q.offset + q.rows)
          raise(OSFT_STATUS_SHAPE_MISMATCH,
                "in->weight: the shards at opts->vocab_offset %lld (%lld rows) and %lld "
                "(%lld rows) overlap",
                static_cast<long long>(r.offset), static_cast<long long>(r.rows),
                static_cast<long long>(q.offset), static_cast<long long>(q.rows));
    }
    if (covered != global)
      raise(OSFT_STATUS_SHAPE_MISMATCH,
            "in->weight: the ranks' shards hold %lld rows in all, not "
            "opts->vocab_size_global %lld",
            static_cast<long long>(covered), static_cast<long long>(global));
  }

  Accumulator accumulator(const Mat &target, int slot, float beta) {
    Accumulator a{target, target, beta};
    if (target.data == nullptr) return a;
    if (slot >= 0) {
      a.acc = mat(slot);
      if (beta != 0.0f) copy(target, a.acc);
    }
    /* Without chunks nothing else writes an overwritten gradient. */
    if (plan_.chunks == 0 && beta == 0.0f) {
      be_.fill_zero(ctx_, a.acc);
      ++counts_.calls;
    }
    return a;
  }

  void start_gradients() {
    weight_ = call_.w;
    /* a vocabulary plan widens W slice by slice (vocab_weight()) */
    if (plan_.slots.w32 >= 0 && !plan_.vocab) {
      weight_ = mat(plan_.slots.w32);
      copy(call_.w, weight_);
    }
    gw_ = accumulator(call_.grad_w, plan_.slots.gw32, call_.beta_w);
    gb_ = accumulator(as_row(call_.grad_b), plan_.slots.gb32, call_.beta_b);
  }

  /* The in-place gradient as the backward GEMMs read it. */
  Mat gradient_view(const Mat &logits) const {
    if (grad_dtype() == OSFTI_F32) return logits;
    return Mat{logits.data, logits.rows, logits.cols, 2 * logits.ld, grad_dtype()};
  }

  /* g: the GEMMs' operand dtype (fp32 where W is widened) */
  osfti_dtype_t grad_dtype() const noexcept {
    return k_.bf16_gemm ? call_.w.dtype : OSFTI_F32;
  }

  /* Rows [first, first + rows) of the held gradients (hold plans). */
  Mat held(int64_t first, int64_t rows) const {
    Mat g = rows_of(mat(plan_.slots.hold), first, rows);
    g.cols = call_.v;
    return g;
  }

  void chunk(int64_t first, int64_t rows) {
    const Mat xc = chunk_x(first, rows);
    /* fp32 gradients of a hold plan: the logits go straight into the hold */
    Mat logits = plan_.slots.logits >= 0 ? rows_of(mat(plan_.slots.logits), 0, rows)
                                         : held(first, rows);
    logits.cols = call_.v;
    gemm(Op::N, xc, Op::T, weight_, 0.0f, logits, &*logits_w_);
    const Slice all{0, call_.v};
    if (comm_ != nullptr) {
      float *records = static_cast<float *>(mat(plan_.slots.records).data);
      row_pass(first, logits, FlceRowPhase::records, all, {records, nullptr, 1});
      row_pass(first, logits, FlceRowPhase::finish, all, gather(records, rows));
    } else {
      row_pass(first, logits, FlceRowPhase::full, all, {});
    }
    if (!call_.want_grad()) return;
    const Mat g = plan_.hold ? held(first, rows) : gradient_view(logits);
    if (call_.grad_x.data != nullptr)
      gemm(Op::N, g, Op::N, weight_, grad_x_beta(), rows_of(call_.grad_x, first, rows));
    if (plan_.hold) return; /* grad_W and grad_b once, in finish_gradients() */
    if (gw_.target.data != nullptr) {
      gemm(Op::T, g, Op::N, xc, gw_.beta, gw_.acc);
      gw_.beta = 1.0f;
    }
    if (gb_.target.data != nullptr) {
      reduce_cols(g, gb_.beta, Vec{gb_.acc.data, call_.v, gb_.acc.dtype});
      gb_.beta = 1.0f;
    }
  }

  /* Vocab parallelism: every rank's records of `rows` rows, all-gathered
   * (rank-major), as the finish phase reads them; one rank: its own. */
  Records gather(float *records, int64_t rows) {
    if (comm_ == nullptr) return Records{nullptr, records, 1};
    const std::vector<int64_t> counts(static_cast<size_t>(comm_->size),
                                      rows * kFlceRecordWords);
    float *gathered = static_cast<float *>(mat(plan_.slots.gathered).data);
    comm_allgather(*comm_, records, gathered, counts.data(), OSFTI_F32);
    ++counts_.host_waits;
    return Records{nullptr, gathered, comm_->size};
  }

  /* ---- the vocabulary plan */

  /* Slice s of this rank's classes. */
  Slice slice(int64_t s) const noexcept {
    const int64_t first = s * plan_.slice_cols;
    return Slice{first, std::min(plan_.slice_cols, call_.v - first)};
  }

  /* W's rows of slice `sl` as the GEMMs read them: W's own, or where the
   * GEMMs take no bf16 the slice's fp32 copy in scratch (which holds the
   * slice vocab_weight() widened last). */
  Mat slice_weight(const Slice &sl) const {
    if (plan_.slots.w32 < 0) return rows_of(call_.w, sl.first, sl.cols);
    return rows_of(mat(plan_.slots.w32), 0, sl.cols);
  }

  /* slice_weight(sl), widened into scratch first where the GEMMs need it. */
  Mat vocab_weight(const Slice &sl) {
    const Mat w = slice_weight(sl);
    if (plan_.slots.w32 >= 0) copy(rows_of(call_.w, sl.first, sl.cols), w);
    return w;
  }

  /* The logits of rows x slice `sl` into the tile buffer. */
  Mat tile_logits(const Mat &xc, const Slice &sl) {
    Mat tile = rows_of(mat(plan_.slots.logits), 0, xc.rows);
    tile.cols = sl.cols;
    gemm(Op::N, xc, Op::T, vocab_weight(sl), 0.0f, tile);
    return tile;
  }

  /* One chunk of tokens over the slices: pass 1 merges every slice's row
   * records into the running ones (first block of the records slot; a
   * slice's go to the second), pass 2 recomputes each slice's logits,
   * starting with the last slice of pass 1, whose logits are still in the
   * tile buffer, and takes its share of every gradient. */
  void vocab_chunk(int64_t first, int64_t rows) {
    const Mat xc = chunk_x(first, rows);
    float *running = static_cast<float *>(mat(plan_.slots.records).data);
    float *sliced = running + rows * kFlceRecordWords;
    Mat tile;
    for (int64_t s = 0; s < plan_.slices; ++s) {
      tile = tile_logits(xc, slice(s));
      row_pass(first, tile, FlceRowPhase::records, slice(s),
               {s == 0 ? running : sliced, nullptr, 1});
      if (s > 0)
        row_pass(first, Mat{nullptr, rows, 0, 0, OSFTI_F32}, FlceRowPhase::merge, {},
                 {running, running, 2});
    }
    const Records combined = gather(running, rows);
    if (!call_.want_grad()) { /* the per-token results only: no logits read */
      row_pass(first, tile, FlceRowPhase::finish, Slice{0, call_.v}, combined);
      return;
    }
    Accumulator gx = grad_x_accumulator(first, rows);
    for (int64_t k = 0; k < plan_.slices; ++k) {
      const Slice sl = slice(k == 0 ? plan_.slices - 1 : k - 1);
      if (k > 0) tile = tile_logits(xc, sl);
      row_pass(first, tile, FlceRowPhase::finish, sl, combined);
      const Mat g = gradient_view(tile);
      if (gx.target.data != nullptr) {
        gemm(Op::N, g, Op::N, slice_weight(sl), gx.beta, gx.acc);
        gx.beta = 1.0f;
      }
      if (gw_.target.data != nullptr) grad_w_slice(g, xc, sl);
      if (gb_.target.data != nullptr) reduce_cols(g, gb_.beta, vec_of(gb_.acc, sl));
    }
    gw_.beta = gb_.beta = 1.0f; /* every slice's rows written: later chunks add */
    if (gx.in_scratch()) copy(gx.acc, gx.target);
  }

  /* ---- the in-place plan (FlcePlan::in_place) */

  /* Slice k of the kept tile. */
  Slice kept_slice(int64_t k) const noexcept {
    const int64_t first = k * plan_.kept_cols;
    return Slice{first, std::min(plan_.kept_cols, call_.v - first)};
  }

  /* Slice `sl`'s logits of the kept rows, in grad_weight's buffer: the
   * slices' tiles one after another from its start, each kept_rows x Sp
   * (slices before the last are whole rows of 16 classes). */
  Mat kept_tile(const Slice &sl) const {
    auto *base = static_cast<float *>(call_.grad_w.data);
    return Mat{base + plan_.kept_rows * sl.first, plan_.kept_rows, sl.cols,
               padded_vocab(sl.cols), OSFTI_F32};
  }

  /* Where slice `sl`'s gradient goes when its grad_W rows would overwrite
   * its own logits. */
  Mat staged_gradient(const Slice &sl) const {
    return Mat{mat(plan_.slots.tile_grad).data, plan_.kept_rows, sl.cols,
               padded_vocab(plan_.kept_cols), OSFTI_F32};
  }

  /* Slice `sl`'s logits of the extra kept rows, in the logits slot: the
   * slices' tiles one after another, each extra_rows x Sp. */
  Mat extra_tile(const Slice &sl) const {
    auto *base = static_cast<float *>(mat(plan_.slots.logits).data);
    return Mat{base + plan_.extra_rows * sl.first, plan_.extra_rows, sl.cols,
               padded_vocab(sl.cols), OSFTI_F32};
  }

  /* The kept rows over the slices: every slice's logits computed once into
   * their tiles (pass 1, merging the row records), then from the last slice
   * to the first (pass 2) the gradient from the merged records, grad_x +=
   * g W_s, grad_W_s = g^T x, grad_b_s. The first kept_rows lie in
   * grad_weight: slice k's grad_W rows start at k S H floats, its tile at
   * k S R (R <= H), so they never reach an earlier slice's tile; where they
   * would overwrite their own, the gradient goes to tile_grad first. The
   * next extra_rows lie in scratch and add their share to grad_W_s while
   * its rows are hot. Overwrites grad_W and grad_b: token chunks after it
   * add to them. */
  void in_place_tile() {
    const int64_t r = plan_.kept_rows, e = plan_.extra_rows, m = r + e;
    const Mat xa = rows_of(call_.x, 0, r), xb = rows_of(call_.x, r, e);
    float *running = static_cast<float *>(mat(plan_.slots.records).data);
    float *sliced = running + m * kFlceRecordWords;
    for (int64_t s = 0; s < plan_.kept_slices; ++s) {
      const Slice sl = kept_slice(s);
      const Mat w = rows_of(call_.w, sl.first, sl.cols);
      float *rec = s == 0 ? running : sliced;
      const Mat ta = kept_tile(sl);
      gemm(Op::N, xa, Op::T, w, 0.0f, ta);
      row_pass(0, ta, FlceRowPhase::records, sl, {rec, nullptr, 1});
      if (e > 0) {
        const Mat tb = extra_tile(sl);
        gemm(Op::N, xb, Op::T, w, 0.0f, tb);
        row_pass(r, tb, FlceRowPhase::records, sl,
                 {rec + r * kFlceRecordWords, nullptr, 1});
      }
      if (s > 0)
        row_pass(0, Mat{nullptr, m, 0, 0, OSFTI_F32}, FlceRowPhase::merge, {},
                 {running, running, 2});
    }
    Accumulator gxa = grad_x_accumulator(0, r), gxb = grad_x_accumulator(r, e);
    for (int64_t k = plan_.kept_slices - 1; k >= 0; --k) {
      const Slice sl = kept_slice(k);
      const Mat w = rows_of(call_.w, sl.first, sl.cols);
      const Mat rows = rows_of(call_.grad_w, sl.first, sl.cols);
      const Mat ta = kept_tile(sl);
      const bool staged = static_cast<const float *>(rows.data) <
                          static_cast<const float *>(ta.data) + r * ta.ld;
      const Mat ga = staged ? staged_gradient(sl) : ta;
      row_pass(0, ta, FlceRowPhase::finish, sl, {nullptr, running, 1},
               staged ? &ga : nullptr);
      slice_gradients(ga, xa, w, sl, gxa, 0.0f, gb_.beta);
      if (e > 0) {
        const Mat tb = extra_tile(sl);
        row_pass(r, tb, FlceRowPhase::finish, sl,
                 {nullptr, running + r * kFlceRecordWords, 1});
        slice_gradients(tb, xb, w, sl, gxb, 1.0f, 1.0f);
      }
    }
    gw_.beta = gb_.beta = 1.0f;
  }

  /* One slice's share of a kept part: grad_x += g W_s over the slices,
   * grad_W_s (+)= g^T x, grad_b_s (+)= the column sums of g. */
  void slice_gradients(const Mat &g, const Mat &x, const Mat &w, const Slice &sl,
                       Accumulator &gx, float beta_w, float beta_b) {
    if (gx.target.data != nullptr) {
      gemm(Op::N, g, Op::N, w, gx.beta, gx.acc);
      gx.beta = 1.0f;
    }
    gemm(Op::T, g, Op::N, x, beta_w, rows_of(call_.grad_w, sl.first, sl.cols));
    if (gb_.target.data != nullptr) reduce_cols(g, beta_b, vec_of(gb_.acc, sl));
  }

  /* grad_W's rows of slice `sl` (+)= g^T x_c. Bf16 rows where the GEMMs take
   * no bf16 go through the slice's fp32 copy of W (free once grad_x has
   * had its share), so that the GEMM stages nothing beyond the budget. */
  void grad_w_slice(const Mat &g, const Mat &xc, const Slice &sl) {
    const Mat rows = rows_of(gw_.acc, sl.first, sl.cols);
    if (plan_.slots.w32 < 0 || rows.dtype == OSFTI_F32)
      return gemm(Op::T, g, Op::N, xc, gw_.beta, rows);
    const Mat stage = slice_weight(sl);
    if (gw_.beta != 0.0f) copy(rows, stage);
    gemm(Op::T, g, Op::N, xc, gw_.beta, stage);
    copy(stage, rows);
  }

  /* grad_x's rows of a chunk as the slices sum into them: the caller's, or
   * an fp32 scratch copy (a bf16 grad_x with the fp32 accumulator). */
  Accumulator grad_x_accumulator(int64_t first, int64_t rows) {
    if (call_.grad_x.data == nullptr) return Accumulator{};
    const Mat target = rows_of(call_.grad_x, first, rows);
    Accumulator a{target, target, grad_x_beta()};
    if (plan_.slots.gx32 >= 0) {
      a.acc = rows_of(mat(plan_.slots.gx32), 0, rows);
      if (a.beta != 0.0f) copy(target, a.acc);
    }
    return a;
  }

  /* Elements [sl.first, sl.first + sl.cols) of a one-row gradient. */
  static Vec vec_of(const Mat &row, const Slice &sl) {
    return Vec{static_cast<char *>(row.data) +
                   sl.first * static_cast<int64_t>(osfti_dtype_size(row.dtype)),
               sl.cols, row.dtype};
  }

  /* A chunk's rows of x as the GEMMs take them (widened where needed; a
   * hold plan widens all of x, for the grad_W GEMM at the end). */
  Mat chunk_x(int64_t first, int64_t rows) {
    const Mat xc = rows_of(call_.x, first, rows);
    if (plan_.slots.x32 < 0) return xc;
    const Mat x32 = rows_of(mat(plan_.slots.x32), plan_.hold ? first : 0, rows);
    copy(xc, x32);
    return x32;
  }

  /* Rank 0 keeps the caller's beta (its old grad_x is the base); the other
   * ranks write their partial sums only. */
  float grad_x_beta() const noexcept {
    return comm_ != nullptr && comm_->rank != 0 ? 0.0f : call_.beta_x;
  }

  /* Sums grad_x over the ranks once, in place: one all-reduce when it is
   * compact on every rank, else one per row (padding is not ours to touch). */
  void reduce_grad_x() {
    const Mat &gx = call_.grad_x;
    if (comm_ == nullptr || gx.data == nullptr || gx.rows == 0) return;
    const size_t elem = gx.dtype == OSFTI_F32 ? 4 : 2;
    if (grad_x_compact_) {
      comm_allreduce_sum(*comm_, gx.data, static_cast<size_t>(gx.rows * gx.cols),
                         gx.dtype);
      ++counts_.host_waits;
      return;
    }
    for (int64_t r = 0; r < gx.rows; ++r)
      comm_allreduce_sum(*comm_, static_cast<char *>(gx.data) + r * gx.ld * elem,
                         static_cast<size_t>(gx.cols), gx.dtype);
    counts_.host_waits += gx.rows;
  }

  /* Elements [sl.first, sl.first + sl.cols) of a per-class input (none
   * stays none). */
  static Vec classes(const Vec &v, const Slice &sl) {
    if (v.data == nullptr) return v;
    return vec_of(as_row(v), sl);
  }

  /* A row pass over the classes `sl` of this rank's shard (a vocabulary
   * slice, or all of them), with the records it writes and reads. */
  void row_pass(int64_t first, const Mat &logits, FlceRowPhase phase, const Slice &sl,
                const Records &rec, const Mat *grad = nullptr) {
    FlceRowPass a;
    a.loss = loss_;
    a.loss.vocab = sl.cols;
    a.loss.vocab_offset += sl.first;
    a.phase = phase;
    a.records = rec.out;
    a.gathered = rec.in;
    a.ranks = rec.ranks;
    a.logits = logits;
    a.want_grad = call_.want_grad();
    a.grad_dtype = grad_dtype();
    if (plan_.hold && plan_.slots.logits >= 0) a.grad = held(first, logits.rows);
    if (grad != nullptr) a.grad = *grad;
    a.first_token = first;
    a.targets = call_.targets;
    a.bias = classes(call_.bias, sl);
    a.class_weight = classes(call_.class_weight, sl);
    a.grad_loss = call_.grad_loss;
    a.totals = totals_;
    a.tokens = tokens_;
    k_.rows(ctx_, a);
    ++counts_.calls;
  }

  void finish_gradients() {
    if (plan_.hold) {
      /* every row's gradient is held: one GEMM of K = M rows and one sum */
      const Mat g = held(0, call_.m);
      const Mat x = plan_.slots.x32 >= 0 ? mat(plan_.slots.x32) : call_.x;
      gemm(Op::T, g, Op::N, x, gw_.beta, gw_.acc);
      if (gb_.target.data != nullptr)
        reduce_cols(g, gb_.beta, Vec{gb_.acc.data, call_.v, gb_.acc.dtype});
      return;
    }
    if (gw_.in_scratch()) copy(gw_.acc, gw_.target);
    if (gb_.in_scratch()) copy(gb_.acc, gb_.target);
  }

  void finalize() {
    FlceFinalize a;
    a.loss = loss_;
    a.targets = call_.targets;
    a.totals = totals_;
    a.tokens = tokens_;
    a.out_loss = call_.loss;
    a.out_z = call_.z_loss;
    a.out_accuracy = call_.accuracy;
    a.out_argmax = call_.argmax;
    a.out_token_loss = call_.token_loss;
    k_.finalize(ctx_, a);
    ++counts_.calls;
  }

  Flce &f_;
  Context &ctx_;
  const Backend &be_;
  const FlceKernels &k_;
  const FlceCall &call_;
  const FlcePlan &plan_;
  const FlceLoss loss_;
  Comm *comm_;         /* vocab parallelism over more than one rank, else nullptr */
  int64_t chunk_rows_; /* the plan's, or the fewest over the ranks */
  bool grad_x_compact_ = true; /* grad_x has no row padding on any rank */
  FlceTotals *totals_ = nullptr;
  FlceTokens tokens_;
  Mat weight_;                      /* W as the GEMMs take it */
  std::optional<PackedB> logits_w_; /* weight_ packed for the logits GEMMs */
  Accumulator gw_, gb_;
  FlceCounts counts_;
  int64_t vh_elems_ = 0; /* counts_.vh_passes, in elements */
};

}  // namespace

void compute(Flce &f, const osft_flce_inputs_t &in, const osft_flce_outputs_t &out) {
  const FlceCall call = check_call(f, in, out);
  FlcePlan plan = plan_call(f, call);
  plan.scratch.allocate(*f.ctx);
  Run(f, call, plan).run();
}

}  // namespace osft
