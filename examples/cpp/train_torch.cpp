/* A short OSFT training loop in C++ on libtorch tensors, through the C++ API
 * of libosftrt (osftrt/osftrt.hpp).
 *
 * The model: a frozen random embedding, two hidden linear layers (H x H,
 * tanh after each) decomposed into OSFT layers (the top half of each
 * spectrum frozen), and a dense LM head trained with the fused linear
 * cross-entropy (the logits are never formed). The task: predict
 * (7 t + 3) mod V from token t. Every step runs forward and backward
 * through libosftrt, projects the OSFT gradients out of the frozen
 * subspace (one Projector for both layers), takes an Adam step in torch on
 * the trainable factors (at::Tensors that alias the layers' own memory) and
 * the head, projects the factors back, and checks the orthogonality.
 *
 * Tensors cross between torch and libosftrt through DLPack in both
 * directions without a copy: at::toDLPack() into osftrt::ManagedTensor
 * views, and Flinear::factor_dlpack() into at::fromDLPack(); each crossing
 * asserts that the data pointers are the same.
 *
 * Usage: osftrt_train_torch [--steps N] [--batch B] [--hidden H] [--vocab V]
 *                           [--lr LR] [--seed S] [--device cpu|cuda] [--check]
 *   --check: exit 1 unless the loss of the last 5 steps is below 60% of the
 *            first 5 steps' and every orthogonality residual is <= 1e-5.
 */
#include <ATen/ATen.h>
#include <ATen/DLConvertor.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include <osftrt/osftrt.hpp>

namespace {

struct Args {
  int steps = 80;
  int64_t batch = 64, hidden = 32, vocab = 24;
  double lr = 1e-2;
  uint64_t seed = 1;
  std::string device = "cpu";
  bool check = false;
};

Args parse(int argc, char **argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto value = [&]() -> const char * {
      if (i + 1 >= argc) throw std::invalid_argument(k + " needs a value");
      return argv[++i];
    };
    if (k == "--steps")
      a.steps = std::atoi(value());
    else if (k == "--batch")
      a.batch = std::atoll(value());
    else if (k == "--hidden")
      a.hidden = std::atoll(value());
    else if (k == "--vocab")
      a.vocab = std::atoll(value());
    else if (k == "--lr")
      a.lr = std::atof(value());
    else if (k == "--seed")
      a.seed = std::strtoull(value(), nullptr, 10);
    else if (k == "--device")
      a.device = value();
    else if (k == "--check")
      a.check = true;
    else
      throw std::invalid_argument("unknown argument " + k + " (see the file's comment)");
  }
  return a;
}

int shared_tensors = 0;  // DLPack crossings whose data pointers were checked

void require(bool ok, const std::string &what) {
  if (!ok) throw std::runtime_error(what);
}

/* A torch tensor as an osftrt view, zero-copy: the ManagedTensor keeps the
 * torch storage alive for as long as the view is used. */
struct Bound {
  osftrt::ManagedTensor owner;
  osftrt::TensorView view;
};

Bound bind(const at::Tensor &t) {
  Bound b{osftrt::ManagedTensor(at::toDLPack(t)), {}};
  b.view = b.owner.view();
  require(b.view.data() == t.data_ptr(), "DLPack copied a torch tensor");
  ++shared_tensors;
  return b;
}

/* A factor of a layer as a torch tensor over the layer's own memory; the
 * tensor keeps the layer alive (Flinear::factor_dlpack). */
at::Tensor factor_tensor(const osftrt::Flinear &layer, osft_flinear_factor_t which) {
  at::Tensor t = at::fromDLPack(layer.factor_dlpack(which));
  require(t.data_ptr() == layer.factor(which).data(), "DLPack copied a factor");
  ++shared_tensors;
  return t;
}

/* One OSFT layer and the torch side of its training: its trainable factors
 * (aliases of the layer's memory), their gradients and Adam moments. */
struct OsftLayer {
  osftrt::Flinear layer;
  std::vector<at::Tensor> params, grads, m, v;
  Bound gu, gs, gv;
};

OsftLayer decompose(const osftrt::Context &ctx, const at::Tensor &weight) {
  OsftLayer l;
  osftrt::FlinearOptions o;
  o.rank_ratio = 0.5;  // freeze the top half of the spectrum
  l.layer = osftrt::Flinear::from_weight(ctx, bind(weight).view, o);
  for (osft_flinear_factor_t f :
       {OSFT_FACTOR_U_LOW, OSFT_FACTOR_S_LOW, OSFT_FACTOR_V_LOW}) {
    l.params.push_back(factor_tensor(l.layer, f));
    l.grads.push_back(at::zeros_like(l.params.back()));
    l.m.push_back(at::zeros_like(l.params.back()));
    l.v.push_back(at::zeros_like(l.params.back()));
  }
  l.gu = bind(l.grads[0]);
  l.gs = bind(l.grads[1]);
  l.gv = bind(l.grads[2]);
  return l;
}

void adam(at::Tensor p, const at::Tensor &g, at::Tensor &m, at::Tensor &v, double lr,
          int step) {
  const double b1 = 0.9, b2 = 0.999, eps = 1e-8;
  m.mul_(b1).add_(g, 1 - b1);
  v.mul_(b2).addcmul_(g, g, 1 - b2);
  const double c1 = 1 - std::pow(b1, step), c2 = 1 - std::pow(b2, step);
  p.sub_((m / c1) / ((v / c2).sqrt() + eps) * lr);  // in place: the layer sees it
}

