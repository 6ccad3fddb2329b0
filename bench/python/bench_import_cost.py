#!/usr/bin/env python3
"""What importing the osftrt package costs a process that never uses CUDA
(issue 42): VmRSS added and wall time of the import, in fresh interpreters.

Variants, interleaved one process each per round (median of the rounds, so
load from elsewhere on the machine hits every variant alike):
  lazy    the package as shipped: libosftrt.so.1 links no CUDA library and
          its CUDA module loads on the first CUDA request;
  eager   the reference: the same import followed by what the first CUDA
          request maps (osftrt/_cudalibs.py's preload of PyTorch's copies,
          then the module with its CUDA libraries): what the wheel paid at
          import before the split, when libosftrt.so.1 linked CUDA itself;
  old     (--old-site DIR) a wheel of the pre-split library installed with
          `pip install --target DIR`, imported from there (the same venv's
          torch and nvidia-* wheels).
Ratios are lazy / eager (and lazy / old): below 1 is cheaper.

Run with the venv the wheel is installed in (a CUDA wheel, else both
variants are the same), e.g.
  build-pyvenv/bin/python bench/python/bench_import_cost.py --out bench/results/python_import_cpu.md
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys

PROBE = r"""
import ctypes, importlib, json, os, sys, time
def vmrss_mib():
    return int([l for l in open("/proc/self/status") if l.startswith("VmRSS:")][0].split()[1]) / 1024.0
def cuda_mapped():
    return sorted({os.path.basename(l.split()[-1]).split(".so")[0] for l in open("/proc/self/maps")
                   if len(l.split()) >= 6 and os.path.basename(l.split()[-1]).startswith(
                       ("libcudart.", "libcublas", "libcusolver.", "libcusparse.", "libnccl.", "libnvJitLink.",
                        "libosftrt_cuda."))})
before, t0 = vmrss_mib(), time.perf_counter()
importlib.import_module(sys.argv[1])
if sys.argv[2] == "eager":
    from osftrt import _cudalibs
    _cudalibs.before_cuda()
    module = _cudalibs.module_path(_cudalibs._PACKAGE_DIR)
    if module:
        ctypes.CDLL(module)
seconds = time.perf_counter() - t0
import osftrt
print(json.dumps({"mib": vmrss_mib() - before, "before": before, "s": seconds, "cuda": cuda_mapped(),
                  "from": os.path.dirname(osftrt.__file__)}))
"""


def run(module, variant, old_site):
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    if variant == "old":
        env["PYTHONPATH"] = old_site + (":" + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    mode = "eager" if variant == "eager" else "lazy"
    r = subprocess.run([sys.executable, "-c", PROBE, module, mode], capture_output=True, text=True, env=env,
                       cwd="/", timeout=300, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def cpu_name():
    info = {}
    for line in open("/proc/cpuinfo"):
        k, _, v = line.partition(":")
        info.setdefault(k.strip(), v.strip())
    return "%s (family %s, model %s)" % (info.get("model name"), info.get("cpu family"), info.get("model"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--modules", default="osftrt,osftrt.torch,osftrt.transformers")
    ap.add_argument("--old-site", help="a pre-split wheel installed with pip install --target (the 'old' variant)")
    ap.add_argument("--out", help="write the markdown table here too")
    a = ap.parse_args()
    variants = ["lazy", "eager"] + (["old"] if a.old_site else [])
    rows = []
    for module in a.modules.split(","):
        samples = {v: [] for v in variants}
        for _ in range(a.rounds):
            for v in variants:
                samples[v].append(run(module, v, a.old_site))
        med = {v: (statistics.median(s["mib"] for s in samples[v]), statistics.median(s["s"] for s in samples[v]),
                   samples[v][-1]["cuda"]) for v in variants}
        rows.append((module, med))
        print(module, json.dumps(med), flush=True)
    import torch

    lines = ["# What `import osftrt...` costs a process that uses no CUDA (issue 42)", "",
             "Machine: %s; Python %s; torch %s (CUDA %s); %d rounds, medians; fresh interpreter per sample." % (
                 cpu_name(), platform.python_version(), torch.__version__, torch.version.cuda, a.rounds), "",
             "lazy: the wheel as shipped (CUDA module loaded on the first CUDA request); eager: the same import "
             "followed by what the first CUDA request maps (the pre-split wheel's import, emulated)" +
             ("; old: the pre-split wheel itself" if a.old_site else "") + ". VmRSS added by the import, MiB; "
             "wall time of the import, s (indicative: a shared machine).", "",
             "| import | " + " | ".join("%s MiB" % v for v in variants) + " | lazy/eager MiB" +
             (" | lazy/old MiB" if a.old_site else "") + " | " + " | ".join("%s s" % v for v in variants) +
             " | CUDA libraries mapped after the lazy import (by anyone) |",
             "|" + "---|" * (2 * len(variants) + 3 + (1 if a.old_site else 0))]
    for module, med in rows:
        cells = ["%.1f" % med[v][0] for v in variants] + ["%.3f" % (med["lazy"][0] / med["eager"][0])]
        if a.old_site:
            cells.append("%.3f" % (med["lazy"][0] / med["old"][0]))
        cells += ["%.2f" % med[v][1] for v in variants]
        cells.append(", ".join(med["lazy"][2]) or "none")
        lines.append("| `%s` | %s |" % (module, " | ".join(cells)))
    lines += ["", "(`import osftrt.torch` and `osftrt.transformers` import PyTorch, whose CUDA wheel maps the CUDA "
              "libraries itself: there the module is all osftrt could save.)"]
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
