"""osftrt.transformers: Hugging Face causal LMs patched in place, against the
same models unpatched (tiny random models built from their configs; no
downloads). Needs transformers (the PyPI PyTorch run of CI); skipped
elsewhere."""
import copy
import io
import pickle

import pytest
import torch

transformers = pytest.importorskip("transformers")
import osftrt.transformers as ot  # noqa: E402
from osftrt.torch import OSFTLinear  # noqa: E402

VOCAB = 96


def _config(family):
    common = dict(hidden_size=48, intermediate_size=80, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=64)
    if family == "llama":
        return transformers.LlamaConfig(**common)
    if family == "mistral":
        return transformers.MistralConfig(**common, sliding_window=None)
    if family == "qwen2":
        return transformers.Qwen2Config(**common)
    if family == "qwen3":
        return transformers.Qwen3Config(**common, head_dim=12)
    if family == "gemma2":
        return transformers.Gemma2Config(**common, head_dim=12, final_logit_softcapping=3.0,
                                         attn_logit_softcapping=None, query_pre_attn_scalar=12)
    if family == "olmo2":
        return transformers.Olmo2Config(**common)
    raise AssertionError(family)


def _model(family, seed=0):
    torch.manual_seed(seed)
    cfg = _config(family)
    cfg._attn_implementation = "eager"
    m = transformers.AutoModelForCausalLM.from_config(cfg).float()
    with torch.no_grad():  # a random, non-trivial head (tied heads included)
        m.get_output_embeddings().weight.normal_(0, 0.5)
    return m


def _batch(gen, batch=3, seq=12):
    ids = torch.randint(0, VOCAB, (batch, seq), generator=gen)
    labels = ids.clone()
    labels[0, :4] = -100  # a prompt that is not trained on
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # left padding
    labels[1, :3] = -100
    return ids, mask, labels


def _grads(model):
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def _assert_grads_close(got, want, rtol=1e-4):
    assert set(got) == set(want), set(got) ^ set(want)
    for n in want:
        scale = want[n].abs().max().item() + 1e-12
        err = (got[n] - want[n]).abs().max().item()
        assert err <= rtol * scale + 1e-7, "%s: max err %.3e (scale %.3e)" % (n, err, scale)


@pytest.mark.parametrize("family", ot.FAMILIES)
def test_patched_loss_and_every_gradient_match_the_model(family, gen):
    ref = _model(family)
    pat = copy.deepcopy(ref)
    info = ot.apply_osftrt(pat)
    assert info.tiled_mlps == 2 and info.fused_cross_entropy
    assert type(pat).__name__ == type(ref).__name__ and isinstance(pat, type(ref))
    ids, mask, labels = _batch(gen)
    want = ref(input_ids=ids, attention_mask=mask, labels=labels)
    want.loss.backward()
    got = pat(input_ids=ids, attention_mask=mask, labels=labels)
    got.loss.backward()
    assert got.logits is None  # never materialized with labels
    torch.testing.assert_close(got.loss, want.loss, rtol=1e-5, atol=1e-6)
    _assert_grads_close(_grads(pat), _grads(ref))


@pytest.mark.parametrize("family", ot.FAMILIES)
def test_long_context_knob_matches_the_model_and_skips_only_unread_mlp_outputs(family, gen, monkeypatch):
    """activation_memory="min" in every family: loss and gradients equal the
    unpatched model's; the checkpoint's recompute computes the tiled MLP's
    output only where a norm after the MLP reads it (Gemma 2, OLMo 2)."""
    from osftrt import capi

    ref = _model(family)
    pat = copy.deepcopy(ref)
    plan = ot.apply_osftrt(pat, activation_memory="min").long_context
    skips = family not in ("gemma2", "olmo2")
    assert plan.mlp_skipped_in_recompute == skips
    calls = []
    forward = capi.osft_mlp_forward
    monkeypatch.setattr(capi, "osft_mlp_forward", lambda *a: calls.append(1) or forward(*a))
    ids, mask, labels = _batch(gen)
    want = ref(input_ids=ids, attention_mask=mask, labels=labels)
    want.loss.backward()
    got = pat(input_ids=ids, attention_mask=mask, labels=labels)
    assert len(calls) == 2  # one per layer
    got.loss.backward()
    assert len(calls) == (2 if skips else 4)
    torch.testing.assert_close(got.loss, want.loss, rtol=1e-5, atol=1e-6)
    _assert_grads_close(_grads(pat), _grads(ref))


@pytest.mark.parametrize("family", ["llama", "gemma2"])
def test_num_items_in_batch_and_shift_labels(family, gen):
    ref = _model(family)
    pat = copy.deepcopy(ref)
    ot.apply_osftrt(pat)
    ids, mask, labels = _batch(gen)
    n = torch.tensor(17)
    want = ref(input_ids=ids, attention_mask=mask, labels=labels, num_items_in_batch=n).loss
    got = pat(input_ids=ids, attention_mask=mask, labels=labels, num_items_in_batch=n).loss
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    shift = torch.nn.functional.pad(labels, (0, 1), value=-100)[..., 1:].contiguous()
    want = ref(input_ids=ids, attention_mask=mask, shift_labels=shift, labels=labels).loss
    got = pat(input_ids=ids, attention_mask=mask, shift_labels=shift).loss
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_without_labels_the_model_gives_its_logits(gen):
    ref = _model("llama")
    pat = copy.deepcopy(ref)
    ot.apply_osftrt(pat)
    ids, mask, _ = _batch(gen)
    with torch.no_grad():
        want = ref(input_ids=ids, attention_mask=mask).logits
        got = pat(input_ids=ids, attention_mask=mask).logits
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        out = pat.generate(ids[:1], max_new_tokens=4, do_sample=False)
        assert torch.equal(out, ref.generate(ids[:1], max_new_tokens=4, do_sample=False))
    tup = pat(input_ids=ids, labels=ids, return_dict=False)
    assert torch.is_tensor(tup[0]) and tup[0].dim() == 0


