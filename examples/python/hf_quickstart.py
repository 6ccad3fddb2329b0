#!/usr/bin/env python3
"""The README's five lines, runnable: a Hugging Face Llama (tiny and random:
nothing is downloaded) patched by osftrt in one call and trained with a plain
AdamW loop; prints the loss and the orthogonality of the OSFT updates.

    python examples/python/hf_quickstart.py [--steps 30] [--check]
"""
import argparse
import sys

import torch
import transformers

import osftrt.transformers as ot


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--check", action="store_true", help="exit 1 unless the loss falls and the updates stay orthogonal")
    args = ap.parse_args()
    torch.manual_seed(0)
    text = torch.randint(0, 1024, (4, 64))  # a batch to learn (labels = inputs, shifted by the model)

    # --- the README's five lines --------------------------------------------
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        hidden_size=256, intermediate_size=688, num_hidden_layers=2, num_attention_heads=4, vocab_size=1024))
    patched = ot.apply_osftrt(model, osft=True, rank_ratio=0.5)  # fused CE, tiled MLPs, OSFT + projector
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    for step in range(args.steps):
        loss = model(input_ids=text, labels=text).loss; loss.backward(); opt.step(); opt.zero_grad()  # noqa: E702
        # ------------------------------------------------------------------------
        u, v = patched.projector.orthogonality()
        if step == 0 or step == args.steps - 1 or step % 10 == 9:
            print("step %3d  loss %.4f  max|U_high^T U_low| %.1e  max|V_low V_high^T| %.1e" % (step, loss.item(), u, v))
        if step == 0:
            first = loss.item()
    ok = loss.item() < first and max(u, v) <= 1e-5
    print("loss %.4f -> %.4f, %d OSFT layers, %d tiled MLPs: %s" % (
        first, loss.item(), len(patched.osft_layers), patched.tiled_mlps, "ok" if ok else "FAILED"))
    return 0 if ok or not args.check else 1


if __name__ == "__main__":
    sys.exit(main())
