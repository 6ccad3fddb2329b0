"""The TF32 QR's first pass on the inputs SOAP really gives it, emulated on the CPU.

SOAP refreshes each eigenbasis Q of a Kronecker factor L = EMA(G G^T) every
`freq` steps by one power step and a QR: Q <- qr(L Q_old), the columns of
Q_old first sorted by diag(Q_old^T L Q_old). So the QR's input W = L Q_old
has Q_old close to L's eigenbasis: its columns are nearly orthogonal with
norms spread like L's eigenvalues (kappa(W) ~ kappa(L)), unlike the tests'
soap_like(), whose Q is random. This script builds that sequence (Gaussian
gradients with a power-law covariance, alpha 1 and 2; EMA 0.95 and 0.999)
and runs, per refresh, the route bench/results/qr_tensorcore_plan.md
("A route to 175 ms") weighs:

  pass 1  G = tf32(W D)^T tf32(W D) summed in fp32 (D: unit columns, or
          D = I as built), G += 2^-26 sqrt(m) ||G||_F I, R1 = chol(G) in
          fp64, W1 = W D R1^-1 (an fp32 solve; the library's is 3xTF32)
  last    G = W1^T W1 in fp64 (or fp32), R2 = chol(G), Q = W1 R2^-1 (fp32)

and prints kappa(W D), kappa(W1), the last pass's check ||W1^T W1 - I||_F
(the library falls back above 0.5), ||Q^T Q - I||_F and ||Q R - W|| / ||W||.

  python bench/python/qr_soap_route.py [--n 512] [--unscaled] [--last-gram fp32]
"""
import argparse

import numpy as np
import torch


def soap_inputs(n, cols, alpha, beta, freq, steps, seed):
    """Yields (step, W = L Q_old in fp32) at each refresh after the first
    (the first takes L's eigenbasis, as SOAP's initialization does)."""
    rng = np.random.default_rng(seed)
    lam = (1.0 + np.arange(n)) ** (-alpha)
    basis = np.linalg.qr(rng.standard_normal((n, n)))[0]
    c_half = basis * np.sqrt(lam)[None, :]
    ema, q = np.zeros((n, n)), None
    for t in range(1, steps + 1):
        g = c_half @ rng.standard_normal((n, cols))
        ema = beta * ema + (1 - beta) * (g @ g.T) / cols
        if t % freq:
            continue
        if q is None:
            q = np.linalg.eigh(ema)[1][:, ::-1]
            continue
        q = q[:, np.argsort(-np.einsum("ij,ij->j", q, ema @ q))]
        yield t, (ema @ q).astype(np.float32)
        q = np.linalg.qr(ema @ q)[0]


def tf32(x):
    """fp32 truncated to TF32's 10 mantissa bits, as the CPU backend emulates it."""
    return (x.astype(np.float32).view(np.int32) & np.int32(-8192)).view(np.float32)


def kappa(x):
    s = np.linalg.svd(x.astype(np.float64), compute_uv=False)
    return s[0] / s[-1]


def route(w, scaled, last_fp32):
    m, n = w.shape
    eye = torch.eye(n, dtype=torch.float64)
    d = 1.0 / np.linalg.norm(w.astype(np.float64), axis=0) if scaled else np.ones(n)
    wd = w * d.astype(np.float32)[None, :]
    t = torch.from_numpy(tf32(wd))
    g = (t.T @ t).double()
    g += 2.0**-26 * np.sqrt(m) * torch.linalg.norm(g) * eye
    r1 = torch.linalg.cholesky(g, upper=True).float()
    w1 = torch.linalg.solve_triangular(r1, torch.from_numpy(wd), upper=True, left=False)
    g2 = (w1.T @ w1).double() if last_fp32 else w1.double().T @ w1.double()
    check = torch.linalg.norm(g2 - eye).item()
    r2 = torch.linalg.cholesky(g2, upper=True)
    q = torch.linalg.solve_triangular(r2.float(), w1, upper=True, left=False).double()
    r = (r2 @ r1.double()) / torch.from_numpy(d)[None, :]
    w64 = torch.from_numpy(w.astype(np.float64))
    orth = torch.linalg.norm(q.T @ q - eye).item()
    backward = (torch.linalg.norm(q @ r - w64) / torch.linalg.norm(w64)).item()
    return kappa(wd), kappa(w1.numpy()), check, orth, backward


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=512, help="the factor's size (L is n x n)")
    p.add_argument("--cols", type=int, default=0, help="gradient columns per step (default 4n)")
    p.add_argument("--unscaled", action="store_true", help="pass 1 without column scaling (as built)")
    p.add_argument("--last-gram", choices=("fp64", "fp32"), default="fp64")
    p.add_argument("--refreshes", type=int, default=3)
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    cols = a.cols or 4 * a.n
    print("n %d, %d gradient columns a step, refresh every 10 steps; pass 1 %s; last pass's Gram %s" % (
        a.n, cols, "unscaled (as built)" if a.unscaled else "column-scaled", a.last_gram))
    print("\n| alpha | EMA | step | kappa(W) | kappa(W D) | kappa(W1) | check | orthogonality | backward |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for alpha in (1.0, 2.0):
        for beta in (0.95, 0.999):
            for t, w in soap_inputs(a.n, cols, alpha, beta, 10, 10 * (a.refreshes + 1), 0):
                kwd, kw1, check, orth, back = route(w, not a.unscaled, a.last_gram == "fp32")
                kw = kwd if a.unscaled else kappa(w)  # unscaled, W D is W
                print("| %.0f | %.3f | %d | %.2e | %s | %.2e | %.2e | %.2e | %.1e |" % (
                    alpha, beta, t, kw, "-" if a.unscaled else "%.2e" % kwd, kw1, check, orth, back))


if __name__ == "__main__":
    main()
