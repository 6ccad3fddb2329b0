"""osftrt.batched_qr / power_iteration on rank-deficient and non-finite
inputs: a rank-deficient matrix gets a valid Householder QR (orthonormal Q,
Q R = A, diag(R) >= 0, checked in float64) and is reported in
.rank_deficient (rank_deficient="factor", the default) or fails like before
("fail"); a failure that remains (NaN, Inf) raises NumericalError after the
others were computed (failures="raise", the default), with .result and
.failed, or is only reported (failures="status")."""
import pytest
import torch

import osftrt
from osftrt import capi


def _low_rank(gen, m, n, k, dtype=torch.float32):
    b = torch.randn(m, k, generator=gen, dtype=torch.float64)
    c = torch.randn(k, n, generator=gen, dtype=torch.float64)
    return (b @ c).to(dtype)


def _expect_qr(a, q, r, tol):
    a64, q64 = a.double(), q.double()
    n = q.shape[1]
    assert (q64.T @ q64 - torch.eye(n, dtype=torch.float64)).norm() <= tol * n
    assert torch.equal(r, torch.triu(r)) and (torch.diagonal(r) >= 0).all()
    assert (q64 @ r.double() - a64).norm() <= tol * n * max(a64.norm().item(), 1.0)


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(1234)


@pytest.mark.parametrize("method", ["householder", "cholesky_qr2", "cholesky_tf32"])
def test_rank_deficient_factored_and_reported(gen, method):
    mats = [_low_rank(gen, 64, 64, 20), torch.randn(30, 10, generator=gen, dtype=torch.float64),
            _low_rank(gen, 40, 12, 3, torch.float64), torch.randn(9, 9, generator=gen)]
    qs = [torch.full_like(m, float("nan")) for m in mats]
    res = osftrt.batched_qr(mats, q=qs, method=method)
    assert res.status == [0, 0, 0, 0] and res.ok
    assert res.rank_deficient == [True, False, True, False]
    for a, q, r in zip(mats, res.q, res.r):
        _expect_qr(a, q, r, 1e-5 if a.dtype == torch.float32 else 1e-12)
    # the former semantics on request: the deficient ones fail, outputs untouched
    qs = [torch.full_like(m, float("nan")) for m in mats]
    res = osftrt.batched_qr(mats, q=qs, method=method, rank_deficient="fail", failures="status")
    assert res.status == [capi.OSFT_STATUS_NUMERICAL_ERROR, 0, capi.OSFT_STATUS_NUMERICAL_ERROR, 0]
    assert torch.isnan(qs[0]).all() and torch.isnan(qs[2]).all()
    with pytest.raises(osftrt.NumericalError) as info:
        osftrt.batched_qr(mats, method=method, rank_deficient="fail")
    assert info.value.failed == [0, 2] and info.value.result.status[1] == 0


def test_nan_raises_after_computing_the_others(gen):
    good, deficient = torch.randn(8, 5, generator=gen), _low_rank(gen, 16, 16, 4)
    bad = torch.randn(6, 3, generator=gen)
    bad[1, 2] = float("nan")
    qs = [torch.full_like(m, float("nan")) for m in (good, bad, deficient)]
    with pytest.raises(osftrt.NumericalError) as info:
        osftrt.batched_qr([good, bad, deficient], q=qs)
    e = info.value
    assert e.failed == [1] and e.status == capi.OSFT_STATUS_NUMERICAL_ERROR and "a[1]" in str(e)
    assert e.result.status == [0, capi.OSFT_STATUS_NUMERICAL_ERROR, 0]
    assert e.result.rank_deficient == [False, False, True]
    assert torch.isnan(qs[1]).all(), "a failed matrix's output stays untouched"
    _expect_qr(good, qs[0], e.result.r[0], 1e-5)
    _expect_qr(deficient, qs[2], e.result.r[2], 1e-5)
    res = osftrt.batched_qr([good, bad], failures="status")
    assert res.status == [0, capi.OSFT_STATUS_NUMERICAL_ERROR] and not res.ok


def test_power_iteration_singular_factor(gen):
    """SOAP's case: a Kronecker factor L = G G^T of a 64 x 16 gradient has
    rank 16; its refresh qr(L Q) is reported and valid."""
    g = torch.randn(64, 16, generator=gen)
    L = (g @ g.T).contiguous()
    q0 = torch.linalg.qr(torch.randn(64, 64, generator=gen, dtype=torch.float64))[0].float().contiguous()
    full = torch.randn(32, 32, generator=gen)
    full = (full @ full.T + 32 * torch.eye(32)).contiguous()
    qf = torch.linalg.qr(torch.randn(32, 32, generator=gen))[0].contiguous()
    start = [q0.clone(), qf.clone()]
    st = osftrt.power_iteration([L, full], [q0, qf])
    assert st == [0, 0] and st.rank_deficient == [True, False]
    for a, s, q in zip((L, full), start, (q0, qf)):
        p = a.double() @ s.double()
        r = q.double().T @ p
        low = torch.tril(r, -1)
        assert low.abs().max() <= 1e-4 * r.abs().max()
        r = torch.triu(r)
        d = torch.diagonal(r)
        assert (d >= -1e-4 * r.abs().max()).all()
        d.clamp_(min=0)  # rounding below 0, not a sign flip
        _expect_qr(p / p.norm(), q, r / p.norm(), 1e-5)
    with pytest.raises(osftrt.NumericalError):
        osftrt.power_iteration([L], [q0], rank_deficient="fail")
    nan_a = L.clone()
    nan_a[0, 0] = float("nan")
    keep = q0.clone()
    st = osftrt.power_iteration([nan_a], [q0], failures="status")
    assert st == [capi.OSFT_STATUS_NUMERICAL_ERROR] and torch.equal(q0, keep)


def test_bad_policy_names():
    with pytest.raises(ValueError, match="rank_deficient"):
        osftrt.batched_qr([torch.eye(3)], rank_deficient="keep")
    with pytest.raises(ValueError, match="failures"):
        osftrt.power_iteration([torch.eye(3)], [torch.eye(3)], failures="ignore")
