"""The machinery shared by every family: a causal LM whose loss goes through
the fused linear cross-entropy (logits never built when labels are given),
an MLP that runs over tiles of tokens on its own weights, and the class swap
that applies both to a model in place.

A patched module keeps its class's name and state (``state_dict`` keys,
``config.architectures`` in ``save_pretrained``); its class is a subclass
defined at module level in the family's module, so ``copy.deepcopy`` and
``pickle`` work."""
from __future__ import annotations

import dataclasses
import functools
import inspect

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..torch import OSFTLinear, TiledMLPPlan, fused_linear_cross_entropy, rms_norm, tiled_mlp

# Hugging Face activation names -> osftrt gated MLP variants (down(act(gate x) * up x))
GATED_VARIANTS = {
    "silu": "swiglu",
    "swish": "swiglu",
    "gelu_pytorch_tanh": "geglu_tanh",
    "gelu_new": "geglu_tanh",
    "gelu_fast": "geglu_tanh",
    "gelu": "geglu_erf",
}
_LOSS_KWARGS = ("num_items_in_batch", "ignore_index", "shift_labels")


@dataclasses.dataclass(frozen=True)
class Family:
    """One model family: its patched classes and where its MLPs live."""

    name: str
    causal_lm: type  # the patched causal LM class (a subclass of the HF one)
    mlp: type  # the patched MLP class
    activation_attrs: tuple = ("hidden_act",)  # config attributes naming the MLP activation, first found wins
    norm: type = None  # the patched RMSNorm class (lean backward; used by activation_memory)
    # the decoder layer adds the MLP's output to the residual and ends (no
    # norm after the MLP): a checkpoint's recompute need not compute it
    mlp_output_unsaved: bool = False

    def activation(self, config):
        for a in self.activation_attrs:
            v = getattr(config, a, None)
            if v is not None:
                return v
        raise ValueError("%s: the config names no MLP activation (%s)" % (self.name, ", ".join(self.activation_attrs)))


# --- the loss ---------------------------------------------------------------
def causal_lm_loss(hidden, lm_head, labels=None, *, shift_labels=None, num_items_in_batch=None, ignore_index=-100,
                   softcap=None, **flce_options):
    """Hugging Face's causal-LM loss (``ForCausalLMLoss``) on the hidden
    states, through the fused linear cross-entropy: labels shifted left
    (or ``shift_labels`` as given), ``ignore_index`` tokens skipped, the mean
    over kept tokens, or the sum divided by ``num_items_in_batch`` under
    gradient accumulation; ``softcap`` as ``final_logit_softcapping``."""
    if shift_labels is None:
        shift_labels = F.pad(labels, (0, 1), value=ignore_index)[..., 1:]
    x = hidden.reshape(-1, hidden.shape[-1])
    target = shift_labels.reshape(-1).to(x.device)
    reduction = "mean" if num_items_in_batch is None else "sum"
    loss = fused_linear_cross_entropy(x, lm_head.weight, target, getattr(lm_head, "bias", None),
                                      ignore_index=ignore_index, softcap=softcap or 0.0, reduction=reduction,
                                      **flce_options)
    if num_items_in_batch is not None:
        if torch.is_tensor(num_items_in_batch):
            num_items_in_batch = num_items_in_batch.to(loss.device)
        loss = loss / num_items_in_batch
    return loss


def _output_of(model_outputs, loss, output_class):
    fields = {f.name for f in dataclasses.fields(output_class)}
    rest = {k: v for k, v in model_outputs.items() if k in fields and k not in ("loss", "logits")}
    return output_class(loss=loss, logits=None, **rest)


def _call_arguments(signature, self, args, kwargs):
    """The call's arguments by name, with the **kwargs ones merged in."""
    bound = dict(signature.bind_partial(self, *args, **kwargs).arguments)
    for p in signature.parameters.values():
        if p.kind is p.VAR_KEYWORD:
            bound.update(bound.pop(p.name, {}))
        elif p.kind is p.POSITIONAL_OR_KEYWORD and p.name == "self":
            bound.pop(p.name, None)
    return bound


