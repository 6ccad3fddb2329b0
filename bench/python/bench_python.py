#!/usr/bin/python3
"""Benchmarks of the Python binding, each against its peer in the same run:

  1. per-call overhead of osftrt.capi against the same call made from C
     (bench/python/percall.c), for a handle-only call and a 3-tensor compute
     call at tiny shapes (torch tensors and numpy arrays);
  2. osftrt.torch.OSFTLinear (forward + backward) against the mini_trainer
     formulation in PyTorch: mm(mm(x, V_high^T) * S_high, U_high^T) plus an
     addmm_ of the low part, autograd;
  3. fused_linear_cross_entropy against F.linear + F.cross_entropy: time
     (forward + backward) and peak memory (each in a fresh process: peak RSS
     above the inputs);
  4. TiledMLP against an untiled SwiGLU in PyTorch: time and peak memory.

Run with bench/python/run.sh (builds percall.c against the installed
library, writes bench/results/python_cpu.md). Times are the median of
repeats; ratios > 1 mean osftrt is faster (or smaller).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import osftrt
import osftrt.torch as ot
from osftrt import capi

# torch keeps its default intra-op threads (printed below); its GEMMs go to
# the system BLAS (Debian: OpenBLAS), like libosftrt's.


def timeit(fn, repeats=7, min_time=0.2):
    fn()
    n = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        dt = time.perf_counter() - t0
        if dt >= min_time / repeats or n >= 1 << 20:
            break
        n *= 2
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        samples.append((time.perf_counter() - t0) / n)
    return statistics.median(samples)


# ----------------------------------------------------------------- overhead
def bench_overhead(percall_bin):
    out = subprocess.run([percall_bin, "300000"], check=True, capture_output=True, text=True).stdout
    c = {k: float(v) for k, v in (line.split() for line in out.strip().splitlines())}
    ctx = osftrt.Context("cpu")
    w = torch.tensor([[(float((i * 8 + j) * 37 % 17) - 8) / 7 + ((i * 8 + j) % 9 == 0) for j in range(8)] for i in range(8)])
    layer = capi.osft_flinear_create_from_weight(ctx.handle, w, None)
    x, y = torch.randn(2, 8), torch.empty(2, 8)
    xn, yn = x.numpy(), np.empty((2, 8), dtype=np.float32)
    h = ctx.handle
    rows = []
    py = timeit(lambda: capi.osft_context_get_workspace_size(h), min_time=0.5) * 1e9
    rows.append(("osft_context_get_workspace_size (handle only)", c["context_get_workspace_size"], py))
    py = timeit(lambda: capi.osft_flinear_forward(layer, x, None, y), min_time=0.5) * 1e9
    rows.append(("osft_flinear_forward 2x8x8, torch tensors", c["flinear_forward_2x8x8"], py))
    py = timeit(lambda: capi.osft_flinear_forward(layer, xn, None, yn), min_time=0.5) * 1e9
    rows.append(("osft_flinear_forward 2x8x8, numpy arrays", c["flinear_forward_2x8x8"], py))
    layer.close()
    ctx.close()
    return rows


# ------------------------------------------------------------------- flinear
class MiniTrainerOSFT(nn.Module):
    """mini_trainer's OSFT linear: frozen high factors, trainable low ones,
    plain PyTorch autograd."""

    def __init__(self, m: ot.OSFTLinear):
        super().__init__()
        self.register_buffer("u_high", m.u_high.detach().clone())
        self.register_buffer("s_high", m.s_high.detach().clone())
        self.register_buffer("v_high", m.v_high.detach().clone())
        self.u_low = nn.Parameter(m.u_low.detach().clone())
        self.s_low = nn.Parameter(m.s_low.detach().clone())
        self.v_low = nn.Parameter(m.v_low.detach().clone())

    def forward(self, x):
        x2 = x.reshape(-1, x.shape[-1])
        y = torch.mm(torch.mm(x2, self.v_high.t()) * self.s_high, self.u_high.t())
        y = y.addmm_(torch.mm(x2, self.v_low.t()) * self.s_low, self.u_low.t())
        return y.view(*x.shape[:-1], -1)


def bench_flinear(shapes):
    rows = []
    for m_, n, k in shapes:
        lin = nn.Linear(k, n, bias=False)
        osft = ot.OSFTLinear.from_linear(lin, 0.5)
        mini = MiniTrainerOSFT(osft)
        x = torch.randn(m_, k, requires_grad=True)
        gy = torch.randn(m_, n)

        def step(mod):
            y = mod(x)
            y.backward(gy)
            x.grad = None
            for p in mod.parameters():
                p.grad = None

        # same result first
        y1, y2 = osft(x), mini(x)
        err = ((y1 - y2).abs().max() / y2.abs().max()).item()
        t_osft = timeit(lambda: step(osft), repeats=5, min_time=1.0)
        t_mini = timeit(lambda: step(mini), repeats=5, min_time=1.0)
        rows.append(((m_, n, k), t_mini * 1e3, t_osft * 1e3, err))
        osft.close()
    return rows


# ------------------------------------------------------- memory (subprocess)
def _rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _hwm():
    """This process's peak RSS (VmHWM; unlike ru_maxrss it is not inherited
    from the parent across fork + exec)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def mem_child(kind):
    """Runs one variant once (forward + backward) after a warm-up of nothing,
    prints JSON {peak_bytes_above_inputs, seconds}."""
    torch.manual_seed(0)
    if kind.startswith("flce"):
        M, H, V = 2048, 256, 32000
        x = torch.randn(M, H, requires_grad=True)
        w = (torch.randn(V, H) * 0.05).requires_grad_()
        t = torch.randint(0, V, (M,))
        if kind == "flce_osftrt":
            fn = lambda: ot.fused_linear_cross_entropy(x, w, t, memory_budget=64 << 20)
        else:
            fn = lambda: F.cross_entropy(F.linear(x, w), t)
    else:
        M, H, I = 4096, 512, 1408
        x = torch.randn(M, H, requires_grad=True)
        ws = [nn.Parameter(torch.randn(I, H) * 0.05), nn.Parameter(torch.randn(I, H) * 0.05),
              nn.Parameter(torch.randn(H, I) * 0.05)]
        if kind == "mlp_osftrt":
            mlp = ot.TiledMLP("swiglu", gate=ws[0], up=ws[1], down=ws[2])  # tiles of H tokens (ALST's rule)
            fn = lambda: mlp(x).sum()
        else:
            fn = lambda: F.linear(F.silu(F.linear(x, ws[0])) * F.linear(x, ws[1]), ws[2]).sum()
    for p in [x] + ([w] if kind.startswith("flce") else ws):
        p.grad = torch.zeros_like(p)  # gradients exist before (as in training)
    base = _rss()
    t0 = time.perf_counter()
    fn().backward()
    dt = time.perf_counter() - t0
    peak = _hwm()
    # time: a few more runs in this process
    times = [dt]
    for _ in range(3):
        t0 = time.perf_counter()
        fn().backward()
        times.append(time.perf_counter() - t0)
    print(json.dumps({"peak": max(0, peak - base), "seconds": statistics.median(times)}))


