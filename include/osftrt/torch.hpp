/**
 * @file osftrt/torch.hpp
 * @brief Header-only glue between libtorch (the PyTorch C++ API) and
 * libosftrt, over the C++ API of osftrt/osftrt.hpp.
 *
 * Include it in a program that uses libtorch (it includes <torch/torch.h>);
 * nothing of it is compiled into libosftrt, which links no libtorch. It
 * calls public libosftrt functions only, through osftrt.hpp, and libtorch's
 * public C++ API (tested with Debian's libtorch 1.13 as C++17 and with the
 * libtorch of PyTorch 2.15, which needs C++20).
 *
 * What it gives:
 *  - view(t): a torch tensor as an osftrt::TensorView, zero-copy (the tensor
 *    must outlive the calls the view is passed to); hold(t): the same, and
 *    the view keeps the tensor's storage alive; tensor(view, owner): the
 *    reverse, an at::Tensor over an osftrt buffer that keeps `owner` alive
 *    (factor(layer, which) for a layer's factors).
 *  - LinearCrossEntropy: torch.nn.functional.cross_entropy(x W^T + b, y) as
 *    one fused call (osft_flce_compute: the logits are never formed), a
 *    torch::autograd::Function underneath (LinearCrossEntropyFunction): the
 *    forward computes the loss and, when autograd will need them, the
 *    gradients of x, W and b in the same call; the backward scales them by
 *    the upstream gradient.
 *  - OsftLinear: an OSFT layer (osft_flinear_t) as a torch::nn::Module:
 *    decomposed from a weight or an nn::Linear, its trainable factors
 *    U_low, S_low, V_low registered as parameters (they alias the layer's
 *    own memory: an optimizer step on them is a step on the layer), an
 *    autograd Function underneath (OsftLinearFunction) whose backward
 *    projects the factor gradients out of the frozen subspace;
 *    project_params() after each optimizer step keeps the factors there.
 *
 * A classifier's output layer and loss through libosftrt (e.g. PyTorch's C++
 * TREC sentence classifier, a 6 x 300 output layer):
 * @code
 *   #include <osftrt/torch.hpp>
 *   osftrt::libtorch::LinearCrossEntropy ce;             // once
 *   // instead of  loss = cross_entropy(fc(features), labels):
 *   auto loss = ce(features, fc->weight, labels, fc->bias);
 *   loss.backward();                                   // fc's grads as before
 * @endcode
 * and a hidden layer trained with OSFT:
 * @code
 *   osftrt::libtorch::OsftLinear hidden(dense_hidden, 0.5);  // the top half frozen
 *   torch::optim::Adam opt(hidden->parameters(), 1e-3);
 *   auto loss = ce(torch::tanh(hidden(x)), head->weight, labels);
 *   loss.backward();  opt.step();  hidden->project_params();
 * @endcode
 *
 * Devices: CPU tensors, and CUDA tensors on the legacy default stream (what
 * torch uses unless a stream is set): the contexts made here run there.
 * Pass your own osftrt::Context (with the stream of your choice) to the
 * constructors otherwise. dtypes: fp32 and bf16 (the library's).
 *
 * Threads: before each call into libosftrt the glue passes libtorch's
 * intra-op thread count (at::get_num_threads()) on to the library
 * (osft_set_num_threads()) when it changed, so at::set_num_threads()
 * reaches the library's pool and its BLAS as it reaches torch's own ops.
 *
 * Thread safety: an object of this header is used by one thread at a time
 * (its context's rule); different objects on different threads are
 * independent.
 */
#ifndef OSFTRT_TORCH_HPP
#define OSFTRT_TORCH_HPP

#include <ATen/DLConvertor.h>
#include <torch/torch.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <osftrt/osftrt.hpp>

