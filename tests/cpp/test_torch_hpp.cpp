/* The libtorch glue (include/osftrt/torch.hpp) against libtorch itself:
 * LinearCrossEntropy's loss and gradients (through autograd) against
 * torch::nn::functional::linear + cross_entropy on float64 copies of fresh
 * random inputs (mean, sum and none, ignored tokens, label smoothing, a bias,
 * an upstream gradient other than 1, 3-D inputs, a frozen weight, no grad
 * mode); OsftLinear's output and gradients against libtorch's autograd
 * through U S V^T in float64 (the factor gradients projected as the layer
 * projects them), its parameters aliasing the layer, the orthogonality kept
 * through Adam steps with project_params(); zero-copy views both ways; a
 * bad dtype refused with a message naming the argument. Tolerances: fp32
 * (the library's arithmetic) against float64. */
#include <cmath>
#include <cstdio>
#include <string>

#include <osftrt/torch.hpp>

#include "cpp_test.h"

namespace F = torch::nn::functional;
namespace ol = osftrt::libtorch;

namespace {

const auto kF64 = torch::TensorOptions().dtype(torch::kFloat64);

/* max |a - b| / (max |b| + floor), a read as float64. */
double rel_err(const torch::Tensor &a, const torch::Tensor &b, double floor = 1e-3) {
  const torch::Tensor a64 = a.detach().to(torch::kFloat64), b64 = b.detach();
  return (a64 - b64).abs().max().item<double>() /
         (b64.abs().max().item<double>() + floor);
}

/* One fused loss against libtorch: x (shape xs, last dim H), V classes. */
void check_ce(const std::vector<int64_t> &xs, int64_t v, osft_flce_reduction_t red,
              double smoothing, bool bias, double upstream, bool frozen_weight) {
  const int64_t h = xs.back();
  torch::manual_seed(static_cast<uint64_t>(xs[0] * 131 + v + red * 7));
  const torch::Tensor x64 = torch::randn(xs, kF64);
  const torch::Tensor w64 = torch::randn({v, h}, kF64) * 0.5;
  const torch::Tensor b64 = torch::randn({v}, kF64) * 0.1;
  std::vector<int64_t> ys(xs.begin(), xs.end() - 1);
  torch::Tensor y = torch::randint(v, ys, torch::kLong);
  y.view({-1}).index_put_({torch::rand({y.numel()}) < 0.2}, -100);  // ignored tokens
  // float64 reference through libtorch's own ops
  torch::Tensor rx = x64.clone().requires_grad_(), rw = w64.clone().requires_grad_();
  torch::Tensor rb = b64.clone().requires_grad_();
  torch::Tensor logits = F::linear(rx, rw, bias ? rb : torch::Tensor());
  const char *red_name = red == OSFT_FLCE_MEAN  ? "mean"
                         : red == OSFT_FLCE_SUM ? "sum"
                                                : "none";
  auto ce_opts =
      F::CrossEntropyFuncOptions().ignore_index(-100).label_smoothing(smoothing);
  if (red == OSFT_FLCE_MEAN) ce_opts.reduction(torch::kMean);
  if (red == OSFT_FLCE_SUM) ce_opts.reduction(torch::kSum);
  if (red == OSFT_FLCE_NONE) ce_opts.reduction(torch::kNone);
  torch::Tensor ref = F::cross_entropy(logits.view({-1, v}), y.view({-1}), ce_opts);
  if (red == OSFT_FLCE_NONE) ref = ref.view(ys);
  // per-token upstream weights for NONE, a scalar one otherwise
  const torch::Tensor up = red == OSFT_FLCE_NONE ? torch::rand(ys, kF64) + 0.5
                                                 : torch::full({}, upstream, kF64);
  (ref * up).sum().backward();
  // the glue, fp32
  osftrt::FlceOptions o;
  o.reduction = red;
  o.label_smoothing = smoothing;
  ol::LinearCrossEntropy ce(o);
  torch::Tensor x = x64.to(torch::kFloat).requires_grad_();
  torch::Tensor w = w64.to(torch::kFloat).requires_grad_(!frozen_weight);
  torch::Tensor b = b64.to(torch::kFloat).requires_grad_();
  torch::Tensor loss = ce(x, w, y, bias ? b : torch::Tensor());
  OSFT_CHECK(loss.sizes() == ref.sizes());
  (loss * up.to(torch::kFloat)).sum().backward();
  char what[64];
  std::snprintf(what, sizeof what, "%s, smoothing %g", red_name, smoothing);
  std::printf(
      "  %s, x %s, V %lld, bias %d, upstream %g, frozen W %d: loss %.2e, dx %.2e, "
      "dW %.2e, db %.2e\n",
      what, torch::str(xs).c_str(), static_cast<long long>(v), bias, upstream,
      frozen_weight, rel_err(loss, ref.detach()), rel_err(x.grad(), rx.grad()),
      frozen_weight ? 0.0 : rel_err(w.grad(), rw.grad()),
      bias ? rel_err(b.grad(), rb.grad()) : 0.0);
  OSFT_CHECK_LE(rel_err(loss, ref.detach()), 1e-5);
  OSFT_CHECK_LE(rel_err(x.grad(), rx.grad()), 2e-5);
  if (frozen_weight)
    OSFT_CHECK(!w.grad().defined());
  else
    OSFT_CHECK_LE(rel_err(w.grad(), rw.grad()), 2e-5);
  if (bias) OSFT_CHECK_LE(rel_err(b.grad(), rb.grad()), 2e-5);
}

}  // namespace

