"""Long-context training in one setting: ``apply_osftrt(model,
activation_memory=...)``.

The memory a step's activations take is, per token, what every layer keeps
for the backward plus one layer's working set, plus the scratch of the loss
and of the MLP. This module arranges each part so that the step keeps
about the floor:

* per-layer activation checkpointing (Hugging Face's, non-reentrant): each
  decoder layer keeps only its input, ``hidden x dtype`` bytes per token,
  and recomputes the rest in the backward;
* on a GPU, those checkpoints offloaded to pinned host memory on a side
  stream in the forward and brought back on it one layer ahead of the
  backward (:class:`CheckpointOffloader`), so the device holds at most two
  layers' inputs;
* the fused cross-entropy's ``memory_budget`` and the tiled MLP's tile
  budget set to constants (no scratch that grows with the tokens);
* in a checkpoint's recompute, the tiled MLP keeps its input but does not
  compute its output where the family's layer only adds it to the
  residual (its backward recomputes each tile anyway): the recompute
  costs the attention half only;
* the RMSNorms computed by :func:`osftrt.torch.rms_norm`, whose backward
  keeps only the input (kept anyway) and one float per token: Hugging
  Face's keeps the normalized rows too and makes full-size temporaries in
  its backward, about a quarter of a recomputed layer's working set.

``activation_memory`` is the bytes the step's activations may use, or
``"min"`` (alias ``"as long as possible"``): the smallest scratch that keeps
the GEMMs efficient. The budget sizes the scratch (a sixteenth each for the
loss and the MLP tile, within bounds); the sequence that fits is then about
``(activation_memory - scratch) / floor_bytes_per_token(...)["total"]``
tokens.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import weakref

import torch

from ..torch.mlp import output_unused
from ._patch import swap_classes

MIN_ALIASES = ("min", "as long as possible")
_MiB = 1 << 20
# The scratch under "min": chunks of at least MIN_LOSS_ROWS token rows of
# logits (fewer make every chunk's read-modify-write of the head's gradient
# dominate; bench/results/flce_default_budget_cpu.md) and tiles of at least
# MIN_MLP_ROWS tokens (GEMMs near full speed), never under MIN_SCRATCH.
MIN_LOSS_ROWS = 128
MIN_MLP_ROWS = 256
MIN_SCRATCH = 4 * _MiB
MAX_SCRATCH = 1 << 30
# Saved tensors smaller than this stay on the device (masks, positions).
OFFLOAD_MIN_BYTES = 1 * _MiB


@dataclasses.dataclass
class LongContextPlan:
    """What ``activation_memory`` arranged (:attr:`Patched.long_context`)."""

    activation_memory: object  # bytes, or "min"
    loss_memory_budget: int  # fused_linear_cross_entropy's memory_budget
    mlp_memory_budget: int  # TiledMLPPlan(memory_budget=...)
    checkpointing: bool  # per-layer, keeping only the layer input
    offloader: "CheckpointOffloader | None"  # None: checkpoints stay where they are
    lean_norms: int = 0  # RMSNorm modules swapped for the lean one (apply_plan)
    mlp_skipped_in_recompute: bool = False  # the recompute leaves the MLP's unread output uncomputed (apply_plan)

    def after_loss(self, hidden, context=None):
        """Frees the loss's scratch (the workspace of `context`, else of the
        default context of hidden's device) once the fused loss has run:
        its chunks of logits are the largest scratch of the step, and the
        backward that follows needs only the MLP's smaller tile."""
        from .. import default_context

        (context or default_context(hidden.device)).release_workspace()


def parse_activation_memory(value):
    """None, "min", or a positive number of bytes."""
    if value is None:
        return None
    if isinstance(value, str):
        if value.strip().lower() in MIN_ALIASES:
            return "min"
        raise ValueError("activation_memory: bytes or one of %s, got %r" % (", ".join(map(repr, MIN_ALIASES)), value))
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError("activation_memory: a positive number of bytes, got %r" % (value,))
    return int(value)


def mlp_tile_bytes_per_token(config, dtype_bytes):
    """What one token of an MLP tile takes in the backward (osftrt/mlp.h:
    three intermediates of a gated MLP, and with a 16-bit dtype the fp32
    sum of grad_x)."""
    e = int(dtype_bytes)
    return 3 * int(config.intermediate_size) * e + (4 * int(config.hidden_size) if e < 4 else 0)


def scratch_budgets(config, activation_memory, dtype_bytes=4):
    """(loss memory_budget, MLP tile budget) in bytes for a budget (bytes or
    "min") and the activations' dtype size: under "min" the least that keeps
    the GEMMs efficient (MIN_LOSS_ROWS rows of fp32 logits, MIN_MLP_ROWS
    tokens of MLP tile, each at least MIN_SCRATCH); under a budget a
    sixteenth of it each, at least that, at most MAX_SCRATCH."""
    vp = (int(config.vocab_size) + 15) // 16 * 16
    loss_floor = max(MIN_SCRATCH, MIN_LOSS_ROWS * 4 * vp)
    mlp_floor = max(MIN_SCRATCH, MIN_MLP_ROWS * mlp_tile_bytes_per_token(config, dtype_bytes))
    if activation_memory == "min":
        return loss_floor, mlp_floor
    share = activation_memory // 16
    return min(MAX_SCRATCH, max(loss_floor, share)), min(MAX_SCRATCH, max(mlp_floor, share))


