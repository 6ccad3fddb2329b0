/* Fused linear cross-entropy: the chunked computation. Per chunk of tokens:
 * logits = x_c W^T into the reused scratch buffer (GEMM), the row pass
 * (statistics and the gradient in place), grad_x_c = g W, grad_W += g^T x_c
 * and grad_b += column sums of g (GEMM / reduce accumulating themselves).
 * Nothing the caller passed is written before the targets have been
 * checked. */
#include <algorithm>
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
    logits_w_.emplace(ctx_, Op::T, weight_, chunk_rows_,
                      plan_.budget > used ? plan_.budget - used : 0);
    for (int64_t first = 0; first < call_.m; first += chunk_rows_) {
      chunk(first, std::min(chunk_rows_, call_.m - first));
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

  bool whole_vh(const Mat &m) const noexcept {
    return m.rows == call_.v && m.cols == call_.h;
  }

  void copy(const Mat &src, const Mat &dst) {
    be_.scale_into(ctx_, Axis::cols, src, nullptr, 0.0f, dst);
    ++counts_.calls;
    if (src.dtype != dst.dtype) {
      ++counts_.conversions;
      counts_.converted += src.rows * src.cols;
    }
    if (whole_vh(dst)) counts_.vh_passes += 2; /* read one, write the other */
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
    if (whole_vh(c)) counts_.vh_passes += passes;
  }

  void reduce_cols(const Mat &g, float beta, const Vec &y) {
    be_.reduce(ctx_, Axis::cols, g, nullptr, beta, y);
    ++counts_.calls;
  }

  void log_counts() const {
    if (!log_enabled(OSFT_LOG_DEBUG)) return;
    log_message(OSFT_LOG_DEBUG,
                "flce: counts: %lld chunk(s)%s: %lld calls, %lld conversions (%lld "
                "elements), %lld V x H passes, %lld host waits, %lld allocations",
                static_cast<long long>(counts_.chunks), plan_.hold ? " (held)" : "",
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
    if (plan_.slots.w32 >= 0) {
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

  osfti_dtype_t grad_dtype() const noexcept { return weight_.dtype; }

  /* Rows [first, first + rows) of the held gradients (hold plans). */
  Mat held(int64_t first, int64_t rows) const {
    Mat g = rows_of(mat(plan_.slots.hold), first, rows);
    g.cols = call_.v;
    return g;
  }

  void chunk(int64_t first, int64_t rows) {
    Mat xc = rows_of(call_.x, first, rows);
    if (plan_.slots.x32 >= 0) {
      /* a hold plan widens all of x, for the grad_W GEMM at the end */
      const Mat x32 = rows_of(mat(plan_.slots.x32), plan_.hold ? first : 0, rows);
      copy(xc, x32);
      xc = x32;
    }
    /* fp32 gradients of a hold plan: the logits go straight into the hold */
    Mat logits = plan_.slots.logits >= 0 ? rows_of(mat(plan_.slots.logits), 0, rows)
                                         : held(first, rows);
    logits.cols = call_.v;
    gemm(Op::N, xc, Op::T, weight_, 0.0f, logits, &*logits_w_);
    if (comm_ != nullptr) {
      row_pass(first, logits, FlceRowPhase::records);
      const int64_t count = rows * kFlceRecordWords;
      const std::vector<int64_t> counts(static_cast<size_t>(comm_->size), count);
      comm_allgather(*comm_, mat(plan_.slots.records).data,
                     mat(plan_.slots.gathered).data, counts.data(), OSFTI_F32);
      ++counts_.host_waits;
      row_pass(first, logits, FlceRowPhase::finish);
    } else {
      row_pass(first, logits, FlceRowPhase::full);
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

  void row_pass(int64_t first, const Mat &logits, FlceRowPhase phase) {
    FlceRowPass a;
    a.loss = loss_;
    a.phase = phase;
    if (comm_ != nullptr) {
      a.records = static_cast<float *>(mat(plan_.slots.records).data);
      a.gathered = static_cast<const float *>(mat(plan_.slots.gathered).data);
      a.ranks = comm_->size;
    }
    a.logits = logits;
    a.want_grad = call_.want_grad();
    a.grad_dtype = grad_dtype();
    if (plan_.hold && plan_.slots.logits >= 0) a.grad = held(first, logits.rows);
    a.first_token = first;
    a.targets = call_.targets;
    a.bias = call_.bias;
    a.class_weight = call_.class_weight;
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
};

}  // namespace

void compute(Flce &f, const osft_flce_inputs_t &in, const osft_flce_outputs_t &out) {
  const FlceCall call = check_call(f, in, out);
  FlcePlan plan = plan_call(f, call);
  plan.scratch.allocate(*f.ctx);
  Run(f, call, plan).run();
}

}  // namespace osft
