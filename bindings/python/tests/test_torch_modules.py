"""osftrt.torch modules against PyTorch float64 autograd on fresh random
inputs: OSFTLinear (fp32, bf16), fused linear cross-entropy (every option),
TiledMLP (every variant), the projector, batched QR and power iteration."""
import math

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import osftrt
import osftrt.torch as ot
from osftrt import capi

from conftest import assert_close, poison, rand

F32 = dict(rtol=2e-4, atol=2e-4)
BF16 = dict(rtol=4e-2, atol=4e-2)


# =============================================================== OSFTLinear
def _ref_flinear(m, x, gy):
    d = lambda t: t.detach().to(torch.float64)
    uh, sh, vh = d(m.u_high), d(m.s_high), d(m.v_high)
    ul, sl, vl = (d(p).requires_grad_() for p in (m.u_low, m.s_low, m.v_low))
    x64 = d(x).requires_grad_()
    b = d(m.bias).requires_grad_() if m.bias is not None else None
    y = (x64 @ vh.T * sh) @ uh.T + (x64 @ vl.T * sl) @ ul.T
    if b is not None:
        y = y + b
    y.backward(d(gy))
    return y, x64.grad, ul.grad, sl.grad, vl.grad, (b.grad if b is not None else None)


@pytest.mark.parametrize("dtype,strategy", [(torch.float32, "auto"), (torch.float32, "dense"), (torch.float32, "factorized"), (torch.float32, "hybrid"),
                                            (torch.bfloat16, "auto"), (torch.bfloat16, "hybrid")])
def test_osft_linear_matches_float64(gen, dtype, strategy):
    lin = nn.Linear(24, 18)
    with torch.no_grad():
        lin.weight.copy_(rand(gen, 18, 24))
        lin.bias.copy_(rand(gen, 18))
    m = ot.OSFTLinear.from_linear(lin, 0.5, dtype=dtype, strategy=strategy)
    assert m.u_low.dtype == dtype and m.rank == 9 and m.u_low.shape == (18, 9)
    x = rand(gen, 2, 5, 24, dtype=dtype).requires_grad_()
    y = m(x)
    gy = rand(gen, 2, 5, 18, dtype=dtype)
    y.backward(gy)
    ry, rgx, rgu, rgs, rgv, rgb = _ref_flinear(m, x, gy)
    tol = F32 if dtype == torch.float32 else BF16
    scale = ry.abs().max().item()
    assert_close(y, ry, tol["rtol"], tol["atol"] * scale, "y")
    for got, want, name in ((x.grad, rgx, "grad_x"), (m.u_low.grad, rgu, "grad_u_low"), (m.s_low.grad, rgs, "grad_s_low"),
                            (m.v_low.grad, rgv, "grad_v_low"), (m.bias.grad, rgb, "grad_bias")):
        assert got.dtype == (dtype if name != "grad_bias" else dtype)
        assert_close(got, want, tol["rtol"], tol["atol"] * want.abs().max().item(), name)
    if dtype == torch.float32:  # the SVD split reproduces the dense layer
        assert_close(y, lin(x.detach()), 1e-4, 1e-4 * scale, "y vs nn.Linear")


def _has_fused_adamw():
    try:
        p = nn.Parameter(torch.zeros(2))
        p.grad = torch.ones(2)
        torch.optim.AdamW([p], fused=True).step()
        return True
    except (TypeError, RuntimeError, ValueError):
        return False


def test_osft_linear_parameters_are_used_in_place(gen):
    lin = nn.Linear(16, 12, bias=False)
    m = ot.OSFTLinear.from_linear(lin, 0.25)
    ptrs = [p.data_ptr() for p in (m.u_low, m.s_low, m.v_low)]
    # V_low is a row view of one V^T (the high part first); U's parts are
    # compact tensors of their own (fused AdamW writes a non-compact
    # parameter as if it were compact)
    assert m.v_low.data_ptr() == m.v_high.data_ptr() + 4 * m.rank * 16
    assert m.u_low.is_contiguous() and m.u_high.is_contiguous()
    u_high = m.u_high.clone()
    opt = torch.optim.AdamW(m.parameters(), lr=0.05, **({"fused": True} if _has_fused_adamw() else {}))
    x = rand(gen, 8, 16)
    for _ in range(3):
        opt.zero_grad()
        m(x).pow(2).sum().backward()
        opt.step()
    assert [p.data_ptr() for p in (m.u_low, m.s_low, m.v_low)] == ptrs
    assert torch.equal(m.u_high, u_high)
    y = m(x)
    ry = _ref_flinear(m, x, torch.ones(8, 12))[0]  # the library saw the optimizer's in-place updates
    assert_close(y, ry, 1e-4, 1e-4 * ry.abs().max().item(), "y after AdamW")
    merged = m.merge()
    assert isinstance(merged, nn.Linear)
    assert_close(merged(x), ry, 1e-4, 1e-4 * ry.abs().max().item(), "merged")


