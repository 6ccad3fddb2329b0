"""The binding on a CUDA GPU: Context("cuda") and its stream; OSFTLinear,
fused linear cross-entropy, TiledMLP and batched QR on torch CUDA tensors
against float64 references computed on the CPU (fresh random inputs,
outputs poisoned first, fp32 and bf16 tolerances); zero-copy writes into
torch's own storage on a non-default torch stream, ordered by that stream;
the library's device memory from PyTorch's caching allocator
(TorchCUDAAllocator); a training step captured in a CUDA graph (what
include/osftrt/context.h, flce.h and tests/c/test_capture_cuda.c say is
capturable: flinear, the tiled MLP, FLCE with device_target_check and the
projection, after one uncaptured run); and device mismatches.

Every test skips, with the reason, when torch has no CUDA device, when
libosftrt was built without CUDA or when it sees no GPU. With
OSFTRT_REQUIRE_CUDA=1 (bench/gpu/run_gpu_checks.sh sets it on the GPU
machine) those skips fail instead, so a GPU run cannot pass by skipping.
"""
import gc
import os

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import osftrt
import osftrt.torch as ot
from osftrt import capi

from conftest import assert_close, rand

F32 = dict(rtol=5e-4, atol=5e-4)  # relative to the largest reference value
BF16 = dict(rtol=5e-2, atol=5e-2)
NAN = float("nan")


def _why_no_cuda():
    if not torch.cuda.is_available():
        return "torch sees no CUDA device (torch.cuda.is_available() is False)"
    if not capi.osft_has_feature(capi.OSFT_FEATURE_CUDA):
        return "libosftrt was built without CUDA (osft_has_feature(OSFT_FEATURE_CUDA) is 0)"
    if capi.osft_device_count(capi.OSFT_DEVICE_CUDA) == 0:
        return "libosftrt sees no CUDA device (osft_device_count is 0)"
    return None


NO_CUDA = _why_no_cuda()
REQUIRE_CUDA = os.environ.get("OSFTRT_REQUIRE_CUDA", "0") not in ("", "0")


@pytest.fixture(autouse=True)
def _need_cuda():
    if NO_CUDA:
        if REQUIRE_CUDA:
            pytest.fail("OSFTRT_REQUIRE_CUDA=1, but " + NO_CUDA)
        pytest.skip(NO_CUDA)
    yield
    torch.cuda.synchronize()


def cuda(t):
    return t.to("cuda")


def cuda_poison(*shape, dtype=torch.float32):
    return torch.full(shape, NAN, dtype=dtype, device="cuda")


