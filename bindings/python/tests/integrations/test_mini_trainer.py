"""osftrt.integrations.mini_trainer against mini_trainer's own OSFT model code
(``rhai-innovation-mini-trainer`` from PyPI, Python 3.11-3.12; skipped where
absent), on the CPU: the same trajectory as mini_trainer's own training
(its optim_wrapper projection) from the same factors; the same splits with
rank_rounding="floor"; checkpoints mapped both ways keep the outputs and the
frozen subspaces (principal angles); mini_trainer's save hook writes a plain
Hugging Face model; the decomposition split over 2 gloo ranks gives the
single process's factors with half the SVDs per rank."""
import os
import sys

import pytest
import torch

transformers = pytest.importorskip("transformers")
mt_utils = pytest.importorskip("mini_trainer.osft_utils",
                               reason="rhai-innovation-mini-trainer is not installed (Python 3.11-3.12)")

import osftrt.integrations.mini_trainer as mt  # noqa: E402
from osftrt.torch import OSFTLinear, OSFTProjector  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from conftest import run_ranks  # noqa: E402

CONFIG = dict(hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=256, max_position_embeddings=128)


def tiny_llama(seed=0):
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG))


def mini_trainer_model(ratio=0.5, seed=0):
    """mini_trainer's OSFT Llama, decomposed by mini_trainer itself."""
    torch.manual_seed(seed)
    cls = mt_utils.create_osft_model_class(transformers.LlamaForCausalLM)
    m = cls(transformers.LlamaConfig(**CONFIG), initialize_osft=False)
    m.osft_config = mt_utils.auto_generate_target_osft_config(m, rank_ratio=ratio)
    m.reinitialize_osft(decompose_existing_weights=True)
    return m


IDS = torch.randint(0, 256, (4, 32), generator=torch.Generator().manual_seed(1))


def _train(model, on_osftrt, steps=12):
    if on_osftrt:
        mt.use_osftrt(model)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    opt = mt_utils.optim_wrapper(opt, model)  # mini_trainer's: its projection, a no-op once on osftrt
    losses = []
    for _ in range(steps):
        loss = model(input_ids=IDS, labels=IDS).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def test_same_trajectory_from_its_factors():
    ref = _train(mini_trainer_model(), False)
    model = mini_trainer_model()
    ours = _train(model, True)
    assert max(abs(a - b) / abs(a) for a, b in zip(ref, ours)) <= 1e-5, (ref, ours)
    assert ours[-1] < ours[0]
    assert not mt.mini_trainer_layers(model) and len(model.osftrt_layers) == 14
    assert model.model.layers[0].mlp._osftrt_plan is not None  # tiled MLPs, fused loss (defaults)
    u, v = model.osftrt_projector.orthogonality()
    assert u <= 1e-5 and v <= 1e-5


def test_per_token_losses_as_its_training_loop_sums_them(monkeypatch):
    """mini_trainer's setup_model patches transformers' fixed_cross_entropy
    to reduction "none" and its loop sums output.loss: the fused loss gives
    the same per-token losses."""
    from mini_trainer.none_reduction_losses import hf_fixed_cross_entropy_none_reduction
    from transformers.loss import loss_utils

    monkeypatch.setattr(loss_utils, "fixed_cross_entropy", hf_fixed_cross_entropy_none_reduction)
    ref, ours = mini_trainer_model(), mini_trainer_model()
    mt.use_osftrt(ours)
    labels = IDS.clone()
    labels[:, :5] = -100
    a = ref(input_ids=IDS, labels=labels).loss
    b = ours(input_ids=IDS, labels=labels).loss
    assert a.shape == b.shape and a.dim() == 1
    assert (a - b).abs().max() <= 1e-5 * a.abs().max()
    a.float().sum().backward()
    b.float().sum().backward()
    for (qn, m) in mt.mini_trainer_layers(ref).items():
        want, got = m.osft_params.U_low.grad, ours.get_submodule(qn).u_low.grad
        assert (want - got).abs().max() <= 1e-4 * want.abs().max(), qn


def test_floor_rounding_gives_its_splits():
    ratio = 0.37  # 0.37 * 64 = 23.68: floor 23, round 24
    want = {k.rsplit(".", 1)[0]: v for k, v in mini_trainer_model(ratio).osft_config.items()}
    floor = {qn: m.rank for qn, m in mt.decompose(tiny_llama(), ratio).items()}
    rounded = {qn: m.rank for qn, m in mt.decompose(tiny_llama(), ratio, rank_rounding="round").items()}
    assert floor == want
    assert rounded != want


