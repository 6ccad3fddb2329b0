"""osftrt.torch modules behave like the PyTorch modules they replace, for
every module (OSFTLinear with each strategy, TiledMLP over nn.Linear and
over OSFTLinear, FusedLinearCrossEntropyLoss under an LM head): 3-D,
padded, transposed and sliced inputs, bf16, state_dict round trips (in place,
into a layer that has run), torch.no_grad / inference_mode, activation
checkpointing, torch.compile, torch.autocast, and copy.deepcopy / pickle /
torch.save of modules that have run (the copies train independently).
Every comparison is against float64 PyTorch (or the eager result) on fresh
random inputs."""
import copy
import importlib
import io
import pickle
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import osftrt.torch as ot

from conftest import assert_close, rand

H, I, V = 12, 20, 17
F32 = 2e-4
BF16 = 4e-2
TIGHT = 1e-6  # the same computation again (copies, recomputation)


# ------------------------------------------------------------------ helpers
def _rand_linear(gen, i, o, bias=True, scale=1.0):
    lin = nn.Linear(i, o, bias=bias)
    with torch.no_grad():
        lin.weight.copy_(rand(gen, o, i, scale=scale))
        if bias:
            lin.bias.copy_(rand(gen, o, scale=0.5))
    return lin


def _osft64(P, B, pre, x):
    """An OSFTLinear in float64 from the named parameters/buffers."""
    w = (B[pre + "u_high"] * B[pre + "s_high"]) @ B[pre + "v_high"] + (P[pre + "u_low"] * P[pre + "s_low"]) @ P[pre + "v_low"]
    return F.linear(x, w, P.get(pre + "bias"))


def _dense64(P, B, pre, x):
    return F.linear(x, P[pre + "weight"], P.get(pre + "bias"))


class _LMHeadLoss(nn.Module):
    """An LM head and the fused loss, as a model uses them."""

    def __init__(self, head, **options):
        super().__init__()
        self.head = head
        self.loss = ot.FusedLinearCrossEntropyLoss(**options)

    def forward(self, x, target):
        return self.loss(x, self.head.weight, target, self.head.bias)


class Case:
    def __init__(self, name, build, ref, target=False):
        self.name, self.build, self.ref, self.target = name, build, ref, target

    def __repr__(self):
        return self.name

    def call(self, m, x, extra):
        return m(x, extra) if self.target else m(x)


def _build_linear(strategy, bias):
    def build(gen, dtype):
        lin = _rand_linear(gen, H, I, bias)
        return ot.OSFTLinear.from_linear(lin, 0.5, dtype=dtype, strategy=strategy)
    return build


def _build_mlp(gen, dtype):
    gate, up, down = (_rand_linear(gen, i, o, False, 0.5).to(dtype) for i, o in ((H, I), (H, I), (I, H)))
    return ot.TiledMLP("swiglu", gate=gate, up=up, down=down, tile_tokens=4)


def _ref_mlp(P, B, x, extra):
    return _dense64(P, B, "down.", F.silu(_dense64(P, B, "gate.", x)) * _dense64(P, B, "up.", x))


def _build_mlp_osft(gen, dtype):
    gate, up, down = (ot.OSFTLinear.from_linear(_rand_linear(gen, i, o, True, 0.5), 0.5, dtype=dtype)
                      for i, o in ((H, I), (H, I), (I, H)))
    return ot.TiledMLP("geglu", gate=gate, up=up, down=down, tile_tokens=4)


def _ref_mlp_osft(P, B, x, extra):
    g = F.gelu(_osft64(P, B, "gate.", x), approximate="tanh")
    return _osft64(P, B, "down.", g * _osft64(P, B, "up.", x))


def _build_flce(gen, dtype):
    return _LMHeadLoss(_rand_linear(gen, H, V, True).to(dtype), label_smoothing=0.1)


def _ref_flce(P, B, x, target):
    logits = _dense64(P, B, "head.", x)
    return F.cross_entropy(logits.reshape(-1, V), target.reshape(-1), ignore_index=-100, label_smoothing=0.1)