def poison_allocator():
    """Refills PyTorch's cached CUDA blocks (small and large pool) with NaN,
    so that outputs the modules allocate with torch.empty start as NaN and an
    element the library does not write fails assert_close (best effort)."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    junk = [torch.full((1 << 18,), NAN, device="cuda") for _ in range(4)]  # 1 MiB each: small pool
    junk.append(torch.full((16 << 20,), NAN, device="cuda"))  # 64 MiB: large pool
    torch.cuda.synchronize()
    del junk


def tol_of(dtype):
    return F32 if dtype == torch.float32 else BF16


def close(got, want, dtype, what):
    t = tol_of(dtype)
    assert got.is_cuda, what + ": not on the GPU"
    got = got.detach().cpu()
    assert_close(got, want, t["rtol"], t["atol"] * max(want.abs().max().item(), 1e-30), what)


def d64(t):
    return t.detach().cpu().to(torch.float64)


def spin(stream, ms=20):
    """Keeps `stream` busy for about `ms` milliseconds, so that work another
    stream does not wait for would run too early and read stale data."""
    if hasattr(torch.cuda, "_sleep"):
        with torch.cuda.stream(stream):
            torch.cuda._sleep(int(ms * 1.5e6))  # ~1.5 GHz minimum clock


# ============================================================== contexts
def test_context_cuda_and_its_stream():
    dev = torch.cuda.current_device()
    with osftrt.Context("cuda") as c:
        assert c.is_cuda and c.device_id == dev and "cuda:%d" % dev in repr(c)
        assert c.stream() == torch.cuda.current_stream().cuda_stream  # the legacy default stream: 0
        c.synchronize()
        c.reserve_workspace(1 << 20)
        assert c.workspace_size() >= 1 << 20
        st = c.memory_stats()
        assert st["device_in_use"] >= 1 << 20 and st["device_allocs"] >= 1 and st["host_in_use"] >= 0
        c.release_workspace()
        assert c.workspace_size() == 0
    assert "closed" in repr(c)

    s = torch.cuda.Stream()
    with osftrt.Context("cuda", stream=s.cuda_stream) as c:
        assert c.stream() == s.cuda_stream
    with torch.cuda.stream(s):
        with osftrt.Context("cuda") as c:  # takes torch's current stream
            assert c.stream() == s.cuda_stream
    with osftrt.Context(torch.device("cuda", dev)) as c:
        c.set_stream(s.cuda_stream)
        assert c.stream() == s.cuda_stream
        c.set_stream(None)
        assert c.stream() == 0
        with torch.cuda.stream(s):
            c.sync_torch_stream()  # follows torch, and DLPack producers order their work before s
            assert c.stream() == s.cuda_stream and capi._get_dlpack_stream() == s.cuda_stream
        c.sync_torch_stream()
        assert c.stream() == 0
    with pytest.raises(osftrt.NoDevice):
        osftrt.Context("cuda:%d" % capi.osft_device_count(capi.OSFT_DEVICE_CUDA))
    assert osftrt.default_context("cuda").is_cuda


# ======================================================== the torch modules
def _ref_flinear(m, x, gy):
    uh, sh, vh = d64(m.u_high), d64(m.s_high), d64(m.v_high)
    ul, sl, vl = (d64(p).requires_grad_() for p in (m.u_low, m.s_low, m.v_low))
    x64 = d64(x).requires_grad_()
    b = d64(m.bias).requires_grad_() if m.bias is not None else None
    y = (x64 @ vh.T * sh) @ uh.T + (x64 @ vl.T * sl) @ ul.T
    if b is not None:
        y = y + b
    y.backward(d64(gy))
    return y.detach(), x64.grad, ul.grad, sl.grad, vl.grad, (b.grad if b is not None else None)


@pytest.mark.parametrize("dtype,strategy", [(torch.float32, "auto"), (torch.float32, "dense"),
                                            (torch.float32, "factorized"), (torch.bfloat16, "auto")])
def test_osft_linear_cuda_matches_float64(gen, dtype, strategy):
    N, K = 96, 80
    lin = nn.Linear(K, N)
    with torch.no_grad():
        lin.weight.copy_(rand(gen, N, K))
        lin.bias.copy_(rand(gen, N))
    m = ot.OSFTLinear.from_linear(lin.cuda(), 0.5, dtype=dtype, strategy=strategy)
    assert m.u_low.is_cuda and m.u_low.dtype == dtype
    poison_allocator()
    x = cuda(rand(gen, 3, 37, K, dtype=dtype)).requires_grad_()
    gy = cuda(rand(gen, 3, 37, N, dtype=dtype))
    y = m(x)
    y.backward(gy)
    ry, rgx, rgu, rgs, rgv, rgb = _ref_flinear(m, x, gy)
    close(y, ry, dtype, "y")
    for got, want, name in ((x.grad, rgx, "grad_x"), (m.u_low.grad, rgu, "grad_u_low"), (m.s_low.grad, rgs, "grad_s_low"),
                            (m.v_low.grad, rgv, "grad_v_low"), (m.bias.grad, rgb, "grad_bias")):
        assert got.dtype == dtype, name
        close(got, want, dtype, name)
    m.close()


def _ref_flce(x, w, t, b, *, ignore_index=-100, label_smoothing=0.0, z_loss_scale=0.0, softcap=0.0, reduction="mean",
              grad_loss=None):
    x64, w64 = d64(x).requires_grad_(), d64(w).requires_grad_()
    b64 = d64(b).requires_grad_() if b is not None else None
    t = t.detach().cpu()
    z = x64 @ w64.T + (b64 if b64 is not None else 0)
    if softcap:
        z = softcap * torch.tanh(z / softcap)
    ce = F.cross_entropy(z, t, ignore_index=ignore_index, label_smoothing=label_smoothing, reduction="none")
    valid = t != ignore_index
    zl = z_loss_scale * torch.logsumexp(z, -1) ** 2 * valid
    tok = ce + zl
    n = max(int(valid.sum()), 1)
    loss = {"mean": tok.sum() / n, "sum": tok.sum(), "none": tok}[reduction]
    loss.backward(torch.ones_like(loss) if grad_loss is None else d64(grad_loss))
    return loss.detach(), x64.grad, w64.grad, (b64.grad if b64 is not None else None), tok.detach()


FLCE_CASES = [
    dict(dtype=torch.float32, reduction="mean", chunk_rows=16),
    dict(dtype=torch.float32, reduction="sum", bias=True, ignore=True, label_smoothing=0.1, z_loss_scale=1e-3, softcap=4.0),
    dict(dtype=torch.float32, reduction="none", ignore=True, memory_budget=256 << 10),
    dict(dtype=torch.bfloat16, reduction="mean", bias=True, ignore=True),
]


@pytest.mark.parametrize("case", FLCE_CASES, ids=["f32_mean_chunked", "f32_sum_options", "f32_none_budget", "bf16_mean"])
def test_fused_cross_entropy_cuda_matches_float64(gen, case):
    M, H, V = 67, 64, 1000
    dt = case["dtype"]
    x = cuda(rand(gen, M, H, dtype=dt)).requires_grad_()
    w = cuda(rand(gen, V, H, dtype=dt, scale=0.3)).requires_grad_()
    b = cuda(rand(gen, V, dtype=dt)).requires_grad_() if case.get("bias") else None
    t = torch.randint(0, V, (M,), generator=gen)
    if case.get("ignore"):
        t[::5] = -100
    t = cuda(t)
    opts = {k: case[k] for k in ("label_smoothing", "z_loss_scale", "softcap", "reduction") if k in case}
    poison_allocator()
    loss, extras = ot.fused_linear_cross_entropy(x, w, t, b, chunk_rows=case.get("chunk_rows", 0),
                                                 memory_budget=case.get("memory_budget", 0), return_extras=True, **opts)
    assert loss.is_cuda and loss.dtype == torch.float32
    gl = cuda(rand(gen, *loss.shape)) if opts["reduction"] == "none" else None
    loss.backward(gl)
    rl, rgx, rgw, rgb, rtok = _ref_flce(x, w, t, b, grad_loss=gl, **opts)
    close(loss, rl, torch.float32 if dt == torch.float32 else dt, "loss")
    close(extras["token_loss"], rtok, torch.float32 if dt == torch.float32 else dt, "token_loss")
    close(x.grad, rgx, dt, "grad_x")
    close(w.grad, rgw, dt, "grad_weight")
    if b is not None:
        close(b.grad, rgb, dt, "grad_bias")


@pytest.mark.parametrize("variant,dtype,bias", [("swiglu", torch.float32, False), ("gelu", torch.float32, True),
                                                ("swiglu", torch.bfloat16, False)])
def test_tiled_mlp_cuda_matches_float64(gen, variant, dtype, bias):
    H, I = 64, 176
    gated = variant == "swiglu"
    lins = {}
    for name, (i, o) in (("gate", (H, I)), ("up", (H, I)), ("down", (I, H))):
        if name == "gate" and not gated:
            continue
        lin = nn.Linear(i, o, bias=bias)
        with torch.no_grad():
            lin.weight.copy_(rand(gen, o, i, scale=0.2))
            if bias:
                lin.bias.copy_(rand(gen, o))
        lins[name] = lin.to(device="cuda", dtype=dtype)
    mlp = ot.TiledMLP(variant, gate=lins.get("gate"), up=lins["up"], down=lins["down"], tile_tokens=24)
    x = cuda(rand(gen, 2, 45, H, dtype=dtype)).requires_grad_()
    gy = cuda(rand(gen, 2, 45, H, dtype=dtype))
    tiles, largest = mlp.tile_count(90)
    assert tiles == 4 and largest <= 24
    poison_allocator()
    y = mlp(x)
    y.backward(gy)
    x64 = d64(x).requires_grad_()
    ps = {n: (d64(l.weight).requires_grad_(), d64(l.bias).requires_grad_() if bias else None) for n, l in lins.items()}
    lin64 = lambda n, v: F.linear(v, *ps[n])
    h = F.silu(lin64("gate", x64)) * lin64("up", x64) if gated else F.gelu(lin64("up", x64))
    ry = lin64("down", h)
    ry.backward(d64(gy))
    close(y, ry.detach(), dtype, "y")
    close(x.grad, x64.grad, dtype, "grad_x")
    for n, lin in lins.items():
        close(lin.weight.grad, ps[n][0].grad, dtype, "grad " + n)
        if bias:
            close(lin.bias.grad, ps[n][1].grad, dtype, "grad bias " + n)
    mlp.close()


def _qr64(a):
    q, r = torch.linalg.qr(d64(a))
    s = torch.sign(torch.diagonal(r))
    s[s == 0] = 1
    return q * s, r * s.unsqueeze(1)


def test_batched_qr_cuda_matches_float64(gen):
    shapes = ((64, 16, torch.float32), (33, 33, torch.float64), (300, 40, torch.float32), (7, 3, torch.float64))
    mats = [cuda(rand(gen, m, n, dtype=dt)) for m, n, dt in shapes]
    bad = cuda(rand(gen, 12, 4))
    bad[3, 2] = NAN
    qs = [cuda_poison(m, n, dtype=dt) for m, n, dt in shapes] + [cuda_poison(12, 4)]
    rs = [cuda_poison(n, n, dtype=dt) for _, n, dt in shapes] + [cuda_poison(4, 4)]
    with osftrt.Context("cuda") as c:
        res = osftrt.batched_qr(mats + [bad], q=qs, r=rs, context=c, failures="status")
        assert res.status == [0, 0, 0, 0, capi.OSFT_STATUS_NUMERICAL_ERROR]
        for a, q, r, (_, _, dt) in zip(mats, qs, rs, shapes):
            rq, rr = _qr64(a)
            tol = 2e-4 if dt == torch.float32 else 1e-10
            assert_close(q.cpu(), rq, tol, tol, "q")
            assert_close(r.cpu(), rr, tol, tol * rr.abs().max().item(), "r")
            assert torch.equal(r, torch.triu(r))
        assert torch.isnan(qs[-1]).all() and torch.isnan(rs[-1]).all(), "a failed matrix's outputs must stay untouched"
        # in place (zero-copy into the tensor's storage), CholeskyQR2
        a = cuda(rand(gen, 50, 12))
        want, ptr = _qr64(a)[0], a.data_ptr()
        res = osftrt.batched_qr([a], in_place=True, want_r=False, method="cholesky_qr2", context=c)
        assert res.ok and a.data_ptr() == ptr
        assert_close(a.cpu(), want, 2e-4, 2e-4, "in-place q")


# ======================================== zero-copy on a non-default stream
def test_zero_copy_on_a_side_stream_is_ordered(gen):
    """The library reads and writes the tensors' own storage, on torch's
    current stream: a producer still running on that stream is waited for,
    and a consumer queued on it right after the call sees the results. The
    modules are first called on the default stream (their handles are made
    there), then on a side stream: every call must follow the current one."""
    N, K, M, I = 64, 48, 40, 96
    lin = nn.Linear(K, N)
    with torch.no_grad():
        lin.weight.copy_(rand(gen, N, K))
        lin.bias.copy_(rand(gen, N))
    m = ot.OSFTLinear.from_linear(lin.cuda(), 0.5)
    ws = [nn.Parameter(cuda(rand(gen, *sh, scale=0.2))) for sh in ((I, N), (I, N), (N, I))]
    mlp = ot.TiledMLP("swiglu", gate=ws[0], up=ws[1], down=ws[2], tile_tokens=16)
    xh = rand(gen, M, K)
    with torch.no_grad():
        mlp(m(cuda(xh)))  # handles made on the default stream
    s = torch.cuda.Stream()
    torch.cuda.synchronize()
    poison_allocator()
    with torch.cuda.stream(s), torch.no_grad():
        x = cuda_poison(M, K)
        spin(s)
        x.copy_(xh.to("cuda", non_blocking=False))  # written on s after the spin
        y = m(x)
        y_seen = y.clone()  # queued on s right after the library's work
        z = mlp(y)
        z_seen = z.clone()
        stream_then = osftrt.default_context("cuda").stream()
        dlpack_then = capi._get_dlpack_stream()
    s.synchronize()
    ry = _ref_flinear(m, x, torch.ones(M, N))[0]
    w64 = [d64(w) for w in ws]
    rz = F.linear(F.silu(F.linear(ry, w64[0])) * F.linear(ry, w64[1]), w64[2])
    close(y_seen, ry, torch.float32, "OSFTLinear's y read on the side stream")
    close(z_seen, rz, torch.float32, "TiledMLP's y read on the side stream")
    assert stream_then == s.cuda_stream and dlpack_then == s.cuda_stream, (
        "the modules' context must run on torch's current stream %#x (ran on %#x, DLPack consumer stream %#x)"
        % (s.cuda_stream, stream_then or 0, dlpack_then))

    # explicit outputs through the C API: written in place, same storage
    with osftrt.Context("cuda", stream=s.cuda_stream) as c:
        f = capi.osft_flinear_factors_t()
        f.u_high, f.s_high, f.v_high, f.u_low, f.s_low, f.v_low = (
            t.detach() for t in (m.u_high, m.s_high, m.v_high, m.u_low, m.s_low, m.v_low))
        layer = capi.osft_flinear_create_from_factors(c.handle, f, capi.osft_flinear_options_t())
        with torch.cuda.stream(s):
            c.sync_torch_stream()
            out = cuda_poison(M, N)
            ptr = out.data_ptr()
            spin(s)
            x.copy_(xh * 2)
            capi.osft_flinear_forward(layer, x, m.bias.detach(), out)
            seen = out.clone()
            g = capi.osft_flinear_grads_t()
            gx, gu = cuda_poison(M, K), cuda_poison(*m.u_low.shape)
            g.grad_x, g.grad_u_low = gx, gu
            capi.osft_flinear_backward(layer, x, torch.ones(M, N, device="cuda"), g)
        s.synchronize()
        assert out.data_ptr() == ptr
        ry2, rgx, rgu = _ref_flinear(m, x, torch.ones(M, N))[:3]
        close(seen, ry2, torch.float32, "y (C API, in place)")
        close(out, ry2, torch.float32, "y (C API, in place)")
        close(gx, rgx, torch.float32, "grad_x (C API, in place)")
        close(gu, rgu, torch.float32, "grad_u_low (C API, in place)")
        layer.close()

    # accumulate=True adds into weight.grad in place (no new tensor)
    V, H = 300, 32
    xf = cuda(rand(gen, 20, H))
    w = cuda(rand(gen, V, H, scale=0.3)).requires_grad_()
    t = cuda(torch.randint(0, V, (20,), generator=gen))
    with torch.cuda.stream(s):
        w.grad = cuda(rand(gen, V, H))
        g0, gptr = w.grad.clone(), w.grad.data_ptr()
        spin(s)
        ot.fused_linear_cross_entropy(xf, w, t, accumulate=True).backward()
        g_seen = w.grad.clone()
    s.synchronize()
    assert w.grad.data_ptr() == gptr
    close(g_seen, d64(g0) + _ref_flce(xf, w, t, None)[2], torch.float32, "accumulated grad_weight")
    mlp.close()
    m.close()


# =================================================== the caching allocator
class CountingTorchAllocator(osftrt.TorchCUDAAllocator):
    def __init__(self):
        self.live = {}
        self.allocs = 0

    def device_alloc(self, nbytes, device, stream):
        p = super().device_alloc(nbytes, device, stream)
        self.allocs += 1
        self.live[p] = nbytes
        return p

    def device_free(self, ptr, nbytes, device, stream):
        assert self.live.pop(ptr) == nbytes
        super().device_free(ptr, nbytes, device, stream)


def test_library_memory_comes_from_torchs_caching_allocator(gen):
    torch.cuda.synchronize()
    gc.collect()
    base = torch.cuda.memory_allocated()
    alloc = CountingTorchAllocator()
    c = osftrt.Context("cuda", allocator=alloc)
    assert c.allocator is alloc
    # an operation's scratch
    mats = [cuda(rand(gen, 256, 64)) for _ in range(3)]
    torch.cuda.reset_peak_memory_stats()
    res = osftrt.batched_qr(mats, context=c)
    assert res.ok
    held = c.memory_stats()["device_in_use"]
    assert alloc.allocs >= 1 and held > 0
    assert sum(alloc.live.values()) >= held, "device memory from outside the allocator"
    assert torch.cuda.memory_allocated() - base >= held, "the library's blocks must count in torch's allocated bytes"
    # the workspace
    c.reserve_workspace(32 << 20)
    assert c.workspace_size() >= 32 << 20
    in_torch = torch.cuda.memory_allocated() - base
    assert in_torch >= 32 << 20 and sum(alloc.live.values()) >= 32 << 20
    c.release_workspace()
    assert torch.cuda.memory_allocated() - base <= in_torch - (32 << 20) + (1 << 20)
    del res, mats
    c.close()
    torch.cuda.synchronize()
    assert not alloc.live, "every block must go back on close: %r" % alloc.live
    assert torch.cuda.memory_allocated() == base


# ================================================== a CUDA-graph-captured step
def test_cuda_graph_capture_of_a_step_replays_exactly(gen):
    """flinear forward + backward, the tiled MLP forward + backward, FLCE
    with the device-side target check and the projection, captured on a
    side stream after one uncaptured run; every replay writes what the
    uncaptured step wrote, the capture allocates nothing, and a replay reads
    the inputs' current values."""
    M, K, N, H, I, V = 128, 64, 80, 64, 96, 100
    s = torch.cuda.Stream()
    c = osftrt.Context("cuda", stream=s.cuda_stream)
    u, sv, vt = torch.linalg.svd(rand(gen, N, K, dtype=torch.float64), full_matrices=False)
    r = 24
    fac = [cuda(t.float().contiguous()) for t in (u[:, :r], sv[:r], vt[:r], u[:, r:], sv[r:], vt[r:])]
    f = capi.osft_flinear_factors_t()
    f.u_high, f.s_high, f.v_high, f.u_low, f.s_low, f.v_low = fac
    layer = capi.osft_flinear_create_from_factors(c.handle, f, capi.osft_flinear_options_t())
    x, gy, bias = cuda(rand(gen, M, K)), cuda(rand(gen, M, N)), cuda(rand(gen, N))
    y, gx, gu, gs, gv, gb = (cuda_poison(*t) for t in ((M, N), (M, K), (N, K - r), (K - r,), (K - r, K), (N,)))
    g = capi.osft_flinear_grads_t()
    g.grad_x, g.grad_u_low, g.grad_s_low, g.grad_v_low, g.grad_bias = gx, gu, gs, gv, gb

    mw = capi.osft_mlp_weights_t()
    wts = [cuda(rand(gen, I, H, scale=0.2)), cuda(rand(gen, I, H, scale=0.2)), cuda(rand(gen, H, I, scale=0.2))]
    mw.gate, mw.up, mw.down = wts
    mo = capi.osft_mlp_options_t()
    mo.tiling = capi.OSFT_MLP_TILING_TOKENS
    mo.tile_tokens = 32
    mlp = capi.osft_mlp_create(c.handle, capi.OSFT_MLP_SWIGLU, H, I, mw, mo)
    mx, mgy = cuda(rand(gen, M, H)), cuda(rand(gen, M, H))
    my, mgx = cuda_poison(M, H), cuda_poison(M, H)
    mgw = [cuda_poison(*t.shape) for t in wts]
    mg = capi.osft_mlp_grads_t()
    mg.grad_x, mg.grad_gate, mg.grad_up, mg.grad_down = mgx, *mgw

    fo = capi.osft_flce_options_t()
    fo.device_target_check = 1
    flce = capi.osft_flce_create(c.handle, fo)
    fx, fw = cuda(rand(gen, M, H)), cuda(rand(gen, V, H, scale=0.3))
    tg = cuda(torch.randint(0, V, (M,), generator=gen))
    loss, fgx, fgw, tok = cuda_poison(), cuda_poison(M, H), cuda_poison(V, H), cuda_poison(M)
    fi = capi.osft_flce_inputs_t()
    fi.x, fi.weight, fi.targets = fx, fw, tg
    fout = capi.osft_flce_outputs_t()
    fout.loss, fout.grad_x, fout.grad_weight, fout.token_loss = loss, fgx, fgw, tok

    po = capi.osft_projector_options_t()
    proj = capi.osft_projector_create(c.handle, None, po)
    pt = capi.osft_projection_target_t()
    pt.u_high, pt.u_low, pt.v_high, pt.v_low = fac[0], fac[3], fac[2], fac[5]
    idx = capi.osft_projector_add_target(proj, pt)
    pgu0, pgv0 = cuda(rand(gen, N, K - r)), cuda(rand(gen, K - r, K))
    pgu, pgv = pgu0.clone(), pgv0.clone()
    capi.osft_projector_set_grads(proj, idx, pgu, pgv)

    outs = [y, gx, gu, gs, gv, gb, my, mgx, *mgw, loss, fgx, fgw, tok, pgu, pgv]

    def step():
        c.sync_torch_stream()
        pgu.copy_(pgu0)
        pgv.copy_(pgv0)
        capi.osft_flinear_forward(layer, x, bias, y)
        capi.osft_flinear_backward(layer, x, gy, g)
        capi.osft_mlp_forward(mlp, mx, my, 0)
        capi.osft_mlp_backward(mlp, mx, mgy, mg, 0)
        capi.osft_flce_compute(flce, fi, fout)
        capi.osft_projector_project(proj)

    torch.cuda.synchronize()
    with torch.cuda.stream(s):
        step()  # uncaptured: grows every scratch block
    s.synchronize()
    want = [o.clone() for o in outs]
    assert all(torch.isfinite(w).all() for w in want), "an output was not written by the uncaptured step"
    allocs = c.memory_stats()["device_allocs"]
    for o in outs:
        o.fill_(NAN)
    gc.collect()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=s, capture_error_mode="thread_local"):
        step()
    assert c.memory_stats()["device_allocs"] == allocs, "the capture allocated"
    for replay in range(3):
        for o in outs:
            o.fill_(NAN)
        graph.replay()
        torch.cuda.synchronize()
        for i, (o, w) in enumerate(zip(outs, want)):
            assert torch.equal(o, w), "replay %d: output %d differs from the uncaptured step" % (replay, i)
    capi.osft_flce_check_targets(flce)  # no target was out of range
    # a replay reads the inputs' current values
    x.copy_(cuda(rand(gen, M, K)))
    graph.replay()
    torch.cuda.synchronize()
    f64 = [d64(t) for t in fac]
    ry = (d64(x) @ f64[2].T * f64[1]) @ f64[0].T + (d64(x) @ f64[5].T * f64[4]) @ f64[3].T + d64(bias)
    close(y, ry, torch.float32, "y after a replay on new x")
    del graph
    for h in (proj, flce, mlp, layer):
        h.close()
    c.close()