def test_osft_patch_matches_the_converted_model_and_stays_orthogonal(gen):
    base = _model("qwen2")
    ref = copy.deepcopy(base)
    pat = copy.deepcopy(base)
    from osftrt.torch import convert_linear_layers

    convert_linear_layers(ref, rank_ratio=0.5)  # the same SVD, the model's own loss and MLP
    info = ot.apply_osftrt(pat, osft=True, rank_ratio=0.5)
    assert len(info.osft_layers) == 14 and ot.projector_of(pat) is info.projector
    assert isinstance(pat.model.layers[0].mlp.gate_proj, OSFTLinear)
    ids, mask, labels = _batch(gen)
    want = ref(input_ids=ids, attention_mask=mask, labels=labels)
    want.loss.backward()
    info.projector.detach()  # compare raw gradients first
    got = pat(input_ids=ids, attention_mask=mask, labels=labels)
    got.loss.backward()
    torch.testing.assert_close(got.loss, want.loss, rtol=1e-5, atol=1e-6)
    _assert_grads_close(_grads(pat), _grads(ref))


def _orthogonal_after(model, projector, steps, gen):
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    losses = []
    ids, mask, labels = _batch(gen)  # one batch, learned
    for _ in range(steps):
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()  # the attached projector projects the gradients here ...
        opt.step()  # ... and the parameters here
        opt.zero_grad()
        losses.append(loss.item())
        assert max(projector.orthogonality()) <= 1e-5
    return losses


def test_plain_loop_needs_no_extra_calls(gen):
    model = _model("llama")
    info = ot.apply_osftrt(model, osft=True, rank_ratio=0.5)
    losses = _orthogonal_after(model, info.projector, 8, gen)
    assert info.projector.projections == {"gradients": 8, "parameters": 8}
    assert losses[-1] < losses[0]


def test_without_attach_adamw_drifts(gen):
    """The control: the orthogonality check above can fail."""
    model = _model("llama")
    info = ot.apply_osftrt(model, osft=True, rank_ratio=0.5, attach=False)
    with pytest.raises(AssertionError):
        _orthogonal_after(model, info.projector, 3, gen)


def test_trainer_keeps_updates_orthogonal(gen, tmp_path):
    model = _model("mistral")
    info = ot.apply_osftrt(model, osft=True, rank_ratio=0.5)
    ids, _, labels = _batch(gen, batch=12)
    rows = [{"input_ids": i, "attention_mask": torch.ones_like(i), "labels": lab} for i, lab in zip(ids, labels)]
    args = transformers.TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=2,
                                          gradient_accumulation_steps=2, max_steps=3, learning_rate=1e-2,
                                          max_grad_norm=1.0, report_to=[], save_strategy="no", use_cpu=True,
                                          logging_steps=1, dataloader_num_workers=0)
    frozen = {n: b.clone() for n, b in model.named_buffers() if n.endswith(("u_high", "s_high", "v_high"))}
    trainer = transformers.Trainer(model=model, args=args, train_dataset=rows)
    out = trainer.train()
    for n, b in model.named_buffers():  # Trainer's default optimizer (fused AdamW) must not touch them
        if n in frozen:
            assert torch.equal(b, frozen[n]), n
    assert out.global_step == 3
    assert info.projector.projections["parameters"] == 3
    # once per optimizer step, before it, not per micro-batch backward
    assert info.projector.projections["gradients"] == 3
    # W rebuilt at most once per layer and optimizer step (not per micro-batch)
    assert all(m.info()["rebuilds"] <= 3 for m in info.osft_layers.values())
    assert max(info.projector.orthogonality()) <= 1e-5
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_patched_model_copies_and_pickles(gen):
    model = _model("qwen3")
    ot.apply_osftrt(model, osft=True)
    ids, mask, labels = _batch(gen)
    want = model(input_ids=ids, attention_mask=mask, labels=labels).loss
    twin = copy.deepcopy(model)
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    unpickled = pickle.loads(pickle.dumps(model))
    for m in (twin, loaded, unpickled):
        assert type(m) is type(model)
        torch.testing.assert_close(m(input_ids=ids, attention_mask=mask, labels=labels).loss, want, rtol=1e-6, atol=0)


def test_autocast_bf16_matches_the_model_under_autocast(gen):
    ref = _model("llama")
    pat = copy.deepcopy(ref)
    ot.apply_osftrt(pat)
    ids, mask, labels = _batch(gen)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = ref(input_ids=ids, attention_mask=mask, labels=labels).loss
        got = pat(input_ids=ids, attention_mask=mask, labels=labels).loss
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
    got.backward()
    assert all(p.grad.dtype == torch.float32 for p in pat.parameters() if p.grad is not None)


def test_merge_and_unpatch_saves_a_plain_model(gen, tmp_path):
    model = _model("llama")
    info = ot.apply_osftrt(model, osft=True)
    _orthogonal_after(model, info.projector, 2, gen)
    ids, mask, labels = _batch(gen)
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=mask, labels=labels).loss
    plain = ot.merge_and_unpatch(model)
    assert not any(isinstance(m, OSFTLinear) for m in plain.modules())
    plain.save_pretrained(tmp_path)
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager")
    with torch.no_grad():
        got = again(input_ids=ids, attention_mask=mask, labels=labels).loss
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_unsupported_family_is_refused():
    cfg = transformers.GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=VOCAB)
    with pytest.raises(NotImplementedError, match="gpt2"):
        ot.apply_osftrt(transformers.GPT2LMHeadModel(cfg))