CASES = [
    Case("linear", _build_linear("auto", True), lambda P, B, x, e: _osft64(P, B, "", x)),
    Case("linear_dense", _build_linear("dense", False), lambda P, B, x, e: _osft64(P, B, "", x)),
    Case("linear_factorized", _build_linear("factorized", True), lambda P, B, x, e: _osft64(P, B, "", x)),
    Case("mlp", _build_mlp, _ref_mlp),
    Case("mlp_osft", _build_mlp_osft, _ref_mlp_osft),
    Case("flce", _build_flce, _ref_flce, target=True),
]
ids = [c.name for c in CASES]


def _input(gen, layout="3d", dtype=torch.float32):
    """(2, 3, H) (or (6, H)) in the given memory layout."""
    if layout == "2d":
        x = rand(gen, 6, H, dtype=dtype)
    elif layout == "3d":
        x = rand(gen, 2, 3, H, dtype=dtype)
    elif layout == "padded":  # rows with a stride beyond H (read in place)
        x = rand(gen, 2, 3, H + 5, dtype=dtype)[..., 2:H + 2]
    elif layout == "transposed":
        x = rand(gen, H, 3, 2, dtype=dtype).permute(2, 1, 0)
    elif layout == "sliced":
        x = rand(gen, 2, 6, 2 * H, dtype=dtype)[:, ::2, 1::2]
    else:
        raise ValueError(layout)
    assert x.shape[-1] == H and (layout in ("2d", "3d")) == x.is_contiguous()
    return x


def _inputs(case, gen, layout="3d", dtype=torch.float32):
    x = _input(gen, layout, dtype)
    extra = None
    if case.target:
        extra = torch.randint(0, V, x.shape[:-1], generator=gen)
        extra.view(-1)[1] = -100  # one ignored token
    return x, extra


def _grad_out(gen, y):
    return rand(gen, *y.shape, dtype=y.dtype) if y.dim() else rand(gen, 1, dtype=y.dtype).reshape(())


def _run(case, m, x, extra, gy, wrap=None, owner=None):
    """(y, {"x": grad_x, name: grad}) of one forward and backward (the
    gradients of owner's parameters, by default m's)."""
    owner = owner or m
    for p in owner.parameters():
        p.grad = None
    x = x.detach().requires_grad_()
    fn = (lambda v: case.call(m, v, extra))
    y = (wrap or (lambda f, v: f(v)))(fn, x)
    y.backward(gy)
    grads = {"x": x.grad}
    grads.update({n: p.grad for n, p in owner.named_parameters()})
    return y, grads


def _ref(case, m, x, extra, gy):
    P = {n: p.detach().double().requires_grad_() for n, p in m.named_parameters()}
    B = {n: b.detach().double() for n, b in m.named_buffers()}
    x64 = x.detach().double().requires_grad_()
    y = case.ref(P, B, x64, extra)
    y.backward(gy.double())
    grads = {"x": x64.grad}
    grads.update({n: p.grad for n, p in P.items()})
    return y, grads


def _compare(got, want, tol, what=""):
    gy, gg = got
    wy, wg = want
    assert_close(gy, wy, tol, tol * wy.abs().max().item(), what + " y")
    assert set(gg) == set(wg), (what, set(gg) ^ set(wg))
    for n in wg:
        assert gg[n] is not None, "%s: no gradient for %s" % (what, n)
        assert_close(gg[n], wg[n], tol, tol * wg[n].abs().max().item(), "%s grad %s" % (what, n))


def _check_vs_float64(case, m, gen, layout="3d", dtype=torch.float32, tol=F32, what=""):
    x, extra = _inputs(case, gen, layout, dtype)
    y = case.call(m, x, extra)
    gy = _grad_out(gen, y)
    got = _run(case, m, x, extra, gy)
    _compare(got, _ref(case, m, x, extra, gy), tol, what or case.name)
    return x, extra, gy, got


def _osft_layers(m):
    return [mod for mod in m.modules() if isinstance(mod, ot.OSFTLinear)]


