"""The OSFT layer as a PyTorch module: :class:`OSFTLinear` (W = U S V^T,
frozen high part, trainable low part) and :func:`convert_linear_layers`."""
from __future__ import annotations

import math

import torch
import torch.nn as nn

from .. import capi
from . import linear_state
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

__all__ = ["OSFTLinear", "convert_linear_layers", "frozen_rank", "LLAMA_LINEAR_NAMES"]

LLAMA_LINEAR_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_STRATEGIES = {"auto": 0, "factorized": 1, "dense": 2, "hybrid": 3}


_RANK_ROUNDINGS = ("round", "floor")
_FACTOR_NAMES = ("u_high", "s_high", "v_high", "u_low", "s_low", "v_low")


def frozen_rank(k, rank_ratio, rank_rounding="round"):
    """The frozen rank r of a layer with k = min(N, K) singular values at
    `rank_ratio`: round(rank_ratio * k) (rank_rounding="round") or
    floor(rank_ratio * k) ("floor", mini_trainer's rule), within [1, k - 1]."""
    if rank_rounding not in _RANK_ROUNDINGS:
        raise ValueError("rank_rounding must be one of %s, got %r" % (", ".join(_RANK_ROUNDINGS), rank_rounding))
    r = round(rank_ratio * k) if rank_rounding == "round" else math.floor(rank_ratio * k)
    return min(max(int(r), 1), k - 1)


class _FLinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, u_low, s_low, v_low, bias, module):
        follow_torch_stream(x, module._context)
        layer = module._layer_handle()
        x = as_rows(x)
        y = x.new_empty(x.shape[:-1] + (module.out_features,))
        capi.osft_flinear_forward(layer, x.detach(), None if bias is None else bias.detach(), y)
        ctx.module = module
        # the factors' shapes and dtypes (no module attribute lookups in the
        # backward; not the tensors: FSDP2 refills them between the passes)
        ctx.factors = tuple((t.shape, t.dtype) for t in (u_low, s_low, v_low))
        ctx.save_for_backward(x, bias)
        return y

    @staticmethod
    def backward(ctx, grad_y):
        x, bias = ctx.saved_tensors
        module = ctx.module
        follow_torch_stream(x, module._context)
        need = ctx.needs_input_grad
        g = capi.osft_flinear_grads_t()
        out = [None] * 6
        if need[0]:
            out[0] = g.grad_x = torch.empty_like(x, memory_format=torch.contiguous_format)
        (u_shape, u_dtype), (s_shape, s_dtype), (v_shape, v_dtype) = ctx.factors
        if need[1]:
            out[1] = g.grad_u_low = torch.empty(u_shape, dtype=u_dtype, device=x.device)
        if need[2]:
            out[2] = g.grad_s_low = torch.empty(s_shape, dtype=s_dtype, device=x.device)
        if need[3]:
            out[3] = g.grad_v_low = torch.empty(v_shape, dtype=v_dtype, device=x.device)
        if need[4] and bias is not None:
            out[4] = g.grad_bias = torch.empty_like(bias)
        if any(o is not None for o in out):
            capi.osft_flinear_backward(module._layer_handle(), x.detach(), as_rows(grad_y).detach(), g)
        return tuple(out)


def _storage_ptr(t):
    return t.untyped_storage().data_ptr() if hasattr(t, "untyped_storage") else t.storage().data_ptr()


def _adjacent(hi, lo, dim, r):
    """lo follows hi along dim in one storage (views of one tensor)."""
    return (_storage_ptr(hi) == _storage_ptr(lo) and hi.stride() == lo.stride()
            and lo.data_ptr() == hi.data_ptr() + r * hi.stride(dim) * hi.element_size())