namespace osftrt {
namespace libtorch {

// ============================================================ tensor views

/**
 * @brief The DLPack dtype of a torch dtype.
 * @param s  The scalar type: float, double, bfloat16, int32 or int64.
 * @return The DLDataType.
 * @throws Error OSFT_STATUS_DTYPE_MISMATCH for any other.
 */
inline DLDataType dtype_of(at::ScalarType s) {
  switch (s) {
    case at::kFloat: return DLDataType{kDLFloat, 32, 1};
    case at::kDouble: return DLDataType{kDLFloat, 64, 1};
    case at::kBFloat16: return DLDataType{kDLBfloat, 16, 1};
    case at::kInt: return DLDataType{kDLInt, 32, 1};
    case at::kLong: return DLDataType{kDLInt, 64, 1};
    default: break;
  }
  detail::throw_error(OSFT_STATUS_DTYPE_MISMATCH,
                      std::string("osftrt::torch: a tensor of dtype ") +
                          c10::toString(s) +
                          " (libosftrt takes float, bfloat16, double, int32, int64)");
}

/**
 * @brief The DLPack device of a torch device.
 * @param d  A CPU or CUDA device (no index: the current CUDA device).
 * @return {kDLCPU, 0} or {kDLCUDA, index}.
 * @throws Error OSFT_STATUS_DEVICE_MISMATCH for any other device type.
 */
inline DLDevice device_of(const at::Device &d) {
  if (d.is_cpu()) return cpu_device();
  if (d.is_cuda())
    return cuda_device(
        d.has_index()
            ? d.index()
            : c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getDevice().index());
  detail::throw_error(
      OSFT_STATUS_DEVICE_MISMATCH,
      "osftrt::torch: a tensor on " + d.str() + " (libosftrt runs on the CPU and CUDA)");
}

/**
 * @brief A view of a torch tensor: its data (storage offset included),
 * dtype, device, sizes and strides, zero-copy. Borrowed: `t` (or another
 * reference to its storage) must stay alive while the view is used. Any
 * strides: each libosftrt call checks what its argument needs.
 * @param t  A defined tensor (an undefined one gives an empty view: "no
 *           tensor").
 * @return The view.
 * @throws Error as dtype_of() and device_of(); OSFT_STATUS_NOT_SUPPORTED for
 *   more than TensorView::max_dims dimensions.
 */
inline TensorView view(const at::Tensor &t) {
  if (!t.defined()) return TensorView();
  DLTensor d{};
  d.data = t.data_ptr();
  d.device = device_of(t.device());
  d.ndim = static_cast<int32_t>(t.dim());
  d.dtype = dtype_of(t.scalar_type());
  d.shape = const_cast<int64_t *>(t.sizes().data());
  d.strides = const_cast<int64_t *>(t.strides().data());
  return TensorView(d);  // copies the sizes and strides
}

/**
 * @brief A view of an optional tensor (empty for none).
 * @param t  The tensor, or nullopt.
 * @return The view.
 * @throws Error as view(const at::Tensor &).
 */
inline TensorView view(const c10::optional<at::Tensor> &t) {
  return t.has_value() ? view(*t) : TensorView();
}

/**
 * @brief A view that keeps its tensor (and so its storage) alive. Converts
 * to the TensorView the osftrt.hpp API takes.
 */
struct HeldView {
  at::Tensor tensor; /**< the reference that keeps the memory alive */
  TensorView view;   /**< the view of it */
  /** @brief The view. @return view. */
  operator const TensorView &() const noexcept { return view; }
};

/**
 * @brief view(t), keeping a reference to `t`.
 * @param t  The tensor.
 * @return The held view.
 * @throws Error as view().
 */
inline HeldView hold(const at::Tensor &t) {
  return HeldView{t, view(t)};
}

/**
 * @brief An at::Tensor over the memory of an osftrt view (zero-copy) that
 * keeps `owner` alive until torch frees the tensor.
 * @param v      The view (not empty; float, bfloat16, double, int32 or
 *               int64; on the CPU or a CUDA device).
 * @param owner  What owns the memory (e.g. Flinear::owner()), or empty when
 *               the caller guarantees the memory outlives the tensor.
 * @return The tensor (requires_grad false).
 * @throws Error OSFT_STATUS_INVALID_ARGUMENT for an empty view.
 */
inline at::Tensor tensor(const TensorView &v, std::shared_ptr<void> owner = {}) {
  return at::fromDLPack(to_dlpack(v, std::move(owner)));
}

/**
 * @brief One factor of an OSFT layer as an at::Tensor over the layer's own
 * memory (writing it writes the layer); it keeps the layer alive.
 * @param layer  The layer.
 * @param which  The factor.
 * @return The tensor.
 * @throws Error as Flinear::factor().
 */
inline at::Tensor factor(const Flinear &layer, osft_flinear_factor_t which) {
  return at::fromDLPack(layer.factor_dlpack(which));
}

/**
 * @brief A context on the device of `t`: the CPU, or its CUDA device on the
 * legacy default stream (torch's stream unless one is set).
 * @param device  The torch device.
 * @return The context.
 * @throws Error as Context's constructor (e.g. OSFT_STATUS_NO_DEVICE).
 */
inline Context context_for(const at::Device &device) {
  ContextOptions o;
  const DLDevice d = device_of(device);
  if (d.device_type == kDLCUDA) {
    o.device_type = OSFT_DEVICE_CUDA;
    o.device_id = d.device_id;
  }
  return Context(o);
}

/// @cond internal
namespace glue {

/* A 0-element CPU tensor whose storage keeps `owner` alive: lets an
 * autograd context (whose saved data are IValues) hold a C++ object until
 * its graph is freed. */
inline at::Tensor keep_alive(std::shared_ptr<void> owner) {
  static char anchor;
  auto holder = std::make_shared<std::shared_ptr<void>>(std::move(owner));
  return at::from_blob(
      &anchor, {0}, [holder](void *) mutable { holder.reset(); },
      at::TensorOptions().dtype(at::kByte));
}

/* The contiguous form of an argument the C API reads as compact rows. */
inline at::Tensor compact(const at::Tensor &t) {
  return t.defined() ? t.contiguous() : t;
}

inline at::Tensor empty_like_if(bool want, const at::Tensor &t) {
  return want && t.defined() ? at::empty_like(t, at::MemoryFormat::Contiguous)
                             : at::Tensor();
}

}  // namespace glue
/// @endcond

// ================================================== fused linear cross-entropy

/**
 * @brief What LinearCrossEntropyFunction works with: one Flce handle (its
 * options fix the loss: ignore_index, reduction, label smoothing, z-loss,
 * softcap) on one context. Shared with the autograd graphs that use it.
 */
struct FlceState {
  FlceOptions opts; /**< its options */
  Flce flce;        /**< the handle (it keeps its context alive) */
  /** @brief A handle with `o` on `c`. @param c The context. @param o The options. */
  FlceState(const Context &c, const FlceOptions &o) : opts(o), flce(c, opts) {}
};

/// @cond internal
namespace glue {
/* libtorch's intra-op thread count passed on to libosftrt before a call,
 * when it changed since the last one passed (both counts are process-wide):
 * at::set_num_threads reaches the library's pool and its BLAS as it reaches
 * torch's own ops. One libtorch query per call, no library call in the
 * steady state; a count set with osftrt::set_num_threads holds until
 * torch's next change. */
inline void follow_torch_threads() {
  static std::atomic<int> passed{0};
  const int n = at::get_num_threads();
  if (n > 0 && n != passed.load(std::memory_order_relaxed)) {
    osftrt::set_num_threads(n);
    passed.store(n, std::memory_order_relaxed);
  }
}
/* The object behind saved_data[key] (a pointer kept as an integer; a
 * keep_alive() tensor beside it keeps the object itself). */
template <class T>
void save_owner(::torch::autograd::AutogradContext *ctx, const std::shared_ptr<T> &p) {
  ctx->saved_data["osftrt_owner"] = keep_alive(p);
  ctx->saved_data["osftrt_ptr"] =
      static_cast<int64_t>(reinterpret_cast<intptr_t>(p.get()));
}
template <class T>
T *saved_owner(::torch::autograd::AutogradContext *ctx) {
  return reinterpret_cast<T *>(
      static_cast<intptr_t>(ctx->saved_data["osftrt_ptr"].toInt()));
}
}  // namespace glue
/// @endcond

/**
 * @brief torch::autograd::Function of the fused linear cross-entropy:
 * apply(x, weight, targets, bias, state) returns the loss of
 * cross_entropy(x weight^T + bias, targets) under state->opts (a scalar for
 * MEAN and SUM, one per token for NONE).
 *
 * MEAN and SUM: the forward computes the loss and, in the same call, the
 * gradients of the inputs that require one (three GEMMs; no logits kept);
 * the backward multiplies them by the upstream gradient (nothing to do when
 * it is 1 on the CPU). NONE: the forward computes the loss alone (one GEMM),
 * the backward the gradients with the per-token upstream gradient (three
 * GEMMs). x: (..., H); weight: (V, H); targets: (...), int64 or int32;
 * bias: (V) or nullopt; fp32 or bf16, on one device. Non-contiguous
 * arguments are made contiguous first (a copy).
 */
class LinearCrossEntropyFunction
    : public ::torch::autograd::Function<LinearCrossEntropyFunction> {
 public:
  /**
   * @brief The loss (see the class).
   * @param ctx      The autograd context.
   * @param x        (..., H).
   * @param weight   (V, H).
   * @param targets  (...).
   * @param bias     (V), or nullopt.
   * @param state    The handle (kept alive until the graph is freed).
   * @return The loss.
   * @throws Error as osft_flce_compute().
   */
  static at::Tensor forward(::torch::autograd::AutogradContext *ctx, const at::Tensor &x,
                            const at::Tensor &weight, const at::Tensor &targets,
                            const c10::optional<at::Tensor> &bias,
                            const std::shared_ptr<FlceState> &state) {
    glue::follow_torch_threads();
    const at::Tensor xc = glue::compact(x), wc = glue::compact(weight);
    const at::Tensor yc = glue::compact(targets);
    const at::Tensor bc = bias.has_value() ? glue::compact(*bias) : at::Tensor();
    const bool per_token = state->opts.reduction == OSFT_FLCE_NONE;
    const auto f32 = x.options().dtype(at::kFloat);
    at::Tensor loss = per_token ? at::empty(targets.sizes(), f32) : at::empty({}, f32);
    FlceInputs in;
    in.x = view(xc);
    in.weight = view(wc);
    in.targets = view(yc);
    in.bias = view(bc);
    FlceOutputs out;
    out.loss = view(loss);
    glue::save_owner(ctx, state);
    ctx->saved_data["per_token"] = per_token;
    if (per_token) {  // the gradients need each token's upstream gradient
      state->flce.compute(in, out);
      ctx->save_for_backward({xc, wc, yc, bc});
      return loss;
    }
    const bool want_b = bias.has_value() && bias->requires_grad();
    const at::Tensor gx = glue::empty_like_if(x.requires_grad(), xc);
    const at::Tensor gw = glue::empty_like_if(weight.requires_grad(), wc);
    const at::Tensor gb = glue::empty_like_if(want_b, bc);
    out.grad_x = view(gx);
    out.grad_weight = view(gw);
    out.grad_bias = view(gb);
    state->flce.compute(in, out);
    ctx->saved_data["grad_x"] = gx;
    ctx->saved_data["grad_weight"] = gw;
    ctx->saved_data["grad_bias"] = gb;
    return loss;
  }

  /**
   * @brief The gradients of x, weight and bias (none for targets and state).
   * @param ctx       The autograd context.
   * @param grad_out  The upstream gradient of the loss.
   * @return {grad_x, grad_weight, undefined, grad_bias, undefined}.
   * @throws Error as osft_flce_compute() (NONE).
   */
  static ::torch::autograd::variable_list backward(
      ::torch::autograd::AutogradContext *ctx,
      ::torch::autograd::variable_list grad_out) {
    const at::Tensor &g = grad_out[0];
    if (ctx->saved_data["per_token"].toBool()) return per_token_backward(ctx, g);
    at::Tensor gx = ctx->saved_data["grad_x"].toTensor();
    at::Tensor gw = ctx->saved_data["grad_weight"].toTensor();
    at::Tensor gb = ctx->saved_data["grad_bias"].toTensor();
    const bool one = g.device().is_cpu() && g.numel() == 1 && g.item<double>() == 1.0;
    if (!one)
      for (at::Tensor *t : {&gx, &gw, &gb})
        if (t->defined()) *t = *t * g.to(t->scalar_type());
    return {gx, gw, at::Tensor(), gb, at::Tensor()};
  }

 private:
  /* NONE: the gradients from the saved inputs, the per-token upstream
   * gradient as grad_loss (the logits computed again). */
  static ::torch::autograd::variable_list per_token_backward(
      ::torch::autograd::AutogradContext *ctx, const at::Tensor &g) {
    glue::follow_torch_threads();
    const ::torch::autograd::variable_list saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &w = saved[1], &y = saved[2], &b = saved[3];
    const at::Tensor gl = g.to(at::kFloat).contiguous();
    const at::Tensor gx = glue::empty_like_if(ctx->needs_input_grad(0), x);
    const at::Tensor gw = glue::empty_like_if(ctx->needs_input_grad(1), w);
    const at::Tensor gb = glue::empty_like_if(b.defined() && ctx->needs_input_grad(3), b);
    if (gx.defined() || gw.defined() || gb.defined()) {
      FlceInputs in;
      in.x = view(x);
      in.weight = view(w);
      in.targets = view(y);
      in.bias = view(b);
      in.grad_loss = view(gl);
      FlceOutputs out;
      out.grad_x = view(gx);
      out.grad_weight = view(gw);
      out.grad_bias = view(gb);
      glue::saved_owner<FlceState>(ctx)->flce.compute(in, out);
    }
    return {gx, gw, at::Tensor(), gb, at::Tensor()};
  }
};

/**
 * @brief The fused linear cross-entropy as a callable: loss = ce(x, weight,
 * targets, bias), the value and the gradients (through autograd) of
 * torch::nn::functional::cross_entropy(torch::nn::functional::linear(x,
 * weight, bias), targets) under its options, without the logits.
 *
 * Its context is made on the device of the first call's x (see
 * context_for()), again when a later call's x is on another device; or
 * given. Where autograd will not run (no argument requires grad, or grad
 * mode is off) the call computes the loss alone.
 */
class LinearCrossEntropy {
 public:
  /**
   * @brief The loss of `opts` (default: mean over the tokens, ignore_index
   * -100), its context made on first use.
   * @param opts  The options.
   */
  explicit LinearCrossEntropy(const FlceOptions &opts = FlceOptions()) : opts_(opts) {}
  /**
   * @brief The same on a given context (its device and stream).
   * @param ctx   The context.
   * @param opts  The options.
   * @throws Error as osft_flce_create().
   */
  LinearCrossEntropy(const Context &ctx, const FlceOptions &opts)
      : opts_(opts), state_(std::make_shared<FlceState>(ctx, opts)), fixed_(true) {}

