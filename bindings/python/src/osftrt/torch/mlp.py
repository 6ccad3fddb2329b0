"""The tiled transformer MLP as PyTorch autograd: :class:`TiledMLP` over
``nn.Linear`` layers, weight tensors or :class:`~osftrt.torch.OSFTLinear`
layers, and :func:`tiled_mlp` for modules that keep their own projections
(the Hugging Face MLPs patched by ``osftrt.transformers``)."""
from __future__ import annotations

import contextlib
import threading

import torch
import torch.nn as nn

from .. import capi
from ._common import (
    TransientHandles,
    as_rows,
    autocast_dtype,
    context_for,
    follow_torch_stream,
    library_dtype,
    no_autocast,
    storage_key,
)
from .linear import OSFTLinear

__all__ = ["TiledMLP", "TiledMLPPlan", "tiled_mlp", "output_unused"]

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
_ROLES = ("gate", "up", "down")
_unused = threading.local()


@contextlib.contextmanager
def output_unused():
    """Within it (this thread), tiled MLPs return zeros instead of computing
    their output, and keep for the backward what it needs (the input and
    the weights), as always: for an activation checkpoint's recompute in
    which nothing reads the MLP's output (a layer that adds it to the
    residual and ends), so that the recompute does not repeat the tiles'
    three GEMMs that the backward recomputes tile by tile anyway."""
    before = getattr(_unused, "on", False)
    _unused.on = True
    try:
        yield
    finally:
        _unused.on = before


def _weight_of(p):
    return p.weight if isinstance(p, nn.Module) else p


def _bias_of(p):
    return getattr(p, "bias", None) if isinstance(p, nn.Module) else None


def _params_of(p, dtype):
    """The autograd inputs of one projection: (weight, bias) for a dense one
    (in the compute dtype), (u_low, s_low, v_low, bias) for an OSFT layer."""
    if p is None:
        return ()
    if isinstance(p, OSFTLinear):
        return (p.u_low, p.s_low, p.v_low, p.bias)
    w = _weight_of(p)
    return (w if dtype is None else w.to(dtype), _bias_of(p))


class TiledMLPPlan(TransientHandles):
    """The options of a tiled MLP and the library handle over the current
    weights (rebuilt when their storage changes). Plain state: copies and
    pickles leave the handle behind."""

    _transient = ("_handle", "_key")

    def __init__(self, variant="swiglu", *, tile_tokens=None, memory_budget=None, num_tiles=0, context=None):
        if variant not in _VARIANTS:
            raise ValueError("variant must be one of %s" % ", ".join(sorted(_VARIANTS)))
        self.variant = variant
        self.tile_tokens = tile_tokens
        self.memory_budget = memory_budget
        self.num_tiles = int(num_tiles)
        self._context = context
        self._handle = None
        self._key = None

    @property
    def gated(self):
        return _VARIANTS[self.variant][1]

    def check(self, gate):
        if self.gated != (gate is not None):
            raise ValueError("%s %s a gate projection" % (self.variant, "needs" if self.gated else "takes no"))

    def handle(self, projs, params, dtype=None):
        """projs: (gate, up, down); params: their autograd inputs; dtype: the
        compute dtype (the activations'), else the library's default (the
        dense weights', fp32 over OSFT layers only)."""
        # keyed on the layers' factor storage, not their handles: the MLP
        # handle depends on the layers' and must go before they are rebuilt
        key = storage_key(params) + tuple(storage_key(p._factors()) for p in projs if isinstance(p, OSFTLinear))
        key += (dtype,)
        if self._handle is None or self._handle.closed or key != self._key:
            self.close()
            layers = tuple(p._layer_handle() if isinstance(p, OSFTLinear) else None for p in projs)
            w = capi.osft_mlp_weights_t()
            it = iter(params)
            for role, p, layer in zip(_ROLES, projs, layers):
                if p is None:
                    continue
                if layer is not None:
                    setattr(w, role + "_layer", layer)
                    next(it), next(it), next(it)
                else:
                    setattr(w, role, next(it).detach())
                bias = next(it)
                if bias is not None:
                    setattr(w, role + "_bias", bias.detach())
            o = capi.osft_mlp_options_t()
            if self.tile_tokens:
                o.tiling = capi.OSFT_MLP_TILING_TOKENS
                o.tile_tokens = int(self.tile_tokens)
            elif self.memory_budget:
                o.tiling = capi.OSFT_MLP_TILING_BUDGET
                o.memory_budget = int(self.memory_budget)
            if dtype is not None:  # bf16 activations over OSFT layers (bf16 or fp32 factors)
                d = capi.DLDataType()
                d.code, d.bits, d.lanes = (capi.kDLBfloat, 16, 1) if dtype == torch.bfloat16 else (capi.kDLFloat, 32, 1)
                o.dtype = d
            up = projs[1]
            hidden, inter = (up.in_features, up.out_features) if isinstance(up, nn.Module) else (up.shape[1], up.shape[0])
            ctx = context_for(params[0], self._context)
            self._handle = capi.osft_mlp_create(ctx.handle, _VARIANTS[self.variant][0], hidden, inter, w, o)
            self._key = key
        return self._handle

    def close(self):
        if self._handle is not None:
            self._handle.close()
            self._handle = None