def test_osft_linear_follows_new_storage(gen):
    m = ot.OSFTLinear.from_linear(nn.Linear(10, 8), 0.5)
    x = rand(gen, 3, 10)
    m(x)
    first = m._layer
    m.double().float()  # new storage for every tensor
    y = m(x)
    assert m._layer is not first and first.closed
    assert_close(y, _ref_flinear(m, x, torch.ones(3, 8))[0], 1e-4, 1e-4, "y")


def test_convert_linear_layers():
    from train_osft import TinyLlama

    model = TinyLlama(vocab=32, hidden=16, heads=2, inter=24, layers=2)
    x = torch.randint(0, 32, (2, 5))
    before = model.hidden_states(x).detach()
    done = ot.convert_linear_layers(model, ot.LLAMA_LINEAR_NAMES, rank_ratio=0.5)
    assert len(done) == 14 and all(isinstance(m, ot.OSFTLinear) for m in done.values())
    assert isinstance(model.lm_head, nn.Linear) and not isinstance(model.lm_head, ot.OSFTLinear)
    assert isinstance(model.layers[1].self_attn.q_proj, ot.OSFTLinear)
    after = model.hidden_states(x).detach()
    assert_close(after, before, 1e-3, 1e-3, "model output after conversion")
    only_q = ot.convert_linear_layers(TinyLlama(vocab=32, hidden=16, heads=2, inter=24), lambda qn, m: qn.endswith("q_proj"))
    assert sorted(only_q) == ["layers.0.self_attn.q_proj", "layers.1.self_attn.q_proj"]


# ================================================================ projector
def test_projector_matches_float64(gen):
    mods = [ot.OSFTLinear.from_linear(nn.Linear(k, n), 0.5) for n, k in ((12, 10), (9, 14), (16, 16))]
    grads = []
    for m in mods:
        m.u_low.grad = rand(gen, *m.u_low.shape)
        m.v_low.grad = rand(gen, *m.v_low.shape)
        grads.append((m.u_low.grad.double().clone(), m.v_low.grad.double().clone()))
    p = ot.OSFTProjector(mods)
    ptrs = [(m.u_low.grad.data_ptr(), m.v_low.grad.data_ptr()) for m in mods]
    p.project_gradients()
    assert p.info()["targets"] == 3 and p.info()["collectives_per_project"] == 0
    for m, (gu, gv), pt in zip(mods, grads, ptrs):
        uh, vh = m.u_high.double(), m.v_high.double()
        assert (m.u_low.grad.data_ptr(), m.v_low.grad.data_ptr()) == pt
        assert_close(m.u_low.grad, gu - uh @ (uh.T @ gu), 1e-5, 1e-5, "dU")
        assert_close(m.v_low.grad, gv - (gv @ vh.T) @ vh, 1e-5, 1e-5, "dV")
    # parameters: push U_low, V_low off the subspace, then project them back
    with torch.no_grad():
        for m in mods:
            m.u_low.add_(0.1 * m.u_high[:, :1])
            m.v_low.add_(0.1 * m.v_high[:1])
    mu, mv = p.orthogonality()
    assert mu > 1e-3 and mv > 1e-3
    p.project_parameters()
    mu, mv = p.orthogonality()
    assert mu <= 1e-6 and mv <= 1e-6
    for m in mods:
        assert (m.u_high.T @ m.u_low).abs().max() <= 1e-6
        assert (m.v_low @ m.v_high.T).abs().max() <= 1e-6
    # new gradient tensors (zero_grad(set_to_none=True)) are rebound
    for m in mods:
        m.u_low.grad = rand(gen, *m.u_low.shape)
        m.v_low.grad = None
    p.project_gradients()
    for m in mods:
        assert (m.u_high.T @ m.u_low.grad).abs().max() <= 1e-5
    p.close()


