"""Small calls at the host framework's speed (issue 55): each capability
through osftrt's PyTorch modules against plain PyTorch doing the same work,
in one process, interleaved, at tiny, small and medium shapes, plus the
fixed overhead (the same call on 1 x 1 work). The twin of
bench/bench_small_calls.c (the C API alone).

    python bench/python/bench_small_calls.py [--reps R] [--min-ms T]
        [--only CAP[,CAP]] [--sizes LIST] [--threads N] [--osft-goal]
        [--out FILE.md]

Capabilities, each forward + backward where it has one:
  flce        osftrt.torch.fused_linear_cross_entropy(x, W, y) + backward,
              against F.cross_entropy(x @ W^T, y) + backward (logits
              materialized);
  flinear     OSFTLinear.from_linear(lin, 0.5) forward + backward, against
              the nn.Linear it came from (no optimizer step in between: the
              layer keeps its rebuilt W, as between micro-batches);
  projection  OSFTProjector.project_gradients() of one layer, against the
              same two projections in torch matmuls;
  mlp         TiledMLP (SwiGLU over nn.Linear weights) forward + backward,
              against the untiled torch SwiGLU;
  qr          osftrt.batched_qr of a list of equal square matrices, against
              torch.linalg.qr of the stacked batch.

Each row: the median over R repetitions (default 7) of the time per call, a
repetition being as many calls as take T ms (default 20), osftrt's and
torch's repetitions alternating; the ratio osftrt / torch (goal <= 1.1 at
tiny and small shapes).

--osft-goal adds the issue's OSFT layer goal: forward + backward at
576^2, 576 x 1536 and 1536 x 576 with 512 and 2048 tokens, against its
GEMM-flop floor: the GEMM flops of the strategies the library chooses
(include/osftrt/flinear.h; the kept W is not rebuilt between calls) priced
at nn.Linear's time per flop (6 M N K flops) in the same run.

The library's thread count follows torch.get_num_threads() (--threads N
sets torch's first). --cpu-time times in the process's CPU time instead of
wall time: with --threads 1 that is the work each side does, which other
jobs on a loaded machine do not stretch. Prints the machine and the load
average.
"""
import argparse
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402

import osftrt  # noqa: E402
import osftrt.torch as ot  # noqa: E402
from osftrt import capi  # noqa: E402

# (capability, size, shape arguments)
ROWS = [
    ("flce", "1x1", dict(m=1, h=1, v=1)),
    ("flce", "tiny", dict(m=16, h=300, v=6)),
    ("flce", "tiny", dict(m=64, h=300, v=6)),
    ("flce", "small", dict(m=256, h=256, v=1000)),
    ("flce", "small", dict(m=16, h=768, v=50257)),
    ("flce", "medium", dict(m=256, h=768, v=50257)),
    ("flce", "large", dict(m=4096, h=768, v=50257)),
    ("flinear", "1x1", dict(m=1, n=2, k=2)),
    ("flinear", "tiny", dict(m=16, n=64, k=64)),
    ("flinear", "small", dict(m=64, n=256, k=256)),
    ("flinear", "medium", dict(m=512, n=576, k=576)),
    ("flinear", "medium", dict(m=512, n=2048, k=2048)),
    ("flinear", "large", dict(m=2048, n=2048, k=2048)),
    ("projection", "1x1", dict(n=2, k=2)),
    ("projection", "tiny", dict(n=64, k=64)),
    ("projection", "small", dict(n=576, k=576)),
    ("projection", "medium", dict(n=2048, k=2048)),
    ("mlp", "1x1", dict(m=1, h=1, i=1)),
    ("mlp", "tiny", dict(m=16, h=64, i=172)),
    ("mlp", "small", dict(m=128, h=256, i=688)),
    ("mlp", "medium", dict(m=512, h=576, i=1536)),
    ("qr", "1x1", dict(count=1, n=1)),
    ("qr", "tiny", dict(count=16, n=8)),
    ("qr", "small", dict(count=8, n=64)),
    ("qr", "medium", dict(count=4, n=256)),
    ("qr", "medium", dict(count=2, n=512)),
]

OSFT_GOAL = [(t, n, k) for t in (512, 2048) for (n, k) in ((576, 576), (576, 1536), (1536, 576))]


def _rand(*shape):
    return torch.randn(*shape) * 0.5


