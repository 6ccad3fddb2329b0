"""What an :class:`~osftrt.torch.OSFTLinear` writes to a state dict and
accepts from one: the checkpoint layout that both readers take.

A saved OSFT layer is its six factors (``u_high``, ``s_high``, ``v_high``,
``u_low``, ``s_low``, ``v_low``: exact resume, the frozen subspace as it was)
plus ``weight``, the dense W = U_high S_high V_high + U_low S_low V_low
merged from them, under the key an ``nn.Linear`` has. So plain
``transformers`` (``from_pretrained`` of the unpatched class, osftrt not
imported) loads the trained weights from any checkpoint of a patched model
(``save_pretrained``, every ``Trainer`` checkpoint, ``accelerate``'s
``save_state``), and a patched model resumes from it exactly: re-decomposing
``weight`` would give other frozen subspaces, so the factors are what a
patched model loads, ``weight`` is checked against them.

Loading refuses, with a message naming the tensor, what would otherwise
leave a layer silently wrong: a dense ``weight`` without factors (a plain
fine-tuning checkpoint; its layer would keep its own factors), factors of
another frozen rank (another rank ratio), and factors that do not give the
checkpoint's ``weight`` back (a corrupted or edited file). A factor-only
state dict (osftrt <= 1.3 wrote those) still loads.

Under FSDP2 the factors are DTensors sharded on dim 0 and ``weight`` is one
too, sharded like U's rows: each rank merges its rows (S and V gathered),
so ``torch.distributed.checkpoint`` saves it sharded and its
``get_model_state_dict(full_state_dict=True)`` gathers it."""
from __future__ import annotations

import json
import os
import weakref

import torch

FACTORS = ("u_high", "s_high", "v_high", "u_low", "s_low", "v_low")

# how far the merged factors may be from the saved weight, relative to its
# norm, per dtype: the merge's rounding, never a changed value
_CONSISTENCY_RTOL = {torch.float32: 1e-5, torch.float64: 1e-12, torch.bfloat16: 2e-2, torch.float16: 4e-3}

try:  # torch >= 2.4 (FSDP2); Debian's 1.13 has none
    from torch.distributed.tensor import DTensor, Replicate
except Exception:  # ImportError, or torch.distributed unavailable
    DTensor = Replicate = None


class CheckpointError(ValueError):
    """A checkpoint that cannot give back the layers it should: unreadable,
    truncated, inconsistent, or of another model or rank ratio. The message
    names the file and the tensor."""


def _is_dtensor(t):
    return DTensor is not None and isinstance(t, DTensor)


def _versions(module):
    return tuple((id(t), t._version) for t in (getattr(module, n) for n in FACTORS))


def dense_weight(module):
    """The layer's dense W (N x K, the factors' dtype, no grad), merged from
    its current factors. The last one made is reused while it is alive and
    the factors did not change (a state dict and the lookups of its keys
    that ``torch.distributed.checkpoint`` makes share one merge)."""
    key = _versions(module)
    cached = getattr(module, "_dense_weight_ref", None)
    if cached is not None and cached[0] == key:
        w = cached[1]()
        if w is not None:
            return w
    w = _merge_sharded(module) if _is_dtensor(module.u_low) else module.merged_weight(module.u_low.dtype)
    module._dense_weight_ref = (key, weakref.ref(w))
    return w


@torch.no_grad()
def _merge_sharded(module):
    """W as a DTensor placed like u_low (rows of U): each rank's rows from
    its rows of U and the whole of S and V (all-gathered)."""
    mesh = module.u_low.device_mesh
    rep = [Replicate()] * mesh.ndim

    def whole(t):  # a replicated DTensor of t, whatever t's placement
        return t.redistribute(mesh, rep) if _is_dtensor(t) else DTensor.from_local(t, mesh, rep, run_check=False)

    def rows(t):  # U's rows as placed by FSDP2 (a replicated buffer otherwise)
        return t if _is_dtensor(t) else whole(t)

    w = (rows(module.u_high.detach()) * whole(module.s_high.detach())) @ whole(module.v_high.detach())
    w = w + (rows(module.u_low.detach()) * whole(module.s_low.detach())) @ whole(module.v_low.detach())
    return w.redistribute(mesh, module.u_low.placements)


def _storage_bytes(t):
    return (t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()).nbytes()


def unshare_views(destination, prefix, keep_vars):
    """S and V^T are one storage each (high part first, so that the layer's
    GEMMs fuse): savers that keep one name per storage (accelerate's
    ``save_state``, safetensors' check) would drop or refuse the high or the
    low part. A state dict of values (keep_vars=False) gets each part as a
    tensor over the same memory but a storage of its own (a DLPack alias, no
    copy): writes into it still reach the layer (``torch.distributed.checkpoint``
    loads in place), and every saver sees separate tensors. One of
    variables keeps the parameters and buffers themselves."""
    if keep_vars:
        return
    for name in ("s_high", "v_high", "s_low", "v_low"):
        t = destination.get(prefix + name)
        if t is not None and not _is_dtensor(t) and _storage_bytes(t) != t.numel() * t.element_size():
            destination[prefix + name] = _alias(t)