def mem_run(kind, runs=2):
    """The smallest peak and time of `runs` fresh processes (other load on
    the machine only adds)."""
    res = []
    for _ in range(runs):
        out = subprocess.run([sys.executable, __file__, "--child", kind], check=True, capture_output=True, text=True).stdout
        res.append(json.loads(out.strip().splitlines()[-1]))
    return {"peak": min(r["peak"] for r in res), "seconds": min(r["seconds"] for r in res)}


# ---------------------------------------------------------------------- main
def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--child")
    ap.add_argument("--percall", default=None)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    if args.child:
        mem_child(args.child)
        return
    print("libosftrt %s; torch %s (%d intra-op threads); numpy %s" % (osftrt.version(), torch.__version__,
                                                                      torch.get_num_threads(), np.__version__))
    print(osftrt.build_info())
    print()
    if args.percall:
        print("## 1. Per-call overhead of the binding (ns per call; median)")
        print()
        print("| call | C | Python | overhead |")
        print("| --- | ---: | ---: | ---: |")
        for name, c, py in bench_overhead(args.percall):
            print("| %s | %.0f | %.0f | **%.2f us** |" % (name, c, py, (py - c) / 1e3))
        print()
    print("## 2. OSFTLinear vs the mini_trainer formulation (forward + backward, fp32, rank ratio 0.5)")
    print()
    print("| M x N x K | mini_trainer (ms) | OSFTLinear (ms) | speed-up | max rel. diff of y |")
    print("| --- | ---: | ---: | ---: | ---: |")
    shapes = [(256, 512, 512), (1024, 1024, 1024), (4096, 1024, 1024)] if not args.quick else [(256, 512, 512)]
    for (m_, n, k), tm, to, err in bench_flinear(shapes):
        print("| %d x %d x %d | %.2f | %.2f | **%.2fx** | %.1e |" % (m_, n, k, tm, to, tm / to, err))
    print()
    for title, peer, ours, shape in (
        ("## 3. Fused linear cross-entropy vs F.linear + F.cross_entropy (forward + backward, fp32)",
         "flce_torch", "flce_osftrt", "M=2048 tokens, H=256, V=32000; osftrt memory_budget 64 MiB"),
        ("## 4. TiledMLP vs an untiled SwiGLU in PyTorch (forward + backward, fp32)",
         "mlp_torch", "mlp_osftrt", "M=4096 tokens, H=512, I=1408; tiles of H tokens"),
    ):
        a, b = mem_run(peer), mem_run(ours)
        print(title)
        print()
        print("Shape: %s. Peak = process peak RSS above the inputs and gradients; best of 2 fresh processes each." % shape)
        print()
        print("| | PyTorch | osftrt | ratio |")
        print("| --- | ---: | ---: | ---: |")
        print("| time (ms) | %.1f | %.1f | **%.2fx** faster |" % (a["seconds"] * 1e3, b["seconds"] * 1e3, a["seconds"] / b["seconds"]))
        print("| peak memory (MiB) | %.1f | %.1f | **%.3f** of PyTorch's |" % (a["peak"] / 2**20, b["peak"] / 2**20,
                                                                        b["peak"] / max(a["peak"], 1)))
        print()


if __name__ == "__main__":
    main()
