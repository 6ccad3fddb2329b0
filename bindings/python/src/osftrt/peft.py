"""Interoperability with PEFT's OSF adapters (``peft.OSFConfig``, peft >= 0.17).

* :func:`from_peft` turns every OSF-tuned layer of a PEFT model into an
  :class:`~osftrt.torch.OSFTLinear`, in place, from PEFT's own factors (the
  same trainable tensors, the same frozen subspace, the same outputs);
* :func:`save_peft_adapter` writes an osftrt model (OSFTLinear layers,
  trained or not) as an OSF adapter that ``PeftModel.from_pretrained(base,
  directory)`` loads;
* :func:`load_peft_adapter` is the reverse: ``PeftModel.from_pretrained`` +
  :func:`from_peft`.

How PEFT's OSF layer and OSFTLinear hold the same layer
-------------------------------------------------------

OSFTLinear keeps W = U diag(S) V^T as six tensors, split at the frozen rank r:
``u_high`` (N x r), ``s_high`` (r), ``v_high`` (r x K) frozen, ``u_low``
(N x m), ``s_low`` (m), ``v_low`` (m x K) trainable, m = min(N, K) - r.

PEFT's OSF layer (``peft.tuners.osf.layer.Linear``, adapter ``a``) keeps

=======================================  ======================================
PEFT                                     OSFTLinear
=======================================  ======================================
``effective_rank[a]``                    ``rank`` (r, the frozen rank)
``osf_svd_params[a]["U_low"]``           ``u_low``   (trainable, N x m)
``osf_svd_params[a]["S_low"]``           ``s_low``   (trainable, m)
``osf_svd_params[a]["V_low"]``           ``v_low``   (trainable, m x K)
``base_layer.weight`` (W0, dense)        ``u_high diag(s_high) v_high``
                                         + the initial low part (below)
``_osf_{U,S,V}_low_init[a]``             the low factors at creation (not kept)
``_osf_U_high[a]``, only when N > K      ``u_high`` (the same values)
``_osf_V_high[a]``, only when N < K      ``v_high`` (the same values)
S_high: never stored                     ``s_high``
=======================================  ======================================

PEFT keeps the base weight W0 dense and adds a rank-2m delta,

    y = x W0^T + x (U_low S_low V_low - U_low_init S_low_init V_low_init)^T,

where W0 = U S V^T (PEFT's fp32 SVD when the adapter is created) and the
``*_low_init`` buffers are its last m triplets. So PEFT's frozen part is
W0 - U_low_init S_low_init V_low_init = U_high S_high V_high, and its model
equals OSFTLinear's W = U_high S_high V_high + U_low S_low V_low.
:func:`from_peft` recovers (U_high, S_high, V_high) from what PEFT holds,
without a new SVD of W0:

* N > K: U_high is PEFT's stored ``_osf_U_high``; U_high^T W0 = S_high V_high,
  so S_high are its row norms and V_high its normalized rows;
* N < K: V_high is PEFT's ``_osf_V_high``; W0 V_high^T = U_high S_high
  (column norms, normalized columns);
* N == K: PEFT stores neither, because its frozen subspaces are exactly the
  orthogonal complements of U_low_init and V_low_init (its gradient hook
  projects onto U_low_init U_low_init^T). U_high spans that complement (a
  complete QR of U_low_init) and Q^T W0 (r x K) is factored by a small r x K
  SVD, which only picks the basis inside PEFT's frozen subspace.

The arithmetic runs in float64; the factors come out in the layer's dtype
(float32 or bfloat16; other dtypes give float32). The projector
(:class:`~osftrt.torch.OSFTProjector`) then protects the same subspace that
PEFT's hooks did. Note that PEFT projects only the gradients, so an adaptive
optimizer (Adam) lets PEFT's U_low / V_low drift slightly out of the
complement; :func:`from_peft` copies them as they are (the outputs stay equal)
and ``OSFTProjector(model).orthogonality()`` shows the drift;
``project_parameters()`` removes it (and changes the outputs by as much).

The adapter files, and the condition for saving
-----------------------------------------------

An OSF adapter directory holds ``adapter_config.json`` (``peft_type: OSF``,
``target_modules``, ``effective_rank`` and per-module ``rank_pattern``) and
``adapter_model.safetensors`` with only the trainable factors, under the keys
``base_model.model.<module>.osf_svd_params.{U_low,S_low,V_low}``. Loading it,
PEFT decomposes the *base model's* weight W0 again (fp32 SVD, the top
``effective_rank`` triplets frozen) and copies the saved factors into the
trainable ones. The loaded model therefore computes
top_r(W0) + U_low S_low V_low, and it equals the osftrt model only if the
osftrt layer's frozen part is the rank-r truncated SVD of that base weight:

    U_high^T W0 = diag(S_high) V_high,  W0 V_high^T = U_high diag(S_high),
    ||W0 - U_high diag(S_high) V_high||_2 <= min(S_high),

which holds for a layer made by ``OSFTLinear.from_linear`` /
``convert_linear_layers`` from that base model, or by :func:`from_peft`, as
long as the frozen factors were not changed. :func:`save_peft_adapter`
checks this when given the base model (``base_model=``). The rotation and sign
of the trainable factors do not matter (PEFT only uses their product). The
layers' biases, and any other parameter, are not part of an OSF adapter: they
come from the base model at load (checked too when ``base_model`` is given).
"""
from __future__ import annotations