int run(const Args &a) {
  osftrt::check_version();
  const at::Device dev(a.device);
  osftrt::ContextOptions co;
  if (dev.is_cuda()) {
    co.device_type = OSFT_DEVICE_CUDA;
    co.device_id = dev.has_index() ? dev.index() : 0;
  }
  osftrt::Context ctx(co);  // the legacy default stream, which torch uses too
  at::manual_seed(a.seed);
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(dev);
  const int64_t B = a.batch, H = a.hidden, V = a.vocab;

  const at::Tensor emb = at::randn({V, H}, f32);
  at::Tensor head = at::randn({V, H}, f32) * (1.0 / std::sqrt(double(H)));
  OsftLayer l1 = decompose(ctx, at::randn({H, H}, f32) * (1.5 / std::sqrt(double(H))));
  OsftLayer l2 = decompose(ctx, at::randn({H, H}, f32) * (1.5 / std::sqrt(double(H))));
  osftrt::Projector proj(ctx);
  for (OsftLayer *l : {&l1, &l2}) proj.add_layer(l->layer, l->gu.view, l->gv.view);

  // Activations and gradients: allocated once, bound once, written in place.
  at::Tensor h1 = at::empty({B, H}, f32), h2 = at::empty({B, H}, f32);
  at::Tensor d_a = at::empty({B, H}, f32), d_b = at::empty({B, H}, f32);
  at::Tensor loss = at::empty({}, f32), d_head = at::zeros_like(head);
  at::Tensor m_head = at::zeros_like(head), v_head = at::zeros_like(head);
  const Bound h1b = bind(h1), h2b = bind(h2), dab = bind(d_a), dbb = bind(d_b);
  const Bound lossb = bind(loss), headb = bind(head), dheadb = bind(d_head);
  osftrt::Flce ce(ctx);

  std::vector<double> losses;
  double worst_orth = 0;
  for (int step = 1; step <= a.steps; ++step) {
    const at::Tensor x = at::randint(V, {B}, f32.dtype(at::kLong));
    const at::Tensor y = (x * 7 + 3).remainder(V);
    const at::Tensor h0 = emb.index_select(0, x).contiguous();
    const Bound h0b = bind(h0), yb = bind(y);
    // Forward: h1 = L1 h0, a = tanh h1, h2 = L2 a, b = tanh h2, loss = CE(head b, y).
    l1.layer.forward(h0b.view, h1b.view);
    const at::Tensor act1 = h1.tanh();
    const Bound ab = bind(act1);
    l2.layer.forward(ab.view, h2b.view);
    const at::Tensor act2 = h2.tanh();
    const Bound bb = bind(act2);
    osftrt::FlceInputs in;
    in.x = bb.view;
    in.weight = headb.view;
    in.targets = yb.view;
    osftrt::FlceOutputs out;
    out.loss = lossb.view;
    out.grad_x = dbb.view;          // dL/db
    out.grad_weight = dheadb.view;  // dL/dhead
    ce.compute(in, out);
    // Backward through the tanh's (torch) and the OSFT layers (libosftrt).
    const at::Tensor dh2 = d_b * (1 - act2 * act2);
    osftrt::FlinearGrads g2;
    g2.grad_x = dab.view;
    g2.grad_u_low = l2.gu.view;
    g2.grad_s_low = l2.gs.view;
    g2.grad_v_low = l2.gv.view;
    l2.layer.backward(ab.view, bind(dh2).view, g2);
    const at::Tensor dh1 = d_a * (1 - act1 * act1);
    osftrt::FlinearGrads g1;
    g1.grad_u_low = l1.gu.view;
    g1.grad_s_low = l1.gs.view;
    g1.grad_v_low = l1.gv.view;
    l1.layer.backward(h0b.view, bind(dh1).view, g1);
    // Project, step, project the parameters, check.
    proj.project();
    for (OsftLayer *l : {&l1, &l2})
      for (size_t i = 0; i < l->params.size(); ++i)
        adam(l->params[i], l->grads[i], l->m[i], l->v[i], a.lr, step);
    adam(head, d_head, m_head, v_head, a.lr, step);
    proj.project_params();
    const double orth = proj.orthogonality().max();
    worst_orth = std::max(worst_orth, orth);
    losses.push_back(loss.item<double>());
    if (step == 1 || step % 20 == 0 || step == a.steps)
      std::printf("step %3d  loss %.4f  orthogonality %.2e\n", step, losses.back(), orth);
  }
  auto mean = [&](size_t from, size_t n) {
    double s = 0;
    for (size_t i = from; i < from + n; ++i) s += losses[i];
    return s / double(n);
  };
  const size_t n = std::min<size_t>(5, losses.size());
  const double first = mean(0, n), last = mean(losses.size() - n, n);
  std::printf(
      "loss %.4f -> %.4f (mean of %zu steps), worst orthogonality %.2e, "
      "%d DLPack crossings without a copy\n",
      first, last, n, worst_orth, shared_tensors);
  if (!a.check) return 0;
  const bool ok = last < 0.6 * first && worst_orth <= 1e-5;
  std::printf("check: %s\n", ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char **argv) {
  try {
    return run(parse(argc, argv));
  } catch (const osftrt::Error &e) {
    std::fprintf(stderr, "osftrt_train_torch: %s: %s\n", e.status_name(), e.what());
  } catch (const std::exception &e) {
    std::fprintf(stderr, "osftrt_train_torch: %s\n", e.what());
  }
  return 2;
}