def _fused_forward(self, base_forward, signature, *args, **kwargs):
    bound = _call_arguments(signature, self, args, kwargs)
    labels = bound.pop("labels", None)
    if labels is None and bound.get("shift_labels") is None:
        return base_forward(self, *args, **kwargs)  # generation and inference: the model's own logits
    bound.pop("logits_to_keep", None)
    return_dict = bound.pop("return_dict", None)
    loss_kwargs = {k: bound[k] for k in _LOSS_KWARGS if k in bound}
    outputs = self.model(**bound)
    flce_options = getattr(self, "_osftrt_flce_options", {})
    loss = causal_lm_loss(outputs[0], self.lm_head, labels, softcap=getattr(self.config, "final_logit_softcapping", None),
                          **loss_kwargs, **flce_options)
    long_context = getattr(self, "_osftrt_long_context", None)
    if long_context is not None:
        long_context.after_loss(outputs[0], flce_options.get("context"))
    from transformers.modeling_outputs import CausalLMOutputWithPast

    out = _output_of(outputs, loss, CausalLMOutputWithPast)
    if return_dict is None:
        return_dict = getattr(self.config, "return_dict", True)
    return out if return_dict else out.to_tuple()


def _subclass(base, module_name, forward, base_forward):
    """A subclass of `base` with the same name, defined in `module_name`
    (so that copies and pickles find it), whose forward is `forward`."""
    functools.update_wrapper(forward, base_forward)
    return type(base.__name__, (base,), {"__module__": module_name, "__qualname__": base.__name__, "forward": forward})


def fused_loss_class(base, module_name):
    """A subclass of the causal LM class `base` whose forward computes the loss
    with the fused linear cross-entropy when labels are given (and is
    `base`'s forward otherwise); same name, same signature."""
    base_forward = base.forward
    signature = inspect.signature(base_forward)

    def forward(self, *args, **kwargs):
        return _fused_forward(self, base_forward, signature, *args, **kwargs)

    return _subclass(base, module_name, forward, base_forward)


def tiled_mlp_class(base, module_name):
    """A subclass of the gated MLP class `base` (gate_proj, up_proj,
    down_proj) whose forward runs over tiles of tokens on those projections'
    own weights (nn.Linear or OSFTLinear)."""

    def forward(self, x):
        return tiled_mlp(self._osftrt_plan, x, self.gate_proj, self.up_proj, self.down_proj)

    return _subclass(base, module_name, forward, base.forward)


def lean_norm_class(base, module_name, *, offset=0.0, weight_first=True, eps_attr="variance_epsilon"):
    """A subclass of the RMSNorm class `base` computed by
    :func:`osftrt.torch.rms_norm` (same outputs; its backward keeps only the
    input and one float per row)."""

    def forward(self, x):
        return rms_norm(x, self.weight, getattr(self, eps_attr), offset=offset, weight_first=weight_first)

    return _subclass(base, module_name, forward, base.forward)


def swap_classes(model, base, patched):
    """Every module of class `base` becomes a `patched` (and back, with the
    arguments swapped). Returns the number swapped."""
    n = 0
    for m in model.modules():
        if type(m) is base:
            m.__class__ = patched
            n += 1
    return n


# --- applying it ----------------------------------------------------------------
def _tileable(mlp):
    return all(isinstance(getattr(mlp, n, None), (nn.Linear, OSFTLinear)) for n in ("gate_proj", "up_proj", "down_proj"))


def patch_mlps(model, family, config, *, tile_tokens=None, memory_budget=None):
    """Swaps every MLP of the family's base class in `model` for the tiled
    one. Returns the number patched."""
    base = family.mlp.__bases__[0]
    act = family.activation(config)
    variant = GATED_VARIANTS.get(act)
    if variant is None:
        raise ValueError("%s: no tiled MLP for the activation %r (known: %s)" % (family.name, act, ", ".join(GATED_VARIANTS)))
    n = 0
    for m in model.modules():
        if type(m) is base or type(m) is family.mlp:
            if not _tileable(m):
                raise TypeError("%s: its projections must be nn.Linear or OSFTLinear to be tiled, got %s" % (
                    type(m).__name__, ", ".join(type(getattr(m, k)).__name__ for k in ("gate_proj", "up_proj", "down_proj"))))
            m.__class__ = family.mlp
            m._osftrt_plan = TiledMLPPlan(variant, tile_tokens=tile_tokens, memory_budget=memory_budget)
            n += 1
    return n


def patch_causal_lm(model, family, flce_options):
    base = family.causal_lm.__bases__[0]
    if type(model) is not base and type(model) is not family.causal_lm:
        raise TypeError("expected a %s, got %s" % (base.__name__, type(model).__name__))
    if isinstance(model.lm_head, OSFTLinear):
        raise TypeError("the fused cross-entropy needs a dense lm_head: leave lm_head out of the OSFT targets")
    model.__class__ = family.causal_lm
    model._osftrt_flce_options = dict(flce_options or {})
