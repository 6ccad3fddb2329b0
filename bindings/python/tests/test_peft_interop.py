"""osftrt.peft against the real peft package: PEFT OSF model -> OSFTLinear
(the same factors, the same outputs), osftrt model -> PEFT OSF adapter that
PeftModel.from_pretrained loads (the same outputs), and back."""
import copy
import json
import os

import pytest
import torch
import torch.nn as nn

peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")
if not hasattr(peft, "OSFConfig"):
    pytest.skip("peft without OSF (needs peft >= 0.17)", allow_module_level=True)

import osftrt.peft as opeft  # noqa: E402
from osftrt.torch import LLAMA_LINEAR_NAMES, OSFTLinear, OSFTProjector, convert_linear_layers  # noqa: E402

from conftest import assert_close  # noqa: E402

TOL = dict(rtol=1e-4, atol=2e-5)


def tiny_llama(seed):
    """q/o square, k/v 32x64 (N < K), gate/up 128x64 (N > K), down 64x128."""
    cfg = transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=128,
        max_position_embeddings=64,
    )
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # a spread-out spectrum, as a trained model has
        for m in model.modules():
            if isinstance(m, nn.Linear):
                m.weight.mul_(torch.logspace(0, -1, m.in_features))
    return model


def tokens(gen, batch=2, seq=12):
    return torch.randint(0, 128, (batch, seq), generator=gen)


def logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits.float()


def osf_peft_model(base, rank_pattern=None):
    cfg = peft.OSFConfig(target_modules=list(LLAMA_LINEAR_NAMES), effective_rank=0.5, rank_pattern=rank_pattern)
    return peft.get_peft_model(base, cfg)


def osf_layers(model):
    from peft.tuners.osf.layer import OSFLayer

    return {n: m for n, m in model.named_modules() if isinstance(m, OSFLayer)}


def strip(name):
    return name[len("base_model.model.") :] if name.startswith("base_model.model.") else name


@torch.no_grad()
def move_within_low_subspace(peft_model, gen, scale=0.05):
    """As PEFT training with projected gradients does: U_low, V_low move
    inside span(U_low_init), span(V_low_init); S_low changes freely."""
    for layer in osf_layers(peft_model).values():
        p = layer.osf_svd_params["default"]
        ui, vi = layer._osf_U_low_init["default"], layer._osf_V_low_init["default"]
        m = ui.shape[1]
        p["U_low"].add_(ui @ (scale * torch.randn(m, m, generator=gen)))
        p["V_low"].add_((scale * torch.randn(m, m, generator=gen)) @ vi)
        p["S_low"].mul_(1 + scale * torch.randn(m, generator=gen))


def check_orthogonal(model):
    with OSFTProjector(model) as proj:
        ou, ov = proj.orthogonality()
    assert ou <= 1e-5 and ov <= 1e-5, (ou, ov)


