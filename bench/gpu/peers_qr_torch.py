#!/usr/bin/env python3
"""PyTorch peer of bench_qr's SOAP workloads (bench/bench_qr.c --workload):
the baseline of NeMo Emerging-Optimizers PR 118, which refreshes SOAP's
eigenbases with torch.linalg.qr.

    python3 bench/gpu/peers_qr_torch.py --device cuda|cpu
        [--workload soap-gpt2-1024|soap-gpt2-2048] [--scale S] [--layers L]
        [--reps R] [--warmup W] [--no-power] [--csv FILE]

The list (as bench_qr builds it): a 12-layer GPT-2-style model, hidden H,
MLP 4H; per layer the two Kronecker factors of c_attn (H x 3H), attn c_proj
(H x H), c_fc (H x 4H) and mlp c_proj (4H x H): square fp32 QRs of H, 3H,
H, H, H, 4H, 4H, H, 96 in all, every dimension divided by --scale (default
1 on CUDA, 8 on the CPU).

Inputs, built the way bench_qr builds them (same construction, PyTorch's
random numbers): per size n, U = Q of a uniform random n x n matrix (fp64),
Q0 = a row permutation of U; for kappa = 1e4, 1e5, 1e6, 1e7 (in turn along
the list) P = U diag(lambda) U^T with lambda_k = (1 + k)^-alpha, alpha =
ln(kappa) / ln(n) (PSD, fast-decaying spectrum, kappa(P) = kappa), and per
matrix random permutations Pi, Pi2: the QR input A = Pi (P Q0) Pi2, the
power-iteration pair (Pi P Pi^T, Pi Q0 Pi2). Built in fp64, stored in fp32.

Variants (each timed as the whole list):
  loop            torch.linalg.qr one matrix at a time (the PR's sequential
                  baseline)
  batched         one torch.linalg.qr call per size group (stacked)
  power loop      Q <- qr(P Q) one pair at a time (torch.mm + qr)
  power batched   torch.bmm + one batched qr per size group

Times: W warm-up runs (default 1), then median/min/max of R runs (default
3); CUDA events on CUDA, perf_counter on the CPU. Each variant also reports
the largest ||Q^T Q - I||_F (fp64) over the first layer's 8 matrices, as
bench_qr does. CSV columns: device, workload, scale, count, hidden, variant,
median_ms, min_ms, max_ms, max_orth_err_fro, torch, device_name.
"""
import argparse
import csv
import math
import statistics
import sys
import time

import torch

QUARTERS = [4, 12, 4, 4, 4, 16, 16, 4]  # per layer, sides in units of H/4


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--workload", choices=["soap-gpt2-1024", "soap-gpt2-2048"],
                   default="soap-gpt2-1024")
    p.add_argument("--scale", type=int, default=0)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--no-power", action="store_true")
    p.add_argument("--csv")
    a = p.parse_args()
    if a.scale < 1:
        a.scale = 1 if a.device == "cuda" else 8
    return a


def build_inputs(dims, device, power, gen):
    """Stacks per size: A (the QR inputs), P and Q (the power pairs), fp32,
    and each matrix's (size, index in its stack) in list order."""
    f64 = torch.float64
    where, count = [], {}
    for d in dims:
        where.append((d, count.get(d, 0)))
        count[d] = count.get(d, 0) + 1
    a_stk, p_stk, q_stk = {}, {}, {}
    for n, c in count.items():
        u = torch.linalg.qr((torch.rand(n, n, generator=gen, dtype=f64) - 0.5).to(device))[0]
        q0 = u[torch.randperm(n, generator=gen).to(device)]
        b = u.T @ q0
        a_stk[n] = torch.empty(c, n, n, device=device)
        if power:
            p_stk[n] = torch.empty(c, n, n, device=device)
            q_stk[n] = torch.empty(c, n, n, device=device)
        for k in range(4):
            kappa = 10.0 ** (4 + k)
            alpha = math.log(kappa) / math.log(n) if n > 1 else 0.0
            lam = (1.0 + torch.arange(n, dtype=f64, device=device)) ** -alpha
            ul = u * lam
            a_k = ul @ b
            p_k = ul @ u.T if power else None
            for i, (d, j) in enumerate(where):
                if d != n or i % 4 != k:
                    continue
                pr = torch.randperm(n, generator=gen).to(device)
                pc = torch.randperm(n, generator=gen).to(device)
                a_stk[n][j] = a_k[pr][:, pc].float()
                if power:
                    p_stk[n][j] = p_k[pr][:, pr].float()
                    q_stk[n][j] = q0[pr][:, pc].float()
            del a_k, p_k, ul
    return where, a_stk, p_stk, q_stk


