"""osftrt.integrations.trl.SFTTrainer against TRL's own SFTTrainer (PyPI
``trl``; skipped where absent), on the CPU: a model patched with the fused
cross-entropy and tiled MLPs gives the unpatched run's losses; an OSFT run
trains, keeps the updates orthogonal, and its ``save_model`` folder opens in
plain transformers (no missing or new weights) with the same logits."""
import os
import sys

import pytest
import torch

trl = pytest.importorskip("trl", reason="TRL is not installed")
datasets = pytest.importorskip("datasets")
transformers = pytest.importorskip("transformers")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fixtures  # noqa: E402

from osftrt.integrations.trl import SFTTrainer, fused_loss  # noqa: E402


def _run(tmp_path, name, cls, osftrt=None, steps=6):
    lines = fixtures.sentences()
    tok = fixtures.tokenizer(lines)
    model = fixtures.tiny_llama()
    args = trl.SFTConfig(output_dir=str(tmp_path / name), max_steps=steps, per_device_train_batch_size=4,
                         learning_rate=1e-3, lr_scheduler_type="constant", logging_steps=1, report_to=[],
                         save_strategy="no", seed=42, data_seed=42, dataloader_num_workers=0, max_length=64,
                         packing=False, use_cpu=True, bf16=False, fp16=False)
    kw = {"osftrt": osftrt} if cls is SFTTrainer else {}
    trainer = cls(model=model, args=args, train_dataset=datasets.Dataset.from_list([{"text": t} for t in lines]),
                  processing_class=tok, **kw)
    losses = []
    real = trainer.compute_loss

    def record(*a, **k):
        out = real(*a, **k)
        losses.append((out[0] if isinstance(out, tuple) else out).item())
        return out

    trainer.compute_loss = record
    trainer.train()
    return trainer, losses, tok


def test_fused_loss_and_tiled_mlp_equal_the_unpatched_run(tmp_path):
    _, plain, _ = _run(tmp_path, "plain", trl.SFTTrainer)
    trainer, ours, _ = _run(tmp_path, "osftrt", SFTTrainer, osftrt={})
    assert fused_loss(trainer.model) and trainer.osftrt_patched.tiled_mlps == 2
    assert len(plain) == len(ours) == 6
    assert max(abs(a - b) / abs(a) for a, b in zip(plain, ours)) <= 1e-6, (plain, ours)
    assert "num_tokens" in trainer.state.log_history[0]


def test_osft_run_saves_a_plain_model(tmp_path):
    trainer, losses, tok = _run(tmp_path, "osft", SFTTrainer, osftrt={"osft": True, "rank_ratio": 0.5}, steps=8)
    assert losses[-1] < losses[0]
    u, v = trainer.osftrt_patched.projector.orthogonality()
    assert u <= 1e-5 and v <= 1e-5
    out = tmp_path / "saved"
    trainer.save_model(str(out))
    ids = torch.tensor([tok("the quick brown fox jumps over the lazy dog")["input_ids"]])
    with torch.no_grad():
        want = trainer.model(input_ids=ids).logits
    plain, info = transformers.LlamaForCausalLM.from_pretrained(str(out), output_loading_info=True)
    assert not info["missing_keys"] and not info["mismatched_keys"], info
    with torch.no_grad():
        got = plain(input_ids=ids).logits
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()


def test_liger_and_fused_loss_together_refused(tmp_path):
    model = fixtures.tiny_llama()
    import osftrt.transformers as otf

    otf.apply_osftrt(model)
    args = trl.SFTConfig(output_dir=str(tmp_path / "x"), use_liger_kernel=True, report_to=[], use_cpu=True)
    with pytest.raises(ValueError, match="use_liger_kernel"):
        SFTTrainer(model=model, args=args, train_dataset=datasets.Dataset.from_list([{"text": "a b"}]))
