/* Fused linear cross-entropy: the chunked computation. Per chunk of tokens:
 * logits = x_c W^T into the reused scratch buffer (GEMM), the row pass
 * (statistics and the gradient in place), grad_x_c = g W, grad_W += g^T x_c
 * and grad_b += column sums of g (GEMM / reduce accumulating themselves).
 * Nothing the caller passed is written before the targets have been
 * checked. */
#include <algorithm>

#include "core/error.h"
#include "ops/flce.h"

namespace osft {
namespace {

FlceLoss loss_params(const Flce &f, int64_t v) {
  const osft_flce_options_t &o = f.opts;
  FlceLoss p;
  p.vocab = v;
  p.ignore_index = o.ignore_index;
  p.smoothing = static_cast<float>(o.label_smoothing);
  p.eps = static_cast<float>(o.label_smoothing / static_cast<double>(v));
  p.z_scale = static_cast<float>(o.z_loss_scale);
  p.softcap = static_cast<float>(o.softcap);
  p.mean = o.reduction == OSFT_FLCE_MEAN;
  p.per_token = o.reduction == OSFT_FLCE_NONE;
  return p;
}

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
      : ctx_(*f.ctx),
        be_(backend(ctx_)),
        k_(flce_kernels(ctx_)),
        call_(call),
        plan_(plan),
        loss_(loss_params(f, call.v)) {}

  void run() {
    totals_ = static_cast<FlceTotals *>(mat(plan_.slots.totals).data);
    tokens_.loss = static_cast<float *>(mat(plan_.slots.token_loss).data);
    tokens_.z = static_cast<float *>(mat(plan_.slots.token_z).data);
    tokens_.argmax = static_cast<int64_t *>(mat(plan_.slots.token_argmax).data);
    check_targets(); /* the last check: outputs are written from here on */
    start_gradients();
    for (int64_t first = 0; first < call_.m; first += plan_.chunk_rows)
      chunk(first, std::min(plan_.chunk_rows, call_.m - first));
    finish_gradients();
    finalize();
  }

 private:
  Mat mat(int slot) const { return plan_.scratch.mat(slot); }

  void copy(const Mat &src, const Mat &dst) const {
    be_.scale_into(ctx_, Axis::cols, src, nullptr, 0.0f, dst);
  }

  void check_targets() {
    FlcePrepare a;
    a.loss = loss_;
    a.targets = call_.targets;
    a.class_weight = call_.class_weight;
    a.totals = totals_;
    const FlceTotals t = k_.prepare(ctx_, a);
    if (t.first_bad >= 0)
      raise(OSFT_STATUS_INDEX_OUT_OF_RANGE,
            "in->targets: token %lld has target %lld, outside [0, %lld) and not the "
            "ignore_index %lld",
            static_cast<long long>(t.first_bad), static_cast<long long>(t.bad_value),
            static_cast<long long>(call_.v), static_cast<long long>(loss_.ignore_index));
  }

  Accumulator accumulator(const Mat &target, int slot, float beta) const {
    Accumulator a{target, target, beta};
    if (target.data == nullptr) return a;
    if (slot >= 0) {
      a.acc = mat(slot);
      if (beta != 0.0f) copy(target, a.acc);
    }
    /* Without chunks nothing else writes an overwritten gradient. */
    if (plan_.chunks == 0 && beta == 0.0f) be_.fill_zero(ctx_, a.acc);
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

  void chunk(int64_t first, int64_t rows) {
    Mat xc = rows_of(call_.x, first, rows);
    if (plan_.slots.x32 >= 0) {
      const Mat x32 = rows_of(mat(plan_.slots.x32), 0, rows);
      copy(xc, x32);
      xc = x32;
    }
    Mat logits = rows_of(mat(plan_.slots.logits), 0, rows);
    logits.cols = call_.v;
    be_.gemm(ctx_, Op::N, xc, Op::T, weight_, 1.0f, 0.0f, logits);
    row_pass(first, logits);
    if (!call_.want_grad()) return;
    const Mat g = gradient_view(logits);
    if (call_.grad_x.data != nullptr)
      be_.gemm(ctx_, Op::N, g, Op::N, weight_, 1.0f, call_.beta_x,
               rows_of(call_.grad_x, first, rows));
    if (gw_.target.data != nullptr) {
      be_.gemm(ctx_, Op::T, g, Op::N, xc, 1.0f, gw_.beta, gw_.acc);
      gw_.beta = 1.0f;
    }
    if (gb_.target.data != nullptr) {
      be_.reduce(ctx_, Axis::cols, g, nullptr, gb_.beta,
                 Vec{gb_.acc.data, call_.v, gb_.acc.dtype});
      gb_.beta = 1.0f;
    }
  }

  void row_pass(int64_t first, const Mat &logits) const {
    FlceRowPass a;
    a.loss = loss_;
    a.logits = logits;
    a.want_grad = call_.want_grad();
    a.grad_dtype = grad_dtype();
    a.first_token = first;
    a.targets = call_.targets;
    a.bias = call_.bias;
    a.class_weight = call_.class_weight;
    a.grad_loss = call_.grad_loss;
    a.totals = totals_;
    a.tokens = tokens_;
    k_.rows(ctx_, a);
  }

  void finish_gradients() const {
    if (gw_.in_scratch()) copy(gw_.acc, gw_.target);
    if (gb_.in_scratch()) copy(gb_.acc, gb_.target);
  }

  void finalize() const {
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
  }

  Context &ctx_;
  const Backend &be_;
  const FlceKernels &k_;
  const FlceCall &call_;
  const FlcePlan &plan_;
  const FlceLoss loss_;
  FlceTotals *totals_ = nullptr;
  FlceTokens tokens_;
  Mat weight_; /* W as the GEMMs take it */
  Accumulator gw_, gb_;
};

}  // namespace

void compute(Flce &f, const osft_flce_inputs_t &in, const osft_flce_outputs_t &out) {
  const FlceCall call = check_call(f, in, out);
  FlcePlan plan = plan_call(f, call);
  plan.scratch.allocate(*f.ctx);
  Run(f, call, plan).run();
}

}  // namespace osft