OSFT_CPP_TEST(linear_cross_entropy_matches_libtorch) {
  check_ce({37, 24}, 101, OSFT_FLCE_MEAN, 0.0, true, 1.0, false);
  check_ce({37, 24}, 101, OSFT_FLCE_MEAN, 0.1, false, 2.5, false);
  check_ce({5, 7, 16}, 64, OSFT_FLCE_SUM, 0.0, true, 0.5, false);
  check_ce({5, 7, 16}, 64, OSFT_FLCE_NONE, 0.0, true, 1.0, false);
  check_ce({5, 7, 16}, 64, OSFT_FLCE_NONE, 0.05, false, 1.0, true);
  check_ce({64, 300}, 6, OSFT_FLCE_MEAN, 0.0, true, 1.0, false);  // TREC's output layer
  check_ce({20, 12}, 33, OSFT_FLCE_MEAN, 0.0, true, 1.0, true);   // frozen head
}

/* Without autograd (no grad mode, or nothing requires grad): the loss alone. */
OSFT_CPP_TEST(linear_cross_entropy_without_autograd) {
  torch::manual_seed(3);
  const torch::Tensor x = torch::randn({9, 8}), w = torch::randn({15, 8});
  const torch::Tensor y = torch::randint(15, {9}, torch::kLong);
  const torch::Tensor ref =
      F::cross_entropy(F::linear(x.to(torch::kFloat64), w.to(torch::kFloat64)), y);
  ol::LinearCrossEntropy ce;
  const torch::Tensor a = ce(x, w, y);
  OSFT_CHECK(!a.requires_grad());
  OSFT_CHECK_LE(rel_err(a, ref), 1e-5);
  torch::Tensor wg = w.clone().requires_grad_();
  torch::NoGradGuard guard;
  const torch::Tensor b = ce(x, wg, y);
  OSFT_CHECK(!b.requires_grad());
  OSFT_CHECK_LE(rel_err(b, ref), 1e-5);
}

/* A dtype the library does not take: refused, naming the argument. */
OSFT_CPP_TEST(linear_cross_entropy_refuses_float64) {
  ol::LinearCrossEntropy ce;
  const torch::Tensor x = torch::randn({4, 3}, kF64), w = torch::randn({5, 3}, kF64);
  const torch::Tensor y = torch::randint(5, {4}, torch::kLong);
  OSFT_EXPECT_THROWS(ce(x, w, y), OSFT_STATUS_DTYPE_MISMATCH, "in->x");
}

/* Views share memory both ways; hold() keeps a tensor alive; a factor tensor
 * keeps its layer alive and writes it. */
