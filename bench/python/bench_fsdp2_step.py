#!/usr/bin/env python3
"""One FSDP2 training step of a small Llama on 2 CPU processes (gloo), OSFT
layers sharded by ``fully_shard``, with three ways to keep the updates
orthogonal to the frozen subspace -- on the same sharded model:

* ``none``      -- no projection (the floor: what FSDP2 + OSFT cost alone);
* ``peft_osf``  -- PEFT OSF's distributed path,
  ``peft.tuners.osf.utils.project_gradient_to_orthogonal_space`` called for
  every layer on its sharded gradients (an optimizer step pre-hook): per
  layer one all-reduce of the r x l U coefficients and one of the K x K
  Gram matrix of V_high, i.e. 2 collectives per layer and step, gradients
  only (PEFT has no parameter projection). PEFT's own gradient hooks do not
  run under FSDP2 at all (fully_shard replaces the parameters they were
  registered on), so this is the path a PEFT OSF user has;
* ``osftrt``    -- ``osftrt.torch.distributed.shard_aware_projector``:
  gradients (before step) and parameters (after step) of all layers in one
  library call each, one all-reduce per call; V_high's rows gathered once.

The model: ``osftrt.transformers.apply_osftrt(osft=True)`` (OSFT layers,
fused cross-entropy, tiled MLPs), ``prepare_fsdp2``, ``fully_shard`` per
decoder layer and on the root; AdamW. Both processes run every variant in
turns (round robin per step, so drift hits all alike); time per step is the
slower rank's, median over the timed steps. Collectives and bytes: what the
projection path hands to collectives per step and rank (FSDP2's own
all-gathers and reduce-scatters are the same for all variants and not
counted).

    python bench/python/bench_fsdp2_step.py [--out bench/results/fsdp2_step_cpu.md]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from benchlib import finish_process, machine, report, versions

VARIANTS = ("none", "peft_osf", "osftrt")


class _Counting:
    """torch.distributed as PEFT's OSF utils see it, counting all_reduce."""

    def __init__(self, dist):
        self._dist = dist
        self.calls = 0
        self.bytes = 0

    def all_reduce(self, t, *a, **k):
        self.calls += 1
        self.bytes += t.numel() * t.element_size()
        return self._dist.all_reduce(t, *a, **k)

    def __getattr__(self, name):
        return getattr(self._dist, name)


def _build(a, variant):
    import torch
    import transformers
    from torch.distributed.fsdp import fully_shard

    import osftrt.transformers as otf
    from osftrt.torch.distributed import prepare_fsdp2, shard_aware_projector

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=a.hidden, intermediate_size=a.intermediate, num_hidden_layers=a.layers,
                                   num_attention_heads=a.heads, num_key_value_heads=a.kv_heads, vocab_size=a.vocab,
                                   max_position_embeddings=a.seq, tie_word_embeddings=False)
    cfg._attn_implementation = "sdpa"
    model = transformers.LlamaForCausalLM(cfg).float()
    otf.apply_osftrt(model, osft=True, rank_ratio=a.rank_ratio, attach=False)
    otf.projector_of(model).close()
    prepare_fsdp2(model)
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    # the orthogonality meter (and osftrt's projector)
    proj = shard_aware_projector(model)
    v = {"model": model, "opt": opt, "proj": proj, "grads_s": 0.0, "params_s": 0.0}

    def timed(fn, key):
        def run(*args):
            t = time.perf_counter()
            out = fn(*args)
            v[key] += time.perf_counter() - t
            return out

        return run

    if variant == "osftrt":
        proj.project_gradients = timed(proj.project_gradients, "grads_s")
        proj.project_parameters = timed(proj.project_parameters, "params_s")
        proj.attach(opt)
    elif variant == "peft_osf":
        import peft.tuners.osf.utils as pu

        import osftrt.torch as ot

        if not isinstance(pu.dist, _Counting):
            pu.dist = _Counting(pu.dist)
        v["counter"] = pu.dist
        dicts = [{"U_high": m.u_high, "V_high": m.v_high, "U_low": m.u_low, "S_low": m.s_low, "V_low": m.v_low}
                 for m in model.modules() if isinstance(m, ot.OSFTLinear)]

        def pre(opt, args, kwargs):
            for d in dicts:
                pu.project_gradient_to_orthogonal_space(d)

        opt.register_step_pre_hook(timed(pre, "grads_s"))
    return v