def test_cuda_graph_capture_of_module_forwards(gen):
    """OSFTLinear and TiledMLP forwards (no grad) captured with
    torch.cuda.graph on the stream they were warmed up on."""
    H, I = 64, 128
    lin = ot.OSFTLinear.from_linear(nn.Linear(H, H).cuda(), 0.5)
    gate, up, down = nn.Linear(H, I, bias=False).cuda(), nn.Linear(H, I, bias=False).cuda(), nn.Linear(I, H, bias=False).cuda()
    mlp = ot.TiledMLP("swiglu", gate=gate, up=up, down=down, tile_tokens=32)
    x = cuda(rand(gen, 96, H))
    s = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.no_grad():
        with torch.cuda.stream(s):
            for _ in range(2):
                mlp(lin(x))
        s.synchronize()
        gc.collect()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=s, capture_error_mode="thread_local"):
            y = mlp(lin(x))
        x.copy_(cuda(rand(gen, 96, H)))
        graph.replay()
        torch.cuda.synchronize()
        want = mlp(lin(x))
        torch.cuda.synchronize()
    assert_close(y.cpu(), want.cpu(), 1e-5, 1e-5 * want.abs().max().item(), "replay vs eager forward")
    h = _ref_flinear(lin, x, torch.ones(96, H))[0]
    ref = F.linear(F.silu(F.linear(h, d64(gate.weight))) * F.linear(h, d64(up.weight)), d64(down.weight))
    close(y, ref, torch.float32, "y")
    del graph
    mlp.close()
    lin.close()


