"""The fused linear cross-entropy as PyTorch autograd:
:func:`fused_linear_cross_entropy` and :class:`FusedLinearCrossEntropyLoss`
(the LM-head loss without materialized logits)."""
from __future__ import annotations

import torch
import torch.nn as nn

from .. import Communicator, capi
from ._common import TransientHandles, as_rows, autocast_dtype, context_for, library_dtype, no_autocast

__all__ = ["fused_linear_cross_entropy", "FusedLinearCrossEntropyLoss"]

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
        self.context = context
        self.follows_torch_stream = False  # set for default contexts on CUDA

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
        xd, wd = as_rows(x).detach(), as_rows(weight).detach()
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
        if ctx.h.follows_torch_stream:  # backward may run on another torch stream
            ctx.h.context.sync_torch_stream()
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
    ctx = context_for(x, context)
    key = (id(ctx), ignore_index, label_smoothing, z_loss_scale, softcap, reduction, accumulator, memory_budget,
           chunk_rows, id(comm) if comm is not None else None, vocab_offset, vocab_size_global)
    h = _flce_cache.get(key)
    if h is None or h.handle.closed:
        if len(_flce_cache) > 64:
            _flce_cache.clear()
        h = _flce_cache[key] = _FLCEHandle(ctx, ignore_index, label_smoothing, z_loss_scale, softcap, reduction,
                                           accumulator, memory_budget, chunk_rows, comm, vocab_offset,
                                           vocab_size_global)
        h.follows_torch_stream = context is None and ctx.is_cuda
    return _flce_apply(h, x, weight, target, bias, class_weight, return_extras, accumulate)


def _flce_apply(h, x, weight, target, bias, class_weight, return_extras, accumulate):
    dt = autocast_dtype(x)
    if dt is None:
        out = _FLCEFn.apply(x, weight, bias, target, class_weight, h, bool(return_extras), bool(accumulate))
    else:  # as F.linear under autocast: x and weight in the autocast dtype; the loss stays fp32.
        # Accumulating into weight.grad needs the weight itself: x follows its dtype.
        cdt = weight.dtype if accumulate else library_dtype(dt)
        x, weight = x.to(cdt), weight.to(cdt)
        with no_autocast(x.device.type):
            out = _FLCEFn.apply(x, weight, bias, target, class_weight, h, bool(return_extras), bool(accumulate))
    if return_extras:
        loss, z, acc, am, tl = out
        return loss, {"z_loss": z, "accuracy": acc, "argmax": am, "token_loss": tl}
    return out


class FusedLinearCrossEntropyLoss(TransientHandles, nn.Module):
    """Module form of :func:`fused_linear_cross_entropy`:
    ``loss = FusedLinearCrossEntropyLoss(...)(hidden, lm_head.weight, labels)``."""

    _transient = ("_h", "_h_ctx")

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
        self._h_ctx = None

    def forward(self, x, weight, target, bias=None):
        ctx = context_for(x, self._context)
        if self._h is None or self._h.handle.closed or self._h_ctx is not ctx:
            self._h = _FLCEHandle(ctx, **self.options)
            self._h.follows_torch_stream = self._context is None and ctx.is_cuda
            self._h_ctx = ctx
        return _flce_apply(self._h, x, weight, target, bias, self.class_weight, self.return_extras, self.accumulate)


