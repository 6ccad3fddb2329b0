"""SOAP's eigenbasis refresh: stock emerging-optimizers' per-matrix loop
(``Q = torch.linalg.qr(K @ Q).Q`` for each Kronecker factor, as
``utils.eig.orthogonal_iteration`` does) against osftrt's one batched call
(``osftrt.power_iteration`` over the whole list, what
``osftrt.integrations.soap.SOAP`` runs per step), on the factors a few SOAP
steps leave on a Llama-shaped model, at the same thread count (torch's
``set_num_threads`` for both; the library's ``max_concurrency`` = threads).
Interleaved repetitions, medians, the ratio per thread count, the load
average beside it. Needs emerging-optimizers (Python >= 3.12: build-py312).

  build-py312/bin/python bench/python/bench_integrations_soap.py [--hidden 256 --layers 4 --reps 7 --out FILE]
"""
import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402

import osftrt  # noqa: E402


def factors(hidden, inter, layers, vocab, steps=4, seed=0):
    """(K, Q) pairs as a refresh sees them: K after `steps` SOAP updates of
    its Kronecker factors (lerp 0.05) with random gradients of rank <= 16 (a
    micro-batch's worth, so many K are singular, as early in training), Q
    the eigenbasis of K one step earlier (descending)."""
    g = torch.Generator().manual_seed(seed)
    shapes = [(vocab, hidden)]
    for _ in range(layers):
        shapes += [(hidden, hidden)] * 4 + [(inter, hidden)] * 2 + [(hidden, inter)]
    pairs = []
    for m, n in shapes:
        L, R = torch.zeros(m, m), torch.zeros(n, n)
        for step in range(steps):
            if step == steps - 1:
                q_l = torch.linalg.eigh(L)[1].flip(-1).contiguous()
                q_r = torch.linalg.eigh(R)[1].flip(-1).contiguous()
            grad = torch.randn(m, 16, generator=g) @ torch.randn(16, n, generator=g) / 16
            L.lerp_(grad @ grad.T, 0.05)
            R.lerp_(grad.T @ grad, 0.05)
        pairs += [(L.contiguous(), q_l), (R.contiguous(), q_r)]
    return pairs


def stock(pairs):
    out = []
    for k, q in pairs:
        out.append(torch.linalg.qr(k @ q).Q)
    return out


def ours(pairs, threads):
    qs = [q.clone() for _, q in pairs]
    st = osftrt.power_iteration([k for k, _ in pairs], qs, max_concurrency=threads)
    return qs, st


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--inter", type=int, default=688)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--out")
    a = ap.parse_args()
    pairs = factors(a.hidden, a.inter, a.layers, a.vocab)
    lines = ["# SOAP eigenbasis refresh: stock per-matrix loop vs osftrt.power_iteration", "",
             "machine: %s; %s" % (benchlib.machine(), benchlib.versions()),
             "list: %d factors (%s), hidden %d, intermediate %d, %d layers, vocabulary %d; %d interleaved repetitions, "
             "medians" % (len(pairs), ", ".join("%dx%d" % s for s in sorted({tuple(k.shape) for k, _ in pairs})),
                          a.hidden, a.inter, a.layers, a.vocab, a.reps), "",
             "| threads | stock loop (ms) | osftrt one call (ms) | ratio | rank-deficient reported | max column gap (within rank) | load avg |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for t in [int(x) for x in a.threads.split(",")]:
        torch.set_num_threads(t)
        if hasattr(osftrt.capi, "osft_set_num_threads"):  # the library's pool and its BLAS engine's
            osftrt.capi.osft_set_num_threads(t)
        ts, to = [], []
        stock(pairs), ours(pairs, t)  # warm up
        for _ in range(a.reps):
            t0 = time.perf_counter()
            ref = stock(pairs)
            t1 = time.perf_counter()
            qs, st = ours(pairs, t)
            t2 = time.perf_counter()
            ts.append(t1 - t0)
            to.append(t2 - t1)
        # the same Q up to column signs where QR determines it: the columns
        # within the numerical rank of K Q (|R_jj| >= 1e-3 |R_00| in stock's R)
        gap = 0.0
        for (k, q0), r, q in zip(pairs, ref, qs):
            rd = torch.linalg.qr(k @ q0).R.diagonal().abs()
            keep = int((rd >= 1e-3 * rd[0]).sum())
            d = torch.diagonal(r.double().T @ q.double()).abs()[:keep]
            gap = max(gap, (1 - d).abs().max().item())
        ms, mo = statistics.median(ts) * 1e3, statistics.median(to) * 1e3
        lines.append("| %d | %.1f | %.1f | **%.2fx** | %d of %d | %.1e | %s |" % (
            t, ms, mo, mo / ms, sum(st.rank_deficient), len(pairs), gap,
            " ".join("%.1f" % x for x in os.getloadavg())))
    benchlib.report(lines, a.out)


if __name__ == "__main__":
    main()
