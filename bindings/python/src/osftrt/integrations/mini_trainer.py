"""mini_trainer's OSFT on libosftrt (``rhai-innovation-mini-trainer`` on PyPI,
the OSFT backend of Red Hat's ``training-hub``).

>>> from osftrt.integrations.mini_trainer import use_osftrt
>>> model = ...  # mini_trainer's OSFT model (create_osft_model_class / from_pretrained(..., initialize_osft=True))
>>> use_osftrt(model)                     # in place; then create the optimizer as usual
>>> opt = optim_wrapper(torch.optim.AdamW(model.parameters(), lr), model)   # mini_trainer's own wrapper still works

How mini_trainer holds a target layer, and what :func:`use_osftrt` makes of it
------------------------------------------------------------------------------

mini_trainer (``mini_trainer/osft_utils.py``, ``create_osft_model_class``)
keeps each target ``nn.Linear`` module, removes its ``weight`` and attaches
the factors of W = U S V^T split at its frozen rank r (``top_k``):

================================  ==================  ========================
mini_trainer key (on the module)  osftrt key          what
================================  ==================  ========================
``osft_U_high``                   ``u_high``          N x r, frozen
``osft_S_high``                   ``s_high``          r, frozen
``osft_V_high``                   ``v_high``          r x K, frozen
``osft_params.U_low``             ``u_low``           N x (k - r), trainable
``osft_params.S_low``             ``s_low``           k - r, trainable
``osft_params.V_low``             ``v_low``           (k - r) x K, trainable
``bias``                          ``bias``            as it was
(none: removed)                   ``weight`` (dense)  written by osftrt's
                                                      checkpoints where they
                                                      carry one; dropped here
================================  ==================  ========================

and replaces the module's ``forward`` by its factorized product (four GEMMs
per call, autograd keeping every intermediate). :func:`use_osftrt` puts an
:class:`~osftrt.torch.OSFTLinear` in the module's place, built from those
very factors (no new SVD: the frozen subspace is exactly mini_trainer's),
attaches an :class:`~osftrt.torch.OSFTProjector` to the optimizer (the
projection of gradients and parameters mini_trainer's ``optim_wrapper`` ran,
one batched call for all layers), and makes the model's own
``project_gradients`` / ``project_parameters`` no-ops (it finds no
mini_trainer layer any more) and its ``prepare_state_dict_for_save`` (what
mini_trainer's ``save_model`` calls) write dense weights from osftrt's
layers, so mini_trainer's checkpoints stay plain Hugging Face models.

:func:`to_mini_trainer_state_dict` and :func:`from_mini_trainer_state_dict`
map checkpoints between the two key sets (the table), so a run moves
between the two trainers with its protected subspace.

mini_trainer picks r = floor(rank_ratio * min(N, K)) (at most k - 1);
osftrt's default rounds: :func:`decompose` (and ``apply_osftrt``'s
``rank_rounding="floor"``) use mini_trainer's rule, so both make the same
split. :func:`decompose` also splits the SVDs over the ranks of a process
group (each rank decomposes its share of the layers, then every layer's
factors are broadcast from the rank that made them), as mini_trainer's
distributed set-up does, so each rank's set-up time falls with the world
size.
"""
from __future__ import annotations

import math
import re
import types

import torch
import torch.nn as nn

from ..torch import OSFTLinear, OSFTProjector
from ..torch.linear import _parent_of, frozen_rank

__all__ = ["use_osftrt", "decompose", "to_mini_trainer_state_dict", "from_mini_trainer_state_dict",
           "mini_trainer_layers", "MINI_TRAINER_KEYS", "LLAMA_TARGETS"]

# osftrt key -> mini_trainer key, relative to the layer's module
MINI_TRAINER_KEYS = {
    "u_high": "osft_U_high",
    "s_high": "osft_S_high",
    "v_high": "osft_V_high",
    "u_low": "osft_params.U_low",
    "s_low": "osft_params.S_low",
    "v_low": "osft_params.V_low",
}
_FROM_MT = {v: k for k, v in MINI_TRAINER_KEYS.items()}
# mini_trainer's default target patterns (MODEL_CONFIGS["llama"], also its "default")
LLAMA_TARGETS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
                 "mlp.down_proj", "mlp.up_proj")


def mini_trainer_layers(model):
    """{qualified name: module} of every layer mini_trainer turned into
    OSFT factors (a module with ``osft_params`` and ``osft_U_high``)."""
    return {qn: m for qn, m in model.named_modules()
            if hasattr(m, "osft_params") and all(hasattr(m, a) for a in ("osft_U_high", "osft_S_high", "osft_V_high"))}