OSFT_CPP_TEST(views_are_zero_copy) {
  torch::Tensor t = torch::randn({6, 4}).t();  // strided
  const osftrt::TensorView v = ol::view(t);
  OSFT_CHECK(v.data() == t.data_ptr());
  OSFT_CHECK(v.size(0) == 4 && v.size(1) == 6 && v.stride(0) == 1 && v.stride(1) == 4);
  ol::HeldView held = ol::hold(torch::arange(10, torch::kFloat) + 1);
  const osftrt::TensorView &hv = held;
  OSFT_CHECK(hv.data_as<float>()[9] == 10.0f);
  const torch::Tensor back = ol::tensor(ol::view(t), {});
  OSFT_CHECK(back.data_ptr() == t.data_ptr());
  osftrt::Context ctx;
  torch::Tensor u;
  {
    const torch::Tensor w = torch::randn({8, 6});
    osftrt::Flinear layer = osftrt::Flinear::from_weight(ctx, ol::view(w));
    u = ol::factor(layer, OSFT_FACTOR_U_LOW);
    OSFT_CHECK(u.data_ptr() == layer.factor(OSFT_FACTOR_U_LOW).data());
  }  // the layer lives on in u
  u.zero_();
  OSFT_CHECK(u.abs().sum().item<double>() == 0.0);
}

/* The OSFT layer: y and every gradient against libtorch's autograd through
 * W = U_high S_high V_high + U_low S_low V_low in float64, the factor
 * gradients projected as the layer projects them. */
OSFT_CPP_TEST(osft_linear_matches_libtorch) {
  const int64_t n = 12, k = 20, m = 9;
  torch::manual_seed(7);
  torch::nn::Linear dense(torch::nn::LinearOptions(k, n));
  ol::OsftLinear layer(dense, 0.5);
  const osftrt::FlinearDims d = layer->layer().dims();
  OSFT_CHECK(d.frozen_rank + d.trainable_rank == std::min(n, k));
  OSFT_CHECK(layer->parameters().size() == 4);  // u_low, s_low, v_low, bias
  OSFT_CHECK(layer->u_low.data_ptr() == layer->layer().factor(OSFT_FACTOR_U_LOW).data());
  // the merged weight is the dense one
  OSFT_CHECK_LE(rel_err(layer->merged_weight(), dense->weight.to(torch::kFloat64)), 1e-5);
  const torch::Tensor x64 = torch::randn({3, m / 3, k}, kF64);
  const torch::Tensor r64 = torch::randn({3, m / 3, n}, kF64);
  torch::Tensor x = x64.to(torch::kFloat).requires_grad_();
  torch::Tensor y = layer(x);
  (y * r64.to(torch::kFloat)).sum().backward();
  // float64 reference
  auto f64 = [&](osft_flinear_factor_t f) {
    return ol::factor(layer->layer(), f).to(torch::kFloat64).clone();
  };
  const torch::Tensor uh = f64(OSFT_FACTOR_U_HIGH), sh = f64(OSFT_FACTOR_S_HIGH);
  const torch::Tensor vh = f64(OSFT_FACTOR_V_HIGH);
  torch::Tensor ul = f64(OSFT_FACTOR_U_LOW).requires_grad_();
  torch::Tensor sl = f64(OSFT_FACTOR_S_LOW).requires_grad_();
  torch::Tensor vl = f64(OSFT_FACTOR_V_LOW).requires_grad_();
  torch::Tensor rx = x64.clone().requires_grad_();
  torch::Tensor rb = dense->bias.detach().to(torch::kFloat64).clone().requires_grad_();
  const torch::Tensor w =
      uh.matmul(torch::diag(sh)).matmul(vh) + ul.matmul(torch::diag(sl)).matmul(vl);
  const torch::Tensor ry = F::linear(rx, w, rb);
  (ry * r64).sum().backward();
  const torch::Tensor gu = ul.grad() - uh.matmul(uh.t().matmul(ul.grad()));
  const torch::Tensor gv = vl.grad() - vl.grad().matmul(vh.t()).matmul(vh);
  std::printf("  y %.2e, dx %.2e, dU_low %.2e, dS_low %.2e, dV_low %.2e, db %.2e\n",
              rel_err(y, ry), rel_err(x.grad(), rx.grad()),
              rel_err(layer->u_low.grad(), gu), rel_err(layer->s_low.grad(), sl.grad()),
              rel_err(layer->v_low.grad(), gv),
              rel_err(layer->named_parameters()["bias"].grad(), rb.grad()));
  OSFT_CHECK_LE(rel_err(y, ry), 1e-5);
  OSFT_CHECK_LE(rel_err(x.grad(), rx.grad()), 1e-5);
  OSFT_CHECK_LE(rel_err(layer->u_low.grad(), gu), 1e-5);
  OSFT_CHECK_LE(rel_err(layer->s_low.grad(), sl.grad()), 1e-5);
  OSFT_CHECK_LE(rel_err(layer->v_low.grad(), gv), 1e-5);
  OSFT_CHECK_LE(rel_err(layer->named_parameters()["bias"].grad(), rb.grad()), 1e-5);
  // a second backward adds to .grad (autograd's rule), the buffers reused
  const torch::Tensor before = layer->u_low.grad().clone();
  (layer(x) * r64.to(torch::kFloat)).sum().backward();
  OSFT_CHECK_LE(rel_err(layer->u_low.grad(), before.to(torch::kFloat64) * 2), 1e-5);
}

