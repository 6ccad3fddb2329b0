#!/usr/bin/env python3
"""PyTorch peer of bench_projection --device cuda (bench/bench_projection.c):
mini_trainer's per-target OSFT projection of the gradients and then of the
parameters, on the same 224 targets of Llama-3.1-8B.

    python3 bench/gpu/peers_projection_torch.py --device cuda|cpu
        [--layers L] [--scale S] [--reps R] [--warmup W] [--csv FILE]

Targets: 32 layers x (q 4096x4096, k 1024x4096, v 1024x4096, o 4096x4096,
gate 14336x4096, up 14336x4096, down 4096x14336), N x K = out x in, every
dimension divided by --scale (default 1 on CUDA, 32 on the CPU), rank ratio
0.5 (r = l = min(N, K) / 2); U_high N x r, U_low and its gradient N x l,
V_high r x K, V_low and its gradient l x K, all bf16 (29.2 GB at scale 1).
Data as bench_projection makes it: uniform, the high factors scaled so that
repeated projections cannot grow (not orthonormal: timing only).

One step is what mini_trainer (rhai-innovation-mini-trainer, osft_utils.py)
runs per optimizer step on one GPU (world size 1: no collective), for every
target in turn:
  project_gradient_to_orthogonal_space:
    coeff = U_high^T dU;  dU.addmm_(U_high, coeff, alpha=-1)
    coeff = dV V_high^T;  dV.addmm_(coeff, V_high, alpha=-1)
  project_parameter_to_orthogonal_space (after the optimizer step):
    the same on U_low and V_low.
i.e. dU_low -= U_high (U_high^T dU_low), dV_low -= (dV_low V_high^T) V_high
(include/osftrt/projection.h; DESIGN.md 3.2), with bf16 coefficients and
bf16 GEMMs (torch.mm of bf16 tensors: fp32 accumulation, bf16 results; addmm_
adds into x inside the GEMM, x rounded once). libosftrt's default arithmetic
for bf16 factors is the same (OSFT_PROJECTION_ARITHMETIC_AUTO: C rounded once
to bf16, one GEMM into x); its EXACT arithmetic keeps C to 16 bits (two bf16
halves, two update GEMMs).

Times: W warm-up steps (default 1), then the median/min/max of R steps
(default 5): CUDA events on CUDA, perf_counter on the CPU. CSV columns:
device, gpu, targets, scale, variant, median_ms, min_ms, max_ms,
gemm_tflop_per_step, tflops, finite, torch.
"""
import argparse
import csv
import statistics
import sys
import time

import torch

SHAPES = [("q", 4096, 4096), ("k", 1024, 4096), ("v", 1024, 4096), ("o", 4096, 4096),
          ("gate", 14336, 4096), ("up", 14336, 4096), ("down", 4096, 14336)]


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--scale", type=int, default=0)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--csv")
    a = p.parse_args()
    if a.scale < 1:
        a.scale = 1 if a.device == "cuda" else 32
    return a


def make_targets(layers, scale, device, gen):
    """Per target a dict of the six bf16 tensors (the gradients as .grad of
    the trainable factors, as mini_trainer has them)."""
    targets = []
    for _ in range(layers):
        for _, n0, k0 in SHAPES:
            n, k = n0 // scale, k0 // scale
            r = min(n, k) // 2
            l = min(n, k) - r

            def uniform(rows, cols, bound):
                t = torch.empty(rows, cols, dtype=torch.bfloat16, device=device)
                return t.uniform_(-bound, bound, generator=gen)

            # |1 - sigma^2| <= 1 for U_high, V_high: entry variance 0.64 / N
            su, sv = 0.8 * (3.0 / n) ** 0.5, 0.8 * (3.0 / k) ** 0.5
            u_low = torch.nn.Parameter(uniform(n, l, 0.025))
            v_low = torch.nn.Parameter(uniform(l, k, 0.025))
            u_low.grad = uniform(n, l, 0.025)
            v_low.grad = uniform(l, k, 0.025)
            targets.append({"U_high": uniform(n, r, su), "V_high": uniform(r, k, sv),
                            "U_low": u_low, "V_low": v_low, "n": n, "k": k, "r": r, "l": l})
    return targets


