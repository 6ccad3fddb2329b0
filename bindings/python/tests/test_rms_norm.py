"""osftrt.torch.rms_norm: the RMSNorm whose backward keeps only its input
and one float per row.

* against a float64 reference: output and both gradients, fp32 and bf16,
  one chunk and several (MIN_CHUNK_ROWS lowered), both forms;
* against Hugging Face's modules (Llama, Gemma 2, OLMo 2 forms): outputs
  equal bit for bit, gradients no further from float64 than theirs;
* what it keeps: the saved-tensor hooks see x (the caller's own storage),
  the weight and one fp32 per row, nothing else;
* a frozen weight gets no gradient, an input that needs none gets none."""
import pytest
import torch

import osftrt.torch.norm as rn
from osftrt.torch import rms_norm

from conftest import rand

FORMS = {"llama": {}, "gemma2": {"offset": 1.0, "weight_first": False}, "olmo2": {"weight_first": False}}


def _reference(x, w, eps, offset=0.0, weight_first=True):
    """float64 RMSNorm, the same math without the roundings."""
    x = x.detach().double().requires_grad_()
    w = w.detach().double().requires_grad_()
    xhat = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return x, w, xhat * (w + offset)


def _storage(t):
    """(address, bytes) of t's storage (torch 1.13 has no untyped_storage)."""
    s = t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()
    return s.data_ptr(), s.nbytes()


def _err(got, want):
    return ((got.double() - want).abs().max() / want.abs().max()).item()


@pytest.mark.parametrize("form", sorted(FORMS))
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-6), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("rows", [5, 700])
def test_against_float64(form, dtype, tol, rows, gen, monkeypatch):
    monkeypatch.setattr(rn, "MIN_CHUNK_ROWS", 64)  # 700 rows: 11 chunks, the last one short
    h, eps = 48, 1e-6
    x = rand(gen, 2, rows, h, dtype=dtype, scale=3.0).requires_grad_()
    w = (rand(gen, h) * 0.5 + 1.0).to(dtype).requires_grad_()
    g = rand(gen, 2, rows, h, dtype=dtype)
    y = rms_norm(x, w, eps, **FORMS[form])
    assert y.dtype == dtype and y.shape == x.shape
    y.backward(g)
    xd, wd, yd = _reference(x, w, eps, **FORMS[form])
    yd.backward(g.double())
    assert _err(y, yd) <= tol
    assert _err(x.grad, xd.grad) <= tol
    assert _err(w.grad, wd.grad) <= tol


def test_it_keeps_only_its_input_and_one_float_per_row(gen):
    rows, h = 3000, 32
    x = rand(gen, rows, h).requires_grad_()
    w = rand(gen, h).requires_grad_()
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        y = rms_norm(x, w, 1e-5)
    kept = dict(_storage(t) for t in saved)
    mine = (_storage(x)[0], _storage(w)[0])
    assert all(p in kept for p in mine)
    others = sum(n for p, n in kept.items() if p not in mine)
    assert others == rows * 4, "kept %d bytes beyond x and the weight; one float per row is %d" % (others, rows * 4)
    y.sum().backward()
    assert torch.isfinite(x.grad).all() and torch.isfinite(w.grad).all()


def test_frozen_weight_and_input_without_gradient(gen):
    x = rand(gen, 4, 40, 16).requires_grad_()
    w = rand(gen, 16)  # frozen
    rms_norm(x, w, 1e-6).sum().backward()
    assert x.grad is not None and w.grad is None
    x2 = rand(gen, 4, 40, 16)
    w2 = rand(gen, 16).requires_grad_()
    rms_norm(x2, w2, 1e-6).sum().backward()
    assert w2.grad is not None and x2.grad is None


def test_empty_input(gen):
    x = torch.empty(0, 8, requires_grad=True)
    w = rand(gen, 8).requires_grad_()
    y = rms_norm(x, w, 1e-6)
    assert y.shape == (0, 8)
    y.sum().backward()
    assert w.grad.abs().max().item() == 0.0


@pytest.mark.parametrize("family", ["llama", "gemma2", "olmo2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_equals_hugging_face_modules(family, dtype, gen, monkeypatch):
    pytest.importorskip("transformers")
    import importlib

    monkeypatch.setattr(rn, "MIN_CHUNK_ROWS", 128)
    patched = importlib.import_module("osftrt.transformers." + family).FAMILY.norm
    base = patched.__bases__[0]
    h = 40
    m = base(h).to(dtype)
    with torch.no_grad():
        m.weight.copy_((rand(gen, h) * 0.5 + 1.0).to(dtype))
    eps = getattr(m, "variance_epsilon", None) or m.eps
    x = rand(gen, 1, 1000, h, dtype=dtype, scale=3.0).requires_grad_()
    g = rand(gen, 1, 1000, h, dtype=dtype)
    y_hf = m(x)
    y_hf.backward(g)
    gx_hf, gw_hf = x.grad.clone(), m.weight.grad.clone()
    x.grad = None
    m.weight.grad = None
    m.__class__ = patched
    y = m(x)
    y.backward(g)
    assert torch.equal(y, y_hf), "outputs differ from %s's" % base.__name__
    xd, wd, yd = _reference(x, m.weight, eps, **FORMS[family])
    yd.backward(g.double())
    slack = 1.5 if dtype == torch.bfloat16 else 4.0  # bf16: one rounding either way
    assert _err(x.grad, xd.grad) <= slack * _err(gx_hf, xd.grad) + 1e-7
    assert _err(m.weight.grad, wd.grad) <= slack * _err(gw_hf, wd.grad) + 1e-7
