"""Checkpoints of patched models: where :func:`~osftrt.transformers.apply_osftrt`
finds the factors of an earlier OSFT run, a check of a checkpoint folder,
and the repair of the factor-only folders that osftrt <= 1.3 wrote.

The layout (``osftrt.torch.linear_state``): every OSFT layer saves its six
factors and ``weight``, the dense matrix they merge to. Plain ``transformers``
reads ``weight`` (the factors are keys it reports as unexpected and
ignores); a patched model loads the factors and checks ``weight`` against
them. ``save_pretrained``, ``Trainer`` checkpoints and ``accelerate``'s
``save_state`` all write it, since they all save the model's state dict."""
from __future__ import annotations

import logging
import os
import tempfile

import torch

from ..torch import linear_state
from ..torch.linear_state import CheckpointError, SavedFactors, checkpoint_files, read_factors

__all__ = ["saved_factors_for", "check_checkpoint", "add_dense_weights", "CheckpointError"]

log = logging.getLogger("osftrt")


def _source_folder(model):
    """The local folder `model` was loaded from (``from_pretrained``), or None."""
    path = getattr(getattr(model, "config", None), "_name_or_path", None) or getattr(model, "name_or_path", None)
    return path if isinstance(path, str) and os.path.isdir(path) and checkpoint_files(path) else None


def saved_factors_for(model, source="auto") -> SavedFactors | None:
    """The OSFT factors to build `model`'s OSFT layers from, or None (decompose).

    source: "auto" -- those saved in the folder `model` was loaded from
    (``config._name_or_path``), if it holds any: a model loaded with plain
    ``from_pretrained`` from an OSFT checkpoint goes on with the subspaces
    that run protected (its dense weights, loaded from the same files, must
    be their merge); a folder, a weight file or a state dict -- those, which
    must be there (where the dense weights were saved beside them, they must
    be their merge); None or False -- none."""
    if source is None or source is False:
        return None
    if isinstance(source, str) and source == "auto":
        folder = _source_folder(model)
        if folder is None:
            return None
        factors = read_factors(folder)
        if not factors:
            return None
        named = dict(model.named_modules())
        weights = {}
        for layer in factors:
            m = named.get(layer)
            if m is None or not hasattr(m, "weight"):
                raise CheckpointError("%s: holds OSFT factors for %s, which this model does not have" % (folder, layer))
            weights[layer] = m.weight if layer in factors.dense else None
        linear_state.check_consistency(factors, weights)
        log.info("osftrt: OSFT layers from the factors saved in %s (%d layers)", folder, len(factors))
        return factors
    is_folder = isinstance(source, (str, os.PathLike)) and os.path.isdir(source)
    factors = _checked_factors(source) if is_folder else read_factors(source)
    if not factors:
        raise CheckpointError("%s: holds no OSFT factors" % factors.where)
    if not isinstance(source, (str, os.PathLike)) and factors.dense:
        linear_state.check_consistency({k: factors[k] for k in factors.dense},
                                       {k: source[k + ".weight"] for k in factors.dense})
    return factors


def check_checkpoint(folder):
    """Reads every weight file of a checkpoint folder and checks each OSFT
    layer in it: six factors of consistent shapes (U_high, S_high, V_high,
    U_low, S_low, V_low) whose merge equals the dense ``weight`` saved beside
    them. Returns {layer: (frozen rank, trainable rank)}; raises
    :class:`CheckpointError` naming the file and the tensor otherwise."""
    factors = _checked_factors(folder)
    return {layer: (f["u_high"].shape[-1], f["u_low"].shape[-1]) for layer, f in factors.items()}


def _checked_factors(folder):
    factors = read_factors(folder)
    weights = {}
    for path in checkpoint_files(folder):
        weights.update(_read_tensors(path, [layer + ".weight" for layer in factors]))
    linear_state.check_consistency(factors, {layer: weights.get(layer + ".weight") for layer in factors})
    return factors


def _read_tensors(path, keys):
    """{key: tensor} of those of `keys` that the weight file at `path` has."""
    wanted = set(keys)
    key = None
    try:
        if path.endswith(".safetensors"):
            from safetensors import safe_open

            out = {}
            with safe_open(path, framework="pt") as f:
                for key in [k for k in f.keys() if k in wanted]:
                    out[key] = f.get_tensor(key)
            return out
        sd = torch.load(path, map_location="cpu", weights_only=True)
        return {k: v for k, v in sd.items() if k in wanted}
    except Exception as e:
        what = "tensor %s is unreadable" % key if key else "not a readable weight file"
        raise CheckpointError("%s: %s (%s: %s)" % (path, what, type(e).__name__, e)) from e


@torch.no_grad()
def _merge(f):
    w = (f["u_high"].float() * f["s_high"].float()) @ f["v_high"].float()
    w += (f["u_low"].float() * f["s_low"].float()) @ f["v_low"].float()
    return w.to(f["u_low"].dtype)


def _write_atomically(path, write):
    """write(tmp_path) into a new file beside `path`, fsync'ed, renamed over
    `path`, the folder fsync'ed: a crash leaves the old file or the new one."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=folder)
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    dfd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def add_dense_weights(folder):
    """Repairs a factor-only checkpoint folder (osftrt <= 1.3 saved OSFT
    layers as their factors alone, which plain transformers loads with
    random weights): writes each OSFT layer's dense ``weight``, merged from
    its factors, into the weight file that holds them (one file rewritten
    at a time, atomically). Returns the layers given a weight."""
    added = []
    for path in checkpoint_files(folder):
        if not path.endswith(".safetensors"):
            raise CheckpointError("%s: add_dense_weights rewrites safetensors files only" % path)
        from safetensors import safe_open
        from safetensors.torch import save_file

        with safe_open(path, framework="pt") as f:
            metadata = f.metadata()
            tensors = {k: f.get_tensor(k) for k in f.keys()}
        factors = read_factors(tensors)
        new = [layer for layer in factors if layer + ".weight" not in tensors]
        if not new:
            continue
        for layer in new:
            tensors[layer + ".weight"] = _merge(factors[layer]).contiguous()
        tensors = {k: v.contiguous() for k, v in tensors.items()}
        _write_atomically(path, lambda tmp, t=tensors, m=metadata: save_file(t, tmp, metadata=m))
        added += new
    index = os.path.join(folder, "model.safetensors.index.json")
    if added and os.path.isfile(index):
        _index_weights(index, folder, added)
    return added


def _index_weights(index, folder, layers):
    """Adds the new ``weight`` keys to a sharded checkpoint's index (each in
    the shard of its layer's factors)."""
    import json

    with open(index) as f:
        data = json.load(f)
    wm = data["weight_map"]
    for layer in layers:
        wm[layer + ".weight"] = wm[layer + ".u_high"]

    def write(tmp):
        with open(tmp, "w") as f:
            json.dump(data, f, indent=2, sort_keys=True)

    _write_atomically(index, write)
