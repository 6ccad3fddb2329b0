#!/usr/bin/env python3
"""One training step of a small Llama on the CPU, as a PyTorch user runs it:
forward, backward, (projection), AdamW step, side by side in one run:

* ``hf``        -- unpatched ``transformers``, full fine-tuning;
* ``peft_osf``  -- PEFT's OSF tuner (``get_peft_model(model, OSFConfig(...))``)
  on the attention and MLP projections at the frozen rank ratio;
* ``osftrt``    -- ``osftrt.transformers.apply_osftrt(model, osft=True)``: the
  same projections as OSFTLinear at the same frozen rank, the fused linear
  cross-entropy, tiled MLPs, and the projector attached (gradient and
  parameter projection inside backward() and step()).

Both OSFT variants train only the low factors (PEFT freezes everything else;
osftrt's run freezes the same set). Each variant runs in its own process so
its memory is its own: step time is the median of --steps timed steps after
--warmup; peak memory is the peak resident set during the timed steps
(VmHWM, reset after the warm-up) above the resident set before them.

    python bench/python/bench_hf_step.py [--out bench/results/hf_step_cpu.md]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from benchlib import machine, report, reset_peak, rss_kib, versions

VARIANTS = ("hf", "peft_osf", "osftrt")
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _model(a):
    import torch
    import transformers

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=a.hidden, intermediate_size=a.intermediate, num_hidden_layers=a.layers,
                                   num_attention_heads=a.heads, num_key_value_heads=a.kv_heads, vocab_size=a.vocab,
                                   max_position_embeddings=a.seq, tie_word_embeddings=False)
    cfg._attn_implementation = "sdpa"
    return transformers.LlamaForCausalLM(cfg).float()


def _prepare(variant, model, a):
    import torch

    if variant == "hf":
        return model, [p for p in model.parameters() if p.requires_grad]
    if variant == "peft_osf":
        from peft import OSFConfig, get_peft_model

        model = get_peft_model(model, OSFConfig(effective_rank=a.rank_ratio, target_modules=TARGETS))
        return model, [p for p in model.parameters() if p.requires_grad]
    import osftrt.transformers as ot

    info = ot.apply_osftrt(model, osft=True, rank_ratio=a.rank_ratio, target_modules=TARGETS)
    factors = {id(p) for m in info.osft_layers.values() for p in (m.u_low, m.s_low, m.v_low)}
    for p in model.parameters():
        p.requires_grad_(id(p) in factors)
    return model, [p for p in model.parameters() if p.requires_grad]


def run_variant(variant, a):
    import torch

    torch.set_num_threads(a.threads)
    model, params = _prepare(variant, _model(a), a)
    opt = torch.optim.AdamW(params, lr=1e-4, foreach=True)
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, a.vocab, (a.batch, a.seq), generator=gen)
    times = []
    for i in range(a.warmup + a.steps):
        if i == a.warmup:
            base = rss_kib("VmRSS")
            reset_peak()
        t0 = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i >= a.warmup:
            times.append(time.perf_counter() - t0)
    peak = rss_kib("VmHWM")
    out = {"variant": variant, "step_ms": 1e3 * statistics.median(times), "step_ms_min": 1e3 * min(times),
           "peak_above_mib": (peak - base) / 1024, "peak_mib": peak / 1024, "loss": loss.item(),
           "trainable": sum(p.numel() for p in params)}
    if variant == "osftrt":
        import osftrt.transformers as ot

        out["orthogonality"] = max(ot.projector_of(model).orthogonality())
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--intermediate", type=int, default=1408)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=16000)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--rank-ratio", type=float, default=0.5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)
    p.add_argument("--out", help="write the table (Markdown) here too")
    a = p.parse_args()
    if a.variant:
        print(json.dumps(run_variant(a.variant, a)))
        return 0
    rows = {}
    for v in VARIANTS:
        cmd = [sys.executable, os.path.abspath(__file__), "--variant", v] + sys.argv[1:]
        env = dict(os.environ, OPENBLAS_NUM_THREADS=str(a.threads), OMP_NUM_THREADS=str(a.threads))
        env.setdefault("TRANSFORMERS_VERBOSITY", "error")
        r = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if r.returncode != 0:
            sys.stderr.write(r.stderr)
            return 1
        rows[v] = json.loads(r.stdout.strip().splitlines()[-1])
    tok = a.batch * a.seq
    lines = [
        "# One training step of a small Llama on the CPU: transformers, PEFT OSF, osftrt",
        "",
        "- machine: %s; %d threads" % (machine(isa=True), a.threads),
        "- " + versions(build_info=True),
        "- model: Llama, hidden %d, intermediate %d, %d layers, %d/%d heads, vocab %d; batch %d x seq %d = %d tokens; "
        "fp32; OSFT on %s at frozen rank ratio %.2f" % (a.hidden, a.intermediate, a.layers, a.heads, a.kv_heads,
                                                      a.vocab, a.batch, a.seq, tok, "/".join(TARGETS), a.rank_ratio),
        "- step: forward + backward + AdamW (+ osftrt's projections); median of %d steps after %d; peak = resident "
        "set during the steps above the one before them, each variant in its own process" % (a.steps, a.warmup),
        "- command: `python bench/python/bench_hf_step.py %s`" % " ".join(sys.argv[1:]),
        "",
        "| variant | trainable | step ms (min) | tokens/s | peak MiB above | vs PEFT OSF time | vs transformers peak |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for v in VARIANTS:
        r = rows[v]
        lines.append("| %s | %d | %.0f (%.0f) | %.0f | %.0f | %.2fx | %.2fx |" % (
            v, r["trainable"], r["step_ms"], r["step_ms_min"], tok / r["step_ms"] * 1e3, r["peak_above_mib"],
            r["step_ms"] / rows["peft_osf"]["step_ms"], r["peak_above_mib"] / rows["hf"]["peak_above_mib"]))
    ratio = rows["osftrt"]["step_ms"] / rows["peft_osf"]["step_ms"]
    mem = rows["osftrt"]["peak_above_mib"] / rows["hf"]["peak_above_mib"]
    lines += ["", "osftrt / PEFT OSF step time: %.2fx (goal <= 0.6x: %s); osftrt / transformers peak memory: %.2fx "
              "(goal < 1: %s); osftrt orthogonality after the steps: %.1e" % (
                  ratio, "met" if ratio <= 0.6 else "missed", mem, "met" if mem < 1 else "missed",
                  rows["osftrt"]["orthogonality"])]
    return report(lines, a.out)


if __name__ == "__main__":
    sys.exit(main())