def test_from_peft_same_factors_same_outputs(gen):
    pm = osf_peft_model(tiny_llama(1), rank_pattern={r"mlp\.\w+": 0.25})
    move_within_low_subspace(pm, gen)
    ids = tokens(gen)
    want = logits(pm, ids)
    layers = osf_layers(pm)
    saved = {
        strip(n): dict(
            {k: v.detach().clone() for k, v in l.osf_svd_params["default"].items()},
            rank=l.effective_rank["default"],
            w0=l.get_base_layer().weight.detach().clone(),
            low_init=(l._osf_U_low_init["default"] * l._osf_S_low_init["default"]) @ l._osf_V_low_init["default"],
            U_high=l._osf_U_high["default"].clone() if "default" in l._osf_U_high else None,
            V_high=l._osf_V_high["default"].clone() if "default" in l._osf_V_high else None,
        )
        for n, l in layers.items()
    }
    assert {v["U_high"] is None for v in saved.values()} == {True, False}
    assert {v["V_high"] is None for v in saved.values()} == {True, False}

    model = opeft.from_peft(pm)
    assert isinstance(model, transformers.LlamaForCausalLM)
    assert not osf_layers(model)
    osft = {n: m for n, m in model.named_modules() if isinstance(m, OSFTLinear)}
    assert set(osft) == set(saved) and len(osft) == 14
    for n, m in osft.items():
        s = saved[n]
        assert m.rank == s["rank"] == (16 if ".mlp." in n else min(m.in_features, m.out_features) // 2), n
        # the trainable factors are PEFT's (values, not storage)
        assert torch.equal(m.u_low, s["U_low"]) and torch.equal(m.s_low, s["S_low"]) and torch.equal(m.v_low, s["V_low"]), n
        assert m.u_low.data_ptr() != s["U_low"].data_ptr()
        # PEFT's stored frozen factors are used as they are
        if s["U_high"] is not None:
            assert torch.equal(m.u_high, s["U_high"]), n
        if s["V_high"] is not None:
            assert torch.equal(m.v_high, s["V_high"]), n
        # the frozen part is PEFT's: W0 - U_low_init S_low_init V_low_init
        frozen = (m.u_high * m.s_high) @ m.v_high
        assert_close(frozen, s["w0"] - s["low_init"], 1e-5, 1e-6, n)
        assert_close(m.u_high.T @ m.u_high, torch.eye(m.rank), 0, 1e-5, n)
        assert_close(m.v_high @ m.v_high.T, torch.eye(m.rank), 0, 1e-5, n)
    assert_close(logits(model, ids), want, what="logits", **TOL)
    ids2 = tokens(gen)
    assert_close(logits(model, ids2), logits(pm, ids2), what="logits (fresh inputs)", **TOL)
    check_orthogonal(model)


def test_peft_trained_adapter_to_osftrt(gen, tmp_path):
    base = tiny_llama(2)
    fresh = copy.deepcopy(base)
    pm = osf_peft_model(base)
    opt = torch.optim.SGD([p for p in pm.parameters() if p.requires_grad], lr=0.5)
    pm.train()
    for _ in range(3):
        ids = tokens(gen)
        pm(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()
    pm.eval()
    ids = tokens(gen)
    want = logits(pm, ids)
    assert (want - logits(fresh, ids)).abs().max() > 1e-3  # it did train
    pm.save_pretrained(str(tmp_path))

    model = opeft.load_peft_adapter(fresh, str(tmp_path))
    assert_close(logits(model, ids), want, what="logits", **TOL)
    check_orthogonal(model)
    trained = {strip(n): l.osf_svd_params["default"]["S_low"] for n, l in osf_layers(pm).items()}
    for n, m in model.named_modules():
        if isinstance(m, OSFTLinear):
            assert_close(m.s_low, trained[n], 0, 1e-7, n)


def osftrt_train(model, gen, steps=3):
    for p in model.parameters():
        p.requires_grad_(False)
    osft = [m for m in model.modules() if isinstance(m, OSFTLinear)]
    params = [p for m in osft for p in (m.u_low, m.s_low, m.v_low)]
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.AdamW(params, lr=1e-2)
    proj = OSFTProjector(model).attach(opt)
    model.train()
    for _ in range(steps):
        ids = tokens(gen)
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()
    model.eval()
    ou, ov = proj.orthogonality()
    proj.close()
    assert ou <= 1e-5 and ov <= 1e-5


def test_osftrt_trained_model_saved_as_peft_adapter(gen, tmp_path):
    base = tiny_llama(3)
    model = copy.deepcopy(base)
    convert_linear_layers(model, ("q_proj", "k_proj", "v_proj", "o_proj"), rank_ratio=0.5)
    convert_linear_layers(model, ("gate_proj", "up_proj", "down_proj"), rank_ratio=0.25)
    osftrt_train(model, gen)
    ids = tokens(gen)
    want = logits(model, ids)
    assert (want - logits(base, ids)).abs().max() > 1e-3

    files = opeft.save_peft_adapter(model, str(tmp_path), "tiny-llama", base_model=base)
    assert sorted(os.path.basename(f) for f in files) == ["adapter_config.json", "adapter_model.safetensors"]
    cfg = json.load(open(tmp_path / "adapter_config.json"))
    assert cfg["peft_type"] == "OSF" and cfg["base_model_name_or_path"] == "tiny-llama"
    assert cfg["target_modules"] == sorted(LLAMA_LINEAR_NAMES)
    assert cfg["effective_rank"] == 16 and set(cfg["rank_pattern"].values()) == {32} and len(cfg["rank_pattern"]) == 4

    loaded = peft.PeftModel.from_pretrained(copy.deepcopy(base), str(tmp_path))
    for n, l in osf_layers(loaded).items():
        m = model.get_submodule(strip(n))
        assert l.effective_rank["default"] == m.rank, n
        assert torch.equal(l.osf_svd_params["default"]["U_low"], m.u_low), n
    assert_close(logits(loaded, ids), want, what="PEFT-loaded logits", **TOL)

    # and back: the adapter -> osftrt again
    again = opeft.load_peft_adapter(copy.deepcopy(base), str(tmp_path))
    assert_close(logits(again, ids), want, what="reloaded logits", **TOL)
    check_orthogonal(again)


def test_save_checks_the_base_model(gen, tmp_path):
    base = tiny_llama(4)
    model = copy.deepcopy(base)
    convert_linear_layers(model, ("q_proj", "gate_proj"), rank_ratio=0.5)
    assert opeft.check_base_weights(model, base) == []
    assert opeft.check_base_weights(model, base.state_dict()) == []
    cfg = opeft._peft_config(model, opeft._osft_layers(model), None, None, None)
    assert cfg["target_modules"] == ["gate_proj", "q_proj"] and cfg["effective_rank"] == 32 and cfg["rank_pattern"] is None
    with pytest.raises(ValueError, match="not singular triplets"):
        opeft.save_peft_adapter(model, str(tmp_path), base_model=tiny_llama(5))
    with torch.no_grad():  # singular triplets of W0, but not its top 32 frozen
        layer = model.model.layers[0].self_attn.q_proj
        for t in (layer._s_full, layer._vt_full):  # views of one buffer each, the high part first
            t[[31, 32]] = t[[32, 31]]
        u31 = layer.u_high[:, 31].clone()  # U's parts are compact tensors of their own
        layer.u_high[:, 31] = layer.u_low[:, 0]
        layer.u_low[:, 0] = u31
    problems = opeft.check_base_weights(model, base)
    assert len(problems) == 1 and "model.layers.0.self_attn.q_proj" in problems[0] and "not the top 32" in problems[0]
    assert not os.path.exists(tmp_path / "adapter_config.json")


class Biased(nn.Module):
    def __init__(self):
        super().__init__()
        self.wide = nn.Linear(48, 24)  # N < K
        self.tall = nn.Linear(24, 40)  # N > K
        self.sq = nn.Linear(40, 40)
        self.frozen = nn.Linear(40, 8)  # effective_rank = min(N, K): nothing to train

    def forward(self, x):
        return self.frozen(torch.tanh(self.sq(torch.tanh(self.tall(torch.tanh(self.wide(x)))))))


def test_custom_model_with_biases_round_trip(gen, tmp_path):
    torch.manual_seed(6)
    base = Biased()
    fresh = copy.deepcopy(base)
    cfg = peft.OSFConfig(target_modules=["wide", "tall", "sq", "frozen"], effective_rank=8, rank_pattern={"frozen": 8, "sq": 30})
    pm = peft.get_peft_model(base, cfg)
    move_within_low_subspace(pm, gen)
    x = torch.randn(5, 48, generator=gen)
    with torch.no_grad():
        want = pm(x)
    model = opeft.from_peft(pm)
    assert isinstance(model.frozen, nn.Linear) and not isinstance(model.frozen, OSFTLinear)
    assert model.sq.rank == 30 and model.wide.rank == 8 and model.tall.bias is not None
    with torch.no_grad():
        assert_close(model(x), want, what="outputs", **TOL)
    check_orthogonal(model)

    # converted model -> adapter -> PEFT on the untouched base: same outputs
    model.frozen = OSFTLinear.from_linear(model.frozen, rank_ratio=0.5)
    opeft.save_peft_adapter(model, str(tmp_path), base_model=fresh, safe_serialization=False)
    assert os.path.exists(tmp_path / "adapter_model.bin")
    loaded = peft.PeftModel.from_pretrained(copy.deepcopy(fresh), str(tmp_path))
    with torch.no_grad():
        assert_close(loaded(x), model(x), what="PEFT-loaded outputs", **TOL)
        assert_close(loaded(x), want, what="PEFT-loaded vs original", **TOL)
    with torch.no_grad():
        model.tall.bias.add_(0.1)
    problems = opeft.check_base_weights(model, fresh)
    assert len(problems) == 1 and "bias" in problems[0]
