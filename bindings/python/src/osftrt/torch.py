"""PyTorch modules over libosftrt (zero-copy: the library reads and writes
the tensors' own storage through DLPack).

* :class:`OSFTLinear` -- the OSFT layer, built from an ``nn.Linear``; the
  trainable factors are ``nn.Parameter``\\ s the library uses in place.
  :func:`convert_linear_layers` converts chosen Linear layers of a model.
* :class:`OSFTProjector` -- projects the gradients (after ``backward()``) and
  the parameters (after ``optimizer.step()``) of every OSFT layer out of the
  frozen subspace, in one batched call; one rank or ``torch.distributed``.
* :func:`fused_linear_cross_entropy` / :class:`FusedLinearCrossEntropyLoss`
  -- the LM-head loss without materialized logits.
* :class:`TiledMLP` -- SwiGLU/GeGLU/GELU/SiLU/ReLU MLPs over tiles of tokens.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn

from . import Communicator, Context, capi, default_context

__all__ = [
    "OSFTLinear",
    "convert_linear_layers",
    "OSFTProjector",
    "fused_linear_cross_entropy",
    "FusedLinearCrossEntropyLoss",
    "TiledMLP",
    "LLAMA_LINEAR_NAMES",
]

LLAMA_LINEAR_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _context_for(tensor, context):
    if context is not None:
        return context
    ctx = default_context(tensor.device)
    if ctx.is_cuda:
        ctx.sync_torch_stream()
    return ctx


def _d(t):
    """A tensor the library may take: detached (same storage), or None."""
    return None if t is None else t.detach()


def _rows_ok(t):
    """Row-major with unit column stride (compact or padded rows)."""
    return t.dim() == 0 or t.stride(-1) == 1 and all(
        t.stride(i) == t.stride(i + 1) * t.shape[i + 1] for i in range(t.dim() - 2)
    )


def _as_rows(t):
    return t if _rows_ok(t) else t.contiguous()


# =============================================================================
# OSFT layer
# =============================================================================
class _FLinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, u_low, s_low, v_low, bias, module):
        layer = module._layer_handle()
        x = _as_rows(x)
        y = x.new_empty(x.shape[:-1] + (module.out_features,))
        capi.osft_flinear_forward(layer, x.detach(), _d(bias), y)
        ctx.module = module
        ctx.save_for_backward(x, bias)
        return y

    @staticmethod
    def backward(ctx, grad_y):
        x, bias = ctx.saved_tensors
        module = ctx.module
        need = ctx.needs_input_grad
        g = capi.osft_flinear_grads_t()
        out = [None] * 6
        if need[0]:
            out[0] = g.grad_x = torch.empty_like(x, memory_format=torch.contiguous_format)
        if need[1]:
            out[1] = g.grad_u_low = torch.empty(module.u_low.shape, dtype=module.u_low.dtype, device=x.device)
        if need[2]:
            out[2] = g.grad_s_low = torch.empty_like(module.s_low)
        if need[3]:
            out[3] = g.grad_v_low = torch.empty_like(module.v_low, memory_format=torch.contiguous_format)
        if need[4] and bias is not None:
            out[4] = g.grad_bias = torch.empty_like(bias)
        if any(o is not None for o in out):
            capi.osft_flinear_backward(module._layer_handle(), x.detach(), _as_rows(grad_y).detach(), g)
        return tuple(out)


class OSFTLinear(nn.Module):
    """A linear layer y = x W^T + b with W = U diag(S) V^T split at rank r:
    U_high, S_high, V_high frozen (buffers), U_low, S_low, V_low trainable
    (``nn.Parameter``). The library computes forward and backward on these
    tensors' own storage (caller-owned factors, osft_flinear_create_from_
    factors); an optimizer updates them in place as usual.

    Build with :meth:`from_linear`. ``merge()`` gives back an ``nn.Linear``.
    U and V^T each live in one buffer (high part first), so the high and low
    GEMMs fuse; ``u_high``/``u_low`` are column views of it.
    """

    def __init__(self, u, s, vt, rank, bias=None, *, strategy="auto", context=None):
        super().__init__()
        n, k = u.shape
        k2, kin = vt.shape
        if k != k2 or s.shape != (k,):
            raise ValueError("u, s, vt must be N x k, k and k x K")
        if not 1 <= rank <= k - 1:
            raise ValueError("rank must be in [1, k - 1] (k = %d), got %d" % (k, rank))
        self.in_features = kin
        self.out_features = n
        self.rank = rank
        self._context = context
        self._strategy = strategy
        u = u.detach().contiguous()
        vt = vt.detach().contiguous()
        s = s.detach().contiguous()
        # one storage per factor; the parameters and buffers are views of it
        self.register_buffer("_u_full", u, persistent=False)
        self.register_buffer("_s_full", s, persistent=False)
        self.register_buffer("_vt_full", vt, persistent=False)
        self.register_buffer("u_high", u[:, :rank])
        self.register_buffer("s_high", s[:rank])
        self.register_buffer("v_high", vt[:rank])
        self.u_low = nn.Parameter(u[:, rank:])
        self.s_low = nn.Parameter(s[rank:])
        self.v_low = nn.Parameter(vt[rank:])
        self.bias = nn.Parameter(bias.detach().clone()) if bias is not None else None
        self._layer = None
        self._layer_key = None

    @classmethod
    def from_linear(cls, linear: nn.Linear, rank_ratio=0.5, *, dtype=None, strategy="auto", context=None):
        """Decomposes linear.weight (SVD in float64) and keeps the top
        round(rank_ratio * min(N, K)) singular directions frozen."""
        w = linear.weight.detach()
        dtype = dtype or (w.dtype if w.dtype in (torch.float32, torch.bfloat16) else torch.float32)
        u, s, vt = torch.linalg.svd(w.to(torch.float64), full_matrices=False)
        k = s.shape[0]
        r = min(max(int(round(rank_ratio * k)), 1), k - 1)
        b = linear.bias.detach().to(dtype) if linear.bias is not None else None
        return cls(u.to(dtype), s.to(dtype), vt.to(dtype), r, b, strategy=strategy, context=context).to(w.device)

    # --- the library layer over the current storage --------------------------
    def _factors(self):
        return (self.u_high, self.s_high, self.v_high, self.u_low, self.s_low, self.v_low)

    def _layer_handle(self):
        key = tuple((t.data_ptr(), t.dtype, t.device, t.stride()) for t in self._factors())
        if self._layer is None or self._layer.closed or key != self._layer_key:
            if self._layer is not None:
                self._layer.close()
                self._layer = None
            ctx = _context_for(self.u_low, self._context)
            f = capi.osft_flinear_factors_t()
            f.u_high, f.s_high, f.v_high, f.u_low, f.s_low, f.v_low = (t.detach() for t in self._factors())
            o = capi.osft_flinear_options_t()
            o.strategy = {"auto": 0, "factorized": 1, "dense": 2}[self._strategy]
            self._layer = capi.osft_flinear_create_from_factors(ctx.handle, f, o)
            self._layer_key = key
        return self._layer

    def refresh(self):
        """Call after changing the frozen factors in place."""
        if self._layer is not None and not self._layer.closed:
            capi.osft_flinear_refresh(self._layer)

    def forward(self, x):
        return _FLinearFn.apply(x, self.u_low, self.s_low, self.v_low, self.bias, self)

    @torch.no_grad()
    def merged_weight(self, dtype=torch.float32):
        w = torch.empty(self.out_features, self.in_features, dtype=dtype, device=self.u_low.device)
        capi.osft_flinear_merge(self._layer_handle(), w)
        return w

    @torch.no_grad()
    def merge(self, dtype=torch.float32) -> nn.Linear:
        """An nn.Linear with W = U_high S_high V_high + U_low S_low V_low."""
        lin = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None, device=self.u_low.device, dtype=dtype)
        lin.weight.copy_(self.merged_weight(dtype))
        if self.bias is not None:
            lin.bias.copy_(self.bias)
        return lin

    def close(self):
        if self._layer is not None:
            self._layer.close()
            self._layer = None

    def extra_repr(self):
        return "in_features=%d, out_features=%d, frozen_rank=%d, trainable_rank=%d, bias=%s" % (
            self.in_features,
            self.out_features,
            self.rank,
            self.s_low.shape[0],
            self.bias is not None,
        )


def convert_linear_layers(model: nn.Module, names=LLAMA_LINEAR_NAMES, rank_ratio=0.5, *, dtype=None, context=None):
    """Replaces, in place, every nn.Linear of `model` whose attribute name is
    in `names` (or for which names(qualified_name, module) is true) by an
    OSFTLinear. Returns {qualified name: OSFTLinear}."""
    match = names if callable(names) else (lambda qn, m, _n=frozenset(names): qn.rsplit(".", 1)[-1] in _n)
    todo = [
        (qn, m)
        for qn, m in model.named_modules()
        if isinstance(m, nn.Linear) and not isinstance(m, OSFTLinear) and match(qn, m)
    ]
    done = {}
    for qn, m in todo:
        parent = model
        *path, leaf = qn.split(".")
        for p in path:
            parent = getattr(parent, p)
        new = OSFTLinear.from_linear(m, rank_ratio, dtype=dtype, context=context)
        setattr(parent, leaf, new)
        done[qn] = new
    return done


# =============================================================================
# Projector
# =============================================================================
_LAYOUTS = {
    None: capi.OSFT_SHARD_REPLICATED,
    "replicated": capi.OSFT_SHARD_REPLICATED,
    "u_rows": capi.OSFT_SHARD_U_ROWS,
    "rows": None,  # resolved per part
    "v_rows": capi.OSFT_SHARD_V_ROWS,
    "v_cols": capi.OSFT_SHARD_V_COLS,
    "cols": capi.OSFT_SHARD_V_COLS,
}


class OSFTProjector:
    """Keeps OSFT updates orthogonal to the frozen subspace.

    ``OSFTProjector(model)`` registers every OSFTLinear of the model;
    after ``loss.backward()`` call :meth:`project_gradients` (one batched
    library call for all layers, at most one all-reduce), after
    ``optimizer.step()`` :meth:`project_parameters`. :meth:`orthogonality`
    gives (max|U_high^T U_low|, max|V_low V_high^T|).

    comm: None (one rank), "torch" (torch.distributed, default group), a
    torch.distributed group, or an :class:`osftrt.Communicator`. Sharded
    factors (FSDP-style) are registered with :meth:`add_target`.
    """

    def __init__(self, model=None, *, comm=None, context=None, check_consistency=True):
        self._context = context
        self._modules = []
        self._targets = []  # (index, module or None)
        self._grad_keys = {}
        self._comm = None
        self._handle = None
        self._comm_arg = comm
        self._check = check_consistency
        if model is not None:
            mods = [model] if isinstance(model, OSFTLinear) else [m for m in (model.modules() if isinstance(model, nn.Module) else model) if isinstance(m, OSFTLinear)]
            for m in mods:
                self.add_module(m)

    def _ensure(self, like):
        if self._handle is None:
            self._context = self._context or _context_for(like, None)
            c = self._comm_arg
            if c is None:
                self._comm = None
            elif isinstance(c, Communicator):
                self._comm = c
            elif c == "torch":
                self._comm = Communicator.torch_distributed(self._context)
            else:
                self._comm = Communicator.torch_distributed(self._context, group=c)
            o = capi.osft_projector_options_t()
            o.check_consistency = 1 if self._check else 0
            self._handle = capi.osft_projector_create(self._context.handle, self._comm.handle if self._comm else None, o)
        return self._handle

    def add_module(self, m: OSFTLinear):
        h = self._ensure(m.u_low)
        t = capi.osft_projection_target_t()
        t.u_high, t.u_low, t.v_high, t.v_low = m.u_high.detach(), m.u_low.detach(), m.v_high.detach(), m.v_low.detach()
        idx = capi.osft_projector_add_target(h, t)
        self._targets.append((idx, m))
        self._modules.append(m)
        return idx

    def add_target(
        self,
        *,
        u_high=None,
        u_low=None,
        grad_u_low=None,
        u_layout=None,
        u_shards=None,
        v_high=None,
        v_low=None,
        grad_v_low=None,
        v_layout=None,
        v_shards=None,
    ):
        """Registers explicit (possibly sharded) tensors. Layouts: None or
        "replicated"; U: "rows" (u_shards = every rank's rows of U); V:
        "rows" (v_shards = every rank's rows of V_high) or "cols" (columns).
        Returns the target's index."""
        like = next(t for t in (u_high, v_high) if t is not None)
        h = self._ensure(like)
        t = capi.osft_projection_target_t()
        if u_high is not None:
            t.u_high, t.u_low, t.grad_u_low = _d(u_high), _d(u_low), _d(grad_u_low)
            t.u_layout = capi.OSFT_SHARD_U_ROWS if u_layout in ("rows", "u_rows") else _LAYOUTS[u_layout]
            if u_shards is not None:
                t.u_shards = list(u_shards)
                t.n_u_shards = len(u_shards)
        if v_high is not None:
            t.v_high, t.v_low, t.grad_v_low = _d(v_high), _d(v_low), _d(grad_v_low)
            t.v_layout = capi.OSFT_SHARD_V_ROWS if v_layout in ("rows", "v_rows") else _LAYOUTS[v_layout]
            if v_shards is not None:
                t.v_shards = list(v_shards)
                t.n_v_shards = len(v_shards)
        idx = capi.osft_projector_add_target(h, t)
        self._targets.append((idx, None))
        return idx

    def set_grads(self, index, grad_u_low=None, grad_v_low=None):
        capi.osft_projector_set_grads(self._handle, index, _d(grad_u_low), _d(grad_v_low))
        self._grad_keys[index] = (None if grad_u_low is None else grad_u_low.data_ptr(), None if grad_v_low is None else grad_v_low.data_ptr())

    def _bind_grads(self):
        for idx, m in self._targets:
            if m is None:
                continue
            gu, gv = m.u_low.grad, m.v_low.grad
            key = (None if gu is None else gu.data_ptr(), None if gv is None else gv.data_ptr())
            if self._grad_keys.get(idx) != key:
                self.set_grads(idx, gu, gv)

    @torch.no_grad()
    def project_gradients(self):
        """dU_low -= U_high U_high^T dU_low, dV_low -= dV_low V_high^T V_high
        for every registered layer, in one call (in place on .grad)."""
        if self._handle is None:
            return
        self._bind_grads()
        capi.osft_projector_project(self._handle)

    @torch.no_grad()
    def project_parameters(self):
        """The same projection on U_low, V_low (call after optimizer.step())."""
        if self._handle is None:
            return
        capi.osft_projector_project_params(self._handle)

    def orthogonality(self):
        """(max|U_high^T U_low|, max|V_low V_high^T|) over every target and rank."""
        if self._handle is None:
            return (0.0, 0.0)
        return tuple(capi.osft_projector_orthogonality(self._handle))

    def prepare(self):
        capi.osft_projector_prepare(self._handle)

    def invalidate(self):
        capi.osft_projector_invalidate(self._handle)

    def info(self):
        i = capi.osft_projector_info_t()
        capi.osft_projector_get_info(self._handle, i)
        return {
            k: getattr(i, k)
            for k in ("targets", "reduced_elements", "collectives_per_project", "coefficient_bytes", "gathered_bytes", "setup_pending")
        }

    def close(self):
        if self._handle is not None:
            self._handle.close()
            self._handle = None
        if self._comm is not None and self._comm is not self._comm_arg:
            self._comm.close()
        self._comm = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


# =============================================================================
# Fused linear cross-entropy
# =============================================================================
_REDUCTIONS = {"mean": capi.OSFT_FLCE_MEAN, "sum": capi.OSFT_FLCE_SUM, "none": capi.OSFT_FLCE_NONE}
_ACCUMULATORS = {"fp32": capi.OSFT_FLCE_ACCUMULATOR_FP32, "output": capi.OSFT_FLCE_ACCUMULATOR_OUTPUT}


class _FLCEHandle:
    """An osft_flce_t with its options (created per context, reused)."""

    def __init__(self, context, ignore_index, label_smoothing, z_loss_scale, softcap, reduction, accumulator,
                 memory_budget, chunk_rows, comm, vocab_offset, vocab_size_global):
        o = capi.osft_flce_options_t()
        o.ignore_index = int(ignore_index)
        o.label_smoothing = float(label_smoothing)
        o.z_loss_scale = float(z_loss_scale)
        o.softcap = float(softcap or 0.0)
        o.reduction = _REDUCTIONS[reduction]
        o.accumulator = _ACCUMULATORS[accumulator]
        o.memory_budget = int(memory_budget)
        o.chunk_rows = int(chunk_rows)
        if comm is not None:
            o.comm = comm.handle if isinstance(comm, Communicator) else comm
            o.vocab_offset = int(vocab_offset)
            o.vocab_size_global = int(vocab_size_global)
        self.reduction = reduction
        self.handle = capi.osft_flce_create(context.handle, o)

    def compute(self, x, weight, target, bias, class_weight, grad_loss, *, loss=None, grad_x=None, grad_weight=None,
                grad_bias=None, extras=None, accumulate=0):
        i = capi.osft_flce_inputs_t()
        i.x, i.weight, i.targets = x, weight, target
        if bias is not None:
            i.bias = bias
        if class_weight is not None:
            i.class_weight = class_weight
        if grad_loss is not None:
            i.grad_loss = grad_loss
        o = capi.osft_flce_outputs_t()
        if loss is not None:
            o.loss = loss
        if grad_x is not None:
            o.grad_x = grad_x
        if grad_weight is not None:
            o.grad_weight = grad_weight
        if grad_bias is not None:
            o.grad_bias = grad_bias
        for k, v in (extras or {}).items():
            setattr(o, k, v)
        o.accumulate = accumulate
        capi.osft_flce_compute(self.handle, i, o)


def _flce_extras(x, target, reduction):
    dev = x.device
    shape_loss = tuple(target.shape) if reduction == "none" else ()
    return {
        "z_loss": torch.empty(shape_loss, dtype=torch.float32, device=dev),
        "accuracy": torch.empty((), dtype=torch.float32, device=dev),
        "argmax": torch.empty(target.shape, dtype=torch.int64, device=dev),
        "token_loss": torch.empty(target.shape, dtype=torch.float32, device=dev),
    }


class _FLCEFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, target, class_weight, h, want_extras, accumulate):
        needs = ctx.needs_input_grad
        xd, wd = _as_rows(x).detach(), _as_rows(weight).detach()
        td = target.detach().contiguous()
        bd = None if bias is None else bias.detach().contiguous()
        cw = None if class_weight is None else class_weight.detach().to(torch.float32).contiguous()
        red = h.reduction
        loss = torch.empty(tuple(target.shape) if red == "none" else (), dtype=torch.float32, device=x.device)
        extras = _flce_extras(x, target, red) if want_extras else None
        # mean/sum: the gradients come from the same pass (scaled by the
        # upstream gradient in backward); none, or accumulating into .grad:
        # recomputed in backward with grad_loss.
        eager = red != "none" and not accumulate and (needs[0] or needs[1] or needs[2])
        gx = gw = gb = None
        if eager:
            gx = torch.empty_like(xd, memory_format=torch.contiguous_format) if needs[0] else None
            gw = torch.empty_like(wd, memory_format=torch.contiguous_format) if needs[1] else None
            gb = torch.empty_like(bd) if (needs[2] and bd is not None) else None
        h.compute(xd, wd, td, bd, cw, None, loss=loss, grad_x=gx, grad_weight=gw, grad_bias=gb, extras=extras)
        ctx.h = h
        ctx.eager = eager
        ctx.accumulate = accumulate
        ctx.weight_param = weight if accumulate else None
        ctx.bias_param = bias if accumulate else None
        if eager:
            ctx.save_for_backward(gx, gw, gb)
        else:
            ctx.save_for_backward(xd, wd, td, bd, cw)
        ctx.mark_non_differentiable(*(extras.values() if extras else ()))
        if extras:
            return (loss,) + tuple(extras[k] for k in ("z_loss", "accuracy", "argmax", "token_loss"))
        return loss

    @staticmethod
    def backward(ctx, grad_loss, *unused):
        needs = ctx.needs_input_grad
        if ctx.eager:
            gx, gw, gb = ctx.saved_tensors
            gl = grad_loss.to(torch.float32)
            one = bool((gl == 1).all())
            scale = (lambda t: t if (t is None or one) else t.mul_(gl.to(t.dtype)))
            return scale(gx), scale(gw), scale(gb), None, None, None, None, None
        xd, wd, td, bd, cw = ctx.saved_tensors
        gl = grad_loss.detach().to(torch.float32).contiguous()
        if ctx.h.reduction != "none":
            gl = gl.reshape(())
        gx = torch.empty_like(xd, memory_format=torch.contiguous_format) if needs[0] else None
        acc = 0
        gw = gb = None
        if ctx.accumulate:
            w, b = ctx.weight_param, ctx.bias_param
            if needs[1]:
                if w.grad is None:
                    w.grad = torch.zeros_like(w)
                gw = w.grad
                acc |= capi.OSFT_FLCE_ACCUMULATE_GRAD_WEIGHT
            if needs[2] and b is not None:
                if b.grad is None:
                    b.grad = torch.zeros_like(b)
                gb = b.grad
                acc |= capi.OSFT_FLCE_ACCUMULATE_GRAD_BIAS
        else:
            gw = torch.empty_like(wd, memory_format=torch.contiguous_format) if needs[1] else None
            gb = torch.empty_like(bd) if (needs[2] and bd is not None) else None
        if gx is not None or gw is not None or gb is not None:
            ctx.h.compute(xd, wd, td, bd, cw, gl, grad_x=gx, grad_weight=gw, grad_bias=gb, accumulate=acc)
        if ctx.accumulate:  # already added into .grad
            gw = gb = None
        return gx, gw, gb, None, None, None, None, None


_flce_cache = {}


def fused_linear_cross_entropy(
    x,
    weight,
    target,
    bias=None,
    *,
    ignore_index=-100,
    label_smoothing=0.0,
    z_loss_scale=0.0,
    softcap=0.0,
    class_weight=None,
    reduction="mean",
    accumulator="fp32",
    memory_budget=0,
    chunk_rows=0,
    accumulate=False,
    return_extras=False,
    comm=None,
    vocab_offset=0,
    vocab_size_global=0,
    context=None,
):
    """cross_entropy(x @ weight.T + bias, target) without the logits.

    x (..., H) fp32/bf16; weight (V, H) same dtype; target (...) int64/int32;
    bias (V); class_weight (V) fp32. reduction "mean" | "sum" | "none".
    label_smoothing, z_loss_scale (adds z * lse^2 per token), softcap (z =
    s tanh(z/s)), ignore_index as in F.cross_entropy. memory_budget (bytes)
    and chunk_rows pick the chunking. accumulator "fp32" | "output" (bf16
    grad_weight). accumulate=True adds the weight and bias gradients into
    weight.grad / bias.grad in place (no V x H temporary; recomputed in
    backward). return_extras=True returns (loss, extras) with z_loss,
    accuracy, argmax, token_loss. comm/vocab_offset/vocab_size_global: vocab
    parallelism (weight is this rank's rows).
    """
    ctx = _context_for(x, context)
    key = (id(ctx), ignore_index, label_smoothing, z_loss_scale, softcap, reduction, accumulator, memory_budget,
           chunk_rows, id(comm) if comm is not None else None, vocab_offset, vocab_size_global)
    h = _flce_cache.get(key)
    if h is None or h.handle.closed:
        if len(_flce_cache) > 64:
            _flce_cache.clear()
        h = _flce_cache[key] = _FLCEHandle(ctx, ignore_index, label_smoothing, z_loss_scale, softcap, reduction,
                                           accumulator, memory_budget, chunk_rows, comm, vocab_offset,
                                           vocab_size_global)
    return _flce_apply(h, x, weight, target, bias, class_weight, return_extras, accumulate)


def _flce_apply(h, x, weight, target, bias, class_weight, return_extras, accumulate):
    out = _FLCEFn.apply(x, weight, bias, target, class_weight, h, bool(return_extras), bool(accumulate))
    if return_extras:
        loss, z, acc, am, tl = out
        return loss, {"z_loss": z, "accuracy": acc, "argmax": am, "token_loss": tl}
    return out


class FusedLinearCrossEntropyLoss(nn.Module):
    """Module form of :func:`fused_linear_cross_entropy`:
    ``loss = FusedLinearCrossEntropyLoss(...)(hidden, lm_head.weight, labels)``."""

    def __init__(self, *, ignore_index=-100, label_smoothing=0.0, z_loss_scale=0.0, softcap=0.0, class_weight=None,
                 reduction="mean", accumulator="fp32", memory_budget=0, chunk_rows=0, accumulate=False,
                 return_extras=False, comm=None, vocab_offset=0, vocab_size_global=0, context=None):
        super().__init__()
        self.options = dict(ignore_index=ignore_index, label_smoothing=label_smoothing, z_loss_scale=z_loss_scale,
                            softcap=softcap, reduction=reduction, accumulator=accumulator,
                            memory_budget=memory_budget, chunk_rows=chunk_rows, comm=comm,
                            vocab_offset=vocab_offset, vocab_size_global=vocab_size_global)
        self.register_buffer("class_weight", class_weight)
        self.accumulate = accumulate
        self.return_extras = return_extras
        self._context = context
        self._h = None

    def forward(self, x, weight, target, bias=None):
        ctx = _context_for(x, self._context)
        if self._h is None or self._h.handle.closed or self._h_ctx is not ctx:
            self._h = _FLCEHandle(ctx, **self.options)
            self._h_ctx = ctx
        return _flce_apply(self._h, x, weight, target, bias, self.class_weight, self.return_extras, self.accumulate)


# =============================================================================
# Tiled MLP
# =============================================================================
_VARIANTS = {
    "swiglu": (capi.OSFT_MLP_SWIGLU, True),
    "geglu": (capi.OSFT_MLP_GEGLU_TANH, True),
    "geglu_tanh": (capi.OSFT_MLP_GEGLU_TANH, True),
    "geglu_erf": (capi.OSFT_MLP_GEGLU_ERF, True),
    "gelu": (capi.OSFT_MLP_GELU_ERF, False),
    "gelu_erf": (capi.OSFT_MLP_GELU_ERF, False),
    "gelu_tanh": (capi.OSFT_MLP_GELU_TANH, False),
    "silu": (capi.OSFT_MLP_SILU, False),
    "relu": (capi.OSFT_MLP_RELU, False),
}


class _MLPFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, wg, wu, wd, bg, bu, bd, module):
        h = module._mlp_handle()
        xd = _as_rows(x).detach()
        y = torch.empty_like(xd, memory_format=torch.contiguous_format)
        capi.osft_mlp_forward(h, xd, y, module.num_tiles)
        ctx.module = module
        ctx.save_for_backward(xd)
        return y

    @staticmethod
    def backward(ctx, grad_y):
        (xd,) = ctx.saved_tensors
        m = ctx.module
        need = ctx.needs_input_grad
        g = capi.osft_mlp_grads_t()
        out = [None] * 8
        names = (None, "grad_gate", "grad_up", "grad_down", "grad_gate_bias", "grad_up_bias", "grad_down_bias")
        srcs = (xd, m._w("gate"), m._w("up"), m._w("down"), m._b("gate"), m._b("up"), m._b("down"))
        if need[0]:
            out[0] = g.grad_x = torch.empty_like(xd, memory_format=torch.contiguous_format)
        for i in range(1, 7):
            if need[i] and srcs[i] is not None:
                out[i] = torch.empty_like(srcs[i], dtype=torch.float32 if srcs[i].dtype == torch.float32 else srcs[i].dtype,
                                          memory_format=torch.contiguous_format)
                setattr(g, names[i], out[i])
        if any(o is not None for o in out):
            capi.osft_mlp_backward(m._mlp_handle(), xd, _as_rows(grad_y).detach(), g, m.num_tiles)
        return tuple(out)