# ===================================================== fused cross-entropy
def _ref_flce(x, w, t, b, *, ignore_index=-100, label_smoothing=0.0, z_loss_scale=0.0, softcap=0.0, class_weight=None,
              reduction="mean", grad_loss=None):
    x64 = x.detach().double().requires_grad_()
    w64 = w.detach().double().requires_grad_()
    b64 = b.detach().double().requires_grad_() if b is not None else None
    z = x64 @ w64.T
    if b64 is not None:
        z = z + b64
    if softcap:
        z = softcap * torch.tanh(z / softcap)
    V = z.shape[-1]
    cw = class_weight.double() if class_weight is not None else torch.ones(V, dtype=torch.float64)
    valid = (t != ignore_index)
    ts = torch.where(valid, t, torch.zeros_like(t)).long()
    lse = torch.logsumexp(z, -1)
    zy = z.gather(-1, ts.unsqueeze(-1)).squeeze(-1)
    wy = cw[ts] * valid
    eps = label_smoothing / V
    tok = (1 - label_smoothing) * wy * (lse - zy) + eps * (lse * cw.sum() - (z * cw).sum(-1)) + z_loss_scale * lse**2
    tok = tok * valid
    zl = z_loss_scale * lse**2 * valid
    D = wy.sum()
    N = valid.sum()
    if reduction == "mean":  # the cross-entropy part over D, the z-loss part over N (flce.h)
        loss = ((tok - zl).sum() / D if D > 0 else tok.sum() * 0) + (zl.sum() / N if N > 0 else zl.sum() * 0)
        zred = zl.sum() / N if N > 0 else zl.sum() * 0
    elif reduction == "sum":
        loss, zred = tok.sum(), zl.sum()
    else:
        loss, zred = tok, zl
    g = torch.ones_like(loss) if grad_loss is None else grad_loss.double()
    loss.backward(g)
    am = z.detach().argmax(-1)
    acc = ((am == t) & valid).sum().double() / max(int(valid.sum()), 1)
    return dict(loss=loss.detach(), grad_x=x64.grad, grad_weight=w64.grad, grad_bias=(b64.grad if b64 is not None else None),
                z_loss=zred.detach(), token_loss=tok.detach(), accuracy=acc, argmax=am)


FLCE_CASES = [
    dict(),
    dict(reduction="sum", bias=True, ignore=True),
    dict(reduction="none", label_smoothing=0.1, z_loss_scale=1e-3, softcap=3.0, class_weight=True, ignore=True),
    dict(reduction="mean", label_smoothing=0.2, z_loss_scale=1e-2, softcap=5.0, bias=True, ignore=True, chunk_rows=3),
    dict(reduction="mean", label_smoothing=0.2, softcap=5.0, class_weight=True, bias=True, ignore=True, chunk_rows=5),
    dict(reduction="mean", memory_budget=4096, bias=True, grad_scale=2.5),
    dict(reduction="sum", ignore_index=3, accumulator="output"),
    dict(reduction="mean", z_loss_scale=1e-2, class_weight=True, ignore=True),
]


@pytest.mark.parametrize("case", FLCE_CASES, ids=[str(i) for i in range(len(FLCE_CASES))])
def test_fused_cross_entropy_matches_float64(gen, case):
    M, H, V = 13, 16, 29
    x = rand(gen, M, H).requires_grad_()
    w = rand(gen, V, H, scale=0.5).requires_grad_()
    b = rand(gen, V).requires_grad_() if case.get("bias") else None
    t = torch.randint(0, V, (M,), generator=gen)
    ignore_index = case.get("ignore_index", -100)
    if case.get("ignore"):
        t[::4] = ignore_index
    cw = (torch.rand(V, generator=gen) + 0.5) if case.get("class_weight") else None
    opts = dict(ignore_index=ignore_index, label_smoothing=case.get("label_smoothing", 0.0),
                z_loss_scale=case.get("z_loss_scale", 0.0), softcap=case.get("softcap", 0.0), class_weight=cw,
                reduction=case.get("reduction", "mean"))
    loss, extras = ot.fused_linear_cross_entropy(x, w, t, b, memory_budget=case.get("memory_budget", 0),
                                                 chunk_rows=case.get("chunk_rows", 0),
                                                 accumulator=case.get("accumulator", "fp32"), return_extras=True, **opts)
    gl = rand(gen, *loss.shape) if opts["reduction"] == "none" else torch.tensor(case.get("grad_scale", 1.0))
    loss.backward(gl)
    ref = _ref_flce(x, w, t, b, grad_loss=gl, **opts)
    assert_close(loss, ref["loss"], **F32, what="loss")
    assert_close(x.grad, ref["grad_x"], 2e-4, 2e-4 * ref["grad_x"].abs().max().item(), "grad_x")
    assert_close(w.grad, ref["grad_weight"], 2e-4, 2e-4 * ref["grad_weight"].abs().max().item(), "grad_weight")
    if b is not None:
        assert_close(b.grad, ref["grad_bias"], **F32, what="grad_bias")
    assert_close(extras["z_loss"], ref["z_loss"], **F32, what="z_loss")
    assert_close(extras["token_loss"], ref["token_loss"], **F32, what="token_loss")
    assert abs(extras["accuracy"].item() - ref["accuracy"].item()) < 1e-6
    assert torch.equal(extras["argmax"], ref["argmax"])


