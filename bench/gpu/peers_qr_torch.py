#!/usr/bin/env python3
"""PyTorch peer of bench_qr's SOAP workloads (bench/bench_qr.c --workload):
the baseline of NeMo Emerging-Optimizers PR 118, which refreshes SOAP's
eigenbases with torch.linalg.qr.

    python3 bench/gpu/peers_qr_torch.py --device cuda|cpu
        [--workload soap-gpt2-1024|soap-gpt2-2048|soap-gpt2-2048-mlp8192]
        [--scale S] [--layers L] [--reps R] [--warmup W] [--streams N]
        [--no-power] [--csv FILE]

The list (as bench_qr builds it): a 12-layer GPT-2-style model, hidden H, MLP
F; per layer the two Kronecker factors of c_attn (H x 3H), attn c_proj
(H x H), c_fc (H x F) and mlp c_proj (F x H): square fp32 QRs of H, 3H,
H, H, H, F, F, H, 96 in all, every dimension divided by --scale (default
1 on CUDA, 8 on the CPU). soap-gpt2-1024 is H 1024, F 4096 and
soap-gpt2-2048 H 2048, F 4096 (PR 118's two lists: "hidden=2048,
mlp=4096"); soap-gpt2-2048-mlp8192 (F = 4H) is the heavier list this
script used as soap-gpt2-2048 before.

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
  grouped streams PR 118's method (its batched_qr_grouped, written here from
                  its description): the list grouped by size, one batched
                  torch.linalg.qr per group, the groups issued round-robin
                  over N CUDA streams (--streams, default 4) that wait for
                  the current stream on entry and that it waits for on exit;
                  on the CPU the streams are ignored (the same calls, one
                  after another), so the line runs in a dry run too
  power loop      Q <- qr(P Q) one pair at a time (torch.mm + qr)
  power batched   torch.bmm + one batched qr per size group

Times: W warm-up runs (default 1), then median/min/max of R runs (default
3); CUDA events on CUDA, perf_counter on the CPU. Each variant also reports
the largest ||Q^T Q - I||_F (fp64) over the first layer's 8 matrices, as
bench_qr does. CSV columns: device, workload, scale, count, hidden, mlp, variant,
median_ms, min_ms, max_ms, max_orth_err_fro, torch, device_name.
"""
import argparse
import csv
import math
import statistics
import sys
import time

import torch

# --workload: hidden H and MLP F of PR 118's GPT-2-style lists
WORKLOADS = {"soap-gpt2-1024": (1024, 4096), "soap-gpt2-2048": (2048, 4096),
             "soap-gpt2-2048-mlp8192": (2048, 8192)}


def layer_sides(hidden, mlp):
    """The 8 Kronecker factors' sides of one layer: c_attn, attn c_proj,
    c_fc, mlp c_proj (as bench_qr.c's soap_side)."""
    return [hidden, 3 * hidden, hidden, hidden, hidden, mlp, mlp, hidden]


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--workload", choices=sorted(WORKLOADS), default="soap-gpt2-1024")
    p.add_argument("--streams", type=int, default=4)
    p.add_argument("--scale", type=int, default=0)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--no-power", action="store_true")
    p.add_argument("--ours", help="bench_qr's CSV of the same list, run before "
                   "on the same machine: print issue 35's table of both")
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


def qr_grouped_streams(stacks, sizes, streams):
    """PR 118's batched_qr_grouped, from its description: one batched QR per
    size group, the groups round-robin over `streams`, the most flops first
    so that the long ones start early. Each stream first waits for the
    current stream (the inputs are ready there); the current stream then
    waits for every stream, and each result is marked as used on the
    current stream, so the caching allocator does not hand its memory out
    while another stream still writes it. No streams (the CPU): the same
    calls in order."""
    order = sorted(sizes, key=lambda d: stacks[d].shape[0] * d ** 3, reverse=True)
    if not streams:
        return {d: torch.linalg.qr(stacks[d])[0] for d in order}
    main = torch.cuda.current_stream()
    out = {}
    for i, d in enumerate(order):
        s = streams[i % len(streams)]
        s.wait_stream(main)
        with torch.cuda.stream(s):
            out[d] = torch.linalg.qr(stacks[d])[0]
    for s in streams:
        main.wait_stream(s)
    for q in out.values():
        q.record_stream(main)
    return out


