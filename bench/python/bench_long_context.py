#!/usr/bin/env python3
"""Long-context fine-tuning (issue 44): how much memory one training step
takes per token, and the longest sequence that fits a budget, per variant,
each run in its own process:

* ``plain``  plain ``transformers``;
* ``ckpt``   + activation checkpointing (Hugging Face's, non-reentrant);
* ``osftrt`` ``apply_osftrt(model)`` (fused loss, tiled MLP; defaults);
* ``knob``   ``apply_osftrt(model, activation_memory="min")``: per-layer
  checkpoints of the layer input only, constant loss and MLP scratch, and on a
  GPU the checkpoints offloaded to pinned host memory;
* ``liger``  (GPU, when liger_kernel imports) Liger-Kernel's Llama patch +
  checkpointing.

One step = forward + backward of one sequence (batch 1), gradients kept (no
optimizer). Memory: on the CPU the peak resident set above the one before
the step (VmHWM reset; glibc's mmap and trim thresholds at 64 KiB, so that
freed tensors leave the resident set: MALLOC_MMAP_THRESHOLD_ /
MALLOC_TRIM_THRESHOLD_ set for every child), on a GPU
torch.cuda.max_memory_allocated above the allocated bytes before the step;
in both cases above the model (its parameters, and on a GPU the OSFT
factors), gradients included. Printed per variant: the peak at each length,
the slope (KiB per token, least squares over the lengths), the step time
at each length, and for the knob the floor from the shapes
(osftrt.transformers.long_context.floor_bytes_per_token: the checkpoints,
the working set of the layer being differentiated, what every layer reads; constant scratch
aside), the slope over the floor, and per layer per token (the knob with
twice the layers, same length) against the checkpoint's bytes. Last, the
longest sequence within --budget-mib, found by bisection in subprocesses
(to --precision), for plain and the knob (and ckpt / osftrt with
--bisect-all), and their ratio.

CPU default: the issue's shapes (Llama-shaped hidden 256, intermediate
1024, 4 layers, 4/2 heads, vocabulary 32000, fp32, sdpa). --device cuda:
--model 1b (Llama-3.2-1B: hidden 2048, intermediate 8192, 16 layers, 32/8
heads) or 8b (Llama-3.1-8B: 4096, 14336, 32 layers, 32/8 heads), vocabulary
128256, bf16 weights, random, OSFT at rank ratio 0.5 on the osftrt variants
(their trainable set), full fine-tuning for plain/ckpt/liger.

  python bench/python/bench_long_context.py [--device cpu|cuda] [--model tiny|1b|8b]
      [--lengths 2048,4096,8192] [--budget-mib 512] [--out FILE.md] [--dry-run]
"""
import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

SHAPES = {
    "tiny": dict(hidden_size=256, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=32000),
    "1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
               num_key_value_heads=8, vocab_size=128256, head_dim=64),
    "8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
               num_key_value_heads=8, vocab_size=128256, head_dim=128),
}


# --- the child: one step of one variant at one length ------------------------------
def _config(args, layers=None):
    import transformers

    shape = dict(SHAPES[args.model])
    if layers:
        shape["num_hidden_layers"] = layers
    cfg = transformers.LlamaConfig(**shape, max_position_embeddings=1 << 22, tie_word_embeddings=False)
    cfg._attn_implementation = "sdpa"
    return cfg


def _build(args, variant, layers):
    import benchlib
    import torch
    import transformers

    torch.manual_seed(0)
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    with torch.device(args.device):
        model = transformers.LlamaForCausalLM(_config(args, layers)).to(dtype)
    model.train()
    osft = args.device == "cuda" and not args.no_osft
    if variant in ("osftrt", "knob"):
        import osftrt.transformers as ot

        knob = {"activation_memory": "min"} if variant == "knob" else {}
        ot.apply_osftrt(model, osft=osft, rank_ratio=args.rank_ratio, **knob)
    elif variant == "ckpt":
        benchlib.enable_checkpointing(model)
    elif variant == "liger":
        from liger_kernel.transformers import apply_liger_kernel_to_llama

        apply_liger_kernel_to_llama(model=model)
        benchlib.enable_checkpointing(model)
    return model




def _step(model, tokens, vocab, device):
    import torch

    g = torch.Generator().manual_seed(tokens)
    ids = torch.randint(0, vocab, (1, tokens), generator=g).to(device)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return loss.item()