class TiledMLP(nn.Module):
    """The transformer MLP computed over tiles of tokens, with exact
    gradients: the (tokens x intermediate) activations never exist for all
    tokens at once.

    ``TiledMLP("swiglu", gate=model.mlp.gate_proj, up=..., down=...)`` over
    existing nn.Linear layers (or weight tensors/Parameters; their storage is
    borrowed, so optimizer updates are seen). Variants: swiglu, geglu
    (tanh), geglu_erf, gelu (erf), gelu_tanh, silu, relu. Tiling: tile_tokens
    (tokens per tile), memory_budget (bytes of one tile's intermediates), or
    the default (tiles of at most `hidden` tokens); num_tiles forces a count.
    """

    def __init__(self, variant="swiglu", *, gate=None, up=None, down=None, tile_tokens=None, memory_budget=None,
                 num_tiles=0, context=None):
        super().__init__()
        if variant not in _VARIANTS:
            raise ValueError("variant must be one of %s" % ", ".join(sorted(_VARIANTS)))
        self.variant = variant
        gated = _VARIANTS[variant][1]
        if gated != (gate is not None):
            raise ValueError("%s %s a gate projection" % (variant, "needs" if gated else "takes no"))
        self.gate, self.up, self.down = gate, up, down
        self.tile_tokens = tile_tokens
        self.memory_budget = memory_budget
        self.num_tiles = int(num_tiles)
        self._context = context
        self._mlp = None
        self._key = None

    def _w(self, name):
        p = getattr(self, name)
        if p is None:
            return None
        return p.weight if isinstance(p, nn.Module) else p

    def _b(self, name):
        p = getattr(self, name)
        return getattr(p, "bias", None) if isinstance(p, nn.Module) else None

    def _tensors(self):
        return [self._w(n) for n in ("gate", "up", "down")] + [self._b(n) for n in ("gate", "up", "down")]

    def _mlp_handle(self):
        ts = self._tensors()
        key = tuple(None if t is None else (t.data_ptr(), t.dtype, t.device, t.stride()) for t in ts)
        if self._mlp is None or self._mlp.closed or key != self._key:
            if self._mlp is not None:
                self._mlp.close()
                self._mlp = None
            up = self._w("up")
            ctx = _context_for(up, self._context)
            w = capi.osft_mlp_weights_t()
            for name, t in zip(("gate", "up", "down", "gate_bias", "up_bias", "down_bias"), ts):
                if t is not None:
                    setattr(w, name, t.detach())
            o = capi.osft_mlp_options_t()
            if self.tile_tokens:
                o.tiling = capi.OSFT_MLP_TILING_TOKENS
                o.tile_tokens = int(self.tile_tokens)
            elif self.memory_budget:
                o.tiling = capi.OSFT_MLP_TILING_BUDGET
                o.memory_budget = int(self.memory_budget)
            hidden, inter = up.shape[1], up.shape[0]
            self._mlp = capi.osft_mlp_create(ctx.handle, _VARIANTS[self.variant][0], hidden, inter, w, o)
            self._key = key
        return self._mlp

    def tile_count(self, tokens):
        """(tiles, largest tile) of a call over `tokens` rows."""
        return tuple(capi.osft_mlp_get_tile_count(self._mlp_handle(), int(tokens)))

    def forward(self, x):
        ts = self._tensors()
        return _MLPFn.apply(x, *ts, self)

    def close(self):
        if self._mlp is not None:
            self._mlp.close()
            self._mlp = None
