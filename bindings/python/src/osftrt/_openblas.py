"""The thread and kernel settings that must be made before the libraries
that read them load: OpenBLAS's kernels on recent Intel Xeons and how long
its idle threads spin (read when libosftrt loads OpenBLAS), and how long
GNU OpenMP's idle threads spin (read when PyTorch loads its libgomp).

Each library reads its settings from the environment once, when it loads;
other processes started from this one inherit them, as they would values
the caller set. None is touched when the caller has set it or when the
library that reads it is already loaded in this process.

Kernels (:func:`choose_core`).

Debian's OpenBLAS 0.3.21 (the BLAS a libosftrt built from Debian's packages
links) does not know recent Intel Xeons (Emerald Rapids, model 0xCF, among
others) and runs its generic SSE3 ("Prescott") kernels there: the library's
GEMMs then run 4-5x slower than OpenBLAS's own AVX-512 kernels on the same
CPU. OpenBLAS reads OPENBLAS_CORETYPE once, when it loads, so the choice must
be made before the extension is imported.

The rule: only on an Intel CPU with AVX-512 (F, BW, VL, DQ), and never with
OSFTRT_OPENBLAS_CORETYPE=keep: OPENBLAS_CORETYPE=SkylakeX (AVX-512 kernels).

Idle threads (:func:`choose_thread_timeout`). OpenBLAS's worker threads
busy-wait 2^28 cycles (about 0.1 s) after each call before they sleep.
Python callers run PyTorch's ops between the library's calls, on PyTorch's
own thread pool: the spinning workers then take cores from those ops
(on 2 cores, PyTorch's element-wise ops between the tiled MLP and the fused
loss took 2-4x their time, and the long-context step at 2048 tokens 1.12x;
bench/results/long_context_cpu.md). OPENBLAS_THREAD_TIMEOUT=16 (2^16
cycles, some 20 microseconds) lets them sleep at once; a call wakes them
again in microseconds, against GEMMs of milliseconds.

PyTorch's idle threads (:func:`choose_omp_spin`). The other way round:
PyTorch's OpenMP workers (GNU libgomp) busy-wait 300000 spins (some 5 ms on
AMD Zen 4) after each parallel op, and a library call that follows runs its
two OpenBLAS threads beside a spinning one. On 2 cores an OSFT layer's
forward and backward took 1.9x their time after a PyTorch op (21.0 against
11.1 ms at 1024 x 512 x 512), and the OSFT step of the small Llama of
bench/results/hf_step_cpu.md 1.2-1.3x full fine-tuning's instead of
0.99-1.1x. GOMP_SPINCOUNT=10000 (some 0.2 ms) keeps PyTorch's own speed
(full fine-tuning's step within noise). libgomp reads it when it loads,
i.e. at ``import torch``: so only when no libgomp is loaded yet (osftrt
imported before torch) and the caller set neither GOMP_SPINCOUNT nor
OMP_WAIT_POLICY; otherwise set it in the environment that starts Python.
"""
from __future__ import annotations

import os

_AVX512 = {"avx512f", "avx512bw", "avx512vl", "avx512dq"}
THREAD_TIMEOUT = "16"  # log2 of the cycles OpenBLAS's idle workers spin
OMP_SPIN = "10000"  # spins of an idle GNU OpenMP worker before it sleeps


def _cpu():
    vendor, flags = "", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "vendor_id":
                    vendor = value.strip()
                elif key == "flags":
                    flags = set(value.split())
                    break
    except OSError:
        pass
    return vendor, flags


def _loaded(name):
    try:
        with open("/proc/self/maps") as f:
            return any(name in line for line in f)
    except OSError:
        return True  # cannot tell: leave the library alone


def _openblas_loaded():
    return _loaded("libopenblas")


def _libgomp_loaded():
    return _loaded("libgomp")


def choose_core(environ=os.environ):
    """Sets OPENBLAS_CORETYPE by the rule above; returns what it set, or None."""
    if "OPENBLAS_CORETYPE" in environ or environ.get("OSFTRT_OPENBLAS_CORETYPE") == "keep":
        return None
    vendor, flags = _cpu()
    if vendor != "GenuineIntel" or not _AVX512 <= flags or _openblas_loaded():
        return None
    environ["OPENBLAS_CORETYPE"] = "SkylakeX"
    return "SkylakeX"


def choose_thread_timeout(environ=os.environ):
    """Sets OPENBLAS_THREAD_TIMEOUT by the rule above; returns what it set,
    or None."""
    if "OPENBLAS_THREAD_TIMEOUT" in environ or _openblas_loaded():
        return None
    environ["OPENBLAS_THREAD_TIMEOUT"] = THREAD_TIMEOUT
    return THREAD_TIMEOUT


def choose_omp_spin(environ=os.environ):
    """Sets GOMP_SPINCOUNT by the rule above; returns what it set, or None."""
    if "GOMP_SPINCOUNT" in environ or "OMP_WAIT_POLICY" in environ or _libgomp_loaded():
        return None
    environ["GOMP_SPINCOUNT"] = OMP_SPIN
    return OMP_SPIN
