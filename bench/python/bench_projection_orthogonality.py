#!/usr/bin/env python3
"""How orthogonal each projection arithmetic keeps OSFT factors over AdamW
steps (issue 34): libosftrt's projector in every osft_projection_arithmetic_t
and mini_trainer's per-target PyTorch code, on the same steps, for bf16 and
fp32 factors.

    python3 bench/python/bench_projection_orthogonality.py [--device cpu|cuda]
        [--steps 300] [--every 10] [--scale S] [--lr 1e-4] [--dtypes bf16,fp32]
        [--out FILE.md]

Targets: one Llama-3.1-8B layer's seven projections (q, k, v, o: 4096 x 4096,
1024 x 4096 twice, 4096 x 4096; gate, up 14336 x 4096; down 4096 x 14336),
every dimension divided by --scale (default 1 on CUDA, 16 on the CPU), rank
ratio 0.5. The frozen and trainable factors are orthonormal bases (QR of
Gaussian matrices in float64), stored in the dtype under test. The learning
rate defaults to 1e-4 x sqrt(scale): entries of an N-row orthonormal basis
are about 1/sqrt(N), so this keeps a step's size relative to them (and to
a bf16 ulp) what it is at full size; a bf16 factor ignores an update below
half an ulp, so too small a rate measures only the initial rounding.

Every variant starts from the same stored factors and sees the same
gradients (Gaussian, float32, stored in the factors' dtype). A step:
project the gradients, AdamW (lr, betas 0.9/0.999, eps 1e-8, weight decay
0.01; moments in fp32, the update computed in fp32 from the stored value and
rounded once into the factor's dtype: what torch.optim.AdamW does for a
parameter of that dtype), project the parameters. Every --every steps the
residuals max|U_high^T U_low| and max|V_low V_high^T| of the stored values
are computed in float64 over all targets.

Variants (bf16 factors): osftrt auto (the default: one bf16 GEMM against C
rounded to bf16 where bf16 GEMMs are native, fp32 elsewhere), exact (C split
into bf16 halves where native, else fp32), fp32 (one fp32 GEMM on a widened
factor; TF32 on CUDA: the context allows it), bf16 (forced), and
mini_trainer's code (coeff = U_high^T dU; dU.addmm_(U_high, coeff, alpha=-1),
all bf16). fp32 factors: osftrt auto (exact) and mini_trainer's fp32 code
(TF32 off, torch's default). The table reports the residual after the last
step, the worst over the run, and the median time of one projection call
pair (gradients + parameters).
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time

import torch

import osftrt
from osftrt.torch import OSFTProjector

SHAPES = [("q", 4096, 4096), ("k", 1024, 4096), ("v", 1024, 4096), ("o", 4096, 4096),
          ("gate", 14336, 4096), ("up", 14336, 4096), ("down", 4096, 14336)]
DT = {"bf16": torch.bfloat16, "fp32": torch.float32}


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--every", type=int, default=10)
    p.add_argument("--scale", type=int, default=0)
    p.add_argument("--lr", type=float, default=0.0,
                   help="default 1e-4 x sqrt(scale): the factors' entries grow as sqrt(scale), so the step "
                        "keeps the full-size ratio to them (and to a bf16 ulp)")
    p.add_argument("--dtypes", default="bf16,fp32")
    p.add_argument("--variants", default="", help="comma-separated subset of the variant names")
    p.add_argument("--out")
    a = p.parse_args()
    if a.scale < 1:
        a.scale = 1 if a.device == "cuda" else 16
    if a.lr <= 0:
        a.lr = 1e-4 * a.scale ** 0.5
    return a


def orthonormal(rows, cols, gen, device):
    """rows x cols with orthonormal columns, float64 (QR of a Gaussian, on
    the device: full-size gate/up/down factors take minutes on a CPU)."""
    a = torch.randn(rows, cols, dtype=torch.float64, generator=gen).to(device)
    q, r = torch.linalg.qr(a)
    return q * torch.sign(torch.diagonal(r))


def make_targets(scale, gen, device):
    """Per target the float64 factors: U_high, U_low (N x r, N x l), V_high,
    V_low (r x K, l x K)."""
    out = []
    for name, n0, k0 in SHAPES:
        n, k = n0 // scale, k0 // scale
        kk = min(n, k)
        r = kk // 2
        u, v = orthonormal(n, kk, gen, device), orthonormal(k, kk, gen, device).T.contiguous()
        out.append(dict(name=name, uh=u[:, :r], ul=u[:, r:], vh=v[:r], vl=v[r:]))
    return out


class Factors:
    """One variant's stored factors, gradients and AdamW state."""

    def __init__(self, targets, dtype, device):
        self.t = []
        for f in targets:
            d = {k: f[k].to(device=device, dtype=dtype).contiguous() for k in ("uh", "ul", "vh", "vl")}
            d["gu"] = torch.zeros_like(d["ul"])
            d["gv"] = torch.zeros_like(d["vl"])
            self.t.append(d)
        self.params = [d[k] for d in self.t for k in ("ul", "vl")]
        self.grads = [d[k] for d in self.t for k in ("gu", "gv")]
        self.m = [torch.zeros_like(p, dtype=torch.float32) for p in self.params]
        self.v = [torch.zeros_like(p, dtype=torch.float32) for p in self.params]

    def set_grads(self, grads):
        for g, src in zip(self.grads, grads):
            g.copy_(src)

    def adamw(self, step, lr, b1=0.9, b2=0.999, eps=1e-8, wd=0.01):
        for p, g, m, v in zip(self.params, self.grads, self.m, self.v):
            g32, p32 = g.float(), p.float()
            m.mul_(b1).add_(g32, alpha=1 - b1)
            v.mul_(b2).addcmul_(g32, g32, value=1 - b2)
            mh, vh = m / (1 - b1 ** step), v / (1 - b2 ** step)
            p32.mul_(1 - lr * wd).addcdiv_(mh, vh.sqrt().add_(eps), value=-lr)
            p.copy_(p32)

    def residual(self):
        """max |U_high^T U_low|, max |V_low V_high^T| of the stored values."""
        mu = mv = 0.0
        for d in self.t:
            uh, ul, vh, vl = (d[k].double() for k in ("uh", "ul", "vh", "vl"))
            mu = max(mu, (uh.T @ ul).abs().max().item())
            mv = max(mv, (vl @ vh.T).abs().max().item())
        return mu, mv


