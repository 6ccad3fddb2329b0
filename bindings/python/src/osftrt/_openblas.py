"""OpenBLAS's kernels on recent Intel Xeons, chosen before libosftrt loads.

Debian's OpenBLAS 0.3.21 (the BLAS a libosftrt built from Debian's packages
links) does not know recent Intel Xeons (Emerald Rapids, model 0xCF, among
others) and runs its generic SSE3 ("Prescott") kernels there: the library's
GEMMs then run 4-5x slower than OpenBLAS's own AVX-512 kernels on the same
CPU. OpenBLAS reads OPENBLAS_CORETYPE once, when it loads, so the choice must
be made before the extension is imported.

The rule: only on an Intel CPU with AVX-512 (F, BW, VL, DQ), only when the
caller has not chosen (OPENBLAS_CORETYPE unset), only when no OpenBLAS is
loaded in this process yet, and never with OSFTRT_OPENBLAS_CORETYPE=keep:
OPENBLAS_CORETYPE=SkylakeX (AVX-512 kernels). Other processes started from
this one inherit it, as they would a value the caller set.
"""
from __future__ import annotations

import os

_AVX512 = {"avx512f", "avx512bw", "avx512vl", "avx512dq"}


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
