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
  subspace with no extra calls.

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
from ._patch import Family, causal_lm_loss, patch_causal_lm, patch_mlps

__all__ = ["apply_osftrt", "Patched", "merge_and_unpatch", "projector_of", "family_of", "causal_lm_loss", "FAMILIES",
           "Family"]

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


def apply_osftrt(model, *, fused_cross_entropy=True, tiled_mlp=True, osft=False, rank_ratio=0.5,
                 target_modules=LLAMA_LINEAR_NAMES, osft_dtype=None, projector=True, attach=True, optimizer=None,
                 mlp_tile_tokens=None, mlp_memory_budget=None, cross_entropy_options=None) -> Patched:
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
    mlp_tile_tokens / mlp_memory_budget: the tiling (default: tiles of at most
    `hidden` tokens). cross_entropy_options: extra options of
    fused_linear_cross_entropy (e.g. memory_budget, accumulator).
    """
    family = family_of(model)
    layers = {}
    if osft:
        names = target_modules
        if not callable(names) and "lm_head" in names and fused_cross_entropy:
            raise ValueError("the fused cross-entropy needs a dense lm_head: leave lm_head out of target_modules")
        layers = convert_linear_layers(model, names, rank_ratio, dtype=osft_dtype)
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
    return Patched(model, family, bool(fused_cross_entropy), tiled, layers, projector)


def projector_of(model):
    """The projector :func:`apply_osftrt` attached to `model`, or None."""
    return _projectors.get(model)


def merge_and_unpatch(model, dtype=None):
    """Undoes :func:`apply_osftrt` in place: the original classes back, every
    OSFTLinear merged into an nn.Linear (dtype: the factors' by default), the
    projector detached. Returns the model, ready for ``save_pretrained``."""
    family = family_of(model)
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