def _local(t):
    t = t.detach()
    if hasattr(t, "device_mesh") and hasattr(t, "placements"):
        raise TypeError("mini_trainer's factors are sharded DTensors: call use_osftrt before fully_shard "
                        "(and osftrt.torch.distributed.prepare_fsdp2 between the two)")
    return t


def _osft_linear(u_high, s_high, v_high, u_low, s_low, v_low, bias, dtype=None, strategy="auto"):
    dtype = dtype or (u_low.dtype if u_low.dtype in (torch.float32, torch.bfloat16) else torch.float32)
    u = torch.cat([_local(u_high), _local(u_low)], 1).to(dtype)
    s = torch.cat([_local(s_high), _local(s_low)]).to(dtype)
    vt = torch.cat([_local(v_high), _local(v_low)], 0).to(dtype)
    b = None if bias is None else _local(bias).to(dtype)
    return OSFTLinear(u, s, vt, int(s_high.shape[0]), b, strategy=strategy).to(u_low.device)


def use_osftrt(model, *, projector=True, attach=True, optimizer=None, dtype=None, strategy="auto",
               fused_cross_entropy=True, tiled_mlp=True, mlp_memory_budget=None, cross_entropy_options=None):
    """Makes mini_trainer's OSFT `model` run on osftrt, in place: every
    mini_trainer layer becomes an OSFTLinear over its own factors (same
    values, same frozen subspace, same outputs up to fp32 rounding). Call it
    before the optimizer is created (the trainable factors are new
    parameters). projector: attach an OSFTProjector (False under FSDP2,
    where osftrt.torch.distributed.shard_aware_projector takes its place
    after sharding); attach/optimizer as for OSFTProjector.attach.
    fused_cross_entropy: with labels, the loss through osftrt's fused linear
    cross-entropy (no logits), with mini_trainer's semantics: per-token
    losses (reduction "none", what its patched
    ``transformers.loss.loss_utils.fixed_cross_entropy`` returns and its
    training loop sums) where that patch is in place, else Hugging Face's
    mean; tiled_mlp: every MLP of the model's family over tiles of tokens
    (mlp_memory_budget as in apply_osftrt). Supported families as
    apply_osftrt's (llama, mistral, qwen2, qwen3, gemma2, olmo2).
    Returns {qualified name: OSFTLinear}; model.osftrt_projector is the
    projector (or None)."""
    layers = mini_trainer_layers(model)
    if not layers:
        raise ValueError("no mini_trainer OSFT layer in the model (modules with osft_params and osft_U_high): "
                         "initialize OSFT first (initialize_osft=True / reinitialize_osft)")
    done = {}
    for qn, m in layers.items():
        p = m.osft_params
        new = _osft_linear(m.osft_U_high, m.osft_S_high, m.osft_V_high, p.U_low, p.S_low, p.V_low,
                           getattr(m, "bias", None), dtype=dtype, strategy=strategy)
        parent, leaf = _parent_of(model, qn)
        setattr(parent, leaf, new)
        done[qn] = new
    proj = None
    if projector:
        proj = OSFTProjector(model)
        if attach:
            proj.attach(optimizer)
    model.osftrt_projector = proj
    model.osftrt_layers = done
    if tiled_mlp or fused_cross_entropy:
        from ..transformers import family_of
        from ..transformers._patch import patch_mlps

        family = family_of(model)
        if tiled_mlp:
            patch_mlps(model, family, model.config, memory_budget=mlp_memory_budget)
        if fused_cross_entropy:
            model.__class__ = _fused_class(type(model))
            model._osftrt_flce_options = dict(cross_entropy_options or {})
    if hasattr(model, "prepare_state_dict_for_save"):
        model.prepare_state_dict_for_save = types.MethodType(_prepare_state_dict_for_save, model)
    return done


_FUSED = {}


def _none_reduction_patched():
    """mini_trainer's setup_model patches transformers' fixed_cross_entropy
    to its per-token (reduction "none") version; its training loop sums."""
    try:
        from transformers.loss import loss_utils
    except ImportError:  # pragma: no cover
        return False
    return getattr(loss_utils.fixed_cross_entropy, "__name__", "") == "hf_fixed_cross_entropy_none_reduction"