  /**
   * @brief The loss.
   * @param x        (..., H), fp32 or bf16.
   * @param weight   (V, H), x's dtype.
   * @param targets  (...), int64 or int32; ignore_index where ignored.
   * @param bias     (V) or undefined.
   * @return A scalar (MEAN, SUM) or per-token (NONE) fp32 tensor; with
   *   autograd, its backward gives x, weight and bias their gradients.
   * @throws Error as osft_flce_compute() (a message naming the argument).
   */
  at::Tensor operator()(const at::Tensor &x, const at::Tensor &weight,
                        const at::Tensor &targets,
                        const at::Tensor &bias = at::Tensor()) {
    const std::shared_ptr<FlceState> &s = state_for(x.device());
    const c10::optional<at::Tensor> b =
        bias.defined() ? c10::optional<at::Tensor>(bias) : c10::nullopt;
    const bool grad = ::torch::autograd::GradMode::is_enabled() &&
                      (x.requires_grad() || weight.requires_grad() ||
                       (bias.defined() && bias.requires_grad()));
    if (grad) return LinearCrossEntropyFunction::apply(x, weight, targets, b, s);
    glue::follow_torch_threads();
    const at::Tensor xc = glue::compact(x), wc = glue::compact(weight);
    const at::Tensor yc = glue::compact(targets), bc = glue::compact(bias);
    const auto f32 = x.options().dtype(at::kFloat);
    at::Tensor loss = s->opts.reduction == OSFT_FLCE_NONE
                          ? at::empty(targets.sizes(), f32)
                          : at::empty({}, f32);
    FlceInputs in;
    in.x = view(xc);
    in.weight = view(wc);
    in.targets = view(yc);
    in.bias = view(bc);
    s->flce.forward(in, view(loss));
    return loss;
  }

