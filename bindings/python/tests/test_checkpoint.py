"""Checkpoints of models patched by ``apply_osftrt(osft=True)`` (issue 52).

Every way a model is saved writes its state dict, and an OSFT layer's state
dict is its six factors plus ``weight``, the dense matrix they merge to, so:

* plain ``transformers`` (another interpreter, osftrt never imported) opens
  a ``save_pretrained`` folder as the trained model: no missing weight, the
  same logits;
* a patched model resumes exactly from ``Trainer`` checkpoints
  (``save_steps`` + ``resume_from_checkpoint``), a plain loop's
  ``state_dict`` + optimizer state, and ``accelerate``'s ``save_state``: the
  resumed run starts from another random model (other weights, other frozen
  subspaces), so everything it continues with comes from the checkpoint;
  the next 20 losses equal the uninterrupted run's;
* ``apply_osftrt(osft=True)`` on a model loaded from such a folder goes on
  with the saved subspaces, not a new SVD of the trained weights;
* bad checkpoints fail with an error that names the file or the tensor.
FSDP2's sharded checkpoints: test_fsdp2.py (case "dcp").
Tiny random Llama models built from a config; no downloads."""
import json
import os
import subprocess
import sys

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")
import osftrt.transformers as ot  # noqa: E402
from osftrt.torch import OSFTLinear  # noqa: E402
from osftrt.torch.linear_state import FACTORS  # noqa: E402

VOCAB = 96
RESUME_STEPS = 20


def _model(seed):
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(hidden_size=48, intermediate_size=80, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=64,
                                   tie_word_embeddings=False)
    cfg._attn_implementation = "eager"
    m = transformers.LlamaForCausalLM(cfg).float()
    with torch.no_grad():
        m.lm_head.weight.normal_(0, 0.5)
    return m


def _patched(seed, rank_ratio=0.5, **kw):
    """A model patched with OSFT from a new SVD (of random weights from `seed`)."""
    m = _model(seed)
    info = ot.apply_osftrt(m, osft=True, rank_ratio=rank_ratio, osft_factors=None, **kw)
    return m, info


def _batch(step, batch=4, seq=12):
    g = torch.Generator().manual_seed(1000 + step)
    ids = torch.randint(0, VOCAB, (batch, seq), generator=g)
    return ids, ids.clone()


def _step(model, opt, step):
    ids, labels = _batch(step)
    loss = model(input_ids=ids, labels=labels).loss
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss.item()


def _adamw(model):
    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2, weight_decay=0.01)


def _trained(seed=0, steps=3, **kw):
    """A patched model after `steps` AdamW steps: (model, info, optimizer)."""
    model, info = _patched(seed, **kw)
    opt = _adamw(model)
    for s in range(steps):
        _step(model, opt, s)
    return model, info, opt


def _assert_losses_equal(got, want, what):
    assert len(got) == len(want) == RESUME_STEPS, (what, len(got), len(want))
    rel = max(abs(g - w) / max(abs(w), 1e-12) for g, w in zip(got, want))
    assert rel <= 1e-6, "%s: the resumed losses differ from the uninterrupted run's by %.3e (relative)\n%s\n%s" % (
        what, rel, got, want)
    return rel


def _frozen(model):
    return {n: b.detach().clone() for n, b in model.named_buffers() if n.endswith(("u_high", "s_high", "v_high"))}


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


# --- the plain reader ------------------------------------------------------------
PLAIN_READER = r"""
import json, sys
import torch, transformers
folder, ids_path, out_path = sys.argv[1:4]
model, info = transformers.AutoModelForCausalLM.from_pretrained(folder, output_loading_info=True, attn_implementation="eager")
ids = torch.load(ids_path)
with torch.no_grad():
    logits = model(input_ids=ids).logits
torch.save(logits, out_path)
print(json.dumps({"osftrt_imported": any(m.split(".")[0] == "osftrt" for m in sys.modules),
                  "missing": sorted(info["missing_keys"]), "mismatched": sorted(map(str, info["mismatched_keys"])),
                  "unexpected": sorted(info["unexpected_keys"]), "class": type(model).__name__}))
"""