def test_cuda_tensor_that_requires_grad_is_exported_detached(gen):
    """osftrt.i: torch refuses __dlpack__ on a tensor that requires grad,
    so the binding exports its detached alias (same storage)."""
    with osftrt.Context("cuda") as c:
        w = cuda(rand(gen, 12, 10))
        o = capi.osft_flinear_options_t()
        o.rank_ratio = 0.5
        layer = capi.osft_flinear_create_from_weight(c.handle, w, o)
        x = cuda(rand(gen, 5, 10)).requires_grad_()
        y = cuda_poison(5, 12)
        capi.osft_flinear_forward(layer, x, None, y)
        close(y, d64(x) @ d64(w).T, torch.float32, "y")
        layer.close()


# ========================================================= device mismatches
def test_device_mismatch_raises_and_writes_nothing(gen):
    with osftrt.Context("cuda") as c:
        w = cuda(rand(gen, 12, 10))
        o = capi.osft_flinear_options_t()
        o.rank_ratio = 0.5
        layer = capi.osft_flinear_create_from_weight(c.handle, w, o)
        y = cuda_poison(5, 12)
        with pytest.raises(osftrt.DeviceMismatch):
            capi.osft_flinear_forward(layer, rand(gen, 5, 10), None, y)  # a CPU x for a CUDA layer
        assert torch.isnan(y).all()
        ycpu = torch.full((5, 12), NAN)
        with pytest.raises(osftrt.DeviceMismatch):
            capi.osft_flinear_forward(layer, cuda(rand(gen, 5, 10)), None, ycpu)  # a CPU output
        assert torch.isnan(ycpu).all()
        layer.close()
        q = cuda_poison(8, 3)
        with pytest.raises(osftrt.DeviceMismatch):
            osftrt.batched_qr([rand(gen, 8, 3)], q=[q], context=c)
        assert torch.isnan(q).all()
    with osftrt.Context("cpu") as c:
        q = torch.full((8, 3), NAN)
        with pytest.raises(osftrt.DeviceMismatch):
            osftrt.batched_qr([cuda(rand(gen, 8, 3))], q=[q], context=c)
        assert torch.isnan(q).all()
    # the modules: a CUDA x with a CPU weight
    x = cuda(rand(gen, 6, 8)).requires_grad_()
    with pytest.raises(osftrt.DeviceMismatch):
        ot.fused_linear_cross_entropy(x, rand(gen, 11, 8), cuda(torch.randint(0, 11, (6,), generator=gen)))
