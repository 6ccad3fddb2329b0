"""apply_osftrt(model, activation_memory=...): the long-context knob.

* memory: what a checkpointed decoder layer keeps for the backward, per
  token, is at most 1.1x its checkpoint (hidden x 4 bytes in fp32), counted
  as the distinct storages autograd saves (saved-tensor hooks around the
  whole step) in models of L and 2 L layers; and the step's peak of live
  tensors grows per token by at most 1.1x the floor from the shapes
  (every tensor the step makes tracked from birth to death);
* the lean RMSNorm swapped in with the knob and out again by
  merge_and_unpatch;
* correctness: loss and every gradient equal the unpatched model's at a
  short length, with and without OSFT (orthogonality <= 1e-5 after steps);
* the offloader's hook logic with a fake device (copies between CPU
  tensors): every layer input goes out once and comes back once, in
  reverse layer order, each one prefetched while the layer after it runs.
FSDP2 with the knob: test_fsdp2.py (case llama_long)."""
import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")
import osftrt.transformers as ot  # noqa: E402
from osftrt.transformers import long_context as lc  # noqa: E402

VOCAB = 96
HIDDEN = 64


def _model(layers=2, seed=0):
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(hidden_size=HIDDEN, intermediate_size=128, num_hidden_layers=layers,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB,
                                   max_position_embeddings=512)
    cfg._attn_implementation = "sdpa"
    m = transformers.AutoModelForCausalLM.from_config(cfg).float()
    with torch.no_grad():
        m.get_output_embeddings().weight.normal_(0, 0.5)
    return m.train()


def _grads(model):
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def _assert_grads_close(got, want, rtol=1e-4):
    assert set(got) == set(want), set(got) ^ set(want)
    for n in want:
        scale = want[n].abs().max().item() + 1e-12
        err = (got[n] - want[n]).abs().max().item()
        assert err <= rtol * scale + 1e-7, "%s: max err %.3e (scale %.3e)" % (n, err, scale)


def _batch(gen, batch=2, seq=24):
    ids = torch.randint(0, VOCAB, (batch, seq), generator=gen)
    labels = ids.clone()
    labels[0, :5] = -100
    return ids, labels


@pytest.mark.parametrize("knob", ["min", "as long as possible", 256 << 20])
def test_knob_loss_and_gradients_match_the_unpatched_model(knob, gen):
    ref = _model()
    pat = copy.deepcopy(ref)
    info = ot.apply_osftrt(pat, activation_memory=knob)
    plan = info.long_context
    assert plan.checkpointing and all(m.gradient_checkpointing for m in pat.model.layers)
    assert plan.loss_memory_budget >= lc.MIN_SCRATCH and plan.mlp_memory_budget >= lc.MIN_SCRATCH
    assert pat._osftrt_flce_options["memory_budget"] == plan.loss_memory_budget
    assert all(m.mlp._osftrt_plan.memory_budget == plan.mlp_memory_budget for m in pat.model.layers)
    ids, labels = _batch(gen)
    want = ref(input_ids=ids, labels=labels)
    want.loss.backward()
    got = pat(input_ids=ids, labels=labels)
    got.loss.backward()
    torch.testing.assert_close(got.loss, want.loss, rtol=1e-5, atol=1e-6)
    _assert_grads_close(_grads(pat), _grads(ref))
    assert plan.lean_norms == 2 * len(pat.model.layers) + 1
    assert type(pat.model.norm) is ot.family_of(pat).norm
    ot.merge_and_unpatch(pat)  # checkpointing off again, the model's own norms back
    assert not any(m.gradient_checkpointing for m in pat.model.layers)
    assert type(pat.model.norm) is type(ref.model.norm)
    assert all(type(m.input_layernorm) is type(ref.model.norm) for m in pat.model.layers)