def timed(fn, device, reps, warmup):
    out = None
    for _ in range(warmup):
        out = fn()
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            torch.cuda.synchronize()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            out = fn()
            e.record()
            torch.cuda.synchronize()
            times.append(s.elapsed_time(e))
        else:
            t0 = time.perf_counter()
            out = fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return times, out


def max_orth(qs):
    worst = 0.0
    for q in qs:
        q = q.double()
        e = torch.linalg.norm(q.T @ q - torch.eye(q.shape[1], dtype=q.dtype, device=q.device))
        e = float(e)
        worst = e if not (e <= worst) else worst  # NaN wins
    return worst


def main():
    a = parse()
    device = torch.device(a.device)
    hidden = int(a.workload.split("-")[-1])
    dims = [QUARTERS[k] * hidden // 4 // a.scale for _ in range(a.layers) for k in range(8)]
    power = not a.no_power
    gen = torch.Generator().manual_seed(2024)
    t0 = time.perf_counter()
    where, A, P, Q = build_inputs(dims, device, power, gen)
    print(f"# inputs built in {time.perf_counter() - t0:.1f} s; torch {torch.__version__}, "
          f"{torch.cuda.get_device_name() if device.type == 'cuda' else 'CPU'}")
    sizes = sorted(A)
    first = where[:8]

    def loop():
        return [torch.linalg.qr(A[d][j])[0] for d, j in where]

    def batched():
        return {d: torch.linalg.qr(A[d])[0] for d in sizes}

    def power_loop():
        return [torch.linalg.qr(torch.mm(P[d][j], Q[d][j]))[0] for d, j in where]

    def power_batched():
        return {d: torch.linalg.qr(torch.bmm(P[d], Q[d]))[0] for d in sizes}

    variants = [("torch loop: linalg.qr one at a time", loop, False),
                ("torch batched: one linalg.qr per size", batched, True)]
    if power:
        variants += [("torch power step loop: mm + qr", power_loop, False),
                     ("torch power step batched: bmm + qr per size", power_batched, True)]
    rows = []
    dev_name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    print(f"# workload {a.workload} / scale {a.scale}: {len(dims)} fp32 QRs on {a.device}")
    print(f"{'variant':46s} {'median ms':>10s} {'min ms':>9s} {'max ms':>9s} {'max orth':>10s}")
    for name, fn, grouped in variants:
        times, out = timed(fn, device, a.reps, a.warmup)
        qs = [out[d][j] for d, j in first] if grouped else out[:8]
        orth = max_orth(qs)
        del out
        row = {"device": a.device, "workload": a.workload, "scale": a.scale,
               "count": len(dims), "hidden": hidden // a.scale, "variant": name,
               "median_ms": f"{statistics.median(times):.3f}",
               "min_ms": f"{min(times):.3f}", "max_ms": f"{max(times):.3f}",
               "max_orth_err_fro": f"{orth:.3e}", "torch": torch.__version__,
               "device_name": dev_name}
        rows.append(row)
        print(f"{name:46s} {statistics.median(times):10.1f} {min(times):9.1f} "
              f"{max(times):9.1f} {orth:10.2e}")
        sys.stdout.flush()
    if a.csv:
        with open(a.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)


if __name__ == "__main__":
    main()