def _worker(rank, world, init, a):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(a.threads)
    dist.init_process_group("gloo", init_method="file://" + init, rank=rank, world_size=world)
    g = torch.Generator().manual_seed(1)
    text = torch.randint(0, a.vocab, (a.batch * world, a.seq), generator=g)[a.batch * rank : a.batch * (rank + 1)]
    runs = {n: _build(a, n) for n in VARIANTS}
    times = {n: [] for n in VARIANTS}
    optim = {n: [] for n in VARIANTS}
    projt = {n: [] for n in VARIANTS}
    coll = {}
    for step in range(a.warmup + a.steps):
        for n in VARIANTS:
            r = runs[n]
            model, opt, proj = r["model"], r["opt"], r["proj"]
            s0 = proj.stats()
            p0 = (r["grads_s"], r["params_s"])
            c0 = r["counter"].calls if "counter" in r else 0
            b0 = r["counter"].bytes if "counter" in r else 0
            dist.barrier()
            t = time.perf_counter()
            loss = model(input_ids=text, labels=text).loss
            loss.backward()
            o = time.perf_counter()
            opt.step()
            opt.zero_grad()
            e = time.perf_counter()
            dt = torch.tensor([e - t, e - o, r["grads_s"] - p0[0], r["params_s"] - p0[1]])
            dist.all_reduce(dt, op=dist.ReduceOp.MAX)
            s1 = proj.stats()
            if step >= a.warmup:
                times[n].append(dt[0].item())
                optim[n].append(dt[1].item())
                projt[n].append((dt[2].item(), dt[3].item()))
                coll[n] = {
                    "collectives": (s1["allreduce_calls"] - s0["allreduce_calls"] + s1["allgather_calls"] - s0["allgather_calls"]
                                    + (r["counter"].calls - c0 if "counter" in r else 0)),
                    "bytes": (s1["allreduce_bytes"] - s0["allreduce_bytes"] + s1["allgather_bytes"] - s0["allgather_bytes"]
                              + (r["counter"].bytes - b0 if "counter" in r else 0)),
                }
    out = {}
    for n in VARIANTS:
        proj = runs[n]["proj"]
        out[n] = dict(coll[n], step_ms=1e3 * statistics.median(times[n]), step_ms_min=1e3 * min(times[n]),
                      opt_ms=1e3 * statistics.median(optim[n]), orthogonality=max(proj.orthogonality()),
                      grads_ms=1e3 * statistics.median(x[0] for x in projt[n]),
                      params_ms=1e3 * statistics.median(x[1] for x in projt[n]), blas=_blas_core(),
                      layers=proj.info()["layers"])
    for n in VARIANTS:
        runs[n]["proj"].close()
    dist.barrier()
    dist.destroy_process_group()
    return out