class OSFTLinear(TransientHandles, nn.Module):
    """A linear layer y = x W^T + b with W = U diag(S) V^T split at rank r:
    U_high, S_high, V_high frozen (buffers), U_low, S_low, V_low trainable
    (``nn.Parameter``). The library computes forward and backward on these
    tensors' own storage (caller-owned factors, osft_flinear_create_from_
    factors); an optimizer updates them in place as usual.

    Build with :meth:`from_linear`. ``merge()`` gives back an ``nn.Linear``.

    The dense W that the dense and hybrid strategies rebuild from the
    trainable factors is kept until they change (one rebuild per optimizer
    step, shared by every micro-batch of a gradient accumulation): the layer
    reports a change to the library when torch's version counter of
    ``u_low``, ``s_low`` or ``v_low`` moved (every in-place write through
    the parameter, as optimizers do), and :class:`OSFTProjector`'s parameter
    projection reports its own writes. A write that bypasses the version
    counter (``p.data.copy_(...)``, DLPack) needs :meth:`factors_changed`
    (on the CPU the library's fingerprints catch it anyway). Memory the
    library keeps per layer besides the factors: W (N x K fp32) and the
    frozen product (another N x K), or, where the trainable part is small
    (2*l*(N+K) <= N*K: a square layer at rank_ratio >= 0.75), W and a copy
    of the low product's operands (l*(N+K)), W then following each change
    by the change of its low product (``include/osftrt/flinear.h``,
    "Memory").
    S and V^T each live in one buffer (high part first), so the high and low
    GEMMs over V fuse; ``v_high``/``v_low`` are row views of it. U's parts
    are separate compact tensors: a column view of one U would not be
    compact, and PyTorch's fused AdamW (``transformers.Trainer``'s default
    optimizer) writes a non-compact parameter as if it were compact, over
    U_high's columns.

    Behaves like the ``nn.Linear`` it replaces: any leading dims, non-
    contiguous inputs, fp32 or bf16, ``torch.autocast`` (the input is cast to
    the autocast dtype and so is the output; bf16 is computed in bf16 with
    fp32 accumulation, fp16 in fp32), ``state_dict``, ``copy.deepcopy`` and
    ``pickle`` (the copy creates its own library handle on first use).
    """

    _transient = ("_layer", "_layer_key", "_factor_versions", "_dense_weight_ref")

    def __init__(self, u, s, vt, rank, bias=None, *, strategy="auto", context=None):
        super().__init__()
        n, k = u.shape
        k2, kin = vt.shape
        if k != k2 or s.shape != (k,):
            raise ValueError("u, s, vt must be N x k, k and k x K")
        if not 1 <= rank <= k - 1:
            raise ValueError("rank must be in [1, k - 1] (k = %d), got %d" % (k, rank))
        if strategy not in _STRATEGIES:
            raise ValueError("strategy must be one of %s" % ", ".join(_STRATEGIES))
        self.in_features = kin
        self.out_features = n
        self.rank = rank
        self._context = context
        self._strategy = strategy
        u = u.detach().contiguous()
        vt = vt.detach().contiguous()
        s = s.detach().contiguous()
        # one storage for S and V^T, the parameters and buffers views of it
        # (rows: compact); U's parts compact on their own (see above)
        self.register_buffer("_s_full", s, persistent=False)
        self.register_buffer("_vt_full", vt, persistent=False)
        self.register_buffer("u_high", u[:, :rank].contiguous())
        self.register_buffer("s_high", s[:rank])
        self.register_buffer("v_high", vt[:rank])
        self.u_low = nn.Parameter(u[:, rank:].contiguous())
        self.s_low = nn.Parameter(s[rank:])
        self.v_low = nn.Parameter(vt[rank:])
        self.bias = nn.Parameter(bias.detach().clone()) if bias is not None else None
        self._layer = None
        self._layer_key = None
        self._factor_versions = None
        self._dense_weight_ref = None
        self.frozen_version = 0  # counts refresh(): changes of the frozen factors

    @classmethod
    def from_linear(cls, linear: nn.Linear, rank_ratio=0.5, *, dtype=None, strategy="auto", context=None,
                    rank_rounding="round"):
        """Decomposes linear.weight (SVD in float64) and keeps the top
        round(rank_ratio * min(N, K)) singular directions frozen (floor with
        rank_rounding="floor", see frozen_rank)."""
        w = linear.weight.detach()
        if hasattr(w, "device_mesh") and hasattr(w, "placements"):  # a DTensor (FSDP2, tensor parallel)
            raise TypeError("the weight is a sharded DTensor: convert the model before fully_shard "
                            "(and call osftrt.torch.distributed.prepare_fsdp2 between the two)")
        dtype = dtype or (w.dtype if w.dtype in (torch.float32, torch.bfloat16) else torch.float32)
        u, s, vt = torch.linalg.svd(w.to(torch.float64), full_matrices=False)
        k = s.shape[0]
        r = frozen_rank(k, rank_ratio, rank_rounding)
        b = linear.bias.detach().to(dtype) if linear.bias is not None else None
        return cls(u.to(dtype), s.to(dtype), vt.to(dtype), r, b, strategy=strategy, context=context).to(w.device)

    @classmethod
    def from_factors(cls, factors, bias=None, *, strategy="auto", context=None):
        """An OSFTLinear over copies of saved factors -- a mapping with
        ``u_high``, ``s_high``, ``v_high``, ``u_low``, ``s_low``, ``v_low``
        (a checkpoint's, see :func:`linear_state.read_factors`) -- with no
        decomposition: the frozen subspace exactly as it was saved."""
        f = {n: factors[n].detach() for n in linear_state.FACTORS}
        u = torch.cat([f["u_high"], f["u_low"]], 1)
        s = torch.cat([f["s_high"], f["s_low"]])
        vt = torch.cat([f["v_high"], f["v_low"]], 0)
        b = None if bias is None else bias.detach().to(u.dtype)
        return cls(u, s, vt, f["u_high"].shape[1], b, strategy=strategy, context=context)

    # --- the library layer over the current storage --------------------------
    def _factors(self):
        return (self.u_high, self.s_high, self.v_high, self.u_low, self.s_low, self.v_low)

    def _layer_handle(self):
        # Called twice per forward + backward: the factors straight from the
        # module's dicts (nn.Module.__getattr__ took a third of this call,
        # which was ~10 us of a 2 x 2 layer's ~120 us; issue 55).
        # The backward asks again rather than reusing the forward's handle:
        # FSDP2 frees the gathered factors after the forward and gathers
        # them anew, elsewhere, for the backward.
        b, p = self._buffers, self._parameters
        try:  # a factor may be a parameter or a buffer (prepare_fsdp2 makes the frozen ones parameters)
            factors = tuple(p[n] if n in p else b[n] for n in _FACTOR_NAMES)
        except KeyError:  # elsewhere: as nn.Module finds it
            factors = self._factors()
        key = storage_key(factors)
        if self._layer is None or self._layer.closed or key != self._layer_key:
            self.close()
            ctx = context_for(factors[3], self._context)
            f = capi.osft_flinear_factors_t()
            f.u_high, f.s_high, f.v_high, f.u_low, f.s_low, f.v_low = (t.detach() for t in factors)
            o = capi.osft_flinear_options_t()
            o.strategy = _STRATEGIES[self._strategy]
            # changes are reported (below), so the rebuilt W is kept on
            # every device, not only where the library fingerprints
            o.trainable_updates = capi.OSFT_FLINEAR_UPDATES_REPORTED
            self._layer = capi.osft_flinear_create_from_factors(ctx.handle, f, o)
            self._layer_key = key
            self._factor_versions = self._versions()
        versions = (factors[3]._version, factors[4]._version, factors[5]._version)
        if versions != self._factor_versions:
            capi.osft_flinear_mark_updated(self._layer)
            self._factor_versions = versions
        return self._layer

    def _versions(self):
        return (self.u_low._version, self.s_low._version, self.v_low._version)

    def factors_changed(self):
        """Reports a change of u_low, s_low or v_low made without torch's
        version counter seeing it (``.data`` writes, DLPack, the library's
        projection): the kept dense W is rebuilt at the next call."""
        if self._layer is not None and not self._layer.closed:
            capi.osft_flinear_mark_updated(self._layer)

    def info(self):
        """The library layer's counters: {"rebuilds", "frozen_builds",
        "trainable_version", "weight_kept"} (osft_flinear_info_t)."""
        i = capi.osft_flinear_info_t()
        capi.osft_flinear_get_info(self._layer_handle(), i)
        return {k: getattr(i, k) for k in ("rebuilds", "frozen_builds", "trainable_version", "weight_kept")}

    def refresh(self):
        """Call after changing the frozen factors in place (load_state_dict
        calls it): the layer's caches of the frozen part are dropped, and
        projectors that cache a gather of them (the FSDP2 projector's V_high)
        see ``frozen_version`` move and gather again."""
        self.frozen_version = getattr(self, "frozen_version", 0) + 1
        if self._layer is not None and not self._layer.closed:
            capi.osft_flinear_refresh(self._layer)

    # --- checkpoints: the factors plus the dense weight (linear_state.py) ---
    @property
    def weight(self):
        """The dense W (N x K, the factors' dtype), merged from the current
        factors: what an ``nn.Linear`` in this place would hold. A new tensor
        without grad; writing to it does not change the layer."""
        return linear_state.dense_weight(self)

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        linear_state.unshare_views(destination, prefix, keep_vars)
        destination[prefix + "weight"] = linear_state.dense_weight(self)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        errors = linear_state.incoming_errors(self, state_dict, prefix)
        if errors:  # refuse before copying anything
            error_msgs.extend(errors)
            return
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)
        if prefix + "weight" in unexpected_keys:  # checked against the factors above
            unexpected_keys.remove(prefix + "weight")
        # load_state_dict copies into the factors in place: the layer's
        # caches of the frozen part (the dense strategy's) must go
        self.refresh()

    # --- S and V^T one storage each, kept across copies, pickles and .to() ---
    def _fuse(self):
        """Makes S and V^T one storage each again (high part first) where
        deepcopy (nn.Parameter copies its data alone), pickle or .to() gave
        the parts storage of their own: the layer fuses the high and low
        GEMMs only over adjacent parts. The parameters stay the same objects."""
        r = self.rank
        for full, hi_name, lo_name, dim in (("_s_full", "s_high", "s_low", 0), ("_vt_full", "v_high", "v_low", 0)):
            hi, lo = self._buffers.get(hi_name), self._parameters.get(lo_name)
            if hi is None or lo is None or type(hi) is not torch.Tensor or type(lo.data) is not torch.Tensor:
                continue  # tensor subclasses (FSDP's DTensors, ...) keep their own layout
            if hi.dtype != lo.dtype or hi.device != lo.device or hi.is_meta or _adjacent(hi, lo, dim, r):
                continue
            whole = torch.cat([hi.detach(), lo.detach()], dim)
            self._buffers[full] = whole
            self._buffers[hi_name] = whole.narrow(dim, 0, r)
            lo.data = whole.narrow(dim, r, lo.shape[dim])

    def __setstate__(self, state):
        super().__setstate__(state)
        self._fuse()

    def _apply(self, fn, *args, **kwargs):
        out = super()._apply(fn, *args, **kwargs)
        self._fuse()
        return out

    def forward(self, x):
        dt = autocast_dtype(x)
        if dt is None:
            return _FLinearFn.apply(x, self.u_low, self.s_low, self.v_low, self.bias, self)
        with no_autocast(x.device.type):
            y = _FLinearFn.apply(x.to(library_dtype(dt)), self.u_low, self.s_low, self.v_low, self.bias, self)
        return y.to(dt)

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


