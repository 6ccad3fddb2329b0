"""osftrt.integrations.soap against NVIDIA's emerging-optimizers SOAP itself
(PyPI ``emerging-optimizers``, Python >= 3.12; skipped where absent): the same
trajectory up to fp32 rounding of the QR (measured against the drift that
computing stock's QR in float64 gives), the same state dict, every refresh
of a step in one call, singular Kronecker factors refreshed and counted,
NaN raising and naming the parameter."""
import pytest
import torch

eo_soap = pytest.importorskip("emerging_optimizers.soap", reason="emerging-optimizers is not installed (Python >= 3.12)")
import emerging_optimizers.utils.eig as eo_eig  # noqa: E402

import osftrt  # noqa: E402
from osftrt.integrations.soap import SOAP  # noqa: E402


def _model():
    torch.manual_seed(0)
    # the last layer is 8 x 16: its R = G^T G (16 x 16) is singular
    return torch.nn.Sequential(torch.nn.Linear(32, 48, bias=False), torch.nn.Tanh(),
                               torch.nn.Linear(48, 16, bias=False), torch.nn.Tanh(),
                               torch.nn.Linear(16, 8, bias=False))


def _run(cls, steps, **kw):
    g = torch.Generator().manual_seed(7)
    x, y = torch.randn(128, 32, generator=g), torch.randn(128, 8, generator=g)
    m = _model()
    opt = cls(m.parameters(), lr=1e-3, **kw)
    losses = []
    for _ in range(steps):
        loss = ((m(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses, [p.detach().clone() for p in m.parameters()], opt


class _Q:
    def __init__(self, q):
        self.Q = q


def _stock_fp64_qr(steps, monkeypatch, **kw):
    """Stock SOAP whose QR is computed in float64: a perturbation of the
    trajectory at fp32 rounding, the yardstick for ours (the columns of a
    singular factor's basis beyond its rank are whatever rounding makes
    them, so parameters drift more than losses)."""
    orig = torch.linalg.qr
    monkeypatch.setattr(eo_eig.torch.linalg, "qr", lambda a: _Q(orig(a.double()).Q.to(a.dtype)))
    try:
        return _run(eo_soap.SOAP, steps, **kw)
    finally:
        monkeypatch.setattr(eo_eig.torch.linalg, "qr", orig)


def _drift(a, b):
    loss = max(abs(x - y) / abs(x) for x, y in zip(a[0], b[0]))
    param = max(((p - q).norm() / p.norm()).item() for p, q in zip(a[1], b[1]))
    return loss, param


@pytest.mark.parametrize("kw", [{}, {"power_iter_steps": 2, "weight_decay": 0.0, "nesterov": True}])
def test_trajectory_within_fp32_rounding(monkeypatch, kw):
    steps = 25
    stock = _run(eo_soap.SOAP, steps, **kw)
    ours = _run(SOAP, steps, **kw)
    yardstick = _drift(stock, _stock_fp64_qr(steps, monkeypatch, **kw))
    loss_drift, param_drift = _drift(stock, ours)
    assert stock[0][-1] < stock[0][0] and ours[0][-1] < ours[0][0]
    assert loss_drift <= max(10 * yardstick[0], 5e-5), (loss_drift, yardstick)
    assert param_drift <= max(3 * yardstick[1], 1e-3), (param_drift, yardstick)
    # the same state, by key and shape
    s_stock, s_ours = stock[2].state_dict(), ours[2].state_dict()
    for a, b in zip(s_stock["state"].values(), s_ours["state"].values()):
        assert a.keys() == b.keys()
        for k in a:
            if torch.is_tensor(a[k]):
                assert a[k].shape == b[k].shape and a[k].dtype == b[k].dtype, k
            else:
                assert a[k] == b[k], k


def test_one_call_per_step_and_singular_factors(monkeypatch):
    calls = []
    real = osftrt.power_iteration

    def counting(a, q, *args, **kw):
        calls.append(len(a))
        return real(a, q, *args, **kw)

    monkeypatch.setattr(osftrt, "power_iteration", counting)
    _, _, opt = _run(SOAP, 4)
    assert calls == [6, 6, 6], "step 1 uses eigh (as stock), every later step one call for all 3 x 2 factors"
    assert opt.refresh_stats["pairs"] == 6 and opt.refresh_stats["rank_deficient"] >= 1
    for state in opt.state.values():  # every eigenbasis orthonormal, none kept from before
        for q in (state["Q_L"], state["Q_R"]):
            assert (q.double().T @ q.double() - torch.eye(q.shape[1], dtype=torch.float64)).abs().max() < 1e-5


def test_nan_gradient_raises_naming_the_parameter():
    m = _model()
    opt = SOAP(m.parameters(), lr=1e-3)
    x = torch.randn(16, 32)
    for step in range(2):
        m(x).sum().backward()
        if step == 1:
            m[2].weight.grad[3, 4] = float("nan")
        if step == 0:
            opt.step()
        else:
            with pytest.raises(osftrt.NumericalError, match=r"param_groups\[0\]\[1\] \(L, 16x48\)"):
                opt.step()
        opt.zero_grad()