class _MLPFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, plan, projs, x, *params):
        follow_torch_stream(x, plan._context)
        xd = as_rows(x).detach()
        if getattr(_unused, "on", False):
            y = torch.zeros_like(xd, memory_format=torch.contiguous_format)
        else:
            y = torch.empty_like(xd, memory_format=torch.contiguous_format)
            capi.osft_mlp_forward(plan.handle(projs, params, xd.dtype), xd, y, plan.num_tiles)
        ctx.plan, ctx.projs = plan, projs
        ctx.save_for_backward(xd, *params)
        return y

    @staticmethod
    def backward(ctx, grad_y):
        xd, *params = ctx.saved_tensors
        follow_torch_stream(xd, ctx.plan._context)
        need = ctx.needs_input_grad[3:]
        g = capi.osft_mlp_grads_t()
        grads = [None] * len(params)
        keep = []  # the factor-gradient structs must live until the call
        i = 0
        for role, p in zip(_ROLES, ctx.projs):
            if p is None:
                continue
            if isinstance(p, OSFTLinear):
                f = capi.osft_flinear_grads_t()
                for j, name in enumerate(("grad_u_low", "grad_s_low", "grad_v_low")):
                    if need[i + j]:
                        grads[i + j] = torch.empty_like(params[i + j], memory_format=torch.contiguous_format)
                        setattr(f, name, grads[i + j])
                setattr(g, role + "_factors", f)
                keep.append(f)
                i += 3
            else:
                if need[i]:
                    grads[i] = torch.empty_like(params[i], memory_format=torch.contiguous_format)
                    setattr(g, "grad_" + role, grads[i])
                i += 1
            if need[i] and params[i] is not None:
                grads[i] = torch.empty_like(params[i])
                setattr(g, "grad_%s_bias" % role, grads[i])
            i += 1
        gx = None
        if ctx.needs_input_grad[2]:
            gx = g.grad_x = torch.empty_like(xd, memory_format=torch.contiguous_format)
        if gx is not None or any(t is not None for t in grads):
            capi.osft_mlp_backward(ctx.plan.handle(ctx.projs, params, xd.dtype), xd, as_rows(grad_y).detach(), g, ctx.plan.num_tiles)
        return (None, None, gx, *grads)


def tiled_mlp(plan: TiledMLPPlan, x, gate, up, down):
    """y = down(act(gate(x)) * up(x)) (or down(act(up(x)))) over tiles of
    tokens, with the projections' own weights (nn.Linear, weight tensors or
    OSFTLinear; never copied, except to the autocast dtype under autocast)."""
    projs = (gate, up, down)
    dt = autocast_dtype(x)
    if dt is None:
        return _MLPFn.apply(plan, projs, x, *(t for p in projs for t in _params_of(p, None)))
    cdt = library_dtype(dt)
    params = tuple(t for p in projs for t in _params_of(p, cdt))
    with no_autocast(x.device.type):
        y = _MLPFn.apply(plan, projs, x.to(cdt), *params)
    return y.to(dt)


class TiledMLP(nn.Module):
    """The transformer MLP computed over tiles of tokens, with exact
    gradients: the (tokens x intermediate) activations never exist for all
    tokens at once.

    ``TiledMLP("swiglu", gate=model.mlp.gate_proj, up=..., down=...)`` over
    existing nn.Linear or OSFTLinear layers (or weight tensors/Parameters;
    their storage is borrowed, so optimizer updates are seen). Variants:
    swiglu, geglu (tanh), geglu_erf, gelu (erf), gelu_tanh, silu, relu.
    Tiling: tile_tokens (tokens per tile), memory_budget (bytes of one tile's
    intermediates), or the default (tiles of at most `hidden` tokens);
    num_tiles forces a count.
    """

    def __init__(self, variant="swiglu", *, gate=None, up=None, down=None, tile_tokens=None, memory_budget=None,
                 num_tiles=0, context=None):
        super().__init__()
        self.plan = TiledMLPPlan(variant, tile_tokens=tile_tokens, memory_budget=memory_budget, num_tiles=num_tiles,
                                 context=context)
        self.plan.check(gate)
        self.gate, self.up, self.down = gate, up, down

    @property
    def variant(self):
        return self.plan.variant

    @property
    def num_tiles(self):
        return self.plan.num_tiles

    def tile_count(self, tokens):
        """(tiles, largest tile) of a call over `tokens` rows."""
        projs = (self.gate, self.up, self.down)
        params = tuple(t for p in projs for t in _params_of(p, None))
        return tuple(capi.osft_mlp_get_tile_count(self.plan.handle(projs, params), int(tokens)))

    def forward(self, x):
        return tiled_mlp(self.plan, x, self.gate, self.up, self.down)

    def close(self):
        self.plan.close()
