"""Hugging Face ``transformers`` causal LMs patched in place, in one call:

>>> import osftrt.transformers as ot
>>> patched = ot.apply_osftrt(model, osft=True, rank_ratio=0.5)   # then train as usual

* the LM head and its loss go through the fused linear cross-entropy when
  labels are given (no logits), with the model's own loss semantics: labels
  shifted left, ignore index -100, ``num_items_in_batch`` under gradient
  accumulation, ``final_logit_softcapping`` where the model has it; without
  labels (generation, inference) the model's own forward runs;
* every MLP runs as a tiled MLP over its own ``gate_proj``/``up_proj``/
  ``down_proj`` (no copies), with the family's activation;
* optionally (``osft=True``) the chosen linear layers become
  :class:`~osftrt.torch.OSFTLinear` and an :class:`~osftrt.torch.OSFTProjector`
  is attached, so ``loss.backward(); optimizer.step()`` or
  ``transformers.Trainer`` keep every update orthogonal to the frozen
  subspace with no extra calls;
* optionally (``activation_memory=`` bytes or ``"min"``) long context in
  one setting: per-layer activation checkpointing that keeps only each
  layer's input, those checkpoints offloaded to pinned host memory on a
  GPU (brought back one layer ahead of the backward on a side stream), and
  constant scratch budgets for the loss and the MLP tiles, and RMSNorms
  whose backward keeps only their input
  (:mod:`osftrt.transformers.long_context`).

Families (``config.model_type``): llama, mistral, qwen2, qwen3, gemma2,
olmo2; one module each (``osftrt.transformers.llama``, ...) holds its patched
classes. :func:`merge_and_unpatch` gives back a plain ``transformers`` model
(OSFT layers merged into dense weights), e.g. for ``save_pretrained``.
"""
from __future__ import annotations

import dataclasses
import importlib
import weakref

import torch.nn as nn

from ..torch import LLAMA_LINEAR_NAMES, OSFTLinear, OSFTProjector, convert_linear_layers
from . import checkpoint as _checkpoint
from . import long_context as _long_context
from ._patch import Family, causal_lm_loss, patch_causal_lm, patch_mlps

__all__ = ["apply_osftrt", "Patched", "merge_and_unpatch", "projector_of", "family_of", "causal_lm_loss", "FAMILIES",
           "Family", "check_checkpoint", "add_dense_weights", "CheckpointError"]

FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gemma2", "olmo2")
_projectors = weakref.WeakKeyDictionary()


def family_of(model) -> Family:
    """The :class:`Family` of a model (by ``config.model_type``)."""
    kind = getattr(getattr(model, "config", None), "model_type", None)
    if kind not in FAMILIES:
        raise NotImplementedError("osftrt.transformers patches %s; this model's type is %r" % (", ".join(FAMILIES), kind))
    return importlib.import_module("." + kind, __name__).FAMILY


@dataclasses.dataclass
class Patched:
    """What :func:`apply_osftrt` did."""

    model: nn.Module
    family: Family
    fused_cross_entropy: bool
    tiled_mlps: int
    osft_layers: dict  # qualified name -> OSFTLinear
    projector: OSFTProjector | None
    long_context: _long_context.LongContextPlan | None = None  # what activation_memory arranged