def _alias(t):
    """t's memory under a storage object of its own."""
    from torch.utils import dlpack

    try:
        return dlpack.from_dlpack(dlpack.to_dlpack(t.detach()))
    except (RuntimeError, TypeError, BufferError):  # a dtype DLPack lacks here: a copy
        return t.detach().clone()


def incoming_errors(module, state_dict, prefix):
    """What a state dict offered to `module` (under `prefix`) would leave
    wrong, as error messages; [] when it may be loaded."""
    present = [n for n in FACTORS if prefix + n in state_dict]
    weight = state_dict.get(prefix + "weight")
    name = prefix.rstrip(".") or "the layer"
    if not present:
        if weight is None:
            return []  # nothing for this layer (strict loading reports the missing keys)
        return ["%s: the state dict has a dense weight but no OSFT factors (%s): it was not saved from an OSFT "
                "model, and loading it would leave this layer's own factors in place. Load it into the unpatched "
                "model, then apply OSFT to that (a new decomposition)" % (name, ", ".join(FACTORS))]
    missing = [n for n in FACTORS if n not in present]
    if missing:
        return ["%s: the state dict has OSFT factors %s but not %s" % (name, ", ".join(present), ", ".join(missing))]
    errors = []
    for n in FACTORS:
        have, got = tuple(getattr(module, n).shape), tuple(state_dict[prefix + n].shape)
        if have != got:
            errors.append("%s%s: shape %s in the state dict, %s in this layer (frozen rank %d of %d): the checkpoint "
                          "was saved at another rank ratio or from another model" % (
                              prefix, n, list(got), list(have), module.rank, min(module.out_features, module.in_features)))
    if errors or weight is None or any(_is_dtensor(state_dict[prefix + n]) for n in FACTORS) or _is_dtensor(weight):
        return errors
    return _consistency_errors(prefix, [state_dict[prefix + n] for n in FACTORS], weight)


@torch.no_grad()
def _consistency_errors(prefix, factors, weight):
    uh, sh, vh, ul, sl, vl = (t.detach().to(torch.float32) for t in factors)
    if tuple(weight.shape) != (uh.shape[0], vh.shape[1]):
        return ["%sweight: shape %s, the factors give %s" % (prefix, list(weight.shape), [uh.shape[0], vh.shape[1]])]
    merged = (uh * sh) @ vh + (ul * sl) @ vl
    w = weight.detach().to(torch.float32)
    scale = torch.linalg.norm(w).item()
    err = torch.linalg.norm(merged - w).item()
    tol = _CONSISTENCY_RTOL.get(weight.dtype, 1e-5) * max(scale, 1e-30)
    if not err <= tol:  # NaN fails too
        return ["%sweight: the OSFT factors beside it merge to another matrix (relative difference %.3g, allowed "
                "%.1g): the file is corrupted, or the weight or the factors were changed after saving" % (
                    prefix, err / max(scale, 1e-30), tol / max(scale, 1e-30))]
    return []


# --- reading the factors of a checkpoint --------------------------------------
_WEIGHT_FILES = ("model.safetensors.index.json", "model.safetensors", "pytorch_model.bin.index.json",
                 "pytorch_model.bin")


def checkpoint_files(directory):
    """The weight files of a ``save_pretrained`` / ``Trainer`` checkpoint
    folder (one file, or the shards its index names), or [] if it has none."""
    for name in _WEIGHT_FILES:
        path = os.path.join(directory, name)
        if not os.path.isfile(path):
            continue
        if not name.endswith(".index.json"):
            return [path]
        try:
            with open(path) as f:
                shards = sorted(set(json.load(f)["weight_map"].values()))
        except (OSError, ValueError, KeyError, AttributeError) as e:
            raise CheckpointError("%s: not a readable weight index (%s)" % (path, e)) from e
        return [os.path.join(directory, s) for s in shards]
    return []


def _factor_keys(keys):
    """{layer prefix: {factor: key}} of the keys that end in a factor name."""
    layers = {}
    for k in keys:
        layer, _, leaf = k.rpartition(".")
        if leaf in FACTORS:
            layers.setdefault(layer, {})[leaf] = k
    return layers