def _fused_class(base):
    """A subclass of mini_trainer's OSFT model class whose forward computes
    the loss with the fused linear cross-entropy when labels are given."""
    if base in _FUSED.values():
        return base
    if base in _FUSED:
        return _FUSED[base]

    import torch.nn.functional as F

    from ..torch import fused_linear_cross_entropy

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None,
                inputs_embeds=None, labels=None, use_cache=None, logits_to_keep=0, **kwargs):
        if labels is None:
            return base.forward(self, input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                                past_key_values=past_key_values, inputs_embeds=inputs_embeds, use_cache=use_cache,
                                logits_to_keep=logits_to_keep, **kwargs)
        num_items_in_batch = kwargs.pop("num_items_in_batch", None)
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         past_key_values=past_key_values, inputs_embeds=inputs_embeds, use_cache=use_cache, **kwargs)
        hidden = out[0]
        target = F.pad(labels, (0, 1), value=-100)[..., 1:].reshape(-1).to(hidden.device)
        x = hidden.reshape(-1, hidden.shape[-1])
        softcap = getattr(self.config, "final_logit_softcapping", None) or 0.0
        opts = getattr(self, "_osftrt_flce_options", {})
        if _none_reduction_patched():
            loss = fused_linear_cross_entropy(x, self.lm_head.weight, target, getattr(self.lm_head, "bias", None),
                                              softcap=softcap, reduction="none", **opts)
        elif num_items_in_batch is not None:
            loss = fused_linear_cross_entropy(x, self.lm_head.weight, target, getattr(self.lm_head, "bias", None),
                                              softcap=softcap, reduction="sum", **opts) / num_items_in_batch
        else:
            loss = fused_linear_cross_entropy(x, self.lm_head.weight, target, getattr(self.lm_head, "bias", None),
                                              softcap=softcap, reduction="mean", **opts)
        from transformers.modeling_outputs import CausalLMOutputWithPast

        return CausalLMOutputWithPast(loss=loss, logits=None, past_key_values=getattr(out, "past_key_values", None),
                                      hidden_states=getattr(out, "hidden_states", None),
                                      attentions=getattr(out, "attentions", None))

    cls = type(base.__name__, (base,), {"forward": forward, "__module__": base.__module__,
                                        "__qualname__": base.__qualname__})
    _FUSED[base] = cls
    return cls


def _prepare_state_dict_for_save(self, state_dict):
    """mini_trainer's save hook for a model on osftrt: every OSFT layer's
    factors replaced by its dense weight (W = U_high S_high V_high + U_low
    S_low V_low, computed in fp32 from the state dict's tensors, in the
    model's dtype), so the checkpoint is a plain Hugging Face model."""
    return dense_state_dict(state_dict, getattr(self, "dtype", None))


def dense_state_dict(state_dict, dtype=None):
    """A state dict with osftrt's OSFT factors (``<layer>.u_high`` ...)
    replaced by ``<layer>.weight`` (their product in fp32, then `dtype` or
    the factors' dtype); other keys untouched."""
    out = dict(state_dict)
    for prefix in sorted({k[: -len(".u_high")] for k in state_dict if k.endswith(".u_high")}):
        f = {n: out.pop("%s.%s" % (prefix, n)).float() for n in MINI_TRAINER_KEYS}
        w = (f["u_high"] * f["s_high"]) @ f["v_high"] + (f["u_low"] * f["s_low"]) @ f["v_low"]
        out["%s.weight" % prefix] = w.to(dtype or state_dict["%s.u_low" % prefix].dtype)
    return out


def to_mini_trainer_state_dict(state_dict):
    """osftrt keys -> mini_trainer keys (the module's table): ``<layer>.u_high``
    -> ``<layer>.osft_U_high``, ``<layer>.u_low`` -> ``<layer>.osft_params.U_low``
    ...; an OSFT layer's dense ``weight`` (which osftrt's checkpoints may
    carry beside the factors) is dropped, as mini_trainer's layer has none.
    Tensors are shared, not copied."""
    layers = {k[: -len(".u_high")] for k in state_dict if k.endswith(".u_high")}
    out = {}
    for k, v in state_dict.items():
        prefix, _, leaf = k.rpartition(".")
        if prefix in layers and leaf in MINI_TRAINER_KEYS:
            out["%s.%s" % (prefix, MINI_TRAINER_KEYS[leaf])] = v
        elif prefix in layers and leaf == "weight":
            continue
        else:
            out[k] = v
    return out


_MT_KEY = re.compile(r"^(.*)\.(osft_U_high|osft_S_high|osft_V_high|osft_params\.U_low|osft_params\.S_low|"
                     r"osft_params\.V_low|osft_params\.rank_high)$")


def from_mini_trainer_state_dict(state_dict, dense_weight=False):
    """mini_trainer keys -> osftrt keys (the reverse of
    :func:`to_mini_trainer_state_dict`; ``osft_params.rank_high``, an int in
    its distributed set-up's dicts, is dropped: it is S_high's length).
    dense_weight: also add each layer's dense ``weight`` (the factors'
    product in fp32, in their dtype), for a loader that expects one.
    Tensors are shared, not copied."""
    out = {}
    layers = set()
    for k, v in state_dict.items():
        m = _MT_KEY.match(k)
        if m is None:
            out[k] = v
            continue
        if m.group(2) == "osft_params.rank_high":
            continue
        layers.add(m.group(1))
        out["%s.%s" % (m.group(1), _FROM_MT[m.group(2)])] = v
    if dense_weight:
        for prefix in layers:
            f = {n: out["%s.%s" % (prefix, n)].float() for n in MINI_TRAINER_KEYS}
            w = (f["u_high"] * f["s_high"]) @ f["v_high"] + (f["u_low"] * f["s_low"]) @ f["v_low"]
            out["%s.weight" % prefix] = w.to(out["%s.u_low" % prefix].dtype)
    return out