  /**
   * @brief The handle's options.
   * @return The options.
   */
  const FlceOptions &options() const noexcept { return opts_; }
  /**
   * @brief The handle of the last call's device (null before the first).
   * @return The state.
   */
  const std::shared_ptr<FlceState> &state() const noexcept { return state_; }

 private:
  const std::shared_ptr<FlceState> &state_for(const at::Device &d) {
    if (state_ && (fixed_ || state_device_ == d)) return state_;
    const Context ctx = context_for(d);
    state_ = std::make_shared<FlceState>(ctx, opts_);
    state_device_ = d;
    return state_;
  }

  FlceOptions opts_;
  std::shared_ptr<FlceState> state_;
  at::Device state_device_ = at::kCPU;
  bool fixed_ = false;
};

// ============================================================ the OSFT layer

/**
 * @brief What OsftLinearFunction works with: the layer, its own projector
 * (one target: this layer) and the persistent gradient buffers of U_low and
 * V_low the projector is bound to. Shared with the autograd graphs.
 */
struct OsftState {
  Flinear layer;     /**< the layer (it keeps its context alive) */
  Projector proj;    /**< projects this layer's gradients and factors */
  at::Tensor grad_u; /**< dU_low, N x l, written by each backward */
  at::Tensor grad_v; /**< dV_low, l x K, likewise */
};

/**
 * @brief torch::autograd::Function of an OSFT layer: apply(x, u_low, s_low,
 * v_low, bias, state) returns y = x W^T + bias with W = U S V^T (the frozen
 * part and the trainable factors; u_low, s_low and v_low are the tensors of
 * factor(state->layer, ...), aliases of the layer's memory, passed so that
 * autograd gives them gradients). The backward computes dx and the factor
 * gradients in one call and projects dU_low and dV_low out of the frozen
 * subspace before handing them to autograd.
 */
class OsftLinearFunction : public ::torch::autograd::Function<OsftLinearFunction> {
 public:
  /**
   * @brief y (see the class).
   * @param ctx    The autograd context.
   * @param x      (..., K).
   * @param u_low  The layer's U_low.
   * @param s_low  The layer's S_low.
   * @param v_low  The layer's V_low.
   * @param bias   (N) or nullopt.
   * @param state  The layer (kept alive until the graph is freed).
   * @return (..., N).
   * @throws Error as osft_flinear_forward().
   */
  static at::Tensor forward(::torch::autograd::AutogradContext *ctx, const at::Tensor &x,
                            const at::Tensor &u_low, const at::Tensor &s_low,
                            const at::Tensor &v_low,
                            const c10::optional<at::Tensor> &bias,
                            const std::shared_ptr<OsftState> &state) {
    glue::follow_torch_threads();
    (void)u_low;  // the layer reads its factors itself: the same memory
    (void)s_low;
    (void)v_low;
    const at::Tensor xc = glue::compact(x);
    std::vector<int64_t> shape(xc.sizes().begin(), xc.sizes().end());
    shape.back() = state->layer.dims().out_features;
    at::Tensor y = at::empty(shape, xc.options());
    const at::Tensor b = bias.has_value() ? glue::compact(*bias) : at::Tensor();
    state->layer.forward(view(xc), view(b), view(y));
    ctx->save_for_backward({xc});
    ctx->saved_data["has_bias"] = bias.has_value();
    glue::save_owner(ctx, state);
    return y;
  }

