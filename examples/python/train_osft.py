#!/usr/bin/python3
"""OSFT fine-tuning of a small Llama-style model with libosftrt, from PyTorch.

The model is built here (no downloads): token embedding, a few blocks of
RMSNorm + causal self-attention (q/k/v/o projections) + RMSNorm + SwiGLU MLP
(gate/up/down), a final norm and an LM head. It is first trained briefly as a
dense model (the "pretrained" weights), then:

  1. its q/k/v/o/gate/up/down Linear layers are converted in place to
     osftrt.torch.OSFTLinear (SVD; the top half of each spectrum frozen);
  2. it is fine-tuned on a new task with AdamW, the loss computed by
     osftrt.torch.fused_linear_cross_entropy (logits never materialized), and
     osftrt.torch.OSFTProjector keeping every update orthogonal to the frozen
     subspace (gradients after backward, parameters after the step);
  3. every step prints the loss and the orthogonality residuals
     max|U_high^T U_low| and max|V_low V_high^T|.

Run:  /usr/bin/python3 examples/python/train_osft.py [--steps 50] [--check]
(--check exits non-zero unless the loss fell and orthogonality <= 1e-5).
"""
from __future__ import annotations

import argparse
import math
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import osftrt
import osftrt.torch as ot


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Attention(nn.Module):
    def __init__(self, hidden, heads):
        super().__init__()
        self.heads = heads
        self.q_proj = nn.Linear(hidden, hidden, bias=False)
        self.k_proj = nn.Linear(hidden, hidden, bias=False)
        self.v_proj = nn.Linear(hidden, hidden, bias=False)
        self.o_proj = nn.Linear(hidden, hidden, bias=False)

    def forward(self, x):
        b, t, h = x.shape
        d = h // self.heads
        q, k, v = (p(x).view(b, t, self.heads, d).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        att = (q @ k.transpose(-1, -2)) / math.sqrt(d)
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        att = att.masked_fill(mask, float("-inf")).softmax(-1)
        return self.o_proj((att @ v).transpose(1, 2).reshape(b, t, h))


class MLP(nn.Module):
    def __init__(self, hidden, inter):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, hidden, heads, inter):
        super().__init__()
        self.input_norm = RMSNorm(hidden)
        self.self_attn = Attention(hidden, heads)
        self.post_norm = RMSNorm(hidden)
        self.mlp = MLP(hidden, inter)

    def forward(self, x):
        x = x + self.self_attn(self.input_norm(x))
        return x + self.mlp(self.post_norm(x))


class TinyLlama(nn.Module):
    def __init__(self, vocab=96, hidden=64, heads=4, inter=128, layers=2):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, hidden)
        self.layers = nn.ModuleList(Block(hidden, heads, inter) for _ in range(layers))
        self.norm = RMSNorm(hidden)
        self.lm_head = nn.Linear(hidden, vocab, bias=False)

    def hidden_states(self, ids):
        x = self.embed_tokens(ids)
        for blk in self.layers:
            x = blk(x)
        return self.norm(x)


def task_batch(gen, vocab, batch, seq, mult, add):
    """Sequences of an affine recurrence t[i+1] = (mult * t[i] + add) mod V:
    the next token is a function of the current one, learnable by the model."""
    start = torch.randint(0, vocab, (batch, 1), generator=gen)
    seqs = [start]
    for _ in range(seq):
        seqs.append((seqs[-1] * mult + add) % vocab)
    ids = torch.cat(seqs, 1)
    return ids[:, :-1], ids[:, 1:]


def pretrain(model, steps, gen, vocab):
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(steps):
        ids, tgt = task_batch(gen, vocab, 16, 24, 5, 3)
        loss = F.cross_entropy(model.lm_head(model.hidden_states(ids)).flatten(0, 1), tgt.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()


def build(seed=0, pretrain_steps=30, rank_ratio=0.5, vocab=96):
    """The model after dense pretraining, converted to OSFT; the projector;
    the optimizer over the trainable parameters."""
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    model = TinyLlama(vocab=vocab)
    pretrain(model, pretrain_steps, gen, vocab)
    converted = ot.convert_linear_layers(model, ot.LLAMA_LINEAR_NAMES, rank_ratio=rank_ratio)
    # OSFT fine-tunes only the low singular directions (and what is not a
    # converted layer stays frozen here, as in OSFT trainers)
    for p in model.parameters():
        p.requires_grad_(False)
    for m in converted.values():
        for p in (m.u_low, m.s_low, m.v_low):
            p.requires_grad_(True)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=2e-3, weight_decay=0.01)
    projector = ot.OSFTProjector(model)
    return model, converted, projector, opt, gen


def train(steps=50, seed=0, verbose=True, budget=1 << 20, on_built=None):
    vocab = 96
    model, converted, projector, opt, gen = build(seed, vocab=vocab)
    if on_built is not None:
        on_built(model, converted)
    loss_fn = ot.FusedLinearCrossEntropyLoss(memory_budget=budget)
    losses, orth = [], []
    projector.project_parameters()  # the SVD split is orthogonal already; make it exact in fp32
    for step in range(steps):
        ids, tgt = task_batch(gen, vocab, 16, 24, 7, 11)  # the new task
        t0 = time.perf_counter()
        hidden = model.hidden_states(ids)
        loss = loss_fn(hidden, model.lm_head.weight, tgt)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        projector.project_gradients()
        opt.step()
        projector.project_parameters()
        dt = time.perf_counter() - t0
        mu, mv = projector.orthogonality()
        losses.append(float(loss))
        orth.append((mu, mv))
        if verbose:
            print(
                "step %3d  loss %.4f  max|U_high^T U_low| %.2e  max|V_low V_high^T| %.2e  %.1f ms"
                % (step, losses[-1], mu, mv, dt * 1e3),
                flush=True,
            )
    return losses, orth, model, converted, projector


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--check", action="store_true", help="fail unless the loss fell and orthogonality <= 1e-5")
    args = ap.parse_args(argv)
    print("libosftrt %s; %s" % (osftrt.version(), osftrt.build_info()))
    losses, orth, model, converted, _ = train(args.steps, args.seed)
    print("converted %d Linear layers to OSFT: %s" % (len(converted), ", ".join(sorted(converted))))
    worst = max(max(u, v) for u, v in orth)
    first, last = sum(losses[:3]) / 3, sum(losses[-3:]) / 3
    print("loss %.4f -> %.4f; worst orthogonality residual %.2e" % (first, last, worst))
    if args.check and not (last < first and worst <= 1e-5):
        print("CHECK FAILED", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