import collections
import json
import os
import re

import torch
import torch.nn as nn

from .torch.linear import OSFTLinear, _parent_of

__all__ = [
    "from_peft",
    "osft_linear_from_peft_layer",
    "save_peft_adapter",
    "load_peft_adapter",
    "peft_adapter_state_dict",
    "peft_frozen_factors",
    "check_base_weights",
]

ADAPTER_CONFIG_NAME = "adapter_config.json"
SAFETENSORS_WEIGHTS_NAME = "adapter_model.safetensors"
WEIGHTS_NAME = "adapter_model.bin"
_KEY = "base_model.model.%s.osf_svd_params.%s"


def _factor_dtype(dtype, like):
    if dtype is not None:
        return dtype
    return like if like in (torch.float32, torch.bfloat16) else torch.float32


def _osf_layer_cls():
    from peft.tuners.osf.layer import OSFLayer

    return OSFLayer


def _unwrap_peft(model):
    """The plain model under a PeftModel / OSFModel (or `model` itself)."""
    try:
        from peft import PeftModel
        from peft.tuners.tuners_utils import BaseTuner
    except ImportError:  # pragma: no cover - from_peft needs peft anyway
        return model
    if isinstance(model, PeftModel):
        model = model.base_model
    if isinstance(model, BaseTuner):
        model = model.model
    return model


@torch.no_grad()
def peft_frozen_factors(layer, adapter_name):
    """(U_high, S_high, V_high) of a PEFT OSF layer, float64, recovered from
    PEFT's stored factors and base weight (see the module docstring)."""
    w0 = layer.get_base_layer().weight.detach().to(torch.float64)
    n, k = w0.shape
    if adapter_name in layer._osf_U_high:  # N > K: U_high is stored
        u_high = layer._osf_U_high[adapter_name].detach().to(torch.float64)
        sv = u_high.T @ w0
        s_high = sv.norm(dim=1)
        v_high = sv / s_high[:, None]
    elif adapter_name in layer._osf_V_high:  # N < K: V_high is stored
        v_high = layer._osf_V_high[adapter_name].detach().to(torch.float64)
        us = w0 @ v_high.T
        s_high = us.norm(dim=0)
        u_high = us / s_high
    else:  # square: the frozen subspace is the complement of U_low_init
        u_low_init = layer._osf_U_low_init[adapter_name].detach().to(torch.float64)
        m = u_low_init.shape[1]
        q = torch.linalg.qr(u_low_init, mode="complete")[0][:, m:]
        p, s_high, v_high = torch.linalg.svd(q.T @ w0, full_matrices=False)
        u_high = q @ p
    return u_high, s_high, v_high