def max_orth(qs):
    worst = 0.0
    for q in qs:
        q = q.double()
        e = torch.linalg.norm(q.T @ q - torch.eye(q.shape[1], dtype=q.dtype, device=q.device))
        e = float(e)
        worst = e if not (e <= worst) else worst  # NaN wins
    return worst


def read_bench_qr_csv(path):
    """bench_qr's rows as (variant, median ms, fall-backs, max orth). Its
    variant names hold commas and are not quoted: the five numbers after
    the name are counted from the end."""
    out = []
    with open(path) as f:
        next(f, None)
        for line in f:
            c = line.rstrip("\n").split(",")
            if len(c) >= 13:
                out.append((",".join(c[6:-6]), float(c[-6]), int(c[-2]), float(c[-1])))
    return out


def print_table(ours_csv, peer_rows):
    """Issue 35's table: every variant of the list, ours and the peers, with
    its time against the PR-118-style peer (the goal: ours <= 0.5x)."""
    try:
        ours = read_bench_qr_csv(ours_csv)
    except OSError as e:
        print(f"# no table: {e}")
        return
    peer = {r["variant"]: float(r["median_ms"]) for r in peer_rows}
    anchor = next((v for k, v in peer.items() if k.startswith("PR 118 grouped")), None)
    rows = [(k, float(r["median_ms"]), "", r["max_orth_err_fro"])
            for k, r in ((r["variant"], r) for r in peer_rows)]
    rows += [(v, ms, str(fb), f"{orth:.3e}") for v, ms, fb, orth in ours]
    print(f"\n# issue 35 table: {ours_csv} and this run; x PR peer = time / "
          f"{'%.1f ms' % anchor if anchor else 'n/a'}")
    print(f"{'variant':46s} {'median ms':>10s} {'x PR peer':>10s} {'fallbacks':>9s} "
          f"{'max orth':>10s}")
    for name, ms, fb, orth in rows:
        ratio = f"{ms / anchor:.2f}" if anchor else "n/a"
        print(f"{name:46s} {ms:10.1f} {ratio:>10s} {fb:>9s} {orth:>10s}")


def main():
    a = parse()
    device = torch.device(a.device)
    hidden, mlp = WORKLOADS[a.workload]
    dims = [d // a.scale for _ in range(a.layers) for d in layer_sides(hidden, mlp)]
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

    streams = ([torch.cuda.Stream() for _ in range(max(a.streams, 1))]
               if device.type == "cuda" else [])

    def grouped_streams():
        return qr_grouped_streams(A, sizes, streams)

    def power_loop():
        return [torch.linalg.qr(torch.mm(P[d][j], Q[d][j]))[0] for d, j in where]

    def power_batched():
        return {d: torch.linalg.qr(torch.bmm(P[d], Q[d]))[0] for d in sizes}

    variants = [("torch loop: linalg.qr one at a time", loop, False),
                ("torch batched: one linalg.qr per size", batched, True),
                (f"PR 118 grouped: qr per size, {len(streams)} streams"
                 if streams else "PR 118 grouped: qr per size, CPU: no streams",
                 grouped_streams, True)]
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
               "count": len(dims), "hidden": hidden // a.scale, "mlp": mlp // a.scale,
               "variant": name,
               "median_ms": f"{statistics.median(times):.3f}",
               "min_ms": f"{min(times):.3f}", "max_ms": f"{max(times):.3f}",
               "max_orth_err_fro": f"{orth:.3e}", "torch": torch.__version__,
               "device_name": dev_name}
        rows.append(row)
        print(f"{name:46s} {statistics.median(times):10.1f} {min(times):9.1f} "
              f"{max(times):9.1f} {orth:10.2e}")
        sys.stdout.flush()
    if a.ours:
        print_table(a.ours, rows)
    if a.csv:
        with open(a.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)


if __name__ == "__main__":
    main()