def test_fused_cross_entropy_module_plain_vs_torch(gen):
    x = rand(gen, 2, 7, 12).requires_grad_()
    head = nn.Linear(12, 40, bias=True)
    t = torch.randint(0, 40, (2, 7), generator=gen)
    loss = ot.FusedLinearCrossEntropyLoss(label_smoothing=0.1)(x, head.weight, t, head.bias)
    x2 = x.detach().clone().requires_grad_()
    ref = F.cross_entropy(F.linear(x2, head.weight, head.bias).flatten(0, 1), t.flatten(), label_smoothing=0.1)
    assert_close(loss, ref, **F32, what="loss")
    loss.backward()
    ref.backward()
    assert_close(x.grad, x2.grad, 1e-4, 1e-6, "grad_x")


def test_fused_cross_entropy_accumulates_into_grad(gen):
    x = rand(gen, 6, 8)
    w = rand(gen, 11, 8).requires_grad_()
    b = rand(gen, 11).requires_grad_()
    t = torch.randint(0, 11, (6,), generator=gen)
    w.grad = rand(gen, 11, 8)
    b.grad = rand(gen, 11)
    w0, b0 = w.grad.clone(), b.grad.clone()
    wptr = w.grad.data_ptr()
    fn = ot.FusedLinearCrossEntropyLoss(accumulate=True)
    fn(x, w, t, b).backward()
    fn(x, w, t, b).mul(3.0).backward()
    ref = _ref_flce(x, w, t, b)
    assert w.grad.data_ptr() == wptr
    assert_close(w.grad, w0.double() + 4 * ref["grad_weight"], 1e-4, 1e-5, "accumulated grad_weight")
    assert_close(b.grad, b0.double() + 4 * ref["grad_bias"], 1e-4, 1e-5, "accumulated grad_bias")


def test_fused_cross_entropy_bf16(gen):
    x = rand(gen, 9, 32, dtype=torch.bfloat16).requires_grad_()
    w = rand(gen, 50, 32, dtype=torch.bfloat16, scale=0.3).requires_grad_()
    t = torch.randint(0, 50, (9,), generator=gen)
    loss = ot.fused_linear_cross_entropy(x, w, t)
    loss.backward()
    ref = _ref_flce(x, w, t, None)
    assert loss.dtype == torch.float32
    assert_close(loss, ref["loss"], 1e-2, 1e-2, "loss")
    assert x.grad.dtype == torch.bfloat16 and w.grad.dtype == torch.bfloat16
    assert_close(x.grad, ref["grad_x"], 5e-2, 5e-2 * ref["grad_x"].abs().max().item(), "grad_x")
    assert_close(w.grad, ref["grad_weight"], 5e-2, 5e-2 * ref["grad_weight"].abs().max().item(), "grad_weight")


def test_fused_cross_entropy_bad_target_raises(gen):
    x, w = rand(gen, 4, 8).requires_grad_(), rand(gen, 10, 8)
    with pytest.raises(osftrt.IndexOutOfRange, match="target"):
        ot.fused_linear_cross_entropy(x, w, torch.tensor([0, 1, 12, 2]))
    with pytest.raises(osftrt.DtypeMismatch):
        ot.fused_linear_cross_entropy(x, w.double(), torch.tensor([0, 1, 2, 2]))
    with pytest.raises(osftrt.OutOfMemory):
        ot.fused_linear_cross_entropy(x, w, torch.tensor([0, 1, 2, 2]), memory_budget=8)


