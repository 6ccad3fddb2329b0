"""mini_trainer's OSFT training step against the same model on osftrt
(osftrt.integrations.mini_trainer.use_osftrt), each in its own process, on a
Llama built here: mini_trainer's own model code (create_osft_model_class,
its SVD, its optim_wrapper projection) and AdamW, then the step time
(median of the timed steps), the peak resident set above the process before
the model (the model, the optimizer, the step's activations; glibc's
thresholds at 64 KiB so freed blocks do not blur it) and the losses, which
must agree. Variants alternate over --rounds. Also times the decomposition
(osftrt.integrations.mini_trainer.decompose) on 1 and 2 gloo ranks: the SVD
time per rank. Needs rhai-innovation-mini-trainer (build-py312).

  build-py312/bin/python bench/python/bench_integrations_mini_trainer.py [--ratio 0.5 --hidden 512 --out FILE]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import benchlib  # noqa: E402


def config(a):
    import transformers

    return transformers.LlamaConfig(hidden_size=a.hidden, intermediate_size=a.inter, num_hidden_layers=a.layers,
                                    num_attention_heads=a.hidden // 64, num_key_value_heads=a.hidden // 64,
                                    vocab_size=a.vocab, max_position_embeddings=a.seq)


def worker(a):
    import torch
    import transformers
    from mini_trainer.osft_utils import auto_generate_target_osft_config, create_osft_model_class, optim_wrapper

    torch.set_num_threads(a.threads)
    # mini_trainer's loss as its setup_model installs it: per-token losses
    # (reduction "none"), summed and divided by the counted tokens in its loop
    from mini_trainer.none_reduction_losses import hf_fixed_cross_entropy_none_reduction
    from mini_trainer.utils import patch_target_module

    patch_target_module("transformers.loss.loss_utils.fixed_cross_entropy", hf_fixed_cross_entropy_none_reduction)
    base = benchlib.rss_kib()
    torch.manual_seed(0)
    cls = create_osft_model_class(transformers.LlamaForCausalLM)
    model = cls(config(a), initialize_osft=False)
    # unfrozen ratio u: mini_trainer's rank_ratio is the frozen fraction, 1 - u
    model.osft_config = auto_generate_target_osft_config(model, rank_ratio=1.0 - a.unfrozen)
    model.reinitialize_osft(decompose_existing_weights=True)
    if a.variant.startswith("osftrt"):
        from osftrt.integrations.mini_trainer import use_osftrt

        use_osftrt(model, fused_cross_entropy=a.variant != "osftrt-layers", tiled_mlp=a.variant != "osftrt-layers")
    opt = optim_wrapper(torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4), model)
    ids = torch.randint(0, a.vocab, (a.batch, a.seq), generator=torch.Generator().manual_seed(1))
    losses, times = [], []
    for step in range(a.warmup + a.steps):
        if step == a.warmup:
            benchlib.reset_peak()
        t0 = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss.float().sum() / (a.batch * (a.seq - 1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
    print(json.dumps({"step_s": statistics.median(times[a.warmup:]), "peak_kib": benchlib.rss_kib("VmHWM") - base,
                      "losses": losses}), flush=True)
    benchlib.finish_process(0)


def decompose_worker(a):
    import torch
    import torch.distributed as dist
    import transformers

    torch.set_num_threads(1)
    if a.world > 1:
        dist.init_process_group("gloo", init_method="file://" + a.init, rank=a.rank, world_size=a.world)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config(a))
    from osftrt.integrations import mini_trainer as mt

    svd_s, svd_cpu = [], []
    real = torch.linalg.svd

    def timed(*x, **k):
        t0, c0 = time.perf_counter(), time.process_time()
        out = real(*x, **k)
        svd_s.append(time.perf_counter() - t0)
        svd_cpu.append(time.process_time() - c0)
        return out

    torch.linalg.svd = timed
    if a.world > 1:
        dist.barrier()
    t0 = time.perf_counter()
    mt.decompose(model, 1.0 - a.unfrozen)
    total = time.perf_counter() - t0
    print(json.dumps({"svd_s": sum(svd_s), "svd_cpu_s": sum(svd_cpu), "svds": len(svd_s), "total_s": total}),
          flush=True)
    benchlib.finish_process(0)


def run(a, extra, env=None):
    cmd = [sys.executable, os.path.abspath(__file__)] + extra + [
        "--hidden", str(a.hidden), "--inter", str(a.inter), "--layers", str(a.layers), "--vocab", str(a.vocab),
        "--seq", str(a.seq), "--batch", str(a.batch), "--unfrozen", str(a.unfrozen), "--steps", str(a.steps),
        "--warmup", str(a.warmup), "--threads", str(a.threads)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env=dict(os.environ, **(env or {})))


def result(p):
    out, _ = p.communicate()
    if p.returncode != 0:
        raise RuntimeError("a worker failed:\n" + out[-3000:])
    return json.loads(out.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for k, v in (("hidden", 512), ("inter", 1376), ("layers", 4), ("vocab", 8192), ("seq", 512), ("batch", 2),
                 ("steps", 4), ("warmup", 1), ("threads", 2), ("rounds", 3), ("rank", 0), ("world", 1)):
        ap.add_argument("--" + k, type=int, default=v)
    ap.add_argument("--unfrozen", type=float, default=0.5)
    ap.add_argument("--variant")
    ap.add_argument("--decompose", action="store_true")
    ap.add_argument("--init")
    ap.add_argument("--out")
    a = ap.parse_args()
    if a.decompose:
        return decompose_worker(a)
    if a.variant:
        return worker(a)
    res = {"mini_trainer": [], "osftrt": [], "osftrt-layers": []}
    for _ in range(a.rounds):
        for v in res:
            res[v].append(result(run(a, ["--variant", v], benchlib.LEAN_MALLOC)))
    mt_step = statistics.median(r["step_s"] for r in res["mini_trainer"])
    os_step = statistics.median(r["step_s"] for r in res["osftrt"])
    mt_peak = statistics.median(r["peak_kib"] for r in res["mini_trainer"])
    os_peak = statistics.median(r["peak_kib"] for r in res["osftrt"])
    ly_step = statistics.median(r["step_s"] for r in res["osftrt-layers"])
    ly_peak = statistics.median(r["peak_kib"] for r in res["osftrt-layers"])
    drift = max(abs(x - y) / abs(x) for v in ("osftrt", "osftrt-layers")
                for x, y in zip(res["mini_trainer"][0]["losses"], res[v][0]["losses"]))
    dec = {}
    for world in (1, 2):
        init = tempfile.mktemp(prefix="osftrt-bench-init-")
        ps = [run(a, ["--decompose", "--world", str(world), "--rank", str(r), "--init", init],
                  {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}) for r in range(world)]
        dec[world] = [result(p) for p in ps]
    lines = ["# mini_trainer's OSFT step: its own model code vs the same model on osftrt", "",
             "machine: %s; %s; load average %s" % (benchlib.machine(), benchlib.versions(),
                                                   " ".join("%.1f" % x for x in os.getloadavg())),
             "model: Llama hidden %d, intermediate %d, %d layers, vocabulary %d; batch %d x %d tokens; unfrozen ratio "
             "%.2f (mini_trainer rank_ratio %.2f); AdamW; %d threads; %d rounds x %d timed steps, medians" % (
                 a.hidden, a.inter, a.layers, a.vocab, a.batch, a.seq, a.unfrozen, 1 - a.unfrozen, a.threads, a.rounds,
                 a.steps), "",
             "| variant | step (s) | peak above the process (MiB) |", "| --- | ---: | ---: |",
             "| mini_trainer (its model code, its projection, its per-token loss) | %.3f | %.0f |" % (mt_step, mt_peak / 1024),
             "| osftrt, OSFT layers only (use_osftrt(fused_cross_entropy=False, tiled_mlp=False)) | %.3f (%.2fx) "
             "| %.0f (%.2fx) |" % (ly_step, ly_step / mt_step, ly_peak / 1024, ly_peak / mt_peak),
             "| osftrt (use_osftrt: OSFT layers, projector, fused loss, tiled MLPs) | %.3f | %.0f |" % (
                 os_step, os_peak / 1024),
             "| **ratio (use_osftrt / mini_trainer)** | **%.2fx** | **%.2fx** |" % (os_step / mt_step, os_peak / mt_peak),
             "",
             "losses: max relative difference over %d steps %.1e" % (len(res["osftrt"][0]["losses"]), drift), "",
             "decomposition (osftrt.integrations.mini_trainer.decompose, float64 SVD, 1 thread per rank):", "",
             "| ranks | SVDs per rank | SVD CPU time per rank (s) | SVD wall time per rank (s) | set-up per rank (s) |",
             "| ---: | --- | --- | --- | --- |"]
    for world, rs in dec.items():
        lines.append("| %d | %s | %s | %s | %s |" % (world, ", ".join(str(r["svds"]) for r in rs),
                                                ", ".join("%.2f" % r["svd_cpu_s"] for r in rs),
                                                ", ".join("%.2f" % r["svd_s"] for r in rs),
                                                ", ".join("%.2f" % r["total_s"] for r in rs)))
    benchlib.report(lines, a.out)


if __name__ == "__main__":
    main()