def test_knob_with_osft_matches_and_stays_orthogonal(gen):
    from osftrt.torch import convert_linear_layers

    base = _model()
    ref = copy.deepcopy(base)
    pat = copy.deepcopy(base)
    convert_linear_layers(ref, rank_ratio=0.5)
    info = ot.apply_osftrt(pat, osft=True, rank_ratio=0.5, activation_memory="min")
    ids, labels = _batch(gen)
    want = ref(input_ids=ids, labels=labels)
    want.loss.backward()
    info.projector.detach()  # raw gradients first
    got = pat(input_ids=ids, labels=labels)
    got.loss.backward()
    torch.testing.assert_close(got.loss, want.loss, rtol=1e-5, atol=1e-6)
    _assert_grads_close(_grads(pat), _grads(ref))
    pat.zero_grad()
    info.projector.attach()
    opt = torch.optim.AdamW([p for p in pat.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(3):
        pat(input_ids=ids, labels=labels).loss.backward()
        opt.step()
        opt.zero_grad()
        assert max(info.projector.orthogonality()) <= 1e-5


def test_bad_activation_memory_is_refused():
    for bad in (0, -5, "lots", True, float("nan")):
        with pytest.raises(ValueError, match="activation_memory"):
            ot.apply_osftrt(_model(), activation_memory=bad)


def _saved_bytes(model, ids):
    """The bytes of the distinct storages autograd keeps from the forward of
    one step for its backward (each storage once; parameters excluded)."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen = {}

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in params:
            seen[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return sum(seen.values())


def test_a_checkpointed_layer_keeps_at_most_1_1x_its_checkpoint(gen):
    seq = 256
    ids = torch.randint(0, VOCAB, (1, seq), generator=gen)
    per_layer = {}
    for knob in (None, "min"):
        saved = []
        for layers in (2, 4):
            m = _model(layers)
            ot.apply_osftrt(m, activation_memory=knob)
            saved.append(_saved_bytes(m, ids))
        per_layer[knob] = (saved[1] - saved[0]) / 2 / seq
    checkpoint = lc.floor_bytes_per_token(_model(1).config, 4)["checkpoint_per_layer"]
    assert checkpoint == HIDDEN * 4
    # without checkpointing a layer keeps many times its input: the measure can fail
    assert per_layer[None] > 3 * checkpoint, per_layer
    assert per_layer["min"] <= 1.1 * checkpoint, "a checkpointed layer keeps %.1f bytes per token, its " \
        "checkpoint is %d" % (per_layer["min"], checkpoint)


def _peak_live_bytes(model, ids):
    """The most bytes of tensors alive at once during one step (forward and
    backward), counting every storage an op makes from its birth to its
    death (parameters and what existed before the step excluded)."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    live, state = {}, {"now": 0, "peak": 0}
    before = {p.untyped_storage().data_ptr() for p in model.parameters()}

    class Track(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor):
                    s = t.untyped_storage()
                    p = s.data_ptr()
                    if p and p not in before and p not in live:
                        live[p] = (s.nbytes(), s._weak_ref())
                        state["now"] += s.nbytes()
            for p in [p for p, (_, ref) in live.items() if torch.UntypedStorage._expired(ref)]:
                state["now"] -= live.pop(p)[0]
            state["peak"] = max(state["peak"], state["now"])
            return out

    with Track():
        model(input_ids=ids, labels=ids).loss.backward()
    model.zero_grad(set_to_none=True)
    return state["peak"]


def test_the_step_peak_per_token_is_at_the_floor(gen):
    model = _model(2)
    ot.apply_osftrt(model, activation_memory="min")
    lengths = (1024, 2048)
    peaks = [_peak_live_bytes(model, torch.randint(0, VOCAB, (1, n), generator=gen)) for n in lengths]
    per_token = (peaks[1] - peaks[0]) / (lengths[1] - lengths[0])
    floor = lc.floor_bytes_per_token(model.config, 4)["total"]
    print("peak per token %.0f B, floor %d B" % (per_token, floor))
    assert per_token <= 1.1 * floor, "the step's peak grows by %.0f bytes per token, the floor is %d" % (
        per_token, floor)
    # the measure can fail: Hugging Face's own norms keep more
    ref = _model(2)
    ot.apply_osftrt(ref, activation_memory="min")
    lc.undo(ref, ot.family_of(ref))
    lc.enable_checkpointing(ref)
    ref_peaks = [_peak_live_bytes(ref, torch.randint(0, VOCAB, (1, n), generator=gen)) for n in lengths]
    assert (ref_peaks[1] - ref_peaks[0]) / (lengths[1] - lengths[0]) > 1.15 * per_token


class FakeCopies:
    """A fake device for CheckpointOffloader: every CPU tensor "is on the
    device"; copies are clones; the order of fetches is recorded."""

    def __init__(self):
        self.to_host_calls, self.fetch_order, self.ready_calls = 0, [], 0

    def wants(self, t):
        return t.device.type == "cpu"

    def to_host(self, t):
        self.to_host_calls += 1
        h = t.detach().clone()
        h._fake_tag = self.to_host_calls  # the layer it came from (1-based, forward order)
        return h

    def to_device(self, host, device):
        self.fetch_order.append(host._fake_tag)
        return host.clone(), None

    def ready(self, dev, done):
        self.ready_calls += 1
        return dev


def test_offloader_hook_logic_with_a_fake_device(gen):
    layers = 3
    ref = _model(layers)
    pat = copy.deepcopy(ref)
    fake = FakeCopies()
    offloader = lc.CheckpointOffloader(min_bytes=HIDDEN * 4 * 8, copies=fake)  # the layer inputs, not the dummies
    info = ot.apply_osftrt(pat, activation_memory="min")
    info.long_context.offloader = offloader
    lc.enable_checkpointing(pat, offloader)
    ids, labels = _batch(gen)
    want = ref(input_ids=ids, labels=labels)
    want.loss.backward()
    got = pat(input_ids=ids, labels=labels)
    assert offloader.offloaded == layers and fake.to_host_calls == layers  # one input per layer went out
    got.loss.backward()
    torch.testing.assert_close(got.loss, want.loss, rtol=1e-5, atol=1e-6)
    _assert_grads_close(_grads(pat), _grads(ref))
    # back in reverse layer order: the last layer's fetched on demand, each
    # earlier one prefetched while the layer after it ran
    assert fake.fetch_order == list(range(layers, 0, -1)), fake.fetch_order
    assert offloader.fetched == 1 and offloader.prefetched == layers - 1
    assert fake.ready_calls == layers
    # small tensors stay where they are
    t = torch.ones(3)
    assert offloader.pack(t) is t and offloader.unpack(t) is t


def test_floor_from_the_shapes():
    cfg = _model(4).config
    f = lc.floor_bytes_per_token(cfg, 4)
    assert f["checkpoints"] == 4 * HIDDEN * 4
    assert f["total"] == f["checkpoints"] + f["layer"] + f["shared"]
    assert f["layer"] > 8 * HIDDEN * 4  # a layer's working set is several hidden vectors
    loss, mlp = lc.scratch_budgets(cfg, "min")
    assert loss == lc.MIN_SCRATCH and mlp == lc.MIN_SCRATCH  # tiny shapes: the bytes floor
    big = transformers.LlamaConfig(hidden_size=4096, intermediate_size=14336, vocab_size=128256)
    loss, mlp = lc.scratch_budgets(big, "min", 2)
    assert loss == lc.MIN_LOSS_ROWS * 4 * 128256  # rows of fp32 logits
    assert mlp == lc.MIN_MLP_ROWS * (3 * 14336 * 2 + 4 * 4096)  # tokens of tile
    loss, mlp = lc.scratch_budgets(cfg, 8 << 30)
    assert loss == mlp == 512 << 20