# ================================================================ TiledMLP
ACTS = {
    "swiglu": (lambda g, u: F.silu(g) * u),
    "geglu": (lambda g, u: F.gelu(g, approximate="tanh") * u),
    "geglu_erf": (lambda g, u: F.gelu(g) * u),
    "gelu": (lambda u: F.gelu(u)),
    "gelu_tanh": (lambda u: F.gelu(u, approximate="tanh")),
    "silu": (lambda u: F.silu(u)),
    "relu": (lambda u: F.relu(u)),
}


@pytest.mark.parametrize("variant", sorted(ACTS))
def test_tiled_mlp_matches_float64(gen, variant):
    H, I = 12, 20
    gated = variant in ("swiglu", "geglu", "geglu_erf")
    bias = variant in ("geglu", "gelu", "relu")
    mk = lambda i, o: nn.Linear(i, o, bias=bias)
    gate, up, down = (mk(H, I) if gated else None), mk(H, I), mk(I, H)
    for lin in (gate, up, down):
        if lin is not None:
            with torch.no_grad():
                lin.weight.copy_(rand(gen, *lin.weight.shape, scale=0.5))
                if bias:
                    lin.bias.copy_(rand(gen, *lin.bias.shape))
    mlp = ot.TiledMLP(variant, gate=gate, up=up, down=down, tile_tokens=4)
    x = rand(gen, 2, 7, H).requires_grad_()
    assert mlp.tile_count(14) == (4, 4)
    y = mlp(x)
    gy = rand(gen, 2, 7, H)
    y.backward(gy)
    # float64 reference
    d = lambda t: t.detach().double().requires_grad_()
    x64 = d(x)
    ps = {n: (d(l.weight), d(l.bias) if bias else None) for n, l in (("gate", gate), ("up", up), ("down", down)) if l is not None}
    lin64 = lambda n, v: F.linear(v, *ps[n])
    hmid = ACTS[variant](lin64("gate", x64), lin64("up", x64)) if gated else ACTS[variant](lin64("up", x64))
    ry = lin64("down", hmid)
    ry.backward(gy.double())
    assert_close(y, ry, 1e-4, 1e-4 * ry.abs().max().item(), "y")
    assert_close(x.grad, x64.grad, 1e-4, 1e-4 * x64.grad.abs().max().item(), "grad_x")
    for n, lin in (("gate", gate), ("up", up), ("down", down)):
        if lin is None:
            continue
        assert_close(lin.weight.grad, ps[n][0].grad, 1e-4, 1e-4 * ps[n][0].grad.abs().max().item(), "grad " + n)
        if bias:
            assert_close(lin.bias.grad, ps[n][1].grad, 1e-4, 1e-4 * ps[n][1].grad.abs().max().item(), "grad bias " + n)


def test_tiled_mlp_budget_and_bf16(gen):
    H, I = 16, 32
    ws = [rand(gen, I, H, dtype=torch.bfloat16, scale=0.3), rand(gen, I, H, dtype=torch.bfloat16, scale=0.3),
          rand(gen, H, I, dtype=torch.bfloat16, scale=0.3)]
    params = [nn.Parameter(w) for w in ws]
    mlp = ot.TiledMLP("swiglu", gate=params[0], up=params[1], down=params[2], memory_budget=5 * (3 * I * 2 + H * 4))  # per token: 3 bf16 intermediates + the fp32 grad_x sum
    n_tiles, tile = mlp.tile_count(23)
    assert tile == 5 and n_tiles == 5
    x = rand(gen, 23, H, dtype=torch.bfloat16).requires_grad_()
    y = mlp(x)
    y.float().sum().backward()
    x64 = x.detach().double().requires_grad_()
    w64 = [w.detach().double().requires_grad_() for w in ws]
    ry = F.linear(F.silu(F.linear(x64, w64[0])) * F.linear(x64, w64[1]), w64[2])
    ry.sum().backward()
    assert y.dtype == torch.bfloat16
    assert_close(y, ry, 5e-2, 5e-2 * ry.abs().max().item(), "y")
    assert_close(x.grad, x64.grad, 5e-2, 5e-2 * x64.grad.abs().max().item(), "grad_x")
    for p, w in zip(params, w64):
        assert_close(p.grad, w.grad, 5e-2, 5e-2 * w.grad.abs().max().item(), "grad_w")


# ============================================================ QR, power it.
def _qr64(a):
    q, r = torch.linalg.qr(a.double())
    s = torch.sign(torch.diagonal(r))
    s[s == 0] = 1
    return q * s, r * s.unsqueeze(1)