def project(U_high, V_high, dU, dV):
    """mini_trainer's per-target projection, world size 1: dU -= U_high
    (U_high^T dU), dV -= (dV V_high^T) V_high, in place, all bf16."""
    proj_coeff = torch.mm(U_high.transpose(0, 1), dU)
    dU.addmm_(U_high, proj_coeff, alpha=-1.0)
    coeff = torch.mm(dV, V_high.t())
    dV.addmm_(coeff, V_high, alpha=-1.0)


def project_gradient(svd):
    """mini_trainer's project_gradient_to_orthogonal_space, world size 1."""
    project(svd["U_high"], svd["V_high"], svd["U_low"].grad, svd["V_low"].grad)


def project_parameter(svd):
    """mini_trainer's project_parameter_to_orthogonal_space, world size 1."""
    project(svd["U_high"], svd["V_high"], svd["U_low"].data, svd["V_low"].data)


def timed(fn, device, reps, warmup):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            torch.cuda.synchronize()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            torch.cuda.synchronize()
            times.append(s.elapsed_time(e))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return times


def main():
    a = parse()
    device = torch.device(a.device)
    gen = torch.Generator(device=device).manual_seed(99)
    t0 = time.perf_counter()
    with torch.no_grad():
        targets = make_targets(a.layers, a.scale, device, gen)
    if device.type == "cuda":
        torch.cuda.synchronize()
    gb = sum(t["U_high"].numel() + t["V_high"].numel() + 2 * (t["U_low"].numel() +
             t["V_low"].numel()) for t in targets) * 2 / 1e9
    # 2 passes x (U: 2 GEMMs of 2 N r l flops, V: 2 of 2 K r l)
    flop = sum(8.0 * t["r"] * t["l"] * (t["n"] + t["k"]) for t in targets)
    gpu = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    print(f"# torch {torch.__version__}, {gpu}; {len(targets)} targets ({a.layers} layers x 7), "
          f"shapes / {a.scale}, bf16, rank ratio 0.5: {gb:.2f} GB, built in "
          f"{time.perf_counter() - t0:.1f} s; {flop / 1e12:.2f} TFLOP of GEMMs per step")

    def step():
        with torch.no_grad():
            for svd in targets:
                project_gradient(svd)
            for svd in targets:
                project_parameter(svd)

    variants = [("mini_trainer per-target (bf16)", step)]
    rows = []
    print(f"{'variant':36s} {'median ms':>10s} {'min ms':>9s} {'max ms':>9s} {'TFLOP/s':>8s}")
    for name, fn in variants:
        times = timed(fn, device, a.reps, a.warmup)
        med = statistics.median(times)
        t = targets[0]
        finite = bool(torch.isfinite(t["U_low"].grad).all() and torch.isfinite(t["V_low"].data).all())
        rows.append({"device": a.device, "gpu": gpu, "targets": len(targets), "scale": a.scale,
                     "variant": name, "median_ms": f"{med:.4f}", "min_ms": f"{min(times):.4f}",
                     "max_ms": f"{max(times):.4f}", "gemm_tflop_per_step": f"{flop / 1e12:.4f}",
                     "tflops": f"{flop / med / 1e9:.2f}", "finite": int(finite),
                     "torch": torch.__version__})
        print(f"{name:36s} {med:10.2f} {min(times):9.2f} {max(times):9.2f} "
              f"{flop / med / 1e9:8.1f}{'' if finite else '  NOT FINITE'}")
        sys.stdout.flush()
    if a.csv:
        with open(a.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    return 0 if all(r["finite"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