class Library:
    """libosftrt's projector over the factors, in one arithmetic."""

    def __init__(self, f, device, arithmetic):
        self.ctx = osftrt.Context(device, allow_tf32=(arithmetic == "fp32"))
        self.proj = OSFTProjector(context=self.ctx, arithmetic=arithmetic)
        for d in f.t:
            self.proj.add_target(u_high=d["uh"], u_low=d["ul"], grad_u_low=d["gu"],
                                 v_high=d["vh"], v_low=d["vl"], grad_v_low=d["gv"])

    def grads(self):
        self.proj.project_gradients()

    def params(self):
        self.proj.project_parameters()


class MiniTrainer:
    """mini_trainer's per-target projection (osft_utils.py), one target after
    the other, in the factors' own dtype."""

    def __init__(self, f):
        self.f = f

    def _project(self, which):
        for d in self.f.t:
            u = d["gu" if which == "g" else "ul"]
            v = d["gv" if which == "g" else "vl"]
            coeff = d["uh"].T @ u
            u.addmm_(d["uh"], coeff, alpha=-1)
            coeff = v @ d["vh"].T
            v.addmm_(coeff, d["vh"], alpha=-1)

    def grads(self):
        self._project("g")

    def params(self):
        self._project("p")


def variants_for(dtype):
    if dtype == "bf16":
        return ["osftrt auto", "osftrt exact", "osftrt fp32", "osftrt bf16", "mini_trainer"]
    return ["osftrt auto", "mini_trainer"]


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def run(args, dtype, targets):
    gen = torch.Generator(device=args.device).manual_seed(4321)
    shapes = [(d["ul"].shape, d["vl"].shape) for d in targets]
    wanted = [v for v in variants_for(dtype) if not args.variants or v in args.variants.split(",")]
    runs = []
    for name in wanted:
        f = Factors(targets, DT[dtype], args.device)
        proj = MiniTrainer(f) if name == "mini_trainer" else Library(f, args.device, name.split()[1])
        runs.append(dict(name=name, f=f, proj=proj, curve=[], times=[]))
    for step in range(1, args.steps + 1):
        grads = []
        for su, sv in shapes:
            for s in (su, sv):
                grads.append(torch.randn(*s, generator=gen, dtype=torch.float32, device=args.device))
        for r in runs:
            r["f"].set_grads(grads)
            sync(args.device)
            t0 = time.perf_counter()
            r["proj"].grads()
            sync(args.device)
            t1 = time.perf_counter()
            r["f"].adamw(step, args.lr)
            sync(args.device)
            t2 = time.perf_counter()
            r["proj"].params()
            sync(args.device)
            r["times"].append(1e3 * ((t1 - t0) + (time.perf_counter() - t2)))
            if step % args.every == 0 or step == args.steps:
                r["curve"].append((step,) + r["f"].residual())
    return runs