  /**
   * @brief dx, dU_low, dS_low, dV_low (the first and last projected), db.
   * @param ctx       The autograd context.
   * @param grad_out  dL/dy.
   * @return {dx, dU_low, dS_low, dV_low, db, undefined}.
   * @throws Error as osft_flinear_backward() and osft_projector_project().
   */
  static ::torch::autograd::variable_list backward(
      ::torch::autograd::AutogradContext *ctx,
      ::torch::autograd::variable_list grad_out) {
    glue::follow_torch_threads();
    OsftState *s = glue::saved_owner<OsftState>(ctx);
    const at::Tensor x = ctx->get_saved_variables()[0];
    const at::Tensor gy = grad_out[0].contiguous();
    const bool has_bias = ctx->saved_data["has_bias"].toBool();
    const at::Tensor gx = glue::empty_like_if(ctx->needs_input_grad(0), x);
    const at::Tensor gs =
        at::empty({s->layer.dims().trainable_rank}, s->grad_u.options());
    const at::Tensor gb = has_bias && ctx->needs_input_grad(4)
                              ? at::empty({s->layer.dims().out_features}, gy.options())
                              : at::Tensor();
    FlinearGrads g;
    g.grad_x = view(gx);
    g.grad_u_low = view(s->grad_u);
    g.grad_s_low = view(gs);
    g.grad_v_low = view(s->grad_v);
    g.grad_bias = view(gb);
    s->layer.backward(view(x), view(gy), g);
    s->proj.project();
    // grad_u/grad_v stay referenced here, so autograd copies (or adds) them
    // into .grad rather than taking them over: the next backward rewrites them.
    return {gx, s->grad_u, gs, s->grad_v, gb, at::Tensor()};
  }
};

/**
 * @brief An OSFT layer as a torch::nn::Module (use it through the
 * OsftLinear holder, like torch::nn::Linear).
 *
 * Made from a dense weight (and bias): W = U S V^T decomposed by libosftrt,
 * the top rank_ratio of the spectrum frozen. Parameters: u_low (N x l),
 * s_low (l), v_low (l x K) -- aliases of the layer's own memory, so an
 * optimizer's in-place step updates the layer -- and bias (N) when the
 * dense layer had one. Call project_params() after each optimizer step (the
 * gradients are projected in backward; an optimizer such as Adam scales them
 * per element, which leaks into the frozen subspace without it).
 *
 * Do not move it to another device or dtype (.to()): its parameters would
 * no longer be the layer's memory; make it from a weight on the device and
 * in the dtype it will run in. merged_weight() writes the dense W (for
 * saving).
 */
class OsftLinearImpl : public ::torch::nn::Module {
 public:
  /**
   * @brief Decomposes `weight` (N x K) on `ctx` (default: a context on the
   * weight's device); `bias` (N) is copied into the bias parameter.
   * @param weight  The dense weight (only read).
   * @param bias    The dense bias, or undefined.
   * @param opts    The layer's options (rank_ratio: the frozen fraction).
   * @throws Error as osft_flinear_create_from_weight().
   */
  explicit OsftLinearImpl(const at::Tensor &weight, const at::Tensor &bias = at::Tensor(),
                          const FlinearOptions &opts = FlinearOptions())
      : OsftLinearImpl(context_for(weight.device()), weight, bias, opts) {}
  /**
   * @brief The same on a given context.
   * @param ctx     The context (the weight's device).
   * @param weight  The dense weight.
   * @param bias    The dense bias, or undefined.
   * @param opts    The options.
   * @throws Error as osft_flinear_create_from_weight().
   */
  OsftLinearImpl(const Context &ctx, const at::Tensor &weight, const at::Tensor &bias,
                 const FlinearOptions &opts)
      : state_(std::make_shared<OsftState>()) {
    ::torch::NoGradGuard no_grad;
    const at::Tensor w = weight.detach().contiguous();
    state_->layer = Flinear::from_weight(ctx, view(w), opts);
    u_low = register_parameter("u_low", factor(state_->layer, OSFT_FACTOR_U_LOW));
    s_low = register_parameter("s_low", factor(state_->layer, OSFT_FACTOR_S_LOW));
    v_low = register_parameter("v_low", factor(state_->layer, OSFT_FACTOR_V_LOW));
    if (bias.defined()) bias_ = register_parameter("bias", bias.detach().clone());
    state_->grad_u = at::zeros_like(u_low);
    state_->grad_v = at::zeros_like(v_low);
    state_->proj = Projector(ctx);
    state_->proj.add_layer(state_->layer, view(state_->grad_u), view(state_->grad_v));
  }
  /**
   * @brief From a torch::nn::Linear (its weight and bias).
   * @param dense       The dense layer.
   * @param rank_ratio  The frozen fraction of the spectrum.
   * @throws Error as osft_flinear_create_from_weight().
   */
  OsftLinearImpl(const ::torch::nn::Linear &dense, double rank_ratio)
      : OsftLinearImpl(dense->weight, dense->bias, ratio(rank_ratio)) {}