def _fused(layer):
    """S and V^T each one storage with the high part first (the layer's high
    and low GEMMs over V fuse); U's parts compact (what fused optimizers
    expect of a parameter)."""
    r = layer.rank
    e = layer.u_low.element_size()
    return (layer.u_high.is_contiguous() and layer.u_low.is_contiguous()
            and _storage_ptr(layer.v_high) == _storage_ptr(layer.v_low)
            and layer.v_low.data_ptr() == layer.v_high.data_ptr() + r * layer.v_high.stride(0) * e
            and layer.v_low.stride() == layer.v_high.stride()
            and _storage_ptr(layer.s_high) == _storage_ptr(layer.s_low)
            and layer.s_low.data_ptr() == layer.s_high.data_ptr() + r * e)


def _storage_ptr(t):
    return t.untyped_storage().data_ptr() if hasattr(t, "untyped_storage") else t.storage().data_ptr()


def _handles_dropped(m):
    for mod in list(m.modules()) + [getattr(mod, "plan", None) for mod in m.modules()]:
        for name in getattr(mod, "_transient", ()):
            assert getattr(mod, name) is None, (type(mod).__name__, name)


# ======================================================= layouts and dtypes
@pytest.mark.parametrize("layout", ["2d", "3d", "padded", "transposed", "sliced"])
@pytest.mark.parametrize("case", CASES, ids=ids)
def test_inputs_of_any_layout(gen, case, layout):
    m = case.build(gen, torch.float32)
    _check_vs_float64(case, m, gen, layout)


@pytest.mark.parametrize("layout", ["3d", "transposed"])
@pytest.mark.parametrize("case", CASES, ids=ids)
def test_bf16_parameters_and_inputs(gen, case, layout):
    m = case.build(gen, torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in m.parameters())
    x, extra, gy, (y, grads) = _check_vs_float64(case, m, gen, layout, torch.bfloat16, BF16)
    assert y.dtype == (torch.float32 if case.target else torch.bfloat16)
    assert all(g.dtype == torch.bfloat16 for g in grads.values())


@pytest.mark.parametrize("case", CASES, ids=ids)
def test_to_bf16_after_running(gen, case):
    """A module that has run, converted with .to(bfloat16), computes in bf16
    on its new storage."""
    m = case.build(gen, torch.float32)
    _check_vs_float64(case, m, gen)
    m = m.to(torch.bfloat16)
    _check_vs_float64(case, m, gen, "3d", torch.bfloat16, BF16, case.name + " after .to(bf16)")
    for layer in _osft_layers(m):
        assert _fused(layer), "S, V^T no longer one storage each after .to()"


# ================================================================ state_dict
@pytest.mark.parametrize("case", CASES, ids=ids)
def test_state_dict_round_trip_in_place(gen, case):
    src = case.build(gen, torch.float32)
    _check_vs_float64(case, src, gen)
    dst = case.build(gen, torch.float32)  # other values
    _check_vs_float64(case, dst, gen)  # dst has run: its handles and caches exist
    sd = src.state_dict()
    assert set(sd) == set(dst.state_dict())
    # an OSFT layer's "weight" is derived (merged from the factors, for plain
    # readers of the checkpoint), not storage of the module
    derived = {(n + "." if n else "") + "weight" for n, mod in dst.named_modules() if isinstance(mod, ot.OSFTLinear)}
    stored = set(sd) - derived
    before = {k: v.data_ptr() for k, v in dst.state_dict().items() if k in stored}
    with torch.no_grad():  # every value of dst must be written by the load
        for k, v in dst.state_dict().items():
            if v.is_floating_point() and k in stored:
                v.fill_(float("nan"))
    dst.load_state_dict(sd)
    after = {k: v.data_ptr() for k, v in dst.state_dict().items() if k in stored}
    assert before == after, "load_state_dict must copy into the same storage"
    for layer in _osft_layers(dst):
        assert _fused(layer)
    x, extra = _inputs(case, gen)
    y = case.call(src, x, extra)
    gy = _grad_out(gen, y)
    _compare(_run(case, dst, x, extra, gy), _run(case, src, x, extra, gy), TIGHT, "loaded vs source")
    _check_vs_float64(case, dst, gen, what=case.name + " loaded")