def child(args):
    import torch

    import benchlib

    torch.set_num_threads(args.threads)
    model = _build(args, args.variant, args.layers)
    vocab = model.config.vocab_size
    _step(model, 16, vocab, args.device)  # lazy initialization, outside the measure
    model.zero_grad(set_to_none=True)
    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        base = benchlib.rss_kib() * 1024
        benchlib.reset_peak()
    walls, cpus = [], []
    for i in range(args.steps):  # the same step each time: the peak is the first's, the times their median
        if i:
            model.zero_grad(set_to_none=True)
        t0, c0 = time.perf_counter(), time.process_time()
        loss = _step(model, args.tokens, vocab, args.device)
        if cuda:
            torch.cuda.synchronize()
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    peak = (torch.cuda.max_memory_allocated() if cuda else benchlib.rss_kib("VmHWM") * 1024) - base
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    print("RESULT " + json.dumps({"peak": peak, "seconds": med(walls), "cpu_seconds": med(cpus), "loss": loss,
                                  "steps": args.steps}))
    benchlib.finish_process(0)


# --- the parent -------------------------------------------------------------------
_CACHE = {}  # (variant, tokens, layers) -> a result read by --from-log
PROBES = {}  # variant -> [(tokens, peak bytes)] of its bisection


def load_log(path):
    """The children's results printed in an earlier run's output (the lines
    run_child prints), so that a run can go on from them (e.g. bisect
    within another budget) without measuring them again."""
    import re

    pat = re.compile(r"^\s+(\w+)\s+(\d+) tokens(?: \((\d+) layers\))?: peak\s+([\d.]+) MiB,\s+([\d.]+) s "
                     r"\(CPU ([\d.]+) s\)")
    for line in open(path):
        m = pat.match(line)
        if m:
            v, n, layers, peak, wall, cpu = m.groups()
            _CACHE[(v, int(n), int(layers) if layers else None)] = {
                "peak": float(peak) * 2**20, "seconds": float(wall), "cpu_seconds": float(cpu), "loss": float("nan")}


def run_child(args, variant, tokens, layers=None, steps=1):
    """{"peak", "seconds", "loss"}, or None when the child failed (out of memory)."""
    import benchlib

    hit = _CACHE.get((variant, tokens, layers))
    if hit is not None:
        print("  %-7s %7d tokens%s: peak %8.1f MiB, %7.2f s (CPU %.2f s) [from %s]" % (
            variant, tokens, " (%d layers)" % layers if layers else "", hit["peak"] / 2**20, hit["seconds"],
            hit["cpu_seconds"], args.from_log), flush=True)
        return hit
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--variant", variant, "--tokens", str(tokens),
           "--device", args.device, "--model", args.model, "--threads", str(args.threads),
           "--rank-ratio", str(args.rank_ratio), "--steps", str(steps)] + (["--layers", str(layers)] if layers else []) + \
          (["--no-osft"] if args.no_osft else [])
    if args.dry_run:
        print("dry run: " + " ".join(cmd))
        return {"peak": 0, "seconds": 0.0, "cpu_seconds": 0.0, "loss": 0.0}
    env = dict(os.environ, **benchlib.LEAN_MALLOC)
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.child_timeout)
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            r = json.loads(line[7:])
            print("  %-7s %7d tokens%s: peak %8.1f MiB, %7.2f s (CPU %.2f s)" % (
                variant, tokens, " (%d layers)" % layers if layers else "", r["peak"] / 2**20, r["seconds"],
                r["cpu_seconds"]), flush=True)
            return r
    print("  %-7s %7d tokens: failed (%d): %s" % (variant, tokens, p.returncode, p.stderr.strip()[-300:]), flush=True)
    return None


def slope(points):
    """Least-squares bytes per token over [(tokens, bytes)]."""
    n = len(points)
    mx = sum(t for t, _ in points) / n
    my = sum(b for _, b in points) / n
    return sum((t - mx) * (b - my) for t, b in points) / max(sum((t - mx) ** 2 for t, _ in points), 1e-9)


def longest(args, variant, budget, guess):
    """The longest sequence whose step's peak is within `budget` bytes, by
    bisection (to args.precision), starting from `guess` tokens."""
    lo, hi, n = 0, None, max(16, int(guess))
    while hi is None or lo == 0 or hi - lo > max(16, args.precision * lo):
        r = run_child(args, variant, n)
        if r is not None:
            PROBES.setdefault(variant, []).append((n, r["peak"]))
        if r is not None and r["peak"] <= budget:
            lo = n
        else:
            hi = n
        if args.dry_run:
            break
        if hi is None:  # grow by steps of the precision, then bisect
            n = int(lo * (1 + 2 * args.precision)) + 16
        elif lo == 0:
            n = int(hi * (1 - 2 * args.precision))
        else:
            n = (lo + hi) // 2
    return lo