  /**
   * @brief y = x W^T + bias.
   * @param x  (..., K).
   * @return (..., N).
   * @throws Error as osft_flinear_forward().
   */
  at::Tensor forward(const at::Tensor &x) {
    const c10::optional<at::Tensor> b =
        bias_.defined() ? c10::optional<at::Tensor>(bias_) : c10::nullopt;
    return OsftLinearFunction::apply(x, u_low, s_low, v_low, b, state_);
  }
  /**
   * @brief Projects the trainable factors back out of the frozen subspace
   * (osft_projector_project_params()): after each optimizer step.
   * @throws Error as osft_projector_project_params().
   */
  void project_params() {
    glue::follow_torch_threads();
    state_->proj.project_params();
  }
  /**
   * @brief The orthogonality residual of the trainable factors against the
   * frozen ones (osft_projector_orthogonality()).
   * @return max(|U_high^T U_low|, |V_low V_high^T|).
   * @throws Error as osft_projector_orthogonality().
   */
  double orthogonality() { return state_->proj.orthogonality().max(); }
  /**
   * @brief The dense weight U S V^T (N x K, a new tensor).
   * @return The weight.
   * @throws Error as osft_flinear_merge().
   */
  at::Tensor merged_weight() const {
    const FlinearDims d = state_->layer.dims();
    at::Tensor w = at::empty({d.out_features, d.in_features}, u_low.options());
    state_->layer.merge(view(w));
    return w;
  }
  /** @brief The layer. @return It. */
  const Flinear &layer() const noexcept { return state_->layer; }

  at::Tensor u_low; /**< parameter: the layer's U_low (N x l) */
  at::Tensor s_low; /**< parameter: the layer's S_low (l) */
  at::Tensor v_low; /**< parameter: the layer's V_low (l x K) */

 private:
  static FlinearOptions ratio(double r) {
    FlinearOptions o;
    o.rank_ratio = r;
    return o;
  }
  at::Tensor bias_;
  std::shared_ptr<OsftState> state_;
};

/** @brief The module holder of OsftLinearImpl (as torch::nn::Linear is). */
TORCH_MODULE(OsftLinear);

}  // namespace libtorch
}  // namespace osftrt

#endif