# ============================================================ no_grad etc.
@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
@pytest.mark.parametrize("case", CASES, ids=ids)
def test_forward_without_autograd(gen, case, mode):
    m = case.build(gen, torch.float32)
    x, extra = _inputs(case, gen)
    xg = x.clone().requires_grad_()
    with getattr(torch, mode)():
        y = case.call(m, xg, extra)
    assert not y.requires_grad and y.grad_fn is None
    assert all(p.grad is None for p in m.parameters())
    want = case.call(m, x, extra)
    assert_close(y, want, TIGHT, TIGHT * want.abs().max().item(), "no-grad vs grad mode")
    P = {n: p.detach().double() for n, p in m.named_parameters()}
    B = {n: b.detach().double() for n, b in m.named_buffers()}
    ry = case.ref(P, B, x.double(), extra)
    assert_close(y, ry, F32, F32 * ry.abs().max().item(), "no-grad vs float64")


@pytest.mark.parametrize("case", CASES, ids=ids)
def test_activation_checkpointing(gen, case):
    from torch.utils.checkpoint import checkpoint

    m = case.build(gen, torch.float32)
    x, extra = _inputs(case, gen)
    gy = _grad_out(gen, case.call(m, x, extra))
    plain = _run(case, m, x, extra, gy)
    ck = _run(case, m, x, extra, gy, wrap=lambda f, v: checkpoint(f, v, use_reentrant=False))
    _compare(ck, plain, TIGHT, "checkpointed vs plain")
    _compare(ck, _ref(case, m, x, extra, gy), F32, "checkpointed vs float64")


def _compile_unsupported():
    if not hasattr(torch, "compile"):
        return "torch.compile needs torch >= 2.0"
    try:
        dynamo = importlib.import_module("torch._dynamo")
        return None if dynamo.is_dynamo_supported() else "torch.compile does not support this Python"
    except Exception as e:  # noqa: BLE001 - any import problem of an optional feature
        return "torch._dynamo: %s" % e


@pytest.mark.skipif(not hasattr(torch, "compile"), reason="torch.compile needs torch >= 2.0")
@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("case", CASES, ids=ids)
def test_torch_compile(gen, case):
    why = _compile_unsupported()
    if why:
        pytest.skip(why)
    # aot_eager: dynamo and AOT autograd around the library calls (graph
    # breaks; the same outputs and gradients as eager), without inductor's
    # C++ compile time (30 s for one loss on a 2-core runner)
    torch._dynamo.reset()
    m = case.build(gen, torch.float32)
    cm = torch.compile(m, backend="aot_eager")
    for layout in ("3d", "transposed"):
        x, extra = _inputs(case, gen, layout)
        gy = _grad_out(gen, case.call(m, x, extra))
        eager = _run(case, m, x, extra, gy)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compiled = _run(case, cm, x, extra, gy, owner=m)  # cm's parameters are m's
        _compare(compiled, eager, F32, "compiled vs eager (%s)" % layout)
        _compare(compiled, _ref(case, m, x, extra, gy), F32, "compiled vs float64 (%s)" % layout)
    torch._dynamo.reset()


# ================================================================= autocast
@pytest.mark.parametrize("case", CASES, ids=ids)
def test_autocast_cpu_bf16(gen, case):
    m = case.build(gen, torch.float32)
    x, extra = _inputs(case, gen)
    P32 = {n: p.detach().clone().requires_grad_() for n, p in m.named_parameters()}
    B32 = {n: b.detach().clone() for n, b in m.named_buffers()}
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = case.call(m, x, extra)
        y_torch = case.ref(P32, B32, x, extra)  # the same model in PyTorch ops
    assert y.dtype == y_torch.dtype, (y.dtype, y_torch.dtype)
    assert y.dtype == (torch.float32 if case.target else torch.bfloat16)
    if isinstance(m, ot.OSFTLinear):  # the nn.Linear it replaces
        lin = m.merge()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y_lin = lin(x)
        assert y.dtype == y_lin.dtype
        assert_close(y, y_lin, BF16, BF16 * y_lin.abs().max().item(), "autocast vs nn.Linear under autocast")
    gy = _grad_out(gen, y.float()).to(y.dtype)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = _run(case, m, x, extra, gy)
    y_torch.backward(gy)
    for n, g in got[1].items():
        assert g.dtype == torch.float32, "%s: %s grad under autocast" % (n, g.dtype)
        if n != "x":
            assert P32[n].grad.dtype == g.dtype
    # values: the fp32 result within bf16 tolerance
    _compare(got, _ref(case, m, x, extra, gy.float()), BF16, "autocast vs float64")


