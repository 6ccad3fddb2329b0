"""The OpenBLAS settings osftrt makes before libosftrt loads its BLAS
(osftrt/_openblas.py): the AVX-512 kernels on Intel CPUs that Debian's
OpenBLAS does not know, and idle threads that sleep at once instead of
spinning beside PyTorch's thread pool. Each is left alone when the caller
set it or when an OpenBLAS is already loaded; a fresh interpreter shows
what ``import osftrt`` does."""
import os
import subprocess
import sys

import pytest

from osftrt import _openblas

AVX512 = {"avx512f", "avx512bw", "avx512vl", "avx512dq", "sse3"}


@pytest.fixture
def not_loaded(monkeypatch):
    monkeypatch.setattr(_openblas, "_openblas_loaded", lambda: False)


def test_thread_timeout_set_when_unset(not_loaded):
    env = {}
    assert _openblas.choose_thread_timeout(env) == _openblas.THREAD_TIMEOUT
    assert env == {"OPENBLAS_THREAD_TIMEOUT": _openblas.THREAD_TIMEOUT}
    assert 4 <= int(_openblas.THREAD_TIMEOUT) < 28  # OpenBLAS's range, under its default


def test_thread_timeout_the_callers_value_wins(not_loaded):
    env = {"OPENBLAS_THREAD_TIMEOUT": "28"}
    assert _openblas.choose_thread_timeout(env) is None
    assert env == {"OPENBLAS_THREAD_TIMEOUT": "28"}


def test_nothing_set_once_an_openblas_is_loaded(monkeypatch):
    monkeypatch.setattr(_openblas, "_openblas_loaded", lambda: True)
    monkeypatch.setattr(_openblas, "_cpu", lambda: ("GenuineIntel", AVX512))
    env = {}
    assert _openblas.choose_thread_timeout(env) is None
    assert _openblas.choose_core(env) is None
    assert env == {}


@pytest.mark.parametrize("vendor,flags,env,want", [
    ("GenuineIntel", AVX512, {}, "SkylakeX"),
    ("GenuineIntel", {"avx2", "avx512f"}, {}, None),  # not the whole AVX-512 set
    ("AuthenticAMD", AVX512, {}, None),  # OpenBLAS knows Zen
    ("GenuineIntel", AVX512, {"OPENBLAS_CORETYPE": "Haswell"}, None),
    ("GenuineIntel", AVX512, {"OSFTRT_OPENBLAS_CORETYPE": "keep"}, None),
])
def test_core_rule(monkeypatch, not_loaded, vendor, flags, env, want):
    monkeypatch.setattr(_openblas, "_cpu", lambda: (vendor, flags))
    before = dict(env)
    assert _openblas.choose_core(env) == want
    assert env == (dict(before, OPENBLAS_CORETYPE=want) if want else before)


def _fresh_import(env):
    code = "import os, osftrt; print(os.environ.get('OPENBLAS_THREAD_TIMEOUT'))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1]


def test_import_sets_the_thread_timeout_unless_the_caller_did():
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
    assert _fresh_import(env) == _openblas.THREAD_TIMEOUT
    assert _fresh_import(dict(env, OPENBLAS_THREAD_TIMEOUT="28")) == "28"
