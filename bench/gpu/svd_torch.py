#!/usr/bin/env python3
"""torch.linalg.svd on the shapes of bench_svd (Llama-3.1-8B's 4096x4096 and
14336x4096 projections), for a side-by-side reading with libosftrt's
decomposition (bench/bench_svd.c; bench/gpu/run_svd.sh runs both).

    python3 bench/gpu/svd_torch.py [--device cuda|cpu] [--scale S] [--reps R]
                                   [--csv FILE]

Times torch.linalg.svd(W, full_matrices=False) in fp32 and in fp64 (what
libosftrt computes in), and in fp64 the Gram-matrix route a faster path
would take (torch.linalg.eigh(W^T W)), each the median and minimum of R runs
after one warm-up, synchronizing the device around every run. With the
default cuSOLVER driver PyTorch picks gesvdj for matrices up to 32x32 in
batches and gesvd otherwise; the driver is printed.
"""
import argparse
import csv
import statistics
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default=None)
    ap.add_argument("--scale", type=float, default=None)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--csv", default=None)
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("svd_torch: PyTorch is not installed; skipping", file=sys.stderr)
        return 0
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    scale = args.scale or (1.0 if device == "cuda" else 4.0)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    if device == "cuda":
        print("device:", torch.cuda.get_device_name(), "| torch", torch.__version__,
              "| linalg library:", torch.backends.cuda.preferred_linalg_library())
    rows = []
    print("%8s %8s %-22s %12s %12s" % ("N", "K", "op", "median ms", "min ms"))
    for n0, k0 in ((4096, 4096), (14336, 4096)):
        n, k = int(n0 / scale), int(k0 / scale)
        gen = torch.Generator(device="cpu").manual_seed(777)
        w32 = (torch.rand(n, k, generator=gen) - 0.5).mul_(0.05).to(device)
        w64 = w32.double()
        ops = (
            ("svd fp32", lambda: torch.linalg.svd(w32, full_matrices=False)),
            ("svd fp64", lambda: torch.linalg.svd(w64, full_matrices=False)),
            ("eigh(W^T W) fp64", lambda: torch.linalg.eigh(w64.T @ w64)),
        )
        for name, fn in ops:
            times = []
            for r in range(args.reps + 1):
                sync()
                t0 = time.perf_counter()
                fn()
                sync()
                if r > 0:
                    times.append((time.perf_counter() - t0) * 1e3)
            med, best = statistics.median(times), min(times)
            print("%8d %8d %-22s %12.1f %12.1f" % (n, k, name, med, best))
            rows.append({"device": device, "n": n, "k": k, "op": name,
                         "reps": args.reps, "median_ms": "%.3f" % med,
                         "min_ms": "%.3f" % best})
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