def floor_bytes_per_token(config, dtype_bytes):
    """The activation bytes per token at the peak of a step with per-layer
    checkpointing, from the shapes: what must be alive then, however the
    ops are written (the figure bench_long_context.py prints the knob's
    slope against):

    * ``checkpoints``: layers x hidden x dtype (each layer's input);
    * ``layer``: the working set of the layer being differentiated, at the
      larger of its two moments: (a) the MLP half's backward: the gradient
      coming in, the attention inputs kept for later (the input norm's
      output, rotated q and k, v, the attention output and its log-sum-exp),
      the post-attention residual, and the MLP input's gradient with the
      norm's gradient made from it; (b) the attention backward: the
      residual's gradient (the incoming one summed in), the input norm's
      output, q, k, v, the output and its gradient, and q's, k's and v's
      gradients;
    * ``shared``: what every layer reads for the whole step: the rotary
      cos and sin (2 x head_dim x dtype) and the token ids and labels;
    * ``total``: their sum. Constant scratch (the loss's chunks, the MLP's
      tile, the weights' gradients) is not per token."""
    h = int(config.hidden_size)
    heads = int(config.num_attention_heads)
    kv = int(getattr(config, "num_key_value_heads", None) or heads)
    hd = int(getattr(config, "head_dim", None) or h // heads)
    q, k = heads * hd, kv * hd
    layers = int(config.num_hidden_layers)
    b = int(dtype_bytes)
    checkpoints = layers * h * b
    attention_kept = h + q + 2 * k + q  # norm output, q, k, v, output
    mlp_moment = h + attention_kept + h + 2 * h  # in, kept, residual, MLP input's and norm's gradients
    attention_moment = h + attention_kept + q + (q + 2 * k)  # residual's gradient, kept, d out, dq dk dv
    layer = max(mlp_moment, attention_moment) * b + heads * 4
    shared = 2 * hd * b + 8 + 8
    return {"checkpoints": checkpoints, "layer": layer, "shared": shared, "total": checkpoints + layer + shared,
            "checkpoint_per_layer": h * b}


# --- offloading the checkpoints -------------------------------------------------
class _CudaCopies:
    """The copies of :class:`CheckpointOffloader` on CUDA: device to pinned
    host and back, on one side stream per device, ordered by events against
    the compute stream."""

    def __init__(self):
        self._streams = {}

    def _side(self, device):
        s = self._streams.get(device)
        if s is None:
            s = self._streams[device] = torch.cuda.Stream(device)
        return s

    def wants(self, t):
        return t.device.type == "cuda"

    def to_host(self, t):
        side, cur = self._side(t.device), torch.cuda.current_stream(t.device)
        side.wait_stream(cur)  # the producer of t first
        with torch.cuda.stream(side):
            host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
            host.copy_(t, non_blocking=True)
        t.record_stream(side)  # t's memory is not reused before the copy ends
        return host

    def to_device(self, host, device):
        side = self._side(device)  # after this host's own copy in (same stream)
        with torch.cuda.stream(side):
            dev = torch.empty(host.shape, dtype=host.dtype, device=device)
            dev.copy_(host, non_blocking=True)
            done = torch.cuda.Event()
            done.record(side)
        return dev, done

    def ready(self, dev, done):
        cur = torch.cuda.current_stream(dev.device)
        cur.wait_event(done)
        dev.record_stream(cur)  # allocated on the side stream, used here
        return dev


class _Packed:
    """One offloaded tensor: its host copy, its device, the one packed
    before it (the next to come back in the backward) and, once prefetched,
    its device copy and the event that completes it."""

    __slots__ = ("host", "device", "prev", "fetched", "__weakref__")

    def __init__(self, host, device, prev):
        self.host, self.device, self.prev, self.fetched = host, device, prev, None


class CheckpointOffloader:
    """Saved-tensor hooks (torch.autograd.graph.saved_tensors_hooks) around
    each layer's checkpoint: the layer input the checkpoint saves goes to
    pinned host memory in the forward; in the backward, bringing back layer
    k's input starts bringing back layer k-1's on the side stream, so the
    copy runs while layer k recomputes and differentiates.

    `copies` does the device work (default CUDA; tests pass a fake that
    copies between CPU tensors); tensors `copies.wants` not, or smaller than
    min_bytes, stay as they are. Counters: offloaded, fetched, prefetched."""

    def __init__(self, min_bytes=OFFLOAD_MIN_BYTES, copies=None):
        self.min_bytes = int(min_bytes)
        self.copies = copies if copies is not None else _CudaCopies()
        self._last = None  # weakref to the last _Packed
        self.offloaded = self.fetched = self.prefetched = 0

    def pack(self, t):
        if t.numel() * t.element_size() < self.min_bytes or not self.copies.wants(t):
            return t
        last = self._last() if self._last is not None else None
        with torch.no_grad():  # copies of data, outside the graph
            host = self.copies.to_host(t)
        p = _Packed(host, t.device, weakref.ref(last) if last is not None else None)
        self._last = weakref.ref(p)
        self.offloaded += 1
        return p

    def unpack(self, p):
        if not isinstance(p, _Packed):
            return p
        with torch.no_grad():
            return self._fetch(p)

    def _fetch(self, p):
        if p.fetched is not None:
            dev, done = p.fetched
            p.fetched = None
        else:
            dev, done = self.copies.to_device(p.host, p.device)
            self.fetched += 1
        prev = p.prev() if p.prev is not None else None
        if prev is not None and prev.fetched is None:
            prev.fetched = self.copies.to_device(prev.host, prev.device)
            self.prefetched += 1
        return self.copies.ready(dev, done)

    def checkpoint(self, function, *args, **kwargs):
        """torch.utils.checkpoint.checkpoint (non-reentrant) with the saved
        inputs offloaded: a drop-in for a layer's _gradient_checkpointing_func."""
        kwargs.setdefault("use_reentrant", False)
        with torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack):
            return torch.utils.checkpoint.checkpoint(function, *args, **kwargs)