def _angles(a, b):
    """Largest principal angle between the row spaces of a and b (r x K)."""
    qa, qb = torch.linalg.qr(a.double().T)[0], torch.linalg.qr(b.double().T)[0]
    s = torch.linalg.svdvals(qa.T @ qb).clamp(max=1.0)
    return torch.arccos(s.min()).item()


def test_checkpoints_both_ways_keep_outputs_and_subspaces(tmp_path):
    src = mini_trainer_model(0.5)
    _train(src, False, steps=3)  # trained factors, not the initial SVD
    with torch.no_grad():
        want = src(input_ids=IDS).logits
    sd = {k: v.detach().clone() for k, v in src.state_dict().items()}
    # mini_trainer -> osftrt: the mapped checkpoint into a model of osftrt layers of the same split
    mapped = mt.from_mini_trainer_state_dict(sd)
    dst = tiny_llama(seed=9)
    mt.decompose(dst, 0.5)
    missing, unexpected = dst.load_state_dict(mapped, strict=False)
    assert not unexpected and all(k.endswith(".weight") is False for k in missing), (missing, unexpected)
    with torch.no_grad():
        got = dst(input_ids=IDS).logits
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()
    for qn, m in mt.mini_trainer_layers(src).items():
        o = dst.get_submodule(qn)
        assert _angles(m.osft_V_high, o.v_high) <= 1e-6 and _angles(m.osft_U_high.T, o.u_high.T) <= 1e-6
    # osftrt -> mini_trainer: back into a fresh mini_trainer model, strictly
    back = mini_trainer_model(0.5, seed=5)
    back.load_state_dict(mt.to_mini_trainer_state_dict(dst.state_dict()), strict=True)
    with torch.no_grad():
        again = back(input_ids=IDS).logits
    assert (again - want).abs().max() <= 1e-5 * want.abs().max()
    for qn, m in mt.mini_trainer_layers(back).items():
        assert _angles(m.osft_V_high, dst.get_submodule(qn).v_high) <= 1e-6


def test_save_hook_writes_a_plain_model(tmp_path):
    model = mini_trainer_model()
    _train(model, True, steps=3)
    with torch.no_grad():
        want = model(input_ids=IDS).logits
    dense = model.prepare_state_dict_for_save(model.state_dict())  # what mini_trainer's save_model calls
    plain = tiny_llama(seed=11)
    plain.load_state_dict(dense, strict=True)
    plain.save_pretrained(tmp_path)
    loaded = transformers.LlamaForCausalLM.from_pretrained(tmp_path)
    with torch.no_grad():
        got = loaded(input_ids=IDS).logits
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()


def test_decomposition_split_over_two_gloo_ranks(tmp_path):
    run_ranks(os.path.join("integrations", "mini_trainer_worker.py"), 2, tmp_path, str(tmp_path))
    saved = torch.load(tmp_path / "dist.pt")
    assert saved["svds"] == [7, 7], "each of 2 ranks decomposes half of the 14 layers"
    single = mt.decompose(tiny_llama(seed=3), 0.37)
    for qn, m in single.items():
        for k in mt.MINI_TRAINER_KEYS:
            assert torch.equal(getattr(m, k), saved["factors"][qn][k]), (qn, k)


def test_factors_from_elsewhere_and_errors():
    src = mini_trainer_model(0.5)
    factors = {}
    for qn, m in mt.mini_trainer_layers(src).items():
        p = m.osft_params
        factors[qn] = {"u_high": m.osft_U_high, "s_high": m.osft_S_high, "v_high": m.osft_V_high,
                       "u_low": p.U_low, "s_low": p.S_low, "v_low": p.V_low}
    dst = tiny_llama(seed=4)
    layers = mt.decompose(dst, 0.5, factors=factors)
    for qn, m in layers.items():
        assert isinstance(m, OSFTLinear) and torch.equal(m.v_high, factors[qn]["v_high"])
    with pytest.raises(ValueError, match="no mini_trainer OSFT layer"):
        mt.use_osftrt(tiny_llama())
    assert isinstance(OSFTProjector(dst), OSFTProjector)
