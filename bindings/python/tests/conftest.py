"""Shared fixtures of the osftrt Python tests."""
import os
import sys

import numpy as np
import pytest
import torch

import osftrt

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
sys.path.insert(0, os.path.join(REPO, "examples", "python"))

# torch's and OpenBLAS's thread pools would fight over the cores (2 in CI)
torch.set_num_threads(1)


@pytest.fixture
def ctx():
    c = osftrt.Context("cpu")
    yield c
    c.close()


@pytest.fixture
def gen():
    """A fresh, seeded generator per test (inputs are random, never zero)."""
    return torch.Generator().manual_seed(int.from_bytes(os.urandom(2), "little"))


def rand(gen, *shape, dtype=torch.float32, scale=1.0):
    return (torch.randn(*shape, generator=gen, dtype=torch.float64) * scale).to(dtype)


def poison(*shape, dtype=torch.float32):
    return torch.full(shape, float("nan"), dtype=dtype)


def assert_close(got, want, rtol, atol, what=""):
    got = got.detach().to(torch.float64)
    want = want.detach().to(torch.float64)
    assert got.shape == want.shape, (what, got.shape, want.shape)
    assert torch.isfinite(got).all(), "%s: non-finite (unwritten?) values" % what
    err = (got - want).abs()
    tol = atol + rtol * want.abs()
    assert (err <= tol).all(), "%s: max err %.3e (max |want| %.3e)" % (what, err.max().item(), want.abs().max().item())