# --- applying it ------------------------------------------------------------------
def _checkpointed_layers(model):
    return [m for m in model.modules() if getattr(m, "gradient_checkpointing", False)
            and hasattr(m, "_gradient_checkpointing_func")]


def _recompute_without_mlp_output():
    """torch.utils.checkpoint's context_fn: nothing around the forward,
    output_unused() around the recompute."""
    return contextlib.nullcontext(), output_unused()


def _checkpoint_takes_context_fn():
    return "context_fn" in inspect.signature(torch.utils.checkpoint.checkpoint).parameters


def enable_checkpointing(model, offloader=None, skip_mlp_in_recompute=False):
    """Hugging Face's per-layer activation checkpointing, non-reentrant (each
    layer keeps its input), with `offloader`'s checkpoint function on every
    checkpointed layer when given, and with skip_mlp_in_recompute the tiled
    MLPs' outputs left uncomputed in the recompute (only for layers that
    merely add that output to the residual). Returns the layers."""
    kwargs = {"use_reentrant": False}
    if skip_mlp_in_recompute:
        kwargs["context_fn"] = _recompute_without_mlp_output
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:
        enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    layers = _checkpointed_layers(model)
    if offloader is not None:
        for m in layers:
            m._gradient_checkpointing_func = functools.partial(offloader.checkpoint, **kwargs)
    return layers


def disable_checkpointing(model):
    disable = getattr(model, "activation_checkpointing_disable", None) or model.gradient_checkpointing_disable
    disable()


def plan_long_context(model, activation_memory, offload=None):
    """The :class:`LongContextPlan` for `model` (a transformers causal LM)
    and a budget; offload None: where CUDA is available, offload the
    checkpoints of layers whose inputs are on a GPU (decided per tensor, so
    a model moved to the GPU after apply_osftrt offloads too); True: that,
    even where CUDA is not (yet) available; False: never. Without an
    offloader the checkpoints are Hugging Face's own (and saved-tensor hooks
    of the caller's, e.g. torch.autograd.graph.save_on_cpu, still see the
    layer inputs)."""
    budget = parse_activation_memory(activation_memory)
    if budget is None:
        return None
    dtype_bytes = next(model.parameters()).element_size()
    loss, mlp = scratch_budgets(model.config, budget, dtype_bytes)
    if offload is None:
        offload = torch.cuda.is_available()
    offloader = CheckpointOffloader() if offload else None
    return LongContextPlan(budget, loss, mlp, True, offloader)


def apply_plan(model, plan, family):
    """Turns on the plan's checkpointing (its recompute without the MLP's
    output where the family allows) and the family's lean RMSNorm (the
    budgets go to the loss and the MLP through apply_osftrt); remembered
    for :func:`undo`."""
    if plan is None:
        return
    plan.mlp_skipped_in_recompute = family.mlp_output_unsaved and _checkpoint_takes_context_fn()
    enable_checkpointing(model, plan.offloader, plan.mlp_skipped_in_recompute)
    if family.norm is not None:
        plan.lean_norms = swap_classes(model, family.norm.__bases__[0], family.norm)
    model._osftrt_long_context = plan


def undo(model, family):
    """Checkpointing off and the model's own RMSNorm back, if apply_plan
    turned them on."""
    if model.__dict__.pop("_osftrt_long_context", None) is not None:
        disable_checkpointing(model)
        if family.norm is not None:
            swap_classes(model, family.norm, family.norm.__bases__[0])