def _open_plainly(folder, ids, tmp_path):
    """Loads `folder` with plain transformers in a fresh interpreter (osftrt not
    imported); returns (what it reported, its logits on ids)."""
    ids_path, out_path = str(tmp_path / "ids.pt"), str(tmp_path / "plain_logits.pt")
    torch.save(ids, ids_path)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-c", PLAIN_READER, str(folder), ids_path, out_path], capture_output=True,
                         text=True, env=env, timeout=300, cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1]), torch.load(out_path)


def _assert_opens_as_trained(folder, model, tmp_path):
    ids, _ = _batch(99)
    report, logits = _open_plainly(folder, ids, tmp_path)
    assert not report["osftrt_imported"]
    assert report["class"] == "LlamaForCausalLM"
    assert report["missing"] == [] and report["mismatched"] == [], report
    # what plain transformers ignores is the factors, nothing else
    assert report["unexpected"] and all(k.rsplit(".", 1)[-1] in FACTORS for k in report["unexpected"]), report
    want = _logits(model, ids)
    rel = ((logits - want).norm() / want.norm()).item()
    assert rel <= 1e-5, "plain transformers' logits are %.3e off the patched model's" % rel
    return report


def test_save_pretrained_opens_in_plain_transformers_as_the_trained_model(tmp_path):
    model, info, _ = _trained()
    model.save_pretrained(tmp_path / "ckpt")
    report = _assert_opens_as_trained(tmp_path / "ckpt", model, tmp_path)
    assert len(report["unexpected"]) == 6 * len(info.osft_layers)
    # the overhead on disk: the factors beside the dense weights, at most
    # twice the dense bytes of the layers they replace (U: N x k, V^T: k x K)
    merged = ot.merge_and_unpatch(model)
    merged.save_pretrained(tmp_path / "dense")
    size = os.path.getsize(tmp_path / "ckpt" / "model.safetensors")
    dense = os.path.getsize(tmp_path / "dense" / "model.safetensors")
    layers = sum(m.weight.numel() * 4 for n, m in merged.named_modules() if n in info.osft_layers)
    assert dense < size <= dense + 2.05 * layers, (size, dense, layers)


def test_apply_osftrt_goes_on_with_the_saved_subspaces(tmp_path):
    model, info, _ = _trained()
    model.save_pretrained(tmp_path / "ckpt")
    saved = _frozen(model)
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt", attn_implementation="eager")
    got = ot.apply_osftrt(again, osft=True, rank_ratio=0.5)  # osft_factors="auto": the folder's own
    assert len(got.osft_layers) == len(info.osft_layers)
    for n, b in _frozen(again).items():
        assert torch.equal(b, saved[n]), n
    for n, m in info.osft_layers.items():
        for f in ("u_low", "s_low", "v_low"):
            assert torch.equal(getattr(got.osft_layers[n], f), getattr(m, f)), (n, f)
    ids, _ = _batch(7)
    torch.testing.assert_close(_logits(again, ids), _logits(model, ids), rtol=1e-5, atol=1e-5)
    # another rank ratio: refused, naming the folder and a layer
    other = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt", attn_implementation="eager")
    with pytest.raises(ot.CheckpointError, match=r"ckpt.*q_proj was saved at frozen rank 24 of 48; this rank ratio gives 12"):
        ot.apply_osftrt(other, osft=True, rank_ratio=0.25)
    assert not any(isinstance(m, OSFTLinear) for m in other.modules())  # nothing converted
    # a new SVD of the trained weights (osft_factors=None) gives other subspaces: what "auto" avoids
    fresh = ot.apply_osftrt(other, osft=True, rank_ratio=0.5, osft_factors=None)
    q = "model.layers.0.self_attn.q_proj"
    u_saved, u_new = saved[q + ".u_high"].double(), fresh.osft_layers[q].u_high.double()
    cosines = torch.linalg.svdvals(u_saved.T @ u_new)
    assert cosines.min().item() < 0.999  # a principal angle above 2.5 degrees


class _Recording(transformers.Trainer):
    """A Trainer that keeps every micro-batch loss unrounded (its log rounds)."""

    def compute_loss(self, model, inputs, *args, **kwargs):
        out = super().compute_loss(model, inputs, *args, **kwargs)
        loss = out[0] if isinstance(out, tuple) else out
        self.losses.append(loss.item())
        return out


