#!/usr/bin/env python3
"""PyTorch peers of libosftrt's benchmarks, at the shapes of the C benchmarks
(bench/bench_flce.c, bench_flinear.c, bench_mlp.c, bench_qr.c). Only the
peers are timed here; the C benchmarks time libosftrt, and
bench/gpu/run_cuda_bench.sh runs both on one machine in one call.

    python3 bench/gpu/peers_torch.py --device cuda|cpu [--scale S] [--reps R]
        [--warmup W] [--only flce,flinear,mlp,qr] [--flinear-tokens M,..]
        [--liger-wheel WHL] [--cce-wheel WHL] --outdir DIR

Writes DIR/peers_<name>_<device>.csv (one row per shape; times end in _ms,
memory in _mib) and prints a table per benchmark.

  flce     BT in {2048, 8192}, H = 4096, V in {32000, 128256}: F.linear +
           F.cross_entropy fwd+bwd (grads of x and W), with the logits in the
           compute dtype and upcast to fp32 first (as Hugging Face does);
           the three GEMMs alone (logits = x W^T, dx = g W, dW = g^T x: the
           floor); Liger-Kernel's LigerFusedLinearCrossEntropyLoss if
           liger_kernel imports (else from the wheel under .whl/, else
           skipped); Apple's Cut Cross-Entropy (cut-cross-entropy 25.1.1,
           `from cut_cross_entropy import linear_cross_entropy`, likewise
           installed or from .whl/) twice: "cce" with exact gradients
           (filter_eps=None: no softmax entry skipped in the backward) and
           "cce_filter" with its default filter_eps="high" (entries below
           bf16 eps / 32 = 2.4e-4 skipped). Both with impl="cce" (its Triton
           kernels), ignore_index -100, no softcap, reduction "mean", no
           shift; 25.1.1 has no accum_*_fp32 options: its dE and dC are
           zeros in the input dtype summed in place (bf16). Triton needs
           CUDA: on the CPU both peers are skipped with a message.
  flinear  the OSFT layer shapes of bench_flinear.c (Llama-3.1-8B: 4096x4096,
           1024x4096, 14336x4096, 4096x14336; N out x K in), rank ratio 0.5
           (r = round(0.5 min(N, K)) frozen, l = min(N, K) - r trainable),
           8192 tokens: bias-free dense linear fwd+bwd (grads of x and W) and
           the mini_trainer formulation y = ((x Vh^T) * Sh) Uh^T, addmm_ of
           ((x Vl^T) * Sl) Ul^T (grads of x, Ul, Sl, Vl) through autograd.
  mlp      SwiGLU H = 4096, I = 14336, tokens 4K..64K: untiled
           down(silu(gate x) * up x), fwd and bwd (grads of x and the three
           weights, all requiring grad); a size that runs out of memory is
           recorded as "oom".
  qr       fp32, the SOAP list of bench_qr.c (12 layers x (4 of 1024^2 + 4 of
           4096^2) = 96 matrices): torch.linalg.qr one matrix at a time, and
           one batched call per size; the same for a power-iteration step
           Q <- qr(A Q) (torch.mm + qr per pair, or torch.bmm + batched qr).

Compute dtype: bf16 on CUDA, fp32 on the CPU (qr is fp32 everywhere). Every
shape dimension is divided by --scale (default 1 on CUDA, 16 on the CPU).
Inputs are fresh uniform random numbers (never zeros). Times: W warm-up runs
(default 2), then the median of R runs (default 5), CUDA events on CUDA,
perf_counter on the CPU. Peak memory (CUDA only; nan on the CPU): one more
run after torch.cuda.reset_peak_memory_stats(), max_memory_allocated() minus
what was allocated before it (the inputs), so it includes the returned
gradients; grads_mib gives their size.

On the H100 all four take about a minute and a half (most of it qr). CPU test:
    /usr/bin/python3 bench/gpu/peers_torch.py --device cpu --scale 16 --reps 2 \\
        --outdir /tmp/peers
"""
import argparse
import csv
import glob
import math
import os
import statistics
import sys
import tempfile
import time
import traceback
import zipfile

import torch
import torch.nn.functional as F

MIB = float(1 << 20)
NAN = float("nan")
OOM = "oom"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# ----------------------------------------------------------------- helpers


