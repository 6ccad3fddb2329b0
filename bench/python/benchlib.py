"""What the Python step benchmarks (bench_hf_step.py, bench_fsdp2_step.py)
share: the machine line of their reports, the resident-set readings, the
versions line and the report's output (stdout, and a Markdown file with
--out). Imported by path: the scripts run as ``python bench/python/X.py``,
which puts this folder first on sys.path."""
import os
import platform
import subprocess
import time


def machine(isa=False):
    """"<CPU model>, <n> cores", and with `isa` the AVX-512 / AMX flags the
    CPU has ("no AVX-512" where none)."""
    cpu = "unknown CPU"
    try:
        cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        cpu = next(l.split(":", 1)[1].strip() for l in cpu.splitlines() if l.startswith("Model name"))
    except Exception:
        pass
    text = "%s, %d cores" % (cpu, os.cpu_count())
    if isa:
        flags = open("/proc/cpuinfo").read()
        found = [f for f in ("avx512f", "avx512_bf16", "amx_bf16", "amx_tile") if " %s " % f in flags]
        text += " (%s)" % (", ".join(found) or "no AVX-512")
    return text


def rss_kib(field="VmRSS"):
    """This process's resident set (VmRSS) or its peak (VmHWM), in KiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(field)


def reset_peak():
    """Resets this process's peak resident set (VmHWM) to the current one."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def versions(build_info=False):
    """"date: ...; Python ...; torch ..., transformers ..., peft ..., osftrt
    ..." for the report's header (with `build_info`, the library's build line
    after the osftrt version)."""
    import osftrt
    import peft
    import torch
    import transformers

    lib = osftrt.version()
    if build_info:
        lib += " (%s)" % osftrt.build_info().splitlines()[0]
    return "date: %s; Python %s; torch %s, transformers %s, peft %s, osftrt %s" % (
        time.strftime("%Y-%m-%d"), platform.python_version(), torch.__version__, transformers.__version__,
        peft.__version__, lib)


def report(lines, out=None):
    """Prints the report (its lines, Markdown) and writes it to `out` too
    when given. Returns 0 (the scripts' exit status)."""
    text = "\n".join(lines) + "\n"
    print(text)
    if out:
        with open(out, "w") as f:
            f.write(text)
    return 0