def _parent_of(model, qualified_name):
    parent = model
    *path, leaf = qualified_name.split(".")
    for p in path:
        parent = getattr(parent, p)
    return parent, leaf


def convert_linear_layers(model: nn.Module, names=LLAMA_LINEAR_NAMES, rank_ratio=0.5, *, dtype=None, context=None,
                          factors=None, rank_rounding="round"):
    """Replaces, in place, every nn.Linear of `model` whose attribute name is
    in `names` (or for which names(qualified_name, module) is true) by an
    OSFTLinear. Returns {qualified name: OSFTLinear}.

    factors: None (decompose each weight), or saved factors by qualified
    name ({name: {"u_high": ..., ...}}, e.g. :func:`linear_state.read_factors`
    of a checkpoint of this model): every converted layer is built from its
    own (the layer's current weight is not used); a layer without factors
    there, or whose factors are of another shape or frozen rank than
    `rank_ratio` gives, is an error naming the layer, and nothing is
    converted. rank_rounding: "round" (default) or "floor" (mini_trainer's
    rule: its splits exactly) for the frozen rank, see frozen_rank."""
    match = names if callable(names) else (lambda qn, m, _n=frozenset(names): qn.rsplit(".", 1)[-1] in _n)
    todo = [
        (qn, m)
        for qn, m in model.named_modules()
        if isinstance(m, nn.Linear) and not isinstance(m, OSFTLinear) and match(qn, m)
    ]
    if factors is not None:
        linear_state.check_saved_factors(factors, [(qn, m.weight.shape) for qn, m in todo],
                                         lambda k: frozen_rank(k, rank_ratio, rank_rounding))
    done = {}
    for qn, m in todo:
        parent, leaf = _parent_of(model, qn)
        if factors is None:
            new = OSFTLinear.from_linear(m, rank_ratio, dtype=dtype, context=context, rank_rounding=rank_rounding)
        else:
            new = OSFTLinear.from_factors(factors[qn], m.bias, context=context).to(m.weight.device)
        setattr(parent, leaf, new)
        done[qn] = new
    return done
