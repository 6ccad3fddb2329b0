#!/usr/bin/python3
"""osftrt and PEFT's OSF adapters, both ways, on a tiny random Llama (no
downloads; needs transformers and peft >= 0.17):

  1. a model prepared with peft's OSFConfig becomes osftrt OSFTLinear layers
     (osftrt.peft.from_peft: PEFT's own factors, no new SVD, the same logits);
  2. it is fine-tuned with osftrt (OSFTProjector keeps the updates out of
     the frozen subspace);
  3. the result is saved as a PEFT OSF adapter (osftrt.peft.save_peft_adapter)
     and PeftModel.from_pretrained loads it onto the untouched base model:
     the same logits again.

Run:  python examples/python/peft_interop.py [--steps 5] [--check]
"""
from __future__ import annotations

import argparse
import copy
import sys
import tempfile

import torch
import transformers
from peft import OSFConfig, PeftModel, get_peft_model

import osftrt.peft as opeft
from osftrt.torch import LLAMA_LINEAR_NAMES, OSFTLinear, OSFTProjector


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--check", action="store_true", help="exit non-zero unless every comparison holds")
    args = ap.parse_args()
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=128, max_position_embeddings=64,
    )
    base = transformers.LlamaForCausalLM(cfg).eval()
    pristine = copy.deepcopy(base)  # PEFT wraps `base` in place
    ids = torch.randint(0, 128, (2, 16))

    def logits(m):
        with torch.no_grad():
            return m(input_ids=ids).logits

    # 1. PEFT OSF -> osftrt
    peft_model = get_peft_model(base, OSFConfig(target_modules=list(LLAMA_LINEAR_NAMES), effective_rank=0.5))
    want = logits(peft_model)
    model = opeft.from_peft(peft_model)
    err1 = (logits(model) - want).abs().max().item()
    n = sum(isinstance(m, OSFTLinear) for m in model.modules())
    print("from_peft: %d OSFTLinear layers, max |logits - PEFT's| = %.2e" % (n, err1))

    # 2. fine-tune with osftrt
    params = [p for m in model.modules() if isinstance(m, OSFTLinear) for p in (m.u_low, m.s_low, m.v_low)]
    opt = torch.optim.AdamW(params, lr=1e-2)
    proj = OSFTProjector(model).attach(opt)
    model.train()
    for step in range(args.steps):
        x = torch.randint(0, 128, (4, 16))
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        print("step %d  loss %.4f  orthogonality %.1e %.1e" % ((step, loss.item()) + proj.orthogonality()))
    model.eval()
    ortho = max(proj.orthogonality())

    # 3. osftrt -> PEFT OSF adapter -> PEFT
    with tempfile.TemporaryDirectory() as d:
        opeft.save_peft_adapter(model, d, base_model=pristine)
        loaded = PeftModel.from_pretrained(copy.deepcopy(pristine), d)
        err2 = (logits(loaded) - logits(model)).abs().max().item()
    print("PeftModel.from_pretrained(saved adapter): max |logits - osftrt's| = %.2e" % err2)

    ok = err1 <= 1e-5 and err2 <= 1e-5 and ortho <= 1e-5
    if args.check and not ok:
        print("CHECK FAILED", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