def _blas_core():
    """The CPU kernel set the system OpenBLAS (the library's BLAS) picked."""
    import ctypes

    try:
        lib = ctypes.CDLL("libopenblas.so.0")
        lib.openblas_get_corename.restype = ctypes.c_char_p
        return lib.openblas_get_corename().decode()
    except Exception:
        return "?"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--intermediate", type=int, default=688)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--batch", type=int, default=2, help="sequences per rank")
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--rank-ratio", type=float, default=0.5)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--threads", type=int, default=1, help="threads per process")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    p.add_argument("--openblas-coretype", help="OPENBLAS_CORETYPE for the workers (e.g. SkylakeX where OpenBLAS "
                   "mis-detects the CPU)")
    p.add_argument("--out", help="write the table (Markdown) here too")
    a = p.parse_args()
    if a.worker:
        rank, init = int(a.worker[0]), a.worker[1]
        res = _worker(rank, a.world, init, a)
        if rank == 0:
            print("RESULT " + json.dumps(res))
        return finish_process(0)  # the exit status the parent reads is the worker's own
    with tempfile.TemporaryDirectory() as tmp:
        init = os.path.join(tmp, "init")
        env = dict(os.environ, OPENBLAS_NUM_THREADS=str(a.threads), OMP_NUM_THREADS=str(a.threads))
        if a.openblas_coretype:
            env["OPENBLAS_CORETYPE"] = a.openblas_coretype
        args = [a for a in sys.argv[1:]]
        procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", str(r), init] + args,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
                 for r in range(a.world)]
        outs = [pr.communicate() for pr in procs]
    for pr, (o, e) in zip(procs, outs):
        if pr.returncode != 0:
            sys.stderr.write(o + e)
            return 1
    rows = json.loads(next(l for l in outs[0][0].splitlines() if l.startswith("RESULT "))[7:])
    n = rows["osftrt"]["layers"]
    lines = [
        "# One FSDP2 training step with OSFT on %d CPU processes: no projection, PEFT OSF's per-layer path, osftrt"
        % a.world,
        "",
        "- machine: %s; %d process(es) x %d thread(s), gloo over loopback" % (machine(), a.world, a.threads),
        "- " + versions(),
        "- model: Llama, hidden %d, intermediate %d, %d layers, %d/%d heads, vocab %d, fp32; %d OSFT layers (q, k, v, "
        "o, gate, up, down) at frozen rank ratio %.2f, patched by apply_osftrt; prepare_fsdp2 + fully_shard per "
        "decoder layer and root; %d x %d tokens per rank; AdamW" % (
            a.hidden, a.intermediate, a.layers, a.heads, a.kv_heads, a.vocab, n, a.rank_ratio, a.batch, a.seq),
        "- step: forward + backward + optimizer step (with the projection hooks); the slower rank's time, median "
        "of %d steps after %d, variants taking turns every step" % (a.steps, a.warmup),
        "- collectives / bytes: launched by the projection per step and rank (FSDP2's own are the same for all)",
        "- command: `python bench/python/bench_fsdp2_step.py %s`" % " ".join(sys.argv[1:]),
        "",
        "| variant | step ms (min) | projection ms: gradients + parameters | projection collectives / step | "
        "bytes / step | orthogonality after | step vs PEFT OSF |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for v in VARIANTS:
        r = rows[v]
        lines.append("| %s | %.1f (%.1f) | %.1f + %.1f | %d | %d | %.1e | %.2fx |" % (
            v, r["step_ms"], r["step_ms_min"], r["grads_ms"], r["params_ms"], r["collectives"], r["bytes"],
            r["orthogonality"], r["step_ms"] / rows["peft_osf"]["step_ms"]))
    o, pf = rows["osftrt"], rows["peft_osf"]
    lines += [
        "",
        "osftrt: %d collective(s) per step for %d layers (gradients and parameters: one all-reduce each), PEFT OSF: "
        "%d (gradients only); bytes %d vs %d (%.1fx fewer); step time %.2fx of PEFT OSF's; gradient projection "
        "%.1f ms vs %.1f ms (%.2fx), osftrt's parameter projection (PEFT has none) %.1f ms. Library BLAS core: %s." % (
            o["collectives"], n, pf["collectives"], o["bytes"], pf["bytes"], pf["bytes"] / max(o["bytes"], 1),
            o["step_ms"] / pf["step_ms"], o["grads_ms"], pf["grads_ms"], o["grads_ms"] / pf["grads_ms"],
            o["params_ms"], o["blas"]),
        "Orthogonality after the steps (max|U_high^T U_low|, |V_low V_high^T|): without the parameter projection "
        "AdamW's per-element scaling leaks into the frozen subspace (PEFT OSF, none); osftrt keeps it at fp32 "
        "round-off.",
    ]
    return report(lines, a.out)


if __name__ == "__main__":
    sys.exit(main())