def _trainer(model, out, **kw):
    rows = []
    for s in range(8):
        ids, labels = _batch(s)
        rows += [{"input_ids": i, "attention_mask": torch.ones_like(i), "labels": lab} for i, lab in zip(ids, labels)]
    args = transformers.TrainingArguments(output_dir=str(out), per_device_train_batch_size=4, max_steps=5 + RESUME_STEPS,
                                          learning_rate=1e-2, weight_decay=0.01, max_grad_norm=1.0, report_to=[],
                                          use_cpu=True, logging_steps=1, dataloader_num_workers=0, seed=7,
                                          save_strategy="steps", save_steps=5, **kw)
    t = _Recording(model=model, args=args, train_dataset=rows)
    t.losses = []
    return t


def test_trainer_checkpoints_open_plainly_and_resume_exactly(tmp_path):
    model, info = _patched(0)
    first = _trainer(model, tmp_path / "run")
    first.train()
    uninterrupted = first.losses[5:]
    ckpt = tmp_path / "run" / "checkpoint-5"
    assert (ckpt / "model.safetensors").is_file() and (ckpt / "optimizer.pt").is_file()
    # an intermediate checkpoint opens as the model at its step
    plain = transformers.AutoModelForCausalLM.from_pretrained(ckpt, attn_implementation="eager")
    frozen = ot.check_checkpoint(ckpt)
    assert len(frozen) == len(info.osft_layers)
    # resume into another random model: weights, subspaces, optimizer, data order from the checkpoint
    other, other_info = _patched(1)
    second = _trainer(other, tmp_path / "resumed")
    second.train(resume_from_checkpoint=str(ckpt))
    _assert_losses_equal(second.losses, uninterrupted, "Trainer")
    assert max(other_info.projector.orthogonality()) <= 1e-5
    saved = ot.merge_and_unpatch(_from_checkpoint(ckpt))
    for n, p in plain.state_dict().items():
        torch.testing.assert_close(p, saved.state_dict()[n], rtol=1e-5, atol=1e-6, msg=n)


def _from_checkpoint(folder):
    m = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager")
    ot.apply_osftrt(m, osft=True, rank_ratio=0.5)
    return m


def test_plain_loop_resumes_exactly_from_state_dicts(tmp_path):
    model, _, opt = _trained(steps=5)
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, tmp_path / "state.pt")
    uninterrupted = [_step(model, opt, s) for s in range(5, 5 + RESUME_STEPS)]
    other, info = _patched(1)
    opt2 = _adamw(other)
    state = torch.load(tmp_path / "state.pt", weights_only=True)
    other.load_state_dict(state["model"])  # strict: the dense weights are accepted beside the factors
    opt2.load_state_dict(state["optimizer"])
    resumed = [_step(other, opt2, s) for s in range(5, 5 + RESUME_STEPS)]
    _assert_losses_equal(resumed, uninterrupted, "plain loop")
    assert resumed == uninterrupted  # on one machine, one thread: bitwise
    assert max(info.projector.orthogonality()) <= 1e-5


def test_accelerate_save_state_resumes_exactly(tmp_path):
    accelerate = pytest.importorskip("accelerate")

    def run(seed, load=None, save=None):
        acc = accelerate.Accelerator(cpu=True)
        model, info = _patched(seed)
        opt = _adamw(model)
        model, opt = acc.prepare(model, opt)
        if load is not None:
            acc.load_state(str(load))
        first = 0 if load is None else 5
        losses = []
        for s in range(first, 5 + RESUME_STEPS):
            if s == 5 and save is not None:
                acc.save_state(str(save))
            losses.append(_step(model, opt, s))
        return losses[5 - first:], info

    uninterrupted, _ = run(0, save=tmp_path / "state")
    resumed, info = run(1, load=tmp_path / "state")
    _assert_losses_equal(resumed, uninterrupted, "accelerate")
    assert max(info.projector.orthogonality()) <= 1e-5


# --- bad checkpoints fail loudly ---------------------------------------------------
def test_a_dense_checkpoint_is_refused_by_a_patched_model():
    plain = _model(0).state_dict()  # a plain fine-tuning checkpoint: no factors
    model, _ = _patched(1)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(RuntimeError, match=r"model\.layers\.0\.self_attn\.q_proj: the state dict has a dense weight "
                                           r"but no OSFT factors"):
        model.load_state_dict(plain, strict=False)  # as Trainer loads: strict=False must not hide it
    for k, v in model.state_dict().items():  # no OSFT layer took anything
        if k.rsplit(".", 1)[-1] in FACTORS:
            assert torch.equal(v, before[k]), k