def test_batched_qr_mixed_list(gen):
    mats = [rand(gen, 9, 4), rand(gen, 6, 6, dtype=torch.float64), rand(gen, 20, 7), np.random.rand(8, 3)]
    res = osftrt.batched_qr(mats)
    assert res.ok and res.status == [0, 0, 0, 0]
    for a, q, r in zip(mats, res.q, res.r):
        a = torch.as_tensor(a)
        q, r = torch.as_tensor(q), torch.as_tensor(r)
        rq, rr = _qr64(a)
        tol = 1e-4 if a.dtype == torch.float32 else 1e-10
        assert_close(q, rq, tol, tol, "q")
        assert_close(r, rr, tol, tol * rr.abs().max().item(), "r")
        assert (torch.diagonal(r) >= 0).all() and torch.equal(r, torch.triu(r))
    # in place, and CholeskyQR2
    a = rand(gen, 10, 5)
    want = _qr64(a)[0]
    ptr = a.data_ptr()
    osftrt.batched_qr([a], in_place=True, want_r=False, method="cholesky_qr2")
    assert a.data_ptr() == ptr
    assert_close(a, want, 1e-4, 1e-4, "in-place q")


def test_batched_qr_per_matrix_failure(gen):
    good1, good2 = rand(gen, 7, 3), rand(gen, 5, 5)
    bad = rand(gen, 6, 2)
    bad[2, 1] = float("nan")
    qs = [poison(7, 3), poison(6, 2), poison(5, 5)]
    res = osftrt.batched_qr([good1, bad, good2], q=qs, failures="status")
    assert res.status == [0, capi.OSFT_STATUS_NUMERICAL_ERROR, 0] and not res.ok
    assert torch.isnan(qs[1]).all(), "a failed matrix's output must stay untouched"
    assert_close(qs[0], _qr64(good1)[0], 1e-4, 1e-4, "q0")
    assert_close(qs[2], _qr64(good2)[0], 1e-4, 1e-4, "q2")
    # a malformed list raises and writes nothing
    qs = [poison(7, 3)]
    with pytest.raises(osftrt.ShapeMismatch):
        osftrt.batched_qr([rand(gen, 3, 7)], q=qs)
    assert torch.isnan(qs[0]).all()


def test_power_iteration(gen):
    a_list, q_list, want = [], [], []
    for m, n, dt in ((8, 3, torch.float32), (6, 6, torch.float64)):
        b = rand(gen, m, m, dtype=torch.float64)
        a = (b @ b.T).to(dt)
        q = _qr64(rand(gen, m, n, dtype=torch.float64))[0].to(dt).contiguous()
        ref = q.double()
        for _ in range(3):
            ref = _qr64(a.double() @ ref)[0]
        a_list.append(a)
        q_list.append(q)
        want.append(ref)
    st = osftrt.power_iteration(a_list, q_list, iterations=3)
    assert st == [0, 0]
    for q, ref in zip(q_list, want):
        tol = 1e-3 if q.dtype == torch.float32 else 1e-9
        assert_close(q, ref, tol, tol, "q")


def test_projector_bf16_and_mixed_dtypes(gen):
    n, k, r, l = 10, 12, 4, 3
    u, _, vt = torch.linalg.svd(rand(gen, n, k, dtype=torch.float64), full_matrices=False)
    uh, vh = u[:, :r].contiguous(), vt[:r].contiguous()
    gu, gv = rand(gen, n, l), rand(gen, l, k)
    t_uh, t_vh = uh.to(torch.bfloat16), vh.float()  # each tensor its own dtype
    t_gu, t_gv = gu.to(torch.bfloat16), gv.to(torch.bfloat16)
    gu_in, gv_in = t_gu.double(), t_gv.double()  # the values the library reads
    p = ot.OSFTProjector()
    p.add_target(u_high=t_uh, grad_u_low=t_gu, v_high=t_vh, grad_v_low=t_gv)
    p.project_gradients()
    uh_b, vh_f = t_uh.double(), t_vh.double()
    want_u = gu_in - uh_b @ (uh_b.T @ gu_in)
    want_v = gv_in - (gv_in @ vh_f.T) @ vh_f
    assert t_gu.dtype == torch.bfloat16
    assert_close(t_gu, want_u, 2e-2, 2e-2, "bf16 dU")
    assert_close(t_gv, want_v, 2e-2, 2e-2, "bf16 dV")
    p.close()
