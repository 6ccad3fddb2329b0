"""OpenBLAS's settings that must be made before libosftrt loads it: the
kernels on recent Intel Xeons, and how long its idle threads spin.

OpenBLAS reads both from the environment once, when it loads; other
processes started from this one inherit them, as they would values the
caller set. Neither is touched when the caller has set it or when an
OpenBLAS is already loaded in this process.

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
"""
from __future__ import annotations

import os

_AVX512 = {"avx512f", "avx512bw", "avx512vl", "avx512dq"}
THREAD_TIMEOUT = "16"  # log2 of the cycles OpenBLAS's idle workers spin


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


def _openblas_loaded():
    try:
        with open("/proc/self/maps") as f:
            return any("libopenblas" in line for line in f)
    except OSError:
        return True  # cannot tell: leave OpenBLAS alone


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
