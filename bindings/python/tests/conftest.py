"""Shared fixtures of the osftrt Python tests."""
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import osftrt

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
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


def run_ranks(worker, world, tmp_path, *args, timeout=240):
    """Runs `world` processes of the worker script `worker` (a file of this
    folder) as ``python WORKER RANK WORLD INIT_FILE ARGS...`` (INIT_FILE: the
    file:// rendezvous of torch.distributed, in tmp_path), one thread each;
    kills them all when one outlives `timeout` seconds. Asserts that every
    rank exits 0 and prints "rank R/W: OK"; returns every rank's output."""
    init = str(tmp_path / "init")
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    procs = [
        subprocess.Popen([sys.executable, os.path.join(HERE, worker), str(r), str(world), init] + [str(a) for a in args],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        for r in range(world)
    ]
    outs = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=timeout)
            outs.append((p.returncode, out))
    finally:  # a timeout (or an interrupt) leaves no rank behind
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    for r, (rc, out) in enumerate(outs):
        assert rc == 0, "rank %d failed (exit %d):\n%s" % (r, rc, out)
        assert "rank %d/%d: OK" % (r, world) in out, out
    return [out for _, out in outs]