/* Training through the glue: Adam steps on the layer's parameters move the
 * layer (aliases), project_params() keeps it orthogonal to the frozen part,
 * and the loss falls. */
OSFT_CPP_TEST(osft_linear_trains_orthogonal) {
  torch::manual_seed(11);
  const int64_t k = 16, v = 10, m = 64;
  torch::nn::Linear dense(torch::nn::LinearOptions(k, k));
  ol::OsftLinear hidden(dense, 0.5);
  torch::Tensor head = (torch::randn({v, k}) * 0.3).requires_grad_();
  std::vector<torch::Tensor> params = hidden->parameters();
  params.push_back(head);
  torch::optim::Adam opt(params, torch::optim::AdamOptions(1e-2));
  ol::LinearCrossEntropy ce;
  const torch::Tensor x = torch::randn({m, k});
  const torch::Tensor y = torch::randint(v, {m}, torch::kLong);
  const torch::Tensor w0 = hidden->merged_weight();
  double first = 0, last = 0, worst = 0;
  for (int step = 0; step < 40; ++step) {
    opt.zero_grad();
    torch::Tensor loss = ce(torch::tanh(hidden(x)), head, y);
    loss.backward();
    opt.step();
    hidden->project_params();
    worst = std::max(worst, hidden->orthogonality());
    (step == 0 ? first : last) = loss.item<double>();
  }
  std::printf("  loss %.4f -> %.4f, worst orthogonality %.2e\n", first, last, worst);
  OSFT_CHECK(last < 0.7 * first);
  OSFT_CHECK_LE(worst, 1e-5);
  OSFT_CHECK((hidden->merged_weight() - w0).abs().max().item<double>() > 1e-3);
}

/* The glue passes libtorch's thread count on to the library before a call
 * (at::set_num_threads reaches the library's pool and BLAS); a count set
 * with osftrt::set_num_threads holds until torch's next change. */
OSFT_CPP_TEST(follows_libtorch_thread_count) {
  const int before = at::get_num_threads();
  ol::LinearCrossEntropy ce;
  const torch::Tensor x = torch::randn({8, 12}), w = torch::randn({5, 12});
  const torch::Tensor y = torch::randint(5, {8}, torch::kLong);
  for (int n : {1, 3, 2}) {
    at::set_num_threads(n);
    (void)ce(x, w, y);
    OSFT_CHECK(osftrt::num_threads() == n);
  }
  osftrt::set_num_threads(1);  // the host pins another count ...
  (void)ce(x, w, y);
  OSFT_CHECK(osftrt::num_threads() == 1);  // ... which holds while torch's stays
  at::set_num_threads(3);
  (void)ce(x, w, y);
  OSFT_CHECK(osftrt::num_threads() == 3);
  at::set_num_threads(before);
}