def apply_osftrt(model, *, fused_cross_entropy=True, tiled_mlp=True, osft=False, rank_ratio=0.5,
                 target_modules=LLAMA_LINEAR_NAMES, osft_dtype=None, projector=True, attach=True, optimizer=None,
                 mlp_tile_tokens=None, mlp_memory_budget=None, cross_entropy_options=None, activation_memory=None,
                 offload_checkpoints=None, osft_factors="auto", rank_rounding="round") -> Patched:
    """Patches a causal LM of a supported family in place (see the module's
    doc) and returns a :class:`Patched`.

    osft: convert the linear layers named in target_modules (attribute
    names, or a predicate (qualified_name, module) -> bool) to OSFTLinear with
    the top rank_ratio of each spectrum frozen (factors in osft_dtype, default
    the weights' dtype); projector: create this process's OSFTProjector
    (False under FSDP2 or DDP, where
    osftrt.torch.distributed.shard_aware_projector takes its place after the
    model is sharded); attach: run the projector's gradient projection once
    before every optimizer step (not per micro-batch) and its parameter
    projection after it (of `optimizer`, or of any optimizer holding the
    factors).
    rank_rounding: the frozen rank of a layer with k singular values is
    round(rank_ratio * k) ("round", default) or floor(rank_ratio * k)
    ("floor": mini_trainer's splits exactly), within [1, k - 1].
    osft_factors: where the OSFT layers' factors come from instead of a new
    SVD of each weight. "auto" (default): from the checkpoint folder the model
    was loaded from, if it holds OSFT factors (a folder that a patched
    model's ``save_pretrained`` or ``Trainer`` wrote: plain
    ``from_pretrained`` then ``apply_osftrt(osft=True)`` goes on with the
    subspaces that run protected, which a new SVD of the trained weights
    would not give back); a folder, weight file or state dict: from those;
    None: decompose. The factors' frozen ranks must be those `rank_ratio`
    gives, and the saved dense weights their merge (a
    :class:`~osftrt.transformers.checkpoint.CheckpointError` names the file
    and the tensor otherwise). See :mod:`osftrt.transformers.checkpoint`.
    mlp_tile_tokens / mlp_memory_budget: the tiling (default: tiles of at most
    `hidden` tokens). cross_entropy_options: extra options of
    fused_linear_cross_entropy (e.g. memory_budget, accumulator).

    activation_memory: the bytes the step's activations may use, or "min"
    ("as long as possible"): turns on per-layer activation checkpointing
    that keeps only each decoder layer's input (Hugging Face's,
    non-reentrant; also under FSDP2, whose hooks stay outside the
    checkpoint), swaps the RMSNorms for osftrt.torch.rms_norm (its backward
    keeps only the input and one float per token), sets the loss's
    memory_budget and the MLP's tile budget to constants (under "min" 128
    rows of logits and 256 tokens of tile, each at least 4 MiB; under a
    budget a sixteenth of it each, at least that, at most 1 GiB; explicit
    mlp_tile_tokens / mlp_memory_budget / cross_entropy_options["memory_budget"]
    win), frees the loss's scratch before the backward, and offloads the
    checkpoints of layers that run on a GPU to pinned host memory, brought
    back one layer ahead of the backward on a side stream
    (offload_checkpoints=False keeps them on the device). The sequence that
    fits is about (activation_memory - the weights' gradients - scratch) /
    long_context.floor_bytes_per_token(config, dtype_bytes)["total"]
    tokens; on the CPU, hidden 256 and 4 layers, 12.5 KiB per token
    (bench/results/long_context_cpu.md). None (default): none of this.
    """
    family = family_of(model)
    lc = _long_context.plan_long_context(model, activation_memory, offload_checkpoints)
    if lc is not None:
        if mlp_tile_tokens is None and mlp_memory_budget is None:
            mlp_memory_budget = lc.mlp_memory_budget
        cross_entropy_options = dict(cross_entropy_options or {})
        cross_entropy_options.setdefault("memory_budget", lc.loss_memory_budget)
    layers = {}
    if osft:
        names = target_modules
        if not callable(names) and "lm_head" in names and fused_cross_entropy:
            raise ValueError("the fused cross-entropy needs a dense lm_head: leave lm_head out of target_modules")
        factors = _checkpoint.saved_factors_for(model, osft_factors)
        layers = convert_linear_layers(model, names, rank_ratio, dtype=osft_dtype, factors=factors,
                                       rank_rounding=rank_rounding)
        if factors is not None and osft_dtype is not None:
            for m in layers.values():
                m.to(osft_dtype)
        if projector:
            projector = OSFTProjector(model)
            if attach:
                projector.attach(optimizer)
            _projectors[model] = projector
        else:
            projector = None
    if not osft:
        projector = None
    tiled = patch_mlps(model, family, model.config, tile_tokens=mlp_tile_tokens, memory_budget=mlp_memory_budget) if tiled_mlp else 0
    if fused_cross_entropy:
        patch_causal_lm(model, family, cross_entropy_options)
    _long_context.apply_plan(model, lc, family)
    return Patched(model, family, bool(fused_cross_entropy), tiled, layers, projector, lc)


check_checkpoint = _checkpoint.check_checkpoint
add_dense_weights = _checkpoint.add_dense_weights
CheckpointError = _checkpoint.CheckpointError


def projector_of(model):
    """The projector :func:`apply_osftrt` attached to `model`, or None."""
    return _projectors.get(model)


def merge_and_unpatch(model, dtype=None):
    """Undoes :func:`apply_osftrt` in place: the original classes back, every
    OSFTLinear merged into an nn.Linear (dtype: the factors' by default), the
    projector detached. Returns the model, ready for ``save_pretrained``."""
    family = family_of(model)
    _long_context.undo(model, family)
    projector = _projectors.pop(model, None)
    if projector is not None:
        projector.close()
    for m in model.modules():  # the MLP handles depend on the OSFT layers': they go first
        if type(m) is family.mlp:
            m._osftrt_plan.close()
            m.__class__ = family.mlp.__bases__[0]
            del m._osftrt_plan
    for qn, m in list(model.named_modules()):
        if isinstance(m, OSFTLinear):
            parent = model.get_submodule(qn.rsplit(".", 1)[0]) if "." in qn else model
            setattr(parent, qn.rsplit(".", 1)[-1], m.merge(dtype or m.u_low.dtype))
            m.close()
    if type(model) is family.causal_lm:
        model.__class__ = family.causal_lm.__bases__[0]
        model.__dict__.pop("_osftrt_flce_options", None)
    return model