@torch.no_grad()
def osft_linear_from_peft_layer(layer, adapter_name=None, *, dtype=None, strategy="auto", context=None):
    """An OSFTLinear equal to one PEFT OSF layer's adapter `adapter_name`
    (default: its active adapter), or the frozen base ``nn.Linear`` when that
    adapter trains nothing (effective_rank == min(N, K))."""
    if adapter_name is None:
        active = [a for a in layer.active_adapters if a in layer.osf_svd_params]
        if not active:
            raise ValueError("the PEFT layer has no active OSF adapter")
        adapter_name = active[0]
    if adapter_name not in layer.osf_svd_params:
        raise ValueError("the PEFT layer has no OSF adapter %r" % adapter_name)
    if layer.merged:
        raise ValueError("the OSF adapter is merged into the base weight (PEFT cannot unmerge OSF); convert before merging")
    if layer.disable_adapters:
        raise ValueError("the PEFT model's adapters are disabled")
    base = layer.get_base_layer()
    if not isinstance(base, nn.Linear):
        raise TypeError("only nn.Linear base layers are supported, got %s" % type(base).__name__)
    params = layer.osf_svd_params[adapter_name]
    u_low, s_low, v_low = (params[n].detach() for n in ("U_low", "S_low", "V_low"))
    rank = int(layer.effective_rank[adapter_name])
    if s_low.shape[0] == 0:
        base.weight.requires_grad_(False)
        if base.bias is not None:
            base.bias.requires_grad_(False)
        return base
    dt = _factor_dtype(dtype, base.weight.dtype)
    u_high, s_high, v_high = peft_frozen_factors(layer, adapter_name)
    if u_high.shape[1] != rank:
        raise ValueError("inconsistent PEFT OSF layer: effective_rank %d, frozen factors of rank %d" % (rank, u_high.shape[1]))
    u = torch.cat([u_high.to(dt), u_low.to(dt)], dim=1)
    s = torch.cat([s_high.to(dt), s_low.to(dt)])
    vt = torch.cat([v_high.to(dt), v_low.to(dt)], dim=0)
    b = base.bias.detach().to(dt) if base.bias is not None else None
    new = OSFTLinear(u, s, vt, rank, b, strategy=strategy, context=context)
    if b is not None:
        new.bias.requires_grad_(base.bias.requires_grad)
    return new.to(base.weight.device)


def from_peft(peft_model, adapter_name=None, *, dtype=None, strategy="auto", context=None):
    """Replaces, in place, every OSF layer of `peft_model` (a ``PeftModel``,
    its ``OSFModel``, or a model holding PEFT OSF layers) by an OSFTLinear
    built from the adapter `adapter_name` (default: each layer's active one)
    and returns the plain model under it (e.g. the ``LlamaForCausalLM``).

    The trainable factors are copies of PEFT's U_low / S_low / V_low, the
    frozen ones PEFT's frozen part (module docstring); no SVD of the weights.
    The other adapters of a layer, PEFT's hooks and buffers are dropped; the
    PeftModel wrapper should not be used afterwards. Parameters PEFT froze
    stay frozen. Layers whose adapter trains nothing (effective_rank equal
    to min(N, K)) become their frozen base ``nn.Linear``.
    """
    osf_layer = _osf_layer_cls()
    model = _unwrap_peft(peft_model)
    if isinstance(model, osf_layer):
        return osft_linear_from_peft_layer(model, adapter_name, dtype=dtype, strategy=strategy, context=context)
    todo = [(qn, m) for qn, m in model.named_modules() if isinstance(m, osf_layer)]
    if not todo:
        raise ValueError("no PEFT OSF layer in the model")
    for qn, m in todo:
        parent, leaf = _parent_of(model, qn)
        new = osft_linear_from_peft_layer(m, adapter_name, dtype=dtype, strategy=strategy, context=context)
        m._detach_hooks()
        setattr(parent, leaf, new)
    return model


# --- osftrt -> PEFT -----------------------------------------------------------------