# ------------------------------------------------------------------ cases
def case_flce(m, h, v):
    x = _rand(m, h).requires_grad_()
    w = (_rand(v, h) * 0.2).requires_grad_()
    y = torch.randint(0, v, (m,))

    def lib():
        x.grad = w.grad = None
        ot.fused_linear_cross_entropy(x, w, y).backward()

    def ref():
        x.grad = w.grad = None
        F.cross_entropy(x @ w.t(), y).backward()

    return "%dx%dx%d" % (m, v, h), lib, ref, None


def case_flinear(m, n, k):
    lin = torch.nn.Linear(k, n)
    layer = ot.OSFTLinear.from_linear(lin, 0.5)
    x = _rand(m, k).requires_grad_()
    g = _rand(m, n)

    def lib():
        x.grad = None
        for p in layer.parameters():
            p.grad = None
        layer(x).backward(g)

    def ref():
        x.grad = None
        for p in lin.parameters():
            p.grad = None
        lin(x).backward(g)

    return "%dx%d, %d tok" % (n, k, m), lib, ref, layer


def case_projection(n, k):
    lin = torch.nn.Linear(k, n, bias=False)
    layer = ot.OSFTLinear.from_linear(lin, 0.5)
    layer(_rand(4, k)).sum().backward()
    proj = ot.OSFTProjector(layer)
    gu, gv = layer.u_low.grad, layer.v_low.grad
    uh, vh = layer.u_high, layer.v_high

    def lib():
        proj.project_gradients()

    def ref():
        gu.sub_(uh @ (uh.t() @ gu))
        gv.sub_((gv @ vh.t()) @ vh)

    return "%dx%d, r %d l %d" % (n, k, layer.rank, layer.s_low.shape[0]), lib, ref, None


def case_mlp(m, h, i):
    gate, up, down = torch.nn.Linear(h, i, bias=False), torch.nn.Linear(h, i, bias=False), torch.nn.Linear(
        i, h, bias=False)
    tiled = ot.TiledMLP("swiglu", gate=gate, up=up, down=down)
    x = _rand(m, h).requires_grad_()
    g = _rand(m, h)
    params = list(gate.parameters()) + list(up.parameters()) + list(down.parameters())

    def lib():
        x.grad = None
        for p in params:
            p.grad = None
        tiled(x).backward(g)

    def ref():
        x.grad = None
        for p in params:
            p.grad = None
        down(F.silu(gate(x)) * up(x)).backward(g)

    return "%dx%d, %d tok" % (h, i, m), lib, ref, None


def case_qr(count, n):
    mats = [_rand(n, n) for _ in range(count)]
    stacked = torch.stack(mats)

    def lib():
        osftrt.batched_qr(mats)

    def ref():
        torch.linalg.qr(stacked)

    return "%d x %d^2" % (count, n), lib, ref, None


CASES = {"flce": case_flce, "flinear": case_flinear, "projection": case_projection, "mlp": case_mlp,
         "qr": case_qr}


# ------------------------------------------------------------------ timing
CLOCK = time.perf_counter  # or time.process_time (--cpu-time)


def _calls_for(fn, min_ms):
    fn()
    fn()
    t0 = time.perf_counter()
    fn()
    one = (time.perf_counter() - t0) * 1e3
    return max(1, min(200000, int(min_ms / max(one, 1e-4)) + 1))


def _rep(fn, calls):
    t0 = CLOCK()
    for _ in range(calls):
        fn()
    return (CLOCK() - t0) / calls * 1e6  # us per call


def time_pair(lib, ref, reps, min_ms):
    """Median us per call of lib and ref, their repetitions alternating."""
    nl, nr = _calls_for(lib, min_ms), _calls_for(ref, min_ms)
    tl, tr = [], []
    for _ in range(reps):
        tl.append(_rep(lib, nl))
        tr.append(_rep(ref, nr))
    return statistics.median(tl), statistics.median(tr)