# ===================================================== deepcopy and pickle
def _train_step(m, gen, lr=0.05):
    with torch.no_grad():
        for p in m.parameters():
            p.add_(rand(gen, *p.shape, dtype=p.dtype, scale=lr))


@pytest.mark.parametrize("case", CASES, ids=ids)
def test_deepcopy_of_a_module_that_has_run(gen, case):
    m = case.build(gen, torch.float32)
    _check_vs_float64(case, m, gen)  # forward + backward: handles exist
    c = copy.deepcopy(m)
    _handles_dropped(c)
    pm, pc = dict(m.named_parameters()), dict(c.named_parameters())
    assert set(pm) == set(pc)
    storages_m = {_storage_ptr(p) for p in pm.values()} | {_storage_ptr(b) for b in m.buffers()}
    for n in pm:
        assert pc[n] is not pm[n] and _storage_ptr(pc[n]) not in storages_m, n
        assert torch.equal(pc[n], pm[n]), n
    for layer in _osft_layers(c):
        assert _fused(layer), "the copy's S, V^T are not one storage each"
    # the same results on the same input
    x, extra = _inputs(case, gen)
    gy = _grad_out(gen, case.call(m, x, extra))
    ym = _run(case, m, x, extra, gy)
    _compare(_run(case, c, x, extra, gy), ym, TIGHT, "copy vs original")
    # training the copy leaves the original alone, and the reverse
    _train_step(c, gen)
    _compare(_run(case, m, x, extra, gy), ym, 0.0, "original after the copy trained")
    _check_vs_float64(case, c, gen, what="copy after training")
    yc = _run(case, c, x, extra, gy)
    _train_step(m, gen)
    _compare(_run(case, c, x, extra, gy), yc, 0.0, "copy after the original trained")
    _check_vs_float64(case, m, gen, what="original after training")


@pytest.mark.parametrize("how", ["pickle", "torch.save"])
@pytest.mark.parametrize("case", CASES, ids=ids)
def test_pickle_round_trip(gen, case, how):
    m = case.build(gen, torch.float32)
    _check_vs_float64(case, m, gen)
    if how == "pickle":
        c = pickle.loads(pickle.dumps(m))
    else:
        buf = io.BytesIO()
        torch.save(m, buf)
        buf.seek(0)
        try:
            c = torch.load(buf, weights_only=False)
        except TypeError:  # torch < 1.13 has no weights_only
            c = torch.load(buf)
    _handles_dropped(c)
    for layer in _osft_layers(c):
        assert _fused(layer), "the loaded S, V^T are not one storage each"
    x, extra = _inputs(case, gen)
    gy = _grad_out(gen, case.call(m, x, extra))
    _compare(_run(case, c, x, extra, gy), _run(case, m, x, extra, gy), TIGHT, "loaded vs original")
    _train_step(c, gen)
    _check_vs_float64(case, c, gen, what="loaded after training")