def _osft_layers(model):
    if isinstance(model, OSFTLinear):
        raise TypeError("pass the whole model: the adapter names its layers by their qualified names")
    layers = [(qn, m) for qn, m in model.named_modules() if isinstance(m, OSFTLinear)]
    if not layers:
        raise ValueError("no OSFTLinear layer in the model")
    for qn, m in layers:
        k = m.rank + m.s_low.shape[0]
        if k != min(m.in_features, m.out_features):
            raise ValueError(
                "%s keeps %d singular triplets; a PEFT OSF adapter needs all min(N, K) = %d" % (qn, k, min(m.in_features, m.out_features))
            )
    return layers


@torch.no_grad()
def peft_adapter_state_dict(model, dtype=None):
    """The adapter's tensors: {"base_model.model.<module>.osf_svd_params.U_low"
    | ".S_low" | ".V_low": tensor} for every OSFTLinear of `model` (contiguous
    CPU copies, in `dtype` or the layer's own)."""
    out = {}
    for qn, m in _osft_layers(model):
        for name, t in (("U_low", m.u_low), ("S_low", m.s_low), ("V_low", m.v_low)):
            out[_KEY % (qn, name)] = t.detach().to(device="cpu", dtype=dtype or t.dtype).contiguous().clone()
    return out


def _peft_config(model, layers, base_model_name_or_path, task_type, revision):
    ranks = {qn: int(m.rank) for qn, m in layers}
    effective_rank = collections.Counter(ranks.values()).most_common(1)[0][0]
    rank_pattern = {"^%s$" % re.escape(qn): r for qn, r in ranks.items() if r != effective_rank}
    # short target names (q_proj, ...) when they select exactly these layers
    osft = {qn for qn, _ in layers}
    leaves = {qn.rsplit(".", 1)[-1] for qn in osft}
    clash = any(qn not in osft and qn.rsplit(".", 1)[-1] in leaves for qn, _ in model.named_modules() if qn)
    targets = sorted(osft) if clash else sorted(leaves)
    return {
        "peft_type": "OSF",
        "task_type": task_type,
        "base_model_name_or_path": base_model_name_or_path,
        "revision": revision,
        "inference_mode": True,
        "effective_rank": effective_rank,
        "target_modules": targets,
        "rank_pattern": rank_pattern or None,
        "init_weights": True,
        "modules_to_save": None,
        "target_svd_config": None,
    }


def _base_weights(base_model, qn):
    if isinstance(base_model, nn.Module):
        m = base_model.get_submodule(qn)
        return m.weight, getattr(m, "bias", None)
    return base_model[qn + ".weight"], base_model.get(qn + ".bias")


@torch.no_grad()
def check_base_weights(model, base_model, rtol=None):
    """The problems, as strings, that would make ``PeftModel.from_pretrained(
    base_model, adapter)`` differ from `model`: for every OSFTLinear, its
    frozen part must be the top-rank SVD of the base weight W0 (module
    docstring) and its bias the base bias. `base_model`: the model before
    conversion (same module names) or its state dict. rtol (relative to
    max S_high): 1e-5 for float32 layers, 2e-2 for bfloat16 by default."""
    problems = []
    for qn, m in _osft_layers(model):
        try:
            w0, b0 = _base_weights(base_model, qn)
        except (AttributeError, KeyError):
            problems.append("%s: not in the base model" % qn)
            continue
        if tuple(w0.shape) != (m.out_features, m.in_features):
            problems.append("%s: base weight is %s, layer is %dx%d" % (qn, tuple(w0.shape), m.out_features, m.in_features))
            continue
        tol = rtol if rtol is not None else (2e-2 if m.u_high.dtype == torch.bfloat16 else 1e-5)
        w0 = w0.detach().to(device=m.u_high.device, dtype=torch.float64)
        uh, sh, vh = (t.detach().to(torch.float64) for t in (m.u_high, m.s_high, m.v_high))
        scale = max(sh.max().item(), 1e-30)
        err = max((uh.T @ w0 - sh[:, None] * vh).abs().max().item(), (w0 @ vh.T - uh * sh).abs().max().item()) / scale
        if err > tol:
            problems.append(
                "%s: the frozen factors are not singular triplets of the base weight (rel. error %.2e); PEFT would "
                "freeze a different part" % (qn, err)
            )
            continue
        rest = torch.linalg.matrix_norm(w0 - (uh * sh) @ vh, ord=2).item()
        if rest > sh.min().item() + tol * scale:
            problems.append(
                "%s: the frozen triplets are not the top %d of the base weight (a remaining singular value %.4g > %.4g); "
                "PEFT would freeze a different part" % (qn, m.rank, rest, sh.min().item())
            )
        if (b0 is None) != (m.bias is None):
            problems.append("%s: bias present in only one of the layer and the base layer" % qn)
        elif b0 is not None:
            b0 = b0.detach().to(device=m.bias.device, dtype=torch.float64)
            if (m.bias.detach().to(torch.float64) - b0).abs().max().item() > tol * max(b0.abs().max().item(), 1.0):
                problems.append("%s: the bias differs from the base bias (an OSF adapter does not store biases)" % qn)
    return problems