# --- decomposing a plain model as mini_trainer does, split over ranks ---------
def _targets(model, target_patterns):
    return [(qn, m) for qn, m in model.named_modules()
            if isinstance(m, nn.Linear) and not isinstance(m, OSFTLinear)
            and any(p in qn + ".weight" for p in target_patterns)]


def decompose(model, rank_ratio=0.5, *, target_patterns=LLAMA_TARGETS, rank_rounding="floor", group=None,
              factors=None, dtype=None, strategy="auto"):
    """Turns the target nn.Linear layers of a plain model into OSFTLinear
    layers, in place, the way mini_trainer chooses them: a layer is a target
    when one of `target_patterns` is a substring of its weight's name
    (mini_trainer's ``MODEL_CONFIGS`` patterns; default Llama's), its frozen
    rank floor(rank_ratio * min(N, K)) (rank_rounding="round": osftrt's
    default rule), SVD in float64.

    group: a torch.distributed process group (default: the default group
    when one is initialized, else none): each rank decomposes the layers i
    with i % world_size == rank (every rank must hold the same weights, as
    after loading), then each layer's factors are broadcast from the rank
    that made them, so a rank's SVD time falls as 1/world_size. factors:
    {qualified name: {"u_high", "s_high", "v_high", "u_low", "s_low",
    "v_low"}} made elsewhere (e.g. :func:`from_mini_trainer_state_dict` of
    a mini_trainer checkpoint, or another rank): those layers take them as
    they are (their split is theirs), the others are decomposed.
    Returns {qualified name: OSFTLinear}."""
    import torch.distributed as dist

    todo = _targets(model, target_patterns)
    if not todo:
        raise ValueError("no nn.Linear matches %s" % (", ".join(target_patterns),))
    factors = dict(factors or {})
    if group is None and dist.is_available() and dist.is_initialized():
        group = dist.group.WORLD
    world = dist.get_world_size(group) if group is not None else 1
    rank = dist.get_rank(group) if group is not None else 0
    made = {}
    for i, (qn, m) in enumerate(todo):
        if qn in factors or i % world != rank:
            continue
        w = m.weight.detach()
        u, s, vt = torch.linalg.svd(w.to(torch.float64), full_matrices=False)
        r = frozen_rank(s.shape[0], rank_ratio, rank_rounding)
        made[qn] = (u.contiguous(), s.contiguous(), vt.contiguous(), r)  # broadcast sends the storage
    done = {}
    for i, (qn, m) in enumerate(todo):
        if qn in factors:
            f = factors[qn]
            done[qn] = _osft_linear(f["u_high"], f["s_high"], f["v_high"], f["u_low"], f["s_low"], f["v_low"],
                                    m.bias, dtype=dtype or m.weight.dtype, strategy=strategy).to(m.weight.device)
        else:
            n_out, n_in = m.weight.shape
            k = min(n_out, n_in)
            if qn in made:
                u, s, vt, r = made.pop(qn)
            else:
                u = torch.empty(n_out, k, dtype=torch.float64)
                s = torch.empty(k, dtype=torch.float64)
                vt = torch.empty(k, n_in, dtype=torch.float64)
            if world > 1:
                owner = dist.get_global_rank(group, i % world) if group is not dist.group.WORLD else i % world
                for t in (u, s, vt):
                    dist.broadcast(t, src=owner, group=group)
            r = frozen_rank(k, rank_ratio, rank_rounding)
            dt = dtype or (m.weight.dtype if m.weight.dtype in (torch.float32, torch.bfloat16) else torch.float32)
            b = m.bias.detach().to(dt) if m.bias is not None else None
            done[qn] = OSFTLinear(u.to(dt), s.to(dt), vt.to(dt), r, b, strategy=strategy).to(m.weight.device)
        parent, leaf = _parent_of(model, qn)
        setattr(parent, leaf, done[qn])
    return done


def mini_trainer_rank(k, rank_ratio):
    """mini_trainer's frozen rank for a layer with k singular values
    (``auto_generate_target_osft_config``: floor, at most k - 1; it allows
    0, osftrt's layer needs >= 1)."""
    top = int(math.floor(k * rank_ratio))
    return min(top, k - 1)
