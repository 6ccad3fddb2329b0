"""The library's CPU thread count follows the host's (issue 55,
osftrt/_threads.py): torch.get_num_threads() by default and after a later
torch.set_num_threads(n), both for the library's own threads and its BLAS
engine's; osftrt.set_num_threads(n) pins a count (None follows torch again);
OSFTRT_NUM_THREADS in the environment is left to the library; bad counts
raise; a forked child computes what the parent does. Each scenario that
depends on import order or the environment runs in a fresh interpreter."""
import ctypes
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import osftrt
import osftrt.torch as ot
from osftrt import capi

from conftest import rand


def _library_count():
    """The library's count as it is now (capi: no follow-torch check)."""
    return capi.osft_get_num_threads()


def _blas_count():
    """The BLAS engine's own count, read from the engine the library loaded."""
    info = osftrt.build_info()
    if "OpenBLAS" in info:
        return ctypes.CDLL("libopenblas.so.0").openblas_get_num_threads()
    if "oneMKL" in info:
        for name in ("libmkl_rt.so.2", "libmkl_rt.so"):
            try:
                return ctypes.CDLL(name).MKL_Get_Max_Threads()
            except OSError:
                continue
    pytest.skip("cannot read the BLAS engine's count: %s" % info)


def _one_call(gen):
    """One small library call through the torch modules (FLCE)."""
    x = rand(gen, 16, 8)
    w = rand(gen, 12, 8)
    y = torch.randint(0, 12, (16,), generator=gen)
    return ot.fused_linear_cross_entropy(x, w, y)


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    osftrt.set_num_threads(None)
    torch.set_num_threads(before)


def test_follows_torch_set_num_threads(gen, restore_threads):
    for n in (1, 3, 2):
        torch.set_num_threads(n)
        _one_call(gen)
        assert _library_count() == n
        assert _blas_count() == n
    assert osftrt.get_num_threads() == torch.get_num_threads()


def test_osft_layer_and_qr_follow_too(gen, restore_threads):
    lin = torch.nn.Linear(8, 6)
    layer = ot.OSFTLinear.from_linear(lin, 0.5)
    torch.set_num_threads(3)
    layer(rand(gen, 4, 8)).sum().backward()
    assert _library_count() == 3
    torch.set_num_threads(1)
    osftrt.batched_qr([rand(gen, 6, 4)])
    assert _library_count() == 1 and _blas_count() == 1


def test_explicit_count_is_pinned_until_none(gen, restore_threads):
    osftrt.set_num_threads(3)
    torch.set_num_threads(1)
    _one_call(gen)
    assert _library_count() == 3 and _blas_count() == 3
    osftrt.set_num_threads(None)
    _one_call(gen)
    assert _library_count() == 1 and _blas_count() == 1


def test_bad_counts_raise_and_change_nothing(restore_threads):
    osftrt.set_num_threads(2)
    with pytest.raises(osftrt.InvalidArgument, match="n: -1"):
        osftrt.set_num_threads(-1)
    with pytest.raises(osftrt.InvalidArgument, match="n: 1025"):
        osftrt.set_num_threads(1025)
    with pytest.raises(TypeError):
        osftrt.set_num_threads(1.5)
    assert _library_count() == 2


def _fresh(code, env=None):
    full = dict(os.environ)
    for k in ("OSFTRT_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        full.pop(k, None)
    full.update(env or {})
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=full, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout.strip()


CALL = """
def call():
    x = torch.randn(16, 8); w = torch.randn(12, 8); y = torch.randint(0, 12, (16,))
    ot.fused_linear_cross_entropy(x, w, y)
"""


@pytest.mark.parametrize("order", ["osftrt first", "torch first"])
def test_fresh_interpreter_follows_whatever_the_import_order(order):
    imports = "import osftrt, torch" if order == "osftrt first" else "import torch, osftrt"
    got = _fresh(imports + "\nimport osftrt.torch as ot\nfrom osftrt import capi\n" + CALL + """
torch.set_num_threads(3)
call()
a = capi.osft_get_num_threads()
torch.set_num_threads(1)
call()
print(a, capi.osft_get_num_threads())
""")
    assert got == "3 1"


def test_environment_count_is_left_to_the_library():
    got = _fresh("import torch, osftrt\nimport osftrt.torch as ot\nfrom osftrt import capi\n" + CALL + """
torch.set_num_threads(1)
call()
print(capi.osft_get_num_threads())
""", env={"OSFTRT_NUM_THREADS": "3"})
    assert got == "3"


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork")
def test_forked_child_follows_and_computes_what_the_parent_does(gen, restore_threads):
    torch.set_num_threads(2)
    x = rand(gen, 64, 32)
    w = rand(gen, 4096, 32)
    y = torch.randint(0, 4096, (64,), generator=gen)
    parent = ot.fused_linear_cross_entropy(x, w, y)
    r, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        code = 1
        try:
            torch.set_num_threads(1)  # what a DataLoader worker does
            child = ot.fused_linear_cross_entropy(x, w, y)
            ok = capi.osft_get_num_threads() == 1 and torch.allclose(child, parent, rtol=1e-5, atol=0)
            code = 0 if ok else 2
        finally:
            os.write(wfd, bytes([code]))
            os._exit(code)
    os.close(wfd)
    status = os.read(r, 1)
    os.close(r)
    os.waitpid(pid, 0)
    assert status == b"\x00", "the child's check failed (%r)" % status