class Env:
    """What every benchmark needs: device, dtype, scale, repetitions."""

    def __init__(self, args):
        self.device = torch.device(args.device)
        self.cuda = self.device.type == "cuda"
        self.dtype = torch.bfloat16 if self.cuda else torch.float32
        self.scale = args.scale or (1 if self.cuda else 16)
        self.reps = max(1, args.reps)
        self.warmup = max(0, args.warmup)
        self.gen = torch.Generator(device=self.device)
        self.gen.manual_seed(12345)
        self.liger_cls = None
        self.cce_fn = None

    def dim(self, n):
        """A shape dimension divided by the scale, as the C benchmarks do."""
        return max(1, n // self.scale)

    def rand(self, *shape, scale=1.0, dtype=None, grad=False):
        """Uniform in [-scale, scale), never all zeros."""
        t = torch.empty(shape, dtype=dtype or self.dtype, device=self.device)
        t.uniform_(-scale, scale, generator=self.gen)
        return t.requires_grad_(grad)

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def free(self):
        if self.cuda:
            torch.cuda.empty_cache()


def is_oom(exc):
    oom_type = getattr(torch.cuda, "OutOfMemoryError", None)
    return (oom_type is not None and isinstance(exc, oom_type)) or "out of memory" in str(exc)


def mib_of(*tensors):
    return sum(t.numel() * t.element_size() for t in tensors) / MIB


class Clock:
    """Marks in one run: CUDA events, or perf_counter on the CPU."""

    def __init__(self, env):
        self.env = env
        self.marks = []

    def mark(self):
        if self.env.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            self.marks.append(e)
        else:
            self.marks.append(time.perf_counter())

    def intervals_ms(self):
        self.env.sync()
        m = self.marks
        if self.env.cuda:
            return [m[i].elapsed_time(m[i + 1]) for i in range(len(m) - 1)]
        return [(m[i + 1] - m[i]) * 1e3 for i in range(len(m) - 1)]


def time_phases(env, step):
    """Runs step(clock) warm-up + reps times; step may call clock.mark()
    between its phases. Returns the median of each phase and of the total."""
    runs = []
    for r in range(env.warmup + env.reps):
        clock = Clock(env)
        env.sync()
        clock.mark()
        step(clock)
        clock.mark()
        if r >= env.warmup:
            runs.append(clock.intervals_ms())
    phases = [statistics.median(run[p] for run in runs) for p in range(len(runs[0]))]
    return phases, statistics.median(sum(run) for run in runs)


def time_ms(env, fn):
    """Median milliseconds of fn() (its results dropped)."""
    return time_phases(env, lambda clock: fn())[1]


def peak_mib(env, fn):
    """Peak bytes allocated during one fn() above what was allocated before."""
    if not env.cuda:
        return NAN
    env.sync()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    out = fn()
    env.sync()
    peak = torch.cuda.max_memory_allocated() - before
    del out
    return peak / MIB


def guarded(env, fn):
    """fn(), or OOM if the device runs out of memory."""
    try:
        return fn()
    except RuntimeError as exc:
        if not is_oom(exc):
            raise
        env.free()
        return OOM


def fmt(v, width=9, prec=2):
    if isinstance(v, str):
        return v.rjust(width)
    if isinstance(v, float):
        return ("%*.*f" % (width, prec, v)) if not math.isnan(v) else "nan".rjust(width)
    return str(v).rjust(width)


def print_table(rows, columns):
    widths = [max(9, len(c)) for c in columns]
    print(" ".join(c.rjust(w) for c, w in zip(columns, widths)))
    for row in rows:
        print(" ".join(fmt(row[c], w) for c, w in zip(columns, widths)))
    sys.stdout.flush()


def write_csv(env, outdir, name, rows):
    path = os.path.join(outdir, "peers_%s_%s.csv" % (name, env.device.type))
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        w.writeheader()
        for row in rows:
            w.writerow({k: ("%.4f" % v if isinstance(v, float) else v) for k, v in row.items()})
    print("wrote", path)


# ------------------------------------------------------- liger and cce


def import_package(tag, module, wheel, pattern):
    """True once `module` imports: installed, else from the wheel (the
    newest matching .whl/PATTERN unless `wheel` names one) unpacked into a
    temporary folder; False with a message (a missing or broken peer must
    not stop the rest)."""
    try:
        __import__(module)
        return True
    except ImportError:
        pass
    wheels = [wheel] if wheel else sorted(glob.glob(os.path.join(ROOT, ".whl", pattern)))
    if not wheels or not os.path.exists(wheels[-1]):
        print("%s: %s is not installed and no wheel found; skipped" % (tag, module))
        return False
    target = tempfile.mkdtemp(prefix=tag + "_")
    with zipfile.ZipFile(wheels[-1]) as z:
        z.extractall(target)
    sys.path.insert(0, target)
    try:
        __import__(module)
        return True
    except Exception as exc:
        print("%s: import from %s failed: %r; skipped" % (tag, wheels[-1], exc))
        return False


def import_liger(wheel):
    """The Liger FLCE module class, or None with a message."""
    if not import_package("liger", "liger_kernel", wheel, "liger_kernel-*.whl"):
        return None
    try:
        from liger_kernel.transformers.fused_linear_cross_entropy import (
            LigerFusedLinearCrossEntropyLoss,
        )
    except Exception as exc:
        print("liger: LigerFusedLinearCrossEntropyLoss unavailable: %r; skipped" % (exc,))
        return None
    return LigerFusedLinearCrossEntropyLoss


def import_cce(wheel):
    """Cut Cross-Entropy's linear_cross_entropy, or None with a message."""
    if not import_package("cce", "cut_cross_entropy", wheel, "cut_cross_entropy-*.whl"):
        return None
    try:
        from cut_cross_entropy import linear_cross_entropy
    except Exception as exc:
        print("cce: linear_cross_entropy unavailable: %r; skipped" % (exc,))
        return None
    return linear_cross_entropy


def package_version(dist, module):
    try:
        from importlib.metadata import version

        return version(dist)
    except Exception:
        mod = sys.modules.get(module)
        return getattr(mod, "__version__", "imported") if mod else "not imported"


def liger_version():
    return package_version("liger_kernel", "liger_kernel")


# ------------------------------------------------------------------- flce


def flce_case(env, m, h, v, liger_cls, cce_fn):
    x = env.rand(m, h, scale=2.0, grad=True)
    w = env.rand(v, h, scale=0.2, grad=True)
    y = (torch.arange(m, device=env.device, dtype=torch.int64) * 7919) % v
    g = env.rand(m, v, scale=1e-3)

    def torch_step(upcast):
        def step():
            logits = F.linear(x, w)
            if upcast:
                logits = logits.float()
            loss = F.cross_entropy(logits, y)
            return (loss.detach(),) + torch.autograd.grad(loss, (x, w))

        return step

    def liger_step():
        loss = lce(w, x, y)
        return (loss.detach(),) + torch.autograd.grad(loss, (x, w))

    def cce_step(filter_eps):
        def step():
            loss = cce_fn(x, w, y, ignore_index=-100, softcap=None, reduction="mean",
                          shift=False, filter_eps=filter_eps, impl="cce")
            return (loss.detach(),) + torch.autograd.grad(loss, (x, w))

        return step

    def gemms():
        return (x.detach() @ w.detach().t(), g @ w.detach(), g.t() @ x.detach())

    row = {"device": env.device.type, "bt": m, "h": h, "v": v}
    losses = {}
    variants = [("torch", torch_step(False)), ("torch_upcast", torch_step(True))]
    if liger_cls is not None and env.cuda:
        lce = liger_cls()
        variants.append(("liger", liger_step))
    if cce_fn is not None and env.cuda:
        variants.append(("cce", cce_step(None)))
        variants.append(("cce_filter", cce_step("high")))
    for name, step in variants:
        res = guarded(env, step)
        if res == OOM:
            row[name + "_ms"] = row[name + "_peak_mib"] = OOM
            continue
        losses[name] = float(res[0])
        del res
        row[name + "_ms"] = guarded(env, lambda: time_ms(env, step))
        row[name + "_peak_mib"] = guarded(env, lambda: peak_mib(env, step))
    for name in ("liger", "cce", "cce_filter"):
        if name not in dict(variants):
            row[name + "_ms"] = row[name + "_peak_mib"] = NAN
    row["gemms_ms"] = guarded(env, lambda: time_ms(env, gemms))
    row["grads_mib"] = mib_of(x, w)
    row["logits_mxv_fp32_mib"] = m * v * 4 / MIB
    for name, loss in losses.items():
        row[name + "_loss"] = loss
    for name in ("torch", "torch_upcast", "liger", "cce", "cce_filter"):
        row.setdefault(name + "_loss", NAN)
    ref = losses.get("torch_upcast")
    for name, loss in losses.items():
        if ref is not None and abs(loss - ref) > 2e-2 * abs(ref):
            print("warning: flce %s loss %g vs torch_upcast %g" % (name, loss, ref))
    return row


def bench_flce(env, args):
    rows = []
    for bt in (2048, 8192):
        for v in (32000, 128256):
            rows.append(flce_case(env, env.dim(bt), env.dim(4096), env.dim(v), env.liger_cls,
                                  env.cce_fn))
            env.free()
    cols = ["bt", "h", "v", "gemms_ms", "torch_ms", "torch_upcast_ms", "liger_ms", "cce_ms",
            "cce_filter_ms", "torch_peak_mib", "torch_upcast_peak_mib", "liger_peak_mib",
            "cce_peak_mib", "cce_filter_peak_mib", "grads_mib"]
    print_table(rows, cols)
    return rows


# ---------------------------------------------------------------- flinear


def flinear_case(env, n, k, m):
    kk = min(n, k)
    r = int(round(0.5 * kk))  # the library's frozen_rank: llround(ratio * k)
    l = kk - r
    x = env.rand(m, k, grad=True)
    g = env.rand(m, n)
    w = env.rand(n, k, scale=1.0 / math.sqrt(k), grad=True)
    uh, vh = env.rand(n, r, scale=1.0 / math.sqrt(n)), env.rand(r, k, scale=1.0 / math.sqrt(k))
    ul = env.rand(n, l, scale=1.0 / math.sqrt(n), grad=True)
    vl = env.rand(l, k, scale=1.0 / math.sqrt(k), grad=True)
    sh = (torch.rand(r, generator=env.gen, device=env.device) + 1.0).to(env.dtype)
    sl = (torch.rand(l, generator=env.gen, device=env.device) * 0.5 + 0.1).to(env.dtype)
    sl.requires_grad_(True)

    def dense():
        return torch.autograd.grad(F.linear(x, w), (x, w), g)

    def osft():
        y = torch.mm(torch.mm(x, vh.t()) * sh, uh.t())
        y.addmm_(torch.mm(x, vl.t()) * sl, ul.t())
        return torch.autograd.grad(y, (x, ul, sl, vl), g)

    row = {"device": env.device.type, "n": n, "k": k, "m": m, "r": r, "l": l}
    for name, fn in (("dense", dense), ("osft_torch", osft)):
        row[name + "_ms"] = guarded(env, lambda: time_ms(env, fn))
        row[name + "_peak_mib"] = guarded(env, lambda: peak_mib(env, fn))
    row["dense_grads_mib"] = mib_of(x, w)
    row["osft_grads_mib"] = mib_of(x, ul, sl, vl)
    t_d, t_o = row["dense_ms"], row["osft_torch_ms"]
    row["osft_over_dense"] = t_o / t_d if isinstance(t_d, float) and isinstance(t_o, float) else NAN
    return row


def bench_flinear(env, args):
    shapes = ((4096, 4096), (1024, 4096), (14336, 4096), (4096, 14336))
    tokens = [int(t) for t in args.flinear_tokens.split(",")] if args.flinear_tokens else [8192]
    rows = []
    for n0, k0 in shapes:
        for m0 in tokens:
            rows.append(flinear_case(env, env.dim(n0), env.dim(k0), env.dim(m0)))
            env.free()
    print_table(rows, ["n", "k", "m", "r", "l", "dense_ms", "osft_torch_ms", "osft_over_dense",
                       "dense_peak_mib", "osft_torch_peak_mib"])
    return rows


# -------------------------------------------------------------------- mlp


def mlp_case(env, m, h, i, wg, wu, wd):
    x = env.rand(m, h, grad=True)
    gy = env.rand(m, h)
    params = (x, wg, wu, wd)

    def forward():
        return F.linear(F.silu(F.linear(x, wg)) * F.linear(x, wu), wd)

    def step(clock):
        y = forward()
        clock.mark()
        grads = torch.autograd.grad(y, params, gy)
        del y, grads

    def whole():
        return torch.autograd.grad(forward(), params, gy)

    row = {"device": env.device.type, "dtype": str(env.dtype).replace("torch.", ""),
           "hidden": h, "inter": i, "tokens": m}
    res = guarded(env, lambda: time_phases(env, step))
    if res == OOM:
        row.update(fwd_ms=OOM, bwd_ms=OOM, fwdbwd_ms=OOM)
    else:
        (row["fwd_ms"], row["bwd_ms"]), row["fwdbwd_ms"] = res
    row["peak_mib"] = guarded(env, lambda: peak_mib(env, whole))
    row["grads_mib"] = mib_of(*params)
    row["saved_gu_h_mib"] = 3 * m * i * x.element_size() / MIB
    return row


def bench_mlp(env, args):
    h, i = env.dim(4096), env.dim(14336)
    wg = env.rand(i, h, scale=1.0 / math.sqrt(h), grad=True)
    wu = env.rand(i, h, scale=1.0 / math.sqrt(h), grad=True)
    wd = env.rand(h, i, scale=1.0 / math.sqrt(i), grad=True)
    rows = []
    for m in (4096, 8192, 16384, 32768, 65536):
        rows.append(mlp_case(env, env.dim(m), h, i, wg, wu, wd))
        env.free()
    print_table(rows, ["hidden", "inter", "tokens", "fwd_ms", "bwd_ms", "fwdbwd_ms", "peak_mib",
                       "grads_mib"])
    return rows


# --------------------------------------------------------------------- qr


def bench_qr(env, args):
    layers, hidden, mlp = 12, env.dim(1024), env.dim(4096)
    dims = [hidden if j % 2 == 0 else mlp for _ in range(layers) for j in range(8)]
    f32 = torch.float32
    mats = [env.rand(d, d, dtype=f32) for d in dims]
    factors = [env.rand(d, d, dtype=f32) for d in dims]
    sizes = sorted(set(dims))
    batch = {d: torch.stack([a for a in mats if a.shape[0] == d]) for d in sizes}
    fbatch = {d: torch.stack([a for a in factors if a.shape[0] == d]) for d in sizes}
    del factors

    def loop():
        return [torch.linalg.qr(a)[0] for a in mats]

    def batched():
        return [torch.linalg.qr(batch[d])[0] for d in sizes]

    def power_loop():
        return [torch.linalg.qr(torch.mm(fbatch[d][j], batch[d][j]))[0]
                for d in sizes for j in range(batch[d].shape[0])]

    def power_batched():
        return [torch.linalg.qr(torch.bmm(fbatch[d], batch[d]))[0] for d in sizes]

    row = {"device": env.device.type, "scale": env.scale, "count": len(dims),
           "hidden": hidden, "mlp": mlp}
    for name, fn in (("loop", loop), ("batched", batched), ("power_loop", power_loop),
                     ("power_batched", power_batched)):
        row[name + "_ms"] = guarded(env, lambda: time_ms(env, fn))
    if env.cuda:
        row["linalg_library"] = str(torch.backends.cuda.preferred_linalg_library())
    print_table([row], ["count", "hidden", "mlp", "loop_ms", "batched_ms", "power_loop_ms",
                        "power_batched_ms"])
    return [row]


# ------------------------------------------------------------------- main

BENCHES = {"flce": bench_flce, "flinear": bench_flinear, "mlp": bench_mlp, "qr": bench_qr}


def print_versions(env):
    try:
        import triton

        triton_v = triton.__version__
    except Exception:
        triton_v = "not available"
    name = torch.cuda.get_device_name(env.device) if env.cuda else "CPU (%d threads)" % torch.get_num_threads()
    print("# torch %s (CUDA %s) | triton %s | liger_kernel %s | cut_cross_entropy %s | device %s"
          % (torch.__version__, torch.version.cuda, triton_v, liger_version(),
             package_version("cut-cross-entropy", "cut_cross_entropy"), name))
    print("# %s, shapes / %d, %d warm-up + median of %d" % (str(env.dtype).replace("torch.", ""), env.scale,
                                                           env.warmup, env.reps))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--scale", type=int, default=0)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--only", default=",".join(BENCHES))
    ap.add_argument("--flinear-tokens", default=None)
    ap.add_argument("--liger-wheel", default=None)
    ap.add_argument("--cce-wheel", default=None)
    ap.add_argument("--outdir", required=True)
    args = ap.parse_args()
    env = Env(args)
    os.makedirs(args.outdir, exist_ok=True)
    if "flce" in args.only and env.cuda:
        env.liger_cls = import_liger(args.liger_wheel)
        env.cce_fn = import_cce(args.cce_wheel)
    elif "flce" in args.only:
        print("liger, cce: Triton needs CUDA; skipped on the CPU")
    print_versions(env)
    failed = []
    for name in [s.strip() for s in args.only.split(",") if s.strip()]:
        if name not in BENCHES:
            print("unknown benchmark %r (have %s)" % (name, ", ".join(BENCHES)))
            failed.append(name)
            continue
        print("\n## %s" % name)
        t0 = time.perf_counter()
        try:
            write_csv(env, args.outdir, name, BENCHES[name](env, args))
        except Exception:
            traceback.print_exc()
            failed.append(name)
        env.free()
        print("# %s took %.1f s" % (name, time.perf_counter() - t0))
    if failed:
        print("failed:", ", ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
