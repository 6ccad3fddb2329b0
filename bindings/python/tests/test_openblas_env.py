"""The settings osftrt makes before the libraries that read them load
(osftrt/_openblas.py): the AVX-512 kernels on Intel CPUs that Debian's
OpenBLAS does not know; OpenBLAS's idle threads that sleep at once instead
of spinning beside PyTorch's thread pool; PyTorch's (GNU OpenMP) idle
threads that spin briefly beside the library's. Each is left alone when the
caller set it or when the library that reads it is already loaded; fresh
interpreters show what ``import osftrt`` does, before and after torch."""
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


@pytest.mark.parametrize("env", [{}, {"GOMP_SPINCOUNT": "300000"}, {"OMP_WAIT_POLICY": "active"}])
def test_omp_spin_set_only_when_the_caller_chose_nothing(monkeypatch, env):
    monkeypatch.setattr(_openblas, "_libgomp_loaded", lambda: False)
    before = dict(env)
    got = _openblas.choose_omp_spin(env)
    if before:
        assert got is None and env == before
    else:
        assert got == _openblas.OMP_SPIN and env == {"GOMP_SPINCOUNT": _openblas.OMP_SPIN}


def test_nothing_set_once_an_openblas_is_loaded(monkeypatch):
    monkeypatch.setattr(_openblas, "_openblas_loaded", lambda: True)
    monkeypatch.setattr(_openblas, "_libgomp_loaded", lambda: True)
    monkeypatch.setattr(_openblas, "_cpu", lambda: ("GenuineIntel", AVX512))
    env = {}
    assert _openblas.choose_thread_timeout(env) is None
    assert _openblas.choose_core(env) is None
    assert _openblas.choose_omp_spin(env) is None
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


def _fresh_import(env, imports="osftrt", var="OPENBLAS_THREAD_TIMEOUT"):
    code = "import os, %s; print(os.environ.get(%r))" % (imports, var)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1]


def _clean_env():
    drop = ("OPENBLAS_THREAD_TIMEOUT", "GOMP_SPINCOUNT", "OMP_WAIT_POLICY")
    return {k: v for k, v in os.environ.items() if k not in drop}


def test_import_sets_the_thread_timeout_unless_the_caller_did():
    env = _clean_env()
    assert _fresh_import(env) == _openblas.THREAD_TIMEOUT
    assert _fresh_import(dict(env, OPENBLAS_THREAD_TIMEOUT="28")) == "28"


def test_import_before_torch_sets_the_omp_spin_after_torch_not():
    pytest.importorskip("torch")
    if not _openblas._libgomp_loaded():
        pytest.skip("this torch runs no GNU OpenMP")
    env = _clean_env()
    assert _fresh_import(env, "osftrt, torch", "GOMP_SPINCOUNT") == _openblas.OMP_SPIN
    assert _fresh_import(env, "torch, osftrt", "GOMP_SPINCOUNT") == "None"  # its libgomp has read the environment
    assert _fresh_import(dict(env, OMP_WAIT_POLICY="passive"), "osftrt, torch", "GOMP_SPINCOUNT") == "None"