def parent(args):
    import benchlib

    lengths = [int(x) for x in args.lengths.split(",")]
    variants = args.variants.split(",")
    if args.device == "cuda" and "liger" not in variants:
        try:
            import liger_kernel  # noqa: F401

            variants.append("liger")
        except ImportError:
            pass
    from osftrt.transformers import long_context as lc

    cfg = _config(args)
    b = 2 if args.device == "cuda" else 4
    floor = lc.floor_bytes_per_token(cfg, b)
    lines = ["# Long-context fine-tuning: memory per token and the longest sequence (%s)" % args.device, "",
             "- machine: " + benchlib.machine(gpu=args.device == "cuda" and not args.dry_run),
             "- " + benchlib.versions(build_info=True),
             "- commit: " + benchlib.commit(),
             "- model: Llama-shaped %s (%s), %s, sdpa, batch 1, one forward + backward%s" % (
                 args.model, ", ".join("%s %s" % (k.replace("num_", "").replace("_size", ""), v)
                                       for k, v in SHAPES[args.model].items()),
                 "bf16" if b == 2 else "fp32",
                 "; OSFT rank ratio %g on the osftrt variants" % args.rank_ratio
                 if args.device == "cuda" and not args.no_osft else ""),
             "- memory: %s above the model, each variant and length in its own process (%s); step times: %s" % (
                 "torch.cuda.max_memory_allocated" if args.device == "cuda" else "peak resident set (VmHWM)",
                 " ".join("%s=%s" % kv for kv in benchlib.LEAN_MALLOC.items()),
                 "wall, synchronized" if args.device == "cuda" else
                 "the process's CPU time over the step (all its threads: the work, which other jobs on a shared "
                 "machine do not stretch)"),
             "- command: `%s`" % " ".join([os.path.relpath(sys.argv[0])] + sys.argv[1:]), ""]
    rows, data = [], {}
    for v in variants:
        pts = []
        for n in lengths:
            r = run_child(args, v, n, steps=args.steps)
            if r is not None:
                pts.append((n, r["peak"], r["seconds"] if args.device == "cuda" else r["cpu_seconds"]))
        data[v] = pts
        s = slope([(n, p) for n, p, _ in pts]) if len(pts) >= 2 else float("nan")
        rows.append("| %s | %s | %.1f | %s |" % (
            v, " / ".join("%.0f" % (p / 2**20) for _, p, _ in pts), s / 1024,
            " / ".join("%.1f" % t for _, _, t in pts)))
    lines += ["| variant | peak MiB at %s tokens | KiB per token (slope) | step s (%s) |" % (
        " / ".join(map(str, lengths)), "wall" if args.device == "cuda" else "process CPU time, %d threads" % args.threads),
              "| --- | ---: | ---: | ---: |"] + rows + [""]
    knob = data.get("knob", [])
    if len(knob) >= 2:
        ks = slope([(n, p) for n, p, _ in knob])
        lines.append("Floor from the shapes, bytes per token at the step's peak: checkpoints %d (%d layers x %d x "
                     "%d B) + the working set of the layer being differentiated %d + the rotary cos/sin, ids and "
                     "labels %d = **%d** (%.1f KiB); the knob's slope %.1f KiB = **%.2fx the floor** (goal <= "
                     "1.25x)." % (floor["checkpoints"], cfg.num_hidden_layers, cfg.hidden_size, b, floor["layer"],
                                  floor["shared"], floor["total"], floor["total"] / 1024, ks / 1024,
                                  ks / floor["total"]))
        # per layer: the slope of twice the layers less the knob's, over the added layers
        # (slopes, so that the added layers' weight gradients cancel)
        two = [(n, run_child(args, "knob", n, layers=2 * cfg.num_hidden_layers)) for n in lengths[-2:]]
        one = [(n, p) for n, p, _ in knob if n in lengths[-2:]]
        if len(one) == 2 and all(r is not None for _, r in two):
            per = (slope([(n, r["peak"]) for n, r in two]) - slope(one)) / cfg.num_hidden_layers
            lines.append("Per layer per token with the knob (slope over %s tokens, %d vs %d layers): %.0f bytes, "
                         "**%.2fx the checkpoint's %d** (goal <= 1.1x)." % (
                             " and ".join(map(str, lengths[-2:])), 2 * cfg.num_hidden_layers, cfg.num_hidden_layers,
                             per, per / floor["checkpoint_per_layer"], floor["checkpoint_per_layer"]))
        if "plain" in data and "ckpt" in data:
            both = [(n, t) for n, _, t in knob if any(m == n for m, _, _ in data["ckpt"])]
            for n, t in both:
                tp = [x for m, _, x in data["plain"] if m == n]
                tc = [x for m, _, x in data["ckpt"] if m == n][0]
                lines.append("Step at %d tokens (as in the table): knob %.1f s, + checkpointing %.1f s (%.2fx)%s." % (
                    n, t, tc, t / max(tc, 1e-9), ", plain %.1f s" % tp[0] if tp else ""))
        lines.append("")
    if args.budget_mib > 0:
        budget = args.budget_mib * 2**20
        found = {}
        for v in ["plain", "knob"] + (["ckpt", "osftrt"] if args.bisect_all else []):
            pts = data.get(v)
            if not pts or len(pts) < 2:
                continue
            s = slope([(n, p) for n, p, _ in pts[-2:]])  # the marginal slope, from the last point
            guess = pts[-1][0] + (budget - pts[-1][1]) / max(s, 1.0)
            print("bisecting %s within %d MiB from %d tokens" % (v, args.budget_mib, guess), flush=True)
            found[v] = longest(args, v, budget, guess)
        lines.append("Longest sequence within %d MiB above the model (bisection in subprocesses, to %.0f%%): %s." % (
            args.budget_mib, 100 * args.precision, ", ".join("%s %d tokens" % kv for kv in found.items())))
        knob = PROBES.get("knob", [])
        if len(knob) >= 3 and not args.dry_run:  # bytes per token where the sequences are long
            ks = slope(knob)
            lines.append("The knob's slope over its bisection's probes (%d to %d tokens): %.1f KiB per token, "
                         "**%.2fx the floor** of %.1f KiB; intercept %.0f MiB (the weights' gradients and the "
                         "scratch)." % (min(n for n, _ in knob), max(n for n, _ in knob), ks / 1024,
                                        ks / floor["total"], floor["total"] / 1024,
                                        (sum(p for _, p in knob) - ks * sum(n for n, _ in knob)) / len(knob) / 2**20))
        if found.get("plain") and found.get("knob"):
            lines.append("The knob's over plain transformers': **%.1fx** (goal >= 30x; ALST on one H100: 16x)." % (
                found["knob"] / found["plain"]))
    return benchlib.report(lines, args.out)




