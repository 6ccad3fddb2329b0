#!/usr/bin/env python3
"""One training step of a Llama as a PyTorch user runs it -- forward,
backward, (projection), AdamW step -- in six variants (issue 36), each in its
own process, same model, data and seed:

1. ``hf``            plain ``transformers``, full fine-tuning;
2. ``liger``         the same patched by Liger-Kernel
   (``apply_liger_kernel_to_llama``; Triton: GPU only, skipped elsewhere);
3. ``osftrt``        the same patched by ``apply_osftrt(model)`` (fused linear
   cross-entropy + tiled MLP), full fine-tuning;
4. ``peft_osf``      PEFT's OSF tuner at the rank ratio on the seven
   projections (q, k, v, o, gate, up, down);
5. ``osftrt_osft``   ``apply_osftrt(model, osft=True, rank_ratio=...)`` with
   the attached projector (gradients projected before the step, parameters after
   step); the same trainable set as (4);
6. ``osftrt_fsdp2``  (5) under FSDP2 (``prepare_fsdp2``, ``fully_shard`` per
   decoder layer and root, ``shard_aware_projector``) in one process: NCCL on
   a GPU, gloo on the CPU.

--device cuda: a Llama-3.2-1B-shaped model by default (hidden 2048, 16
layers, 32/8 heads, intermediate 8192, vocabulary 128256; random weights),
sequence 4096, bf16 as ``Trainer(bf16=True)`` runs it (fp32 weights and AdamW
states, ``torch.autocast`` bf16; FSDP2: ``MixedPrecisionPolicy(bf16, fp32
reduce)``); peak memory is ``torch.cuda.max_memory_allocated`` over the
timed steps. --device cpu: a small model in fp32; two peaks of the resident
set: above the one before the timed steps (what a step allocates), and above
the one before the model was built (with what the model, the optimizer's
state and the library's caches hold); --lean-malloc for figures that freed
blocks do not blur. Step time: the median of --steps timed steps
after --warmup (each step synchronized). The losses: the first step's
(before any update) and the last timed step's; (1) vs (3) and (4) vs (5)
compared. Orthogonality, max(|U_high^T U_low|, |V_low V_high^T|) over every
layer after the steps: (4) from PEFT's factors (its frozen part recovered by
``osftrt.peft.peft_frozen_factors``), (5) and (6) from the projector.

--micro-batches N: N forward+backward passes (gradient accumulation) per
optimizer step, the step time covering all of them. Beside each time: the
variant's GEMM flops per optimizer step (forward, backward, the rebuilds of
the OSFT layers' dense W, the projections), counted from the model's shapes,
the library's strategy per layer (osft_flinear_choose_strategy) and what the
run did (OSFTLinear.info()'s rebuilds, the projector's projections, averaged
over the timed steps), and the time per GEMM flop against full fine-tuning's
(variants 1, 3, 4 and 5: PEFT OSF's from its layers' shapes, the frozen W,
the rank-2l delta and the gradient hooks at every backward; n/a for Liger and
FSDP2).

--profile adds one step after the timed ones, timed per phase (CUDA events
on the GPU): attention (the self-attention modules, their projections
included), MLP, head + loss (the top-level forward after the decoder, and
backward until the gradient reaches the decoder), projection (osftrt's
gradient and parameter projection; PEFT's gradient hooks, taken out of the
attention and MLP backward they run in), optimizer (the step, less the
projection inside it) and other (embeddings, norms, residuals, FSDP2's
collectives, zero_grad). Where nothing below a layer trains (OSFT variants)
layer 0's attention backward shows under other. With --out, the rows so far
are also written to OUT.json after every variant (a run cut short keeps them).

    python bench/python/bench_hf_step.py --device cuda [--profile] [--out bench/results/hf_step_h100.md]
    python bench/python/bench_hf_step.py --device cpu --tiny          # dry run of all six
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

from benchlib import (LEAN_MALLOC, finish_process, machine, memory_now, memory_peak, memory_start, report, sync,
                      versions)

VARIANTS = ("hf", "liger", "osftrt", "peft_osf", "osftrt_osft", "osftrt_fsdp2")
LABELS = {
    "hf": "1. transformers, full FT",
    "liger": "2. Liger-Kernel, full FT",
    "osftrt": "3. apply_osftrt(model), full FT",
    "peft_osf": "4. PEFT OSF",
    "osftrt_osft": "5. apply_osftrt(osft=True)",
    "osftrt_fsdp2": "6. (5) under FSDP2",
}
OSFT_VARIANTS = ("peft_osf", "osftrt_osft", "osftrt_fsdp2")
COUNTED_VARIANTS = ("hf", "osftrt", "peft_osf", "osftrt_osft")  # GEMM flops counted
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
PHASES = ("attention", "mlp", "head_loss", "projection", "optimizer", "other")

# model and run sizes per device; --tiny: a dry run in seconds
SIZES = {
    "cuda": dict(hidden=2048, intermediate=8192, layers=16, heads=32, kv_heads=8, vocab=128256, batch=1, seq=4096,
                 precision="bf16", warmup=3, steps=10),
    "cpu": dict(hidden=512, intermediate=1408, layers=4, heads=8, kv_heads=4, vocab=16000, batch=2, seq=512,
                precision="fp32", warmup=2, steps=5),
    "tiny": dict(hidden=64, intermediate=160, layers=2, heads=4, kv_heads=2, vocab=512, batch=2, seq=64,
                 precision=None, warmup=1, steps=2),
}


class Skip(Exception):
    """A variant that cannot run here (the reason goes into the table)."""


# --------------------------------------------------------------- the model
def _config(a):
    import transformers

    cfg = transformers.LlamaConfig(hidden_size=a.hidden, intermediate_size=a.intermediate, num_hidden_layers=a.layers,
                                   num_attention_heads=a.heads, num_key_value_heads=a.kv_heads, vocab_size=a.vocab,
                                   max_position_embeddings=max(a.seq, 2048), tie_word_embeddings=False)
    cfg._attn_implementation = "sdpa"
    return cfg


def _model(a):
    """The random model, fp32, built on the device (same seed: same weights)."""
    import torch
    import transformers

    torch.manual_seed(0)
    with torch.device(a.device):
        return transformers.LlamaForCausalLM(_config(a)).float()


def _freeze_all_but(model, params):
    keep = {id(p) for p in params}
    for p in model.parameters():
        p.requires_grad_(id(p) in keep)


def _low_factors(layers):
    return [p for m in layers for p in (m.u_low, m.s_low, m.v_low)]


def _liger():
    try:
        from liger_kernel.transformers import apply_liger_kernel_to_llama
    except ImportError as e:
        raise Skip("liger_kernel not importable (%s)" % e)
    return apply_liger_kernel_to_llama


def _fsdp2(a, model):
    """(6): init a one-process group, shard, the shard-aware projector."""
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    import osftrt.transformers as otf
    from osftrt.torch.distributed import prepare_fsdp2, shard_aware_projector

    init = os.path.join(tempfile.mkdtemp(), "init")
    dist.init_process_group("nccl" if a.device == "cuda" else "gloo", init_method="file://" + init, rank=0,
                            world_size=1)
    info = otf.apply_osftrt(model, osft=True, rank_ratio=a.rank_ratio, target_modules=TARGETS, projector=False)
    _freeze_all_but(model, _low_factors(info.osft_layers.values()))
    prepare_fsdp2(model)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if a.precision == "bf16" \
        else MixedPrecisionPolicy()
    for layer in model.model.layers:
        fully_shard(layer, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    return model, shard_aware_projector(model)


def _mlp_budget(a):
    return None if a.mlp_memory_budget is None else int(a.mlp_memory_budget * 2**20)


def _mlp_recomputes(model, tokens):
    """[whether the backward of each tiled MLP recomputes its forward]
    (osft_mlp_get_plan: not where its memory budget holds every tile's
    intermediates), in the order of the decoder layers."""
    from osftrt import capi

    out = []
    for m in model.modules():
        plan = getattr(m, "_osftrt_plan", None)
        if plan is None:
            continue
        p = capi.osft_mlp_plan_t()
        capi.osft_mlp_get_plan(plan._handle, tokens, plan.num_tiles, p)
        out.append(bool(p.recompute))
    return out


def prepare(variant, a):
    """(model, the trainable parameters, the projector or None, the
    LlamaForCausalLM inside) of a variant; raises Skip where it cannot run."""
    if variant == "liger":
        if a.device != "cuda":
            raise Skip("Liger's Triton kernels need a GPU")
        _liger()()  # patches the Llama classes before the model is built
    model = _model(a)
    proj = None
    if variant == "peft_osf":
        from peft import OSFConfig, get_peft_model

        model = get_peft_model(model, OSFConfig(effective_rank=a.rank_ratio, target_modules=TARGETS))
    elif variant == "osftrt":
        import osftrt.transformers as otf

        otf.apply_osftrt(model, mlp_memory_budget=_mlp_budget(a))
    elif variant == "osftrt_osft":
        import osftrt.transformers as otf

        info = otf.apply_osftrt(model, osft=True, rank_ratio=a.rank_ratio, target_modules=TARGETS, attach=False,
                                mlp_memory_budget=_mlp_budget(a))
        _freeze_all_but(model, _low_factors(info.osft_layers.values()))
        proj = otf.projector_of(model)
    elif variant == "osftrt_fsdp2":
        model, proj = _fsdp2(a, model)
    inner = model.get_base_model() if variant == "peft_osf" else model
    return model, [p for p in model.parameters() if p.requires_grad], proj, inner


# ------------------------------------------------------- GEMM flop count
def _linear_shapes(a):
    """{name: (N out, K in)} of a decoder layer's seven projections."""
    kv = a.kv_heads * (a.hidden // a.heads)
    return {"q_proj": (a.hidden, a.hidden), "k_proj": (kv, a.hidden), "v_proj": (kv, a.hidden),
            "o_proj": (a.hidden, a.hidden), "gate_proj": (a.intermediate, a.hidden),
            "up_proj": (a.intermediate, a.hidden), "down_proj": (a.hidden, a.intermediate)}


def _osft_pass_flops(m, t, dx):
    """(forward, backward) GEMM flops of one OSFTLinear call on t tokens with
    the strategies the library chooses (include/osftrt/flinear.h); the
    rebuild of W is counted apart. dx: whether grad_x is computed."""
    from osftrt import capi

    n, k, r, l = m.out_features, m.in_features, m.rank, m.s_low.shape[0]
    kk = r + l
    h = m._layer_handle()
    fs = capi.osft_flinear_choose_strategy(h, t, capi.OSFT_FLINEAR_FORWARD)
    bs = capi.osft_flinear_choose_strategy(h, t, capi.OSFT_FLINEAR_BACKWARD)
    fwd = 2 * t * kk * (n + k) if fs == capi.OSFT_FLINEAR_FACTORIZED else 2 * t * n * k
    if bs == capi.OSFT_FLINEAR_DENSE:
        bwd = (2 * t * n * k if dx else 0) + 2 * t * n * k + 4 * n * k * l
    elif bs == capi.OSFT_FLINEAR_HYBRID:
        bwd = (2 * t * n * k if dx else 0) + 4 * t * l * (n + k)
    else:  # factorized: A = g U (g U_low without dx), A V, x V_low^T, dV_low, dU_low
        bwd = 2 * t * n * (kk if dx else l) + (2 * t * kk * k if dx else 0) + 4 * t * k * l + 2 * t * n * l
    return fwd, bwd


def _peft_pass_flops(n, k, l, t, dx):
    """(forward, backward) GEMM flops of one PEFT OSF linear call on t tokens
    (peft/tuners/osf/layer.py): the frozen dense W plus its rank-2l delta
    (x B^T) A^T, B = [V_low; V_low_init], A = [U_low S_low, -U_low_init
    S_low_init]; autograd differentiates the whole of A and B."""
    fwd = 2 * t * n * k + 4 * t * l * (n + k)
    bwd = 8 * t * l * n + 4 * t * l * k + (2 * t * n * k + 4 * t * l * k if dx else 0)
    return fwd, bwd


def _peft_hook_flops(n, k, r, l):
    """GEMM flops of one PEFT OSF layer's gradient hooks (they run at every
    backward): against U_low_init / V_low_init where that factor is square,
    else against U_high / V_high."""
    u = 4 * n * l * (l if n <= k else r)
    v = 4 * k * l * (l if n >= k else r)
    return u + v


def gemm_flops(variant, a, model, proj, counts, recomputes):
    """GEMM flops per optimizer step {forward, backward, rebuild, projections,
    total}, or None where not counted. counts: {"rebuilds", "gradients",
    "parameters", "rebuild_flops"} per optimizer step, measured (PEFT OSF's
    "gradients": its hooks' runs); recomputes: _mlp_recomputes() (empty for
    transformers' own MLPs)."""
    if variant not in COUNTED_VARIANTS:
        return None
    from osftrt.torch import OSFTLinear

    t, mb = a.batch * a.seq, a.micro_batches
    fwd = bwd = rebuild = projections = 0
    # attention (SDPA): Q K^T and P V, 2*S*H each per token; backward twice
    att = 4 * t * a.seq * a.hidden * a.layers
    fwd, bwd = att, 2 * att
    osft = {n: m for n, m in model.named_modules() if isinstance(m, OSFTLinear) or hasattr(m, "osf_svd_params")}
    if variant == "peft_osf" and not all(hasattr(m, "_osf_U_low_init") for m in osft.values()):
        return None  # another PEFT OSF layout than the one _peft_pass_flops counts (peft 0.21's)
    # apply_osftrt's tiled MLP recomputes gate and up in the backward, unless its budget holds them
    recomputes = recomputes or [False] * a.layers
    for i in range(a.layers):
        for name, (n, k) in _linear_shapes(a).items():
            m = next((m for q, m in osft.items() if q.endswith("layers.%d.mlp.%s" % (i, name))
                      or q.endswith("layers.%d.self_attn.%s" % (i, name))), None)
            dx = not (osft and i == 0 and name in ("q_proj", "k_proj", "v_proj"))  # nothing below trains
            if m is None:
                f, b = 2 * t * n * k, (4 if dx else 2) * t * n * k
            elif not isinstance(m, OSFTLinear):  # PEFT OSF
                r = next(iter(m.effective_rank.values()))
                l = min(n, k) - r
                f, b = _peft_pass_flops(n, k, l, t, dx)
                projections += _peft_hook_flops(n, k, r, l) * counts["gradients"]
            else:
                f, b = _osft_pass_flops(m, t, dx)
                r, l = m.rank, m.s_low.shape[0]
                # one call of each projection covers every layer: 4*r*l*(N+K) per layer
                projections += 4 * r * l * (n + k) * (counts["gradients"] + counts["parameters"])
            fwd += f
            bwd += b + (f if recomputes[i] and name in ("gate_proj", "up_proj") else 0)
    rebuild = counts["rebuild_flops"]
    head = 2 * t * a.vocab * a.hidden  # the head is frozen under OSFT: no weight gradient
    fwd, bwd = fwd + head, bwd + (head if osft else 2 * head)
    out = {"forward": mb * fwd, "backward": mb * bwd, "rebuild": rebuild, "projections": projections}
    out["total"] = sum(out.values())
    return out


def _rebuild_flops(m, i):
    """The GEMM flops of an OSFTLinear's rebuilds of W so far, from its
    counters: a layer that updates its kept W in place (2*l*(N+K) <= N*K,
    include/osftrt/flinear.h, "Memory") pays 4*N*K*l per update and
    2*N*K*(r+l) per full build; else 2*N*K*l per rebuild and 2*N*K*r per
    build of the frozen cache. i: m.info()."""
    n, k, r, l = m.out_features, m.in_features, m.rank, m.s_low.shape[0]
    full, rebuilds = i["frozen_builds"], i["rebuilds"]
    if 2 * l * (n + k) <= n * k:
        return full * 2 * n * k * (r + l) + (rebuilds - full) * 4 * n * k * l
    return full * 2 * n * k * r + rebuilds * 2 * n * k * l


def _osft_counts(model, proj):
    from osftrt.torch import OSFTLinear

    infos = [(m, m.info()) for m in model.modules() if isinstance(m, OSFTLinear)]
    p = proj.projections if proj is not None else {}
    return {"rebuilds": sum(i["rebuilds"] for _, i in infos), "gradients": p.get("gradients", 0),
            "parameters": p.get("parameters", 0), "rebuild_flops": sum(_rebuild_flops(m, i) for m, i in infos)}


# ------------------------------------------------------------ the profile
class Clock:
    """Spans of named phases: CUDA events on the GPU (read after a
    synchronize), perf_counter on the CPU."""

    def __init__(self, cuda):
        import torch

        self.torch, self.cuda = torch, cuda
        self.open, self.spans = {}, {}

    def _now(self):
        if self.cuda:
            e = self.torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def start(self, key):
        self.open.setdefault(key, []).append(self._now())

    def stop(self, key):
        if self.open.get(key):
            self.spans.setdefault(key, []).append((self.open[key].pop(), self._now()))

    def _dur(self, s, e):
        return s.elapsed_time(e) if self.cuda else 1e3 * (e - s)

    def ms(self):
        """{phase: total ms}."""
        if self.cuda:
            self.torch.cuda.synchronize()
        return {k: sum(self._dur(s, e) for s, e in v) for k, v in self.spans.items()}

    def ms_within(self, key, outer):
        """The ms of `key`'s spans that lie inside one of `outer`'s."""
        return sum(self._dur(s, e) for s, e in self.spans.get(key, ())
                   if any(self._dur(os_, s) >= 0 and self._dur(e, oe) >= 0 for os_, oe in self.spans.get(outer, ())))


def _hook_phase(clock, module, key, handles):
    """Times module's forward and backward (full backward hooks) as `key`."""
    handles += [
        module.register_forward_pre_hook(lambda m, args: clock.start(key)),
        module.register_forward_hook(lambda m, args, out: clock.stop(key)),
        module.register_full_backward_pre_hook(lambda m, g: clock.start(key)),
        module.register_full_backward_hook(lambda m, gi, go: clock.stop(key)),
    ]


def _wrap(obj, name, clock, key):
    fn = getattr(obj, name)

    def timed(*args, **kwargs):
        clock.start(key)
        try:
            return fn(*args, **kwargs)
        finally:
            clock.stop(key)

    setattr(obj, name, timed)
    return lambda: setattr(obj, name, fn)


def _peft_hooks_timed(model, clock, handles):
    """PEFT's gradient hooks re-registered between two timing hooks."""
    from peft.tuners.osf.layer import OSFLayer

    for m in model.modules():
        if isinstance(m, OSFLayer):
            m._detach_hooks()
            for adapter, params in m.osf_svd_params.items():
                for n in ("U_low", "V_low"):
                    handles.append(params[n].register_hook(lambda g: (clock.start("projection"), g)[1]))
                m._attach_hooks(adapter)
                for n in ("U_low", "V_low"):
                    handles.append(params[n].register_hook(lambda g: (clock.stop("projection"), g)[1]))


def profile_step(variant, a, model, inner, opt, proj, batch):
    """One step timed per phase: {phase of PHASES: ms, "step": ms}. Each
    span of the projection lies inside another phase's (PEFT's hooks in the
    attention and MLP backward, osftrt's parameter projection in the
    optimizer step) or in none (osftrt's end-of-backward gradient
    projection): it is taken out of that phase."""
    clock = Clock(a.device == "cuda")
    handles, undo = [], []
    for layer in inner.model.layers:
        _hook_phase(clock, layer.self_attn, "attention", handles)
        _hook_phase(clock, layer.mlp, "mlp", handles)

    def decoder_done(m, args, out):  # head + loss: from here, and back until the gradient reaches this output
        clock.start("head_loss")
        if out[0].requires_grad:
            out[0].register_hook(lambda g: clock.stop("head_loss"))

    handles += [inner.model.register_forward_hook(decoder_done),
                inner.register_forward_hook(lambda m, args, out: clock.stop("head_loss"))]
    if proj is not None:  # wrapped, then attached again: attach() binds the methods
        undo += [_wrap(proj, "project_gradients", clock, "projection"),
                 _wrap(proj, "project_parameters", clock, "projection")]
        proj.attach(opt)
    elif variant == "peft_osf":
        _peft_hooks_timed(model, clock, handles)
    # layer 0 of an OSFT variant: nothing below it trains (see the module doc)
    warnings.filterwarnings("ignore", message="Full backward hook is firing when gradients are computed with respect "
                            "to module outputs since no inputs require gradients")
    sync(a.device)
    clock.start("step")
    with _autocast(a):
        loss = model(input_ids=batch, labels=batch).loss
    clock.start("head_loss")
    loss.backward()
    clock.start("optimizer")
    opt.step()
    clock.stop("optimizer")
    opt.zero_grad(set_to_none=True)
    clock.stop("step")
    ms = clock.ms()
    out = {k: ms.get(k, 0.0) for k in PHASES if k != "other"}
    for k in ("attention", "mlp", "optimizer"):
        out[k] -= clock.ms_within("projection", k)
    out["other"] = ms["step"] - sum(out.values())
    out["step"] = ms["step"]
    for h in handles:
        h.remove()
    for u in undo:
        u()
    return out


# ------------------------------------------------------------ one variant
def timed_steps(a, model, opt, batch_at, autocast, at_start, micro_batches=1):
    """a.warmup + a.steps optimizer steps of a causal LM: each micro_batches
    forward and backward passes over batch_at(step, micro) (token ids, their
    own labels) under autocast(), then opt.step(); at_start() runs just
    before the first timed step. Returns (seconds of each timed step,
    synchronized; every step's last micro-batch loss)."""
    times, losses = [], []
    for i in range(a.warmup + a.steps):
        if i == a.warmup:
            at_start()
        sync(a.device)
        t = time.perf_counter()
        for j in range(micro_batches):  # gradient accumulation
            b = batch_at(i, j)
            with autocast():
                loss = model(input_ids=b, labels=b).loss / micro_batches
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync(a.device)
        if i >= a.warmup:
            times.append(time.perf_counter() - t)
        losses.append(loss.item())
    return times, losses


def _autocast(a):
    import contextlib

    import torch

    if a.precision == "bf16" and a.variant != "osftrt_fsdp2":  # FSDP2 casts by its MixedPrecisionPolicy
        return torch.autocast(device_type=a.device, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _batches(a):
    import torch

    gen = torch.Generator().manual_seed(1)
    return [torch.randint(0, a.vocab, (a.batch, a.seq), generator=gen).to(a.device) for _ in range(a.batches)]


def orthogonality(variant, model, proj):
    """max(|U_high^T U_low|, |V_low V_high^T|) over every OSFT layer."""
    import torch

    if proj is not None:
        return max(proj.orthogonality())
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








def run_variant(variant, a):
    import torch

    if a.device == "cpu":
        torch.set_num_threads(a.threads)
    before_model = memory_now(a.device)
    t0 = time.perf_counter()
    model, params, proj, inner = prepare(variant, a)
    opt = torch.optim.AdamW(params, lr=a.lr, foreach=True)
    if proj is not None:
        proj.attach(opt)
    setup_s = time.perf_counter() - t0
    batches = _batches(a)
    counted = variant in COUNTED_VARIANTS
    mark = {}

    def at_start():
        mark["base"] = memory_start(a.device)
        mark["before"] = _osft_counts(model, proj) if counted else None

    times, losses = timed_steps(a, model, opt, lambda i, j: batches[(i * a.micro_batches + j) % len(batches)],
                                lambda: _autocast(a), at_start, a.micro_batches)
    base, before = mark["base"], mark["before"]
    peak = memory_peak(a.device)
    out = {"variant": variant, "step_ms": 1e3 * statistics.median(times), "step_ms_min": 1e3 * min(times),
           "peak_bytes": peak, "peak_above_bytes": peak - base, "state_bytes": base,
           "peak_above_model_bytes": peak - before_model, "first_loss": losses[0],
           "last_loss": losses[-1], "trainable": sum(p.numel() for p in params), "setup_s": setup_s}
    if counted:
        after = _osft_counts(model, proj)
        per_step = {k: (after[k] - before[k]) / a.steps for k in after}
        if variant == "peft_osf":  # its hooks project each micro-batch's gradient
            per_step["gradients"] = a.micro_batches
        out["counts_per_step"] = per_step
        recomputes = _mlp_recomputes(model, a.batch * a.seq)  # empty without apply_osftrt's tiled MLPs
        out["gemm_flops"] = gemm_flops(variant, a, model, proj, per_step, recomputes)
        if recomputes:
            out["mlp_recomputes"] = recomputes
    if variant in OSFT_VARIANTS:
        out["orthogonality"] = orthogonality(variant, model, proj)
    if a.profile:
        out["profile"] = profile_step(variant, a, model, inner, opt, proj, batches[0])
    if proj is not None:
        proj.close()
    return out


# ------------------------------------------------------------- the table
def _ratio(rows, num, den, key):
    if num in rows and den in rows and "skipped" not in rows[num] and "skipped" not in rows[den]:
        return rows[num][key] / rows[den][key]
    return None


def _goal(value, limit):
    if value is None:
        return "n/a (a variant was skipped)"
    return "%.2fx (goal <= %.1fx: %s)" % (value, limit, "met" if value <= limit else "missed")


def _loss_agreement(rows, x, y, tol):
    if any(v not in rows or "skipped" in rows[v] for v in (x, y)):
        return "%s vs %s: n/a" % (x, y)
    d = [abs(rows[x][k] - rows[y][k]) / abs(rows[y][k]) for k in ("first_loss", "last_loss")]
    return "%s vs %s: first-step loss %.2e relative, last %.2e (tolerance %.0e: %s)" % (
        x, y, d[0], d[1], tol, "agree" if max(d) <= tol else "DIFFER")


def _gomp_spincount(a):
    """The GOMP_SPINCOUNT every variant's process gets: the caller's, else
    --gomp-spincount's (None: libgomp's own default). Decided once, before
    the parent imports osftrt (whose import sets it in this process)."""
    if "GOMP_SPINCOUNT" in os.environ:
        return os.environ["GOMP_SPINCOUNT"]
    if a.gomp_spincount == "default":
        return None
    if a.gomp_spincount == "osftrt":
        try:
            from osftrt import _openblas
        except ImportError:  # a parent without the package (the GPU call's): the children's own import decides
            return None
        return _openblas.OMP_SPIN
    return str(int(a.gomp_spincount))


def _recompute_words(rows):
    said = {v: r["mlp_recomputes"] for v, r in rows.items() if "mlp_recomputes" in r}
    return "".join(" (%s: the backward %s)" % (v, "recomputes each tile's forward" if any(x) else
                                               "keeps the forward's intermediates, no recompute")
                   for v, x in said.items())


def _cpu_peak_words(a):
    return ("the resident set's peak above the one before the steps, and above the one before the model was built "
            "(the model, the optimizer's state, what the library keeps); glibc %s" % (
                "with " + " ".join("%s=%s" % kv for kv in LEAN_MALLOC.items()) if a.lean_malloc else
                "as it comes (freed blocks may stay resident: --lean-malloc for memory figures)"))


def table(rows, a, cmd):
    cuda = a.device == "cuda"
    tok = a.batch * a.seq
    unit = "GiB" if cuda else "MiB"
    scale = 2.0 ** 30 if cuda else 2.0 ** 20
    lines = [
        "# One training step of a Llama on %s: transformers, Liger, osftrt, PEFT OSF, osftrt OSFT, FSDP2"
        % ("a GPU" if cuda else "the CPU"),
        "",
        "- machine: %s" % machine(isa=not cuda, gpu=cuda) + ("" if cuda else "; %d threads" % a.threads),
        "- " + versions(build_info=True),
        "- model: Llama, hidden %d, intermediate %d, %d layers, %d/%d heads, vocab %d, random weights; batch %d x seq "
        "%d = %d tokens; %s; OSFT on %s at rank ratio %.2f; AdamW lr %g" % (
            a.hidden, a.intermediate, a.layers, a.heads, a.kv_heads, a.vocab, a.batch, a.seq, tok,
            "bf16 autocast, fp32 weights (Trainer(bf16=True)); FSDP2: MixedPrecisionPolicy(bf16, fp32)"
            if a.precision == "bf16" else "fp32", "/".join(TARGETS), a.rank_ratio, a.lr),
        "- step: forward + backward + AdamW (+ projections), synchronized; median of %d steps after %d; peak: %s; "
        "each variant in its own process" % (a.steps, a.warmup, "torch.cuda.max_memory_allocated over the timed "
                                              "steps" if cuda else _cpu_peak_words(a)),
        "- apply_osftrt's tiled MLP: %s" % ("tiles of `hidden` tokens (its default), the backward recomputing each tile's"
                                            " forward" if a.mlp_memory_budget is None else "mlp_memory_budget %g MiB%s" % (
                                                a.mlp_memory_budget, _recompute_words(rows))),
        "- %d micro-batch(es) of %d tokens per optimizer step (gradient accumulation); step ms and GFLOP are per "
        "optimizer step" % (a.micro_batches, tok),
        "- threads: GOMP_SPINCOUNT=%s (PyTorch's OpenMP workers' spin), OPENBLAS_THREAD_TIMEOUT=%s (osftrt's "
        "BLAS), the same for every variant" % (a.spin or "unset (libgomp's default)",
                                               os.environ.get("OPENBLAS_THREAD_TIMEOUT", "16 (set by import osftrt)")),
        "- command: `python bench/python/bench_hf_step.py %s`" % " ".join(cmd),
        "",
        "| variant | trainable | step ms (min) | tokens/s | peak %s | first loss | last loss | orthogonality |" % (
            unit if cuda else "MiB: the step's / with the model's"),
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    tok *= a.micro_batches
    peak_key = "peak_bytes" if cuda else "peak_above_bytes"
    peaks = ["peak_bytes"] if cuda else ["peak_above_bytes", "peak_above_model_bytes"]
    for v in a.variant_list:
        r = rows[v]
        if "skipped" in r:
            lines.append("| %s | skipped: %s | | | | | | |" % (LABELS[v], r["skipped"]))
            continue
        lines.append("| %s | %d | %.1f (%.1f) | %.0f | %s | %.4f | %.4f | %s |" % (
            LABELS[v], r["trainable"], r["step_ms"], r["step_ms_min"], tok / r["step_ms"] * 1e3,
            " / ".join("%.2f" % (r.get(k, float("nan")) / scale) for k in peaks), r["first_loss"], r["last_loss"],
            "%.1e" % r["orthogonality"] if "orthogonality" in r else "-"))
    counted = [v for v in a.variant_list if rows[v].get("gemm_flops")]
    if counted:
        ft = next((rows[v] for v in ("osftrt", "hf") if v in counted), None)
        ft_rate = ft["step_ms"] / ft["gemm_flops"]["total"] if ft else None
        lines += ["", "GEMM flops per optimizer step (GFLOP; counted: shapes, the library's strategies, the rebuilds and "
                  "projections the run made), and time per GEMM flop against full fine-tuning's (%s):" % (
                      "osftrt" if "osftrt" in counted else "hf"), "",
                  "| variant | forward | backward | rebuild | projections | total | rebuilds/step | projections/step "
                  "(grad, param) | step ms | ms per TFLOP | per flop vs full FT | step vs full FT |",
                  "| --- |" + " ---: |" * 11]
        for v in counted:
            g, c, ms = rows[v]["gemm_flops"], rows[v]["counts_per_step"], rows[v]["step_ms"]
            lines.append("| %s | %.1f | %.1f | %.1f | %.1f | %.1f | %.2f | %.2f, %.2f | %.0f | %.1f | %s | %s |" % (
                LABELS[v], g["forward"] / 1e9, g["backward"] / 1e9, g["rebuild"] / 1e9, g["projections"] / 1e9,
                g["total"] / 1e9, c["rebuilds"], c["gradients"], c["parameters"], ms, ms / g["total"] * 1e12,
                "%.3fx" % (ms / g["total"] / ft_rate) if ft_rate else "n/a",
                "%.3fx" % (ms / ft["step_ms"]) if ft else "n/a"))
    tol = 2e-2 if a.precision == "bf16" else 2e-3
    o = rows.get("osftrt_osft", {})
    lines += [
        "",
        "Goals (issue 36):",
        "- (5) vs PEFT OSF (4): time %s, peak memory %s; orthogonality of (5) %s (goal <= 1e-5)" % (
            _goal(_ratio(rows, "osftrt_osft", "peft_osf", "step_ms"), 0.7),
            ", with the model's ".join(_goal(_ratio(rows, "osftrt_osft", "peft_osf", k), 0.7) for k in peaks),
            "%.1e" % o["orthogonality"] if "orthogonality" in o else "n/a"),
        "- (5) vs full fine-tuning (1): time %s" % _goal(_ratio(rows, "osftrt_osft", "hf", "step_ms"), 1.1),
        "- (3) vs Liger (2): time %s, peak memory %s" % (_goal(_ratio(rows, "osftrt", "liger", "step_ms"), 1.0),
                                                          _goal(_ratio(rows, "osftrt", "liger", peak_key), 1.0)),
        "- (6) vs (5): time %s" % _goal(_ratio(rows, "osftrt_fsdp2", "osftrt_osft", "step_ms"), 1.1),
        "- losses: %s; %s" % (_loss_agreement(rows, "osftrt", "hf", tol), _loss_agreement(rows, "osftrt_osft",
                                                                                          "peft_osf", tol)),
    ]
    profiled = [v for v in a.variant_list if "profile" in rows[v]]
    if profiled:
        lines += ["", "Per phase, one profiled step after the timed ones (ms; %s):" % (
            "CUDA events" if cuda else "wall clock"), "",
            "| variant | step | " + " | ".join(PHASES) + " |", "| --- |" + " ---: |" * (len(PHASES) + 1)]
        for v in profiled:
            p = rows[v]["profile"]
            lines.append("| %s | %.1f | %s |" % (LABELS[v], p["step"], " | ".join("%.1f" % p[k] for k in PHASES)))
    return lines


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--tiny", action="store_true", help="a tiny model for a dry run of every variant")
    for k in ("hidden", "intermediate", "layers", "heads", "kv_heads", "vocab", "batch", "seq", "warmup", "steps"):
        p.add_argument("--" + k.replace("_", "-"), type=int)
    p.add_argument("--precision", choices=("fp32", "bf16"))
    p.add_argument("--rank-ratio", type=float, default=0.5)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--batches", type=int, default=4, help="distinct batches, cycled through the steps")
    p.add_argument("--micro-batches", type=int, default=1, help="forward+backward passes per optimizer step")
    p.add_argument("--threads", type=int, default=2, help="CPU threads (--device cpu)")
    p.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated subset of " + ",".join(VARIANTS))
    p.add_argument("--profile", action="store_true", help="time one more step per phase")
    p.add_argument("--gomp-spincount", default="osftrt", help="GOMP_SPINCOUNT of every variant's process (PyTorch's "
                   "OpenMP workers' spin): 'osftrt' (default) what import osftrt before torch sets, 'default' "
                   "libgomp's own (300000), or a number; the caller's environment wins")
    p.add_argument("--mlp-memory-budget", type=float, help="MiB: apply_osftrt's mlp_memory_budget (the osftrt "
                   "variants); one that holds every tile's intermediates drops the backward's recompute")
    p.add_argument("--lean-malloc", action="store_true", help="--device cpu: glibc's mmap and trim thresholds at "
                   "64 KiB in every variant's process, so that freed blocks leave the resident set (memory figures; "
                   "the page faults cost time)")
    p.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)
    p.add_argument("--out", help="write the table (Markdown) here too")
    a = p.parse_args(argv)
    sizes = dict(SIZES[a.device])
    if a.tiny:
        sizes.update({k: v for k, v in SIZES["tiny"].items() if v is not None})
    for k, v in sizes.items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    a.variant_list = [v for v in a.variants.split(",") if v]
    bad = set(a.variant_list) - set(VARIANTS)
    if bad:
        p.error("unknown variant(s): %s" % ", ".join(sorted(bad)))
    return a


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    a = parse(argv)
    if a.variant:
        try:
            res = run_variant(a.variant, a)
        except Skip as e:
            res = {"variant": a.variant, "skipped": str(e)}
        print("RESULT " + json.dumps(res), flush=True)
        return finish_process(0)
    rows = {}
    a.spin = _gomp_spincount(a)
    for v in a.variant_list:
        cmd = [sys.executable, os.path.abspath(__file__), "--variant", v] + argv
        env = dict(os.environ, OPENBLAS_NUM_THREADS=str(a.threads), OMP_NUM_THREADS=str(a.threads))
        env.pop("GOMP_SPINCOUNT", None)
        if a.spin is not None:
            env["GOMP_SPINCOUNT"] = a.spin
        env.setdefault("TRANSFORMERS_VERBOSITY", "error")
        if a.lean_malloc:
            env.update(LEAN_MALLOC)
        t = time.perf_counter()
        r = subprocess.run(cmd, capture_output=True, text=True, env=env)
        res = [l for l in r.stdout.splitlines() if l.startswith("RESULT ")]
        if r.returncode != 0 or not res:
            sys.stderr.write("%s failed (exit %d):\n%s%s" % (v, r.returncode, r.stdout[-3000:], r.stderr[-5000:]))
            return 1
        rows[v] = json.loads(res[-1][7:])
        if a.out:
            with open(a.out + ".json", "w") as f:
                json.dump(rows, f, indent=1)
        print("%s: %s (%.0f s)" % (v, "skipped: " + rows[v]["skipped"] if "skipped" in rows[v] else
                                   "%.1f ms/step" % rows[v]["step_ms"], time.perf_counter() - t), file=sys.stderr,
              flush=True)
    return report(table(rows, a, argv), a.out)


if __name__ == "__main__":
    sys.exit(main())
