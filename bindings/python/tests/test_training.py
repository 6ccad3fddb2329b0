"""The example trainer (examples/python/train_osft.py): 50 AdamW steps of a
small Llama-style model with OSFT layers, the fused cross-entropy and the
projector. The loss falls, the frozen subspace stays orthogonal, and frozen
factors never change."""
import torch

import osftrt.torch as ot
from train_osft import train


def test_50_adamw_steps():
    frozen = {}

    def snapshot(model, converted):
        for n, m in converted.items():
            frozen[n] = (m.u_high.clone(), m.s_high.clone(), m.v_high.clone())

    losses, orth, model, converted, projector = train(steps=50, seed=0, verbose=False, on_built=snapshot)
    assert len(converted) == 14
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < first - 0.5, (first, last)
    worst = max(max(u, v) for u, v in orth)
    assert worst <= 1e-5, worst
    # direct check of one layer against the projector's figure
    for m in converted.values():
        assert (m.u_high.T @ m.u_low).abs().max() <= 1e-5
        assert (m.v_low @ m.v_high.T).abs().max() <= 1e-5
    # the frozen part is untouched by training
    for n, m in converted.items():
        uh, sh, vh = frozen[n]
        assert torch.equal(uh, m.u_high) and torch.equal(sh, m.s_high) and torch.equal(vh, m.v_high)
    projector.close()