def _read_file(path):
    """({key: tensor} of the factor tensors, every key) of one weight file."""
    try:
        if path.endswith(".safetensors"):
            from safetensors import safe_open

            out = {}
            with safe_open(path, framework="pt") as f:
                keys = list(f.keys())
                for names in _factor_keys(keys).values():
                    for key in names.values():
                        try:
                            out[key] = f.get_tensor(key)
                        except Exception as e:  # a truncated file fails here, per tensor
                            raise CheckpointError("%s: tensor %s is unreadable (%s)" % (path, key, e)) from e
            return out, keys
        sd = torch.load(path, map_location="cpu", weights_only=True)
        return {k: sd[k] for names in _factor_keys(sd).values() for k in names.values()}, list(sd)
    except CheckpointError:
        raise
    except Exception as e:  # a damaged header, a missing shard, a file that is not a checkpoint
        raise CheckpointError("%s: not a readable weight file (%s: %s)" % (path, type(e).__name__, e)) from e


class SavedFactors(dict):
    """{layer name: {factor: tensor}} read from `where`; `dense` is the set of
    those layers whose dense ``weight`` was saved too."""

    def __init__(self, layers, where, dense):
        super().__init__(layers)
        self.where = where
        self.dense = set(dense)


def read_factors(source):
    """The OSFT factors a checkpoint holds, as {layer name: {factor: tensor}}
    ({} if it holds none). `source`: a checkpoint folder (``save_pretrained``,
    ``Trainer``'s ``checkpoint-N``), one weight file (.safetensors or a torch
    pickle), or a state dict. A layer must have all six factors; reading
    errors name the file and the tensor (:class:`CheckpointError`)."""
    if isinstance(source, (str, os.PathLike)):
        source = os.fspath(source)
        files = checkpoint_files(source) if os.path.isdir(source) else [source]
        if not files:
            raise CheckpointError("%s: no weight file (%s)" % (source, ", ".join(_WEIGHT_FILES)))
        where, tensors, keys = source, {}, []
        for path in files:
            t, k = _read_file(path)
            tensors.update(t)
            keys += k
    else:
        where, tensors, keys = "the state dict", source, list(source)
    layers = {}
    for layer, names in _factor_keys(tensors).items():
        missing = [n for n in FACTORS if n not in names]
        if missing:
            raise CheckpointError("%s: layer %s has OSFT factors %s but not %s" % (
                where, layer, ", ".join(sorted(names)), ", ".join(missing)))
        layers[layer] = {n: tensors[k] for n, k in names.items()}
    keys = set(keys)
    return SavedFactors(layers, where, [layer for layer in layers if layer + ".weight" in keys])


def check_saved_factors(factors, targets, rank_of=None):
    """Raises :class:`CheckpointError` unless every (name, (N, K)) of
    `targets` has factors in `factors` for an N x K layer, of the frozen rank
    rank_of(min(N, K)) (not checked when rank_of is None)."""
    where = getattr(factors, "where", "the saved factors")
    errors = []
    for name, shape in targets:
        f = factors.get(name)
        if f is None:
            errors.append("%s: no OSFT factors for layer %s" % (where, name))
            continue
        n, k = f["u_high"].shape[0], f["v_high"].shape[-1]
        if (n, k) != tuple(shape):
            errors.append("%s: the factors of layer %s are of a %d x %d layer; the model's is %d x %d" % (
                where, name, n, k, shape[0], shape[1]))
            continue
        r, want = f["u_high"].shape[-1], None if rank_of is None else rank_of(min(n, k))
        if want is not None and r != want:
            errors.append("%s: layer %s was saved at frozen rank %d of %d; this rank ratio gives %d: pass the run's "
                          "rank ratio (or decompose anew, which loses the protected subspace)" % (
                              where, name, r, min(n, k), want))
    _raise(errors)


def check_consistency(factors, weights):
    """Raises :class:`CheckpointError` unless, for every layer of `factors`,
    weights[layer] (the dense weight saved with them, or loaded from the
    same folder) is there and equals the merge of its factors (within the
    merge's rounding): a missing one means a factor-only checkpoint, a
    different one a corrupted or edited file."""
    where = getattr(factors, "where", "the saved factors")
    errors = []
    for name, f in factors.items():
        w = weights.get(name)
        if w is None:
            errors.append("%s: layer %s has OSFT factors but no dense weight (a factor-only checkpoint, as osftrt "
                          "<= 1.3 saved): a plain model loaded from it has a random %s.weight. Add the dense "
                          "weights with osftrt.transformers.add_dense_weights(folder)" % (where, name, name))
            continue
        errors += ["%s: %s" % (where, e) for e in _consistency_errors(name + ".", [f[x] for x in FACTORS], w)]
    _raise(errors)


def _raise(errors):
    if errors:
        raise CheckpointError("; ".join(errors[:8]) + ("; ... (%d errors)" % len(errors) if len(errors) > 8 else ""))