def save_peft_adapter(
    model,
    save_directory,
    base_model_name_or_path=None,
    *,
    base_model=None,
    task_type=None,
    revision=None,
    dtype=None,
    safe_serialization=True,
    check=True,
    rtol=None,
):
    """Writes `model`'s OSFTLinear layers as a PEFT OSF adapter:
    ``save_directory/adapter_config.json`` and ``adapter_model.safetensors``
    (``adapter_model.bin`` with safe_serialization=False or without the
    safetensors package), loadable with ``PeftModel.from_pretrained(base,
    save_directory)`` where `base` is the model before conversion.

    Each layer's frozen rank becomes its effective_rank (the most common one
    as ``effective_rank``, the others in ``rank_pattern``); target_modules
    names the layers (short names when these select exactly them). Only
    U_low, S_low, V_low are stored: PEFT rebuilds the frozen part from the
    base weights, so the loaded model equals `model` only when each frozen
    part is the truncated SVD of its base weight (module docstring). With
    `base_model` (the unconverted model or its state dict) and check=True this
    is verified and a ValueError lists the offending layers. `dtype`: the
    stored tensors' dtype (default: the layers' own). Returns the paths of
    the files written.
    """
    layers = _osft_layers(model)
    if check and base_model is not None:
        problems = check_base_weights(model, base_model, rtol)
        if problems:
            raise ValueError("the adapter would not reproduce the model once PEFT loads it:\n  " + "\n  ".join(problems))
    config = _peft_config(model, layers, base_model_name_or_path, task_type, revision)
    tensors = peft_adapter_state_dict(model, dtype)
    os.makedirs(save_directory, exist_ok=True)
    config_path = os.path.join(save_directory, ADAPTER_CONFIG_NAME)
    with open(config_path, "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
    save_file = None
    if safe_serialization:
        try:
            from safetensors.torch import save_file
        except ImportError:
            save_file = None
    if save_file is not None:
        weights_path = os.path.join(save_directory, SAFETENSORS_WEIGHTS_NAME)
        save_file(tensors, weights_path, metadata={"format": "pt"})
    else:
        weights_path = os.path.join(save_directory, WEIGHTS_NAME)
        torch.save(tensors, weights_path)
    return [config_path, weights_path]


def load_peft_adapter(model, adapter_dir, adapter_name="default", *, dtype=None, strategy="auto", context=None, **kwargs):
    """The reverse of :func:`save_peft_adapter`: loads the OSF adapter
    `adapter_dir` onto `model` (a plain base model, not converted) with
    ``PeftModel.from_pretrained`` (which decomposes the base weights as PEFT
    does) and converts the result with :func:`from_peft`. Returns the plain
    model with OSFTLinear layers. kwargs go to ``PeftModel.from_pretrained``."""
    from peft import PeftConfig, PeftModel

    config = PeftConfig.from_pretrained(adapter_dir)
    peft_type = getattr(config.peft_type, "value", config.peft_type)
    if peft_type != "OSF":
        raise ValueError("%s is a %s adapter, not OSF" % (adapter_dir, peft_type))
    kwargs.setdefault("is_trainable", True)
    peft_model = PeftModel.from_pretrained(model, adapter_dir, adapter_name=adapter_name, **kwargs)
    return from_peft(peft_model, adapter_name, dtype=dtype, strategy=strategy, context=context)