# =========================================================== a whole model
class _TinyModel(nn.Module):
    """OSFT input projection, a tiled SwiGLU MLP over OSFT projections that
    are also the model's own attributes (as osftrt.transformers patches an
    MLP), and the fused LM-head loss."""

    def __init__(self, gen):
        super().__init__()
        # unit-variance activations, a loss near log(V): a step of SGD stays finite
        mk = lambda i, o: ot.OSFTLinear.from_linear(_rand_linear(gen, i, o, True, i ** -0.5), 0.5)
        self.inp = mk(H, H)
        self.gate_proj, self.up_proj, self.down_proj = mk(H, I), mk(H, I), mk(I, H)
        self.mlp = ot.TiledMLP("swiglu", gate=self.gate_proj, up=self.up_proj, down=self.down_proj, tile_tokens=4)
        self.head = _rand_linear(gen, H, V, True, H ** -0.5)
        self.loss = ot.FusedLinearCrossEntropyLoss()

    def forward(self, x, target):
        h = self.inp(x)
        h = h + self.mlp(h)
        return self.loss(h, self.head.weight, target, self.head.bias)

    def reference(self, x, target):
        P = {n: p.detach().double() for n, p in self.named_parameters()}
        B = {n: b.detach().double() for n, b in self.named_buffers()}
        h = _osft64(P, B, "inp.", x.double())
        h = h + _osft64(P, B, "down_proj.", F.silu(_osft64(P, B, "gate_proj.", h)) * _osft64(P, B, "up_proj.", h))
        return F.cross_entropy(_dense64(P, B, "head.", h).reshape(-1, V), target.reshape(-1))


def _orthogonality64(layer):
    uh, vh = layer.u_high.detach().double(), layer.v_high.detach().double()
    gu, gv = layer.u_low.grad.double(), layer.v_low.grad.double()
    return max((uh.T @ gu).abs().max().item() / gu.abs().max().item(), (gv @ vh.T).abs().max().item() / gv.abs().max().item())


def test_deepcopy_of_a_whole_model_trains_independently(gen):
    m = _TinyModel(gen)
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    proj = ot.OSFTProjector(m).attach(opt, gradients="backward")
    x = rand(gen, 2, 5, H)
    t = torch.randint(0, V, (2, 5), generator=gen)
    m(x, t).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)

    c = copy.deepcopy(m)
    _handles_dropped(c)
    assert c.mlp.gate is c.gate_proj and c.mlp.up is c.up_proj and c.mlp.down is c.down_proj
    assert {_storage_ptr(p) for p in c.parameters()}.isdisjoint({_storage_ptr(p) for p in m.parameters()})
    for layer in _osft_layers(c):
        assert _fused(layer)
    lm, lc = m(x, t), c(x, t)
    assert_close(lc, lm, TIGHT, 0.0, "copy's loss")
    assert_close(lc, m.reference(x, t), F32, 0.0, "copy's loss vs float64")

    # a projector over the copy; the original's hooks stay with the original
    opt_c = torch.optim.SGD(c.parameters(), lr=0.05)
    proj_c = ot.OSFTProjector(c).attach(opt_c, gradients="backward")
    lc.backward()
    assert all(p.grad is None for p in m.parameters()), "the original's gradients were touched"
    assert proj.projections["gradients"] == 1 and proj_c.projections["gradients"] == 1
    for layer in _osft_layers(c):
        assert _orthogonality64(layer) < 1e-4
    before = [p.detach().clone() for p in m.parameters()]
    opt_c.step()
    assert proj_c.projections["parameters"] == 1 and proj.projections["parameters"] == 1
    assert max(proj_c.orthogonality()) < 1e-4
    assert all(torch.equal(a, p) for a, p in zip(before, m.parameters()))
    assert_close(c(x, t), c.reference(x, t), F32, 0.0, "copy after its step vs float64")

    # the original keeps training on its own
    lc2 = c(x, t).detach()
    lm.backward()
    for layer in _osft_layers(m):
        assert _orthogonality64(layer) < 1e-4
    opt.step()
    assert proj.projections["parameters"] == 2
    assert_close(c(x, t), lc2, 0.0, 0.0, "copy after the original's step")
    assert_close(m(x, t), m.reference(x, t), F32, 0.0, "original after its step vs float64")

    # and the whole model round-trips through pickle
    p = pickle.loads(pickle.dumps(c))
    assert_close(p(x, t), c(x, t), TIGHT, 0.0, "pickled model's loss")
    proj.close()
    proj_c.close()