def test_another_rank_ratio_is_refused_naming_the_tensor():
    state = _trained(steps=2)[0].state_dict()
    model, _ = _patched(1, rank_ratio=0.25)
    with pytest.raises(RuntimeError, match=r"q_proj\.u_high: shape \[48, 24\] in the state dict, \[48, 12\] in this "
                                           r"layer .*another rank ratio"):
        model.load_state_dict(state)


def test_inconsistent_factors_are_refused_naming_the_tensor():
    state = _trained(steps=2)[0].state_dict()
    state = dict(state)
    key = "model.layers.1.mlp.down_proj.v_high"
    state[key] = state[key].clone()
    state[key][3, 5] *= 1e3  # a damaged value
    model, _ = _patched(1)
    with pytest.raises(RuntimeError, match=r"model\.layers\.1\.mlp\.down_proj\.weight: the OSFT factors beside it "
                                           r"merge to another matrix"):
        model.load_state_dict(state)


def test_a_factor_only_checkpoint_is_refused_and_can_be_repaired(tmp_path):
    from safetensors.torch import load_file, save_file

    model, info = _patched(0)
    model.save_pretrained(tmp_path / "ckpt")
    path = tmp_path / "ckpt" / "model.safetensors"
    sd = load_file(str(path))
    save_file({k: v for k, v in sd.items() if not (k.endswith(".weight") and k[:-7] in info.osft_layers)}, str(path),
              metadata={"format": "pt"})  # what osftrt <= 1.3 wrote
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt", attn_implementation="eager")
    with pytest.raises(ot.CheckpointError, match=r"ckpt: layer model\.layers\.0\.self_attn\.q_proj has OSFT factors "
                                                 r"but no dense weight .*add_dense_weights"):
        ot.apply_osftrt(loaded, osft=True)  # instead of going on from randomly initialized weights
    with pytest.raises(ot.CheckpointError, match="no dense weight"):
        ot.check_checkpoint(tmp_path / "ckpt")
    added = ot.add_dense_weights(tmp_path / "ckpt")
    assert sorted(added) == sorted(info.osft_layers)
    assert not [f for f in os.listdir(tmp_path / "ckpt") if f.endswith(".tmp")]
    ot.check_checkpoint(tmp_path / "ckpt")
    _assert_opens_as_trained(tmp_path / "ckpt", model, tmp_path)


def test_a_truncated_file_is_refused_naming_the_file(tmp_path):
    model, _ = _patched(0)
    model.save_pretrained(tmp_path / "ckpt")
    path = tmp_path / "ckpt" / "model.safetensors"
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)
    with pytest.raises(ot.CheckpointError, match=r"ckpt/model\.safetensors: "):
        ot.check_checkpoint(tmp_path / "ckpt")
    other, _ = _patched(1)
    with pytest.raises(Exception):  # Trainer's own loader (safetensors) refuses it too
        _trainer(other, tmp_path / "resumed").train(resume_from_checkpoint=str(tmp_path / "ckpt"))
    fresh = _model(1)
    with pytest.raises(ot.CheckpointError, match=r"model\.safetensors"):
        ot.apply_osftrt(fresh, osft=True, osft_factors=tmp_path / "ckpt")
    assert not any(isinstance(m, OSFTLinear) for m in fresh.modules())


def test_factors_from_another_folder_build_the_layers(tmp_path):
    """A base model plus an OSFT checkpoint's factors (osft_factors=folder):
    the layers are the checkpoint's, whatever the base's weights are."""
    model, info, _ = _trained()
    model.save_pretrained(tmp_path / "ckpt")
    base = _model(1)
    ot.apply_osftrt(base, osft=True, rank_ratio=0.5, osft_factors=tmp_path / "ckpt")
    sd, want = base.state_dict(), model.state_dict()
    for n in info.osft_layers:
        for f in FACTORS:
            assert torch.equal(sd[n + "." + f], want[n + "." + f]), (n, f)
    with pytest.raises(ot.CheckpointError, match="holds no OSFT factors"):
        ot.apply_osftrt(_model(2), osft=True, osft_factors=_model(3).state_dict())
