/* A short OSFT training loop in C++ with libtorch, through the libtorch glue
 * of libosftrt (osftrt/torch.hpp): an ordinary torch::nn model, optimizer
 * and autograd, with libosftrt under two of its pieces.
 *
 * The model: a frozen random embedding, two hidden linear layers (H x H,
 * tanh after each) turned into OSFT layers (osftrt::libtorch::OsftLinear:
 * the top half of each spectrum frozen, the trainable factors registered as
 * parameters over the layers' own memory), and a dense LM head whose output
 * and loss are one fused call (osftrt::libtorch::LinearCrossEntropy: the
 * logits are never formed). The task: predict (7 t + 3) mod V from token t.
 * torch::optim::Adam steps the trainable factors and the head; the factor
 * gradients come out of backward already projected out of the frozen
 * subspace, and project_params() after each step keeps the factors there;
 * the orthogonality is checked every step.
 *
 * The lines that involve libosftrt are marked "// osftrt" (9, the #include
 * among them): that is all a libtorch program needs for an output layer and
 * its loss, and for OSFT on its hidden layers.
 *
 * Usage: osftrt_train_torch [--steps N] [--batch B] [--hidden H] [--vocab V]
 *                           [--lr LR] [--seed S] [--device cpu|cuda] [--check]
 *   --check: exit 1 unless the loss of the last 5 steps is below 60% of the
 *            first 5 steps' and every orthogonality residual is <= 1e-5.
 */
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include <osftrt/torch.hpp>  // osftrt

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

/* The model: embedding -> OSFT -> tanh -> OSFT -> tanh -> (head: in the loss). */
struct Model : torch::nn::Module {
  Model(int64_t vocab, int64_t hidden, const torch::Device &dev) {
    torch::nn::Linear dense1(hidden, hidden), dense2(hidden, hidden);
    for (torch::nn::Linear *d : {&dense1, &dense2}) {
      torch::NoGradGuard no_grad;
      (*d)->weight.normal_(0.0, 1.5 / std::sqrt(double(hidden)));
      (*d)->to(dev);
    }
    emb = torch::randn({vocab, hidden}, torch::TensorOptions().device(dev));
    l1 = register_module("l1", osftrt::libtorch::OsftLinear(dense1, 0.5));  // osftrt
    l2 = register_module("l2", osftrt::libtorch::OsftLinear(dense2, 0.5));  // osftrt
    head = register_parameter(
        "head", torch::randn({vocab, hidden}, emb.options()) / std::sqrt(double(hidden)));
  }
  /* The last hidden state of tokens t. */
  torch::Tensor hidden(const torch::Tensor &t) {
    return torch::tanh(l2(torch::tanh(l1(emb.index_select(0, t)))));
  }
  torch::Tensor emb, head;  // the embedding stays frozen
  osftrt::libtorch::OsftLinear l1{nullptr}, l2{nullptr};
};

int run(const Args &a) {
  osftrt::check_version();
  const torch::Device dev(a.device);
  torch::manual_seed(a.seed);
  Model model(a.vocab, a.hidden, dev);
  torch::optim::Adam opt(model.parameters(), torch::optim::AdamOptions(a.lr));
  osftrt::libtorch::LinearCrossEntropy ce;  // osftrt

  std::vector<double> losses;
  double worst_orth = 0;
  for (int step = 1; step <= a.steps; ++step) {
    const torch::Tensor x = torch::randint(
        a.vocab, {a.batch}, torch::TensorOptions(torch::kLong).device(dev));
    const torch::Tensor y = (x * 7 + 3).remainder(a.vocab);
    opt.zero_grad();
    torch::Tensor loss = ce(model.hidden(x), model.head, y);  // osftrt
    loss.backward();
    opt.step();
    model.l1->project_params();  // osftrt
    model.l2->project_params();  // osftrt
    const double orth =
        std::max(model.l1->orthogonality(), model.l2->orthogonality());  // osftrt
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
  std::printf("loss %.4f -> %.4f (mean of %zu steps), worst orthogonality %.2e\n", first,
              last, n, worst_orth);
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