# ------------------------------------------------------------------ the OSFT goal
def _osft_flops(layer, t):
    """GEMM flops of one forward + backward (grad_x included) with the
    strategies the library chooses; W kept (no rebuild between calls)."""
    n, k, r, l = layer.out_features, layer.in_features, layer.rank, layer.s_low.shape[0]
    kk = r + l
    h = layer._layer_handle()
    fs = capi.osft_flinear_choose_strategy(h, t, capi.OSFT_FLINEAR_FORWARD)
    bs = capi.osft_flinear_choose_strategy(h, t, capi.OSFT_FLINEAR_BACKWARD)
    fwd = 2 * t * kk * (n + k) if fs == capi.OSFT_FLINEAR_FACTORIZED else 2 * t * n * k
    if bs == capi.OSFT_FLINEAR_DENSE:
        bwd = 2 * t * n * k + 2 * t * n * k  # grad_x, G = g^T x (then G against the low factors)
        bwd += 4 * n * k * l
    elif bs == capi.OSFT_FLINEAR_HYBRID:
        bwd = 2 * t * n * k + 4 * t * l * (n + k)
    else:
        bwd = 2 * t * n * kk + 2 * t * kk * k + 4 * t * k * l + 2 * t * n * l
    names = {capi.OSFT_FLINEAR_FACTORIZED: "factorized", capi.OSFT_FLINEAR_DENSE: "dense",
             capi.OSFT_FLINEAR_HYBRID: "hybrid"}
    return fwd + bwd, "%s/%s" % (names.get(fs, fs), names.get(bs, bs))


def osft_goal(reps, min_ms, lines):
    lines.append("")
    lines.append("OSFT layer vs its GEMM-flop floor (rank ratio 0.5; floor = the chosen strategies' GEMM flops "
                 "at nn.Linear's time per flop in the same run)")
    lines.append("| shape | tokens | strategies fwd/bwd | osftrt us | nn.Linear us | flops / Linear's | floor us | "
                 "osftrt / floor | osftrt / Linear |")
    lines.append("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    print("\n".join(lines[-4:]), flush=True)
    for t, n, k in OSFT_GOAL:
        shape, lib, ref, layer = case_flinear(t, n, k)
        tl, tr = time_pair(lib, ref, reps, min_ms)
        layer_flops, strat = _osft_flops(layer, t)
        lin_flops = 6 * t * n * k
        floor = layer_flops * tr / lin_flops
        line = "| %dx%d | %d | %s | %.0f | %.0f | %.3f | %.0f | %.3f | %.3f |" % (
            n, k, t, strat, tl, tr, layer_flops / lin_flops, floor, tl / floor, tl / tr)
        lines.append(line)
        print(line, flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--min-ms", type=float, default=20.0)
    p.add_argument("--only", default=None, help="comma list of capabilities")
    p.add_argument("--sizes", default="1x1,tiny,small,medium", help="comma list (large: seconds per call)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads first")
    p.add_argument("--osft-goal", action="store_true")
    p.add_argument("--cpu-time", action="store_true", help="process CPU time instead of wall time")
    p.add_argument("--out", default=None, help="also write the report (Markdown) here")
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.cpu_time:
        global CLOCK
        CLOCK = time.process_time
    torch.manual_seed(0)
    only = set(a.only.split(",")) if a.only else None
    sizes = set(a.sizes.split(","))
    lines = []
    lines.append("bench_small_calls.py: %s; torch %s, %d threads (the library: %d); libosftrt %s" % (
        benchlib.machine(), torch.__version__, torch.get_num_threads(), osftrt.get_num_threads(), osftrt.version()))
    lines.append("load average at start: %s" % " ".join(open("/proc/loadavg").read().split()[:3]))
    lines.append("median of %d alternating repetitions of >= %.0f ms each; %s" % (
        a.reps, a.min_ms, "process CPU time" if a.cpu_time else "wall time"))
    lines.append("")
    lines.append("| capability | size | shape | osftrt us/call | torch us/call | osftrt / torch |")
    lines.append("| --- | --- | --- | --- | --- | --- |")
    print("\n".join(lines), flush=True)
    for cap, size, kw in ROWS:
        if (only and cap not in only) or size not in sizes:
            continue
        shape, lib, ref, _ = CASES[cap](**kw)
        tl, tr = time_pair(lib, ref, a.reps, a.min_ms)
        line = "| %s | %s | %s | %.1f | %.1f | %.2f |" % (cap, size, shape, tl, tr, tl / tr)
        lines.append(line)
        print(line, flush=True)
    if a.osft_goal:
        osft_goal(a.reps, a.min_ms, lines)
    lines.append("")
    lines.append("load average at end: %s" % " ".join(open("/proc/loadavg").read().split()[:3]))
    print(lines[-1])
    if a.out:
        with open(a.out, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
