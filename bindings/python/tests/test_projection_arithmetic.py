"""OSFTProjector(arithmetic=...): the update arithmetic of the projection
(osft_projection_arithmetic_t) from Python, against float64."""
import pytest
import torch

import osftrt.torch as ot
from osftrt.torch.projector import ARITHMETICS


def _problem(gen, n=64, k=72, r=16, l=16):
    u, _, vt = torch.linalg.svd(torch.randn(n, k, dtype=torch.float64, generator=gen), full_matrices=False)
    uh, vh = u[:, :r].contiguous(), vt[:r].contiguous()
    gu = torch.randn(n, l, dtype=torch.float64, generator=gen)
    gv = torch.randn(l, k, dtype=torch.float64, generator=gen)
    return uh, vh, gu, gv


def _project(arithmetic, uh, vh, gu, gv):
    """fp32 gradients against bf16 frozen factors: the arithmetics differ
    by far more than fp32 round-off there."""
    t_uh, t_vh = uh.to(torch.bfloat16), vh.to(torch.bfloat16)
    t_gu, t_gv = gu.float(), gv.float()
    p = ot.OSFTProjector(arithmetic=arithmetic)
    p.add_target(u_high=t_uh, grad_u_low=t_gu, v_high=t_vh, grad_v_low=t_gv)
    p.project_gradients()
    p.close()
    return t_uh.double(), t_vh.double(), t_gu.double(), t_gv.double()


def _bf16(x):
    return x.to(torch.bfloat16).double()


@pytest.mark.parametrize("arithmetic", sorted(ARITHMETICS))
def test_arithmetic_matches_float64(gen, arithmetic):
    uh, vh, gu, gv = _problem(gen)
    b_uh, b_vh, got_u, got_v = _project(arithmetic, uh, vh, gu, gv)
    gu32, gv32 = gu.float().double(), gv.float().double()
    exact_u = gu32 - b_uh @ (b_uh.T @ gu32)
    exact_v = gv32 - (gv32 @ b_vh.T) @ b_vh
    bf16_u = gu32 - b_uh @ _bf16(b_uh.T @ gu32)
    bf16_v = gv32 - _bf16(gv32 @ b_vh.T) @ b_vh
    # In Frobenius norm: C accumulated in fp32 may round to the other bf16
    # neighbour than C in float64 at a rare element (a column of x moves by
    # about a fifth of the whole difference here), never at most of them.
    for got, exact, rounded in ((got_u, exact_u, bf16_u), (got_v, exact_v, bf16_v)):
        apart = (exact - rounded).norm().item()
        assert apart > 1e-3
        if arithmetic == "bf16":
            assert (got - rounded).norm().item() <= 0.5 * apart
            assert (got - exact).norm().item() >= 0.5 * apart
        else:  # C to fp32 accuracy (or 16 bits of it: the split)
            assert (got - exact).norm().item() <= 0.05 * apart, arithmetic


def test_bad_arithmetic_is_refused():
    with pytest.raises(ValueError, match="arithmetic"):
        ot.OSFTProjector(arithmetic="tf16")
