"""osftrt.integrations.axolotl.OsftrtPlugin in real ``axolotl train`` runs
(PyPI ``axolotl``, Python >= 3.12; skipped where absent) on a tiny Llama
built here (no hub), on the CPU: one ``plugins:`` line gives plain axolotl's
losses (fused cross-entropy and tiled MLPs, within 1e-6); an OSFT run trains
and writes an intermediate checkpoint and a final model that open in plain
transformers; settings that replace the same forwards are refused with the
key to change; the plugin is registered under axolotl's entry point and
logs under axolotl's logger names."""
import importlib.metadata
import os
import subprocess
import sys

import pytest
import yaml

pytest.importorskip("axolotl", reason="axolotl is not installed (Python >= 3.12)")
transformers = pytest.importorskip("transformers")
import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fixtures  # noqa: E402

from osftrt.integrations.axolotl import PLUGIN_NAME, OsftrtArgs, conflicts  # noqa: E402

BIN = os.path.dirname(sys.executable)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("axolotl")
    model, data = fixtures.model_folder(str(root))
    return root, model, data


def _config(root, model, data, name, **extra):
    cfg = dict(base_model=model, model_type="LlamaForCausalLM", tokenizer_type="PreTrainedTokenizerFast",
               datasets=[dict(path=data, ds_type="json", type="completion")],
               dataset_prepared_path=str(root / "prepared"), val_set_size=0, output_dir=str(root / name),
               sequence_len=64, sample_packing=False, micro_batch_size=4, gradient_accumulation_steps=1, max_steps=6,
               num_epochs=1, learning_rate=1e-3, optimizer="adamw_torch", lr_scheduler="constant", logging_steps=1,
               save_strategy="no", bf16=False, fp16=False, tf32=False, seed=42, dataloader_num_workers=0,
               special_tokens={"pad_token": "<pad>"}, osftrt_loss_file=str(root / (name + ".losses")))
    cfg.update(extra)
    path = root / (name + ".yml")
    path.write_text(yaml.safe_dump(cfg))
    return path


def _train(path, expect_ok=True):
    env = dict(os.environ, PATH=BIN + os.pathsep + os.environ.get("PATH", ""), HF_HUB_OFFLINE="1",
               AXOLOTL_DO_NOT_TRACK="1", WANDB_MODE="disabled", CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    p = subprocess.run([os.path.join(BIN, "axolotl"), "train", str(path), "--launcher", "python"],
                       capture_output=True, text=True, env=env, timeout=900)
    out = p.stdout + p.stderr
    if expect_ok:
        assert p.returncode == 0, out[-6000:]
    return p.returncode, out


def _losses(path):
    return [float(x) for x in open(path).read().split()]


def test_plugin_line_gives_plain_axolotls_losses(folder):
    root, model, data = folder
    _train(_config(root, model, data, "plain"))
    rc, out = _train(_config(root, model, data, "osftrt", plugins=[PLUGIN_NAME]))
    plain, ours = _losses(root / "plain.losses"), _losses(root / "osftrt.losses")
    assert len(plain) == len(ours) == 6
    assert max(abs(a - b) / abs(a) for a, b in zip(plain, ours)) <= 1e-6, (plain, ours)
    assert "[axolotl.integrations.osftrt] osftrt: fused cross-entropy on, 2 tiled MLPs, 0 OSFT layers" in out


def test_osft_run_writes_models_plain_transformers_opens(folder):
    root, model, data = folder
    _train(_config(root, model, data, "osft", plugins=[PLUGIN_NAME], osftrt_osft=True, osftrt_rank_ratio=0.5,
                   save_strategy="steps", save_steps=3))
    losses = _losses(root / "osft.losses")
    assert losses[-1] < losses[0]
    ids = torch.tensor([[1, 5, 9, 12, 7, 30, 4]])
    final, info = transformers.LlamaForCausalLM.from_pretrained(str(root / "osft"), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info  # exported dense
    ckpt, info = transformers.LlamaForCausalLM.from_pretrained(str(root / "osft" / "checkpoint-3"),
                                                               output_loading_info=True)
    assert not info["missing_keys"], info  # the dense weight beside the factors
    start = transformers.LlamaForCausalLM.from_pretrained(model)
    with torch.no_grad():
        a, b, c = (m(input_ids=ids).logits for m in (start, ckpt, final))
    assert (a - b).abs().max() > 1e-4 and (b - c).abs().max() > 1e-6, "both saved the trained weights"


@pytest.mark.parametrize("extra,needle", [
    ({"tiled_mlp": True}, "tiled_mlp (axolotl's TiledMLP)"),
    ({"liger_glu_activation": True}, "liger_glu_activation"),
    ({"liger_fused_linear_cross_entropy": True}, "liger_fused_linear_cross_entropy"),
    ({"plugins": [PLUGIN_NAME, "axolotl.integrations.cut_cross_entropy.CutCrossEntropyPlugin"]}, "Cut Cross-Entropy"),
    ({"adapter": "lora", "osftrt_osft": True}, "adapter: lora"),
    ({"osftrt_activation_memory": "min", "gradient_checkpointing": True}, "gradient_checkpointing"),
])
def test_conflicting_settings_refused(extra, needle):
    cfg = {"plugins": [PLUGIN_NAME]}
    cfg.update(extra)
    assert any(needle in c for c in conflicts(cfg)), conflicts(cfg)
    with pytest.raises(ValueError, match="osftrt plugin: "):
        OsftrtArgs.model_validate(cfg)
    off = dict(cfg, osftrt=False)  # the plugin off: nothing to refuse
    OsftrtArgs.model_validate(off)


def test_axolotl_refuses_a_conflicting_run(folder):
    root, model, data = folder
    rc, out = _train(_config(root, model, data, "conflict", plugins=[PLUGIN_NAME], tiled_mlp=True), expect_ok=False)
    assert rc != 0 and "osftrt plugin: tiled_mlp (axolotl's TiledMLP)" in out, out[-3000:]


def test_registered_under_axolotls_entry_point():
    points = importlib.metadata.entry_points(group="axolotl.plugins")
    assert any(p.value == "osftrt.integrations.axolotl:OsftrtPlugin" for p in points)


def test_fsdp2_on_two_gloo_ranks_runs_osft(tmp_path):
    """The plugin's FSDP2 path through its hooks on 2 gloo processes, rank 1
    on the meta device as cpu_ram_efficient_loading leaves it
    (axolotl_fsdp2_worker.py): the single process's losses, orthogonality."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from conftest import run_ranks

    outs = run_ranks(os.path.join("integrations", "axolotl_fsdp2_worker.py"), 2, tmp_path)
    assert all("orthogonality" in o for o in outs)
