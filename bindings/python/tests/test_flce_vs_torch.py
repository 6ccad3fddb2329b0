"""Fused linear cross-entropy against PyTorch itself (issue 17): for every
combination of reduction x class weights x label smoothing x z-loss x softcap
x bias x ignore_index (-100 or a real class, 1..M/2 tokens ignored) x
upstream gradient, osftrt.torch.fused_linear_cross_entropy equals, in float64
on the same fp32 inputs,

    F.cross_entropy(z, t, weight=, ignore_index=, reduction=, label_smoothing=)
    + z_loss_scale * lse^2 over the tokens not ignored, reduced like the loss
      (MEAN: averaged over their COUNT, as Liger-Kernel and PaLM do)

with z = softcap * tanh((x W^T + b) / softcap): the loss, the z_loss output
and the gradients of x, W and b, at atol 1e-5 / rtol 5e-4."""
import itertools

import pytest
import torch
import torch.nn.functional as F

import osftrt.torch as ot

from conftest import assert_close

TOL = dict(rtol=5e-4, atol=1e-5)
M, H, V, REAL_CLASS = 24, 16, 37, 5


def _uniform(gen, *shape, lo, hi):
    return (torch.rand(*shape, generator=gen, dtype=torch.float64) * (hi - lo) + lo).float()


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_every_option_combination_matches_torch(gen, reduction):
    for cw_on, a, lam, cap, bias_on, real_ignore, upstream in itertools.product(
            [0, 1], [0.0, 0.1], [0.0, 0.03], [0.0, 3.0], [0, 1], [0, 1], [0, 1]):
        case = dict(class_weight=cw_on, label_smoothing=a, z_loss_scale=lam, softcap=cap, bias=bias_on,
                    real_ignore=real_ignore, upstream=upstream)
        ignore = REAL_CLASS if real_ignore else -100
        x = _uniform(gen, M, H, lo=-1, hi=1)
        w = _uniform(gen, V, H, lo=-1.5, hi=1.5)
        b = _uniform(gen, V, lo=-1, hi=1) if bias_on else None
        cw = _uniform(gen, V, lo=0.1, hi=3.0) if cw_on else None
        t = torch.randint(0, V, (M,), generator=gen)
        t[t == REAL_CLASS] = REAL_CLASS + 1
        k = int(torch.randint(1, M // 2 + 1, (), generator=gen))
        t[torch.randperm(M, generator=gen)[:k]] = ignore
        gl = None
        if upstream:
            gl = _uniform(gen, M, lo=0.5, hi=1.5) if reduction == "none" else torch.tensor(0.7)

        xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
        bs = b.clone().requires_grad_() if b is not None else None
        loss, extras = ot.fused_linear_cross_entropy(
            xs, ws, t, bs, ignore_index=ignore, label_smoothing=a, z_loss_scale=lam, softcap=cap,
            class_weight=cw, reduction=reduction, return_extras=True)
        loss.backward(gl if gl is not None else torch.ones_like(loss))

        x64, w64 = x.double().requires_grad_(), w.double().requires_grad_()
        b64 = b.double().requires_grad_() if b is not None else None
        z = x64 @ w64.T
        if b64 is not None:
            z = z + b64
        if cap:
            z = cap * torch.tanh(z / cap)
        ce = F.cross_entropy(z, t, weight=cw.double() if cw is not None else None, ignore_index=ignore,
                             reduction=reduction, label_smoothing=a)
        valid = t != ignore
        zl = lam * torch.logsumexp(z, -1) ** 2 * valid
        z_red = {"mean": zl.sum() / valid.sum(), "sum": zl.sum(), "none": zl}[reduction]
        ref = ce + z_red
        ref.backward(gl.double() if gl is not None else torch.ones_like(ref))

        what = "%s %s" % (reduction, case)
        assert_close(loss, ref, what="loss " + what, **TOL)
        assert_close(extras["z_loss"], z_red, what="z_loss " + what, **TOL)
        assert_close(xs.grad, x64.grad, what="grad_x " + what, **TOL)
        assert_close(ws.grad, w64.grad, what="grad_weight " + what, **TOL)
        if b is not None:
            assert_close(bs.grad, b64.grad, what="grad_bias " + what, **TOL)