def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--model", default=None, choices=sorted(SHAPES))
    ap.add_argument("--lengths", default=None, help="comma-separated tokens (default: cpu 2048,4096,8192; "
                    "cuda 4096,8192,16384)")
    ap.add_argument("--variants", default="plain,ckpt,osftrt,knob")
    ap.add_argument("--budget-mib", type=float, default=None, help="bisection budget (default: cpu 512, "
                    "cuda 40960; 0: no bisection)")
    ap.add_argument("--bisect-all", action="store_true")
    ap.add_argument("--precision", type=float, default=0.05)
    ap.add_argument("--rank-ratio", type=float, default=0.5)
    ap.add_argument("--no-osft", action="store_true", help="cuda: full fine-tuning on the osftrt variants too")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=None, help="steps per child at the table's lengths (the times: "
                    "their median; bisection probes and the per-layer runs take one); default 3 on the CPU, 1 on "
                    "a GPU (synchronized wall times vary less, and the prepared GPU call has minutes)")
    ap.add_argument("--child-timeout", type=float, default=1800)
    ap.add_argument("--out", default=None)
    ap.add_argument("--from-log", default=None, help="reuse the children's results printed in this earlier "
                    "output of the same script (same commit and arguments): e.g. to bisect within another budget")
    ap.add_argument("--dry-run", action="store_true", help="print the children's commands, run none")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--variant", help=argparse.SUPPRESS)
    ap.add_argument("--tokens", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--layers", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    cuda = args.device == "cuda"
    args.model = args.model or ("8b" if cuda else "tiny")
    args.steps = args.steps or (1 if cuda else 3)
    args.lengths = args.lengths or ("4096,8192,16384" if cuda else "2048,4096,8192")
    if args.budget_mib is None:
        args.budget_mib = 40960 if cuda else 512
    if args.from_log:
        load_log(args.from_log)
    return child(args) if args.child else parent(args)


if __name__ == "__main__":
    sys.exit(main())