def machine(device):
    if device == "cuda":
        return torch.cuda.get_device_name(0)
    model = platform.processor() or "cpu"
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        model = next(l.split(":", 1)[1].strip() for l in out.splitlines() if l.startswith("Model name"))
    except (OSError, subprocess.CalledProcessError, StopIteration):
        pass
    return f"{model}, {os.cpu_count()} cores"


def report(args, results):
    lines = [f"# Projection orthogonality over {args.steps} AdamW steps ({args.device})", "",
             f"- machine: {machine(args.device)}",
             f"- libosftrt: {osftrt.build_info()}",
             f"- torch {torch.__version__}; Python {platform.python_version()}",
             f"- targets: one Llama-3.1-8B layer (q, k, v, o, gate, up, down) / {args.scale}, rank ratio 0.5;"
             f" lr {args.lr}, weight decay 0.01",
             "- command: `" + " ".join(["python3"] + sys.argv) + "`", ""]
    for dtype, runs in results:
        best = min(max(max(c[1], c[2]) for c in r["curve"]) for r in runs)
        lines += [f"## {dtype} factors", "",
                  "| variant | residual U after last step | residual V after last step | worst over the run |"
                  " worst / best variant's | ms per step (grads + params) |",
                  "| --- | ---: | ---: | ---: | ---: | ---: |"]
        for r in runs:
            last = r["curve"][-1]
            worst = max(max(c[1], c[2]) for c in r["curve"])
            ms = statistics.median(r["times"][1:] or r["times"])
            lines.append(f"| {r['name']} | {last[1]:.3g} | {last[2]:.3g} | {worst:.3g} | {worst / best:.2f} | {ms:.2f} |")
        lines += ["", "Residual max(U, V) over the steps:", "",
                  "| step | " + " | ".join(r["name"] for r in runs) + " |",
                  "| ---: | " + " | ".join("---:" for _ in runs) + " |"]
        for i, c in enumerate(runs[0]["curve"]):
            lines.append(f"| {c[0]} | " + " | ".join(f"{max(r['curve'][i][1], r['curve'][i][2]):.3g}" for r in runs) + " |")
        lines.append("")
    return "\n".join(lines)


def main():
    args = parse()
    gen = torch.Generator().manual_seed(1234)
    targets = make_targets(args.scale, gen, args.device)
    results = [(dt, run(args, dt, targets)) for dt in args.dtypes.split(",")]
    text = report(args, results)
    print(text)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text + "\n")


if __name__ == "__main__":
    main()
