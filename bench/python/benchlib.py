"""What the Python step benchmarks (bench_hf_step.py, bench_fsdp2_step.py)
share: the machine line of their reports, the resident-set readings, the
versions line and the report's output (stdout, and a Markdown file with
--out). Imported by path: the scripts run as ``python bench/python/X.py``,
which puts this folder first on sys.path."""
import os
import platform
import subprocess
import sys
import time


def machine(isa=False, gpu=False):
    """"<CPU model>, <n> cores", with `isa` the AVX-512 / AMX flags the CPU
    has ("no AVX-512" where none), with `gpu` first the GPU torch sees
    ("<name>, <GiB> GiB, <SMs> SMs, CUDA <version>, driver <version>")."""
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
    if gpu:
        text = "%s; %s" % (_gpu(), text)
    return text


def _gpu():
    import torch

    p = torch.cuda.get_device_properties(torch.cuda.current_device())
    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True).stdout.strip().splitlines()
    except OSError:
        driver = []
    return "%s, %.0f GiB, %d SMs, CUDA %s%s" % (p.name, p.total_memory / 2**30, p.multi_processor_count,
                                              torch.version.cuda, ", driver " + driver[0] if driver else "")


# glibc's mmap and trim thresholds at 64 KiB, for a child process whose
# resident set is read as its memory: else freed blocks stay resident and
# hide (or fake) what a later phase allocates.
LEAN_MALLOC = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "65536"}


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


def sync(device):
    """Waits for the GPU's queued work (nothing on the CPU): before and after
    a timed region."""
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def memory_now(device):
    """Bytes in use: torch's allocated CUDA memory, or the resident set."""
    import torch

    return torch.cuda.memory_allocated() if device == "cuda" else rss_kib() * 1024


def memory_start(device):
    """Resets the peak (CUDA's allocator statistics, or VmHWM) and returns
    memory_now(device): the base a later memory_peak is read against."""
    import torch

    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    else:
        reset_peak()
    return memory_now(device)


def memory_peak(device):
    """The peak since memory_start, in bytes (CUDA allocator, or VmHWM)."""
    import torch

    return torch.cuda.max_memory_allocated() if device == "cuda" else rss_kib("VmHWM") * 1024


def enable_checkpointing(model):
    """Hugging Face's activation checkpointing, non-reentrant (the newer
    name where transformers has it)."""
    kw = {"use_reentrant": False}
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:
        enable(activation_checkpointing_kwargs=kw)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kw)


def commit(path=None):
    """The checkout's short commit id ("unknown" outside git)."""
    try:
        return subprocess.run(["git", "-C", path or os.path.dirname(os.path.abspath(__file__)), "rev-parse",
                               "--short", "HEAD"], capture_output=True, text=True).stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def loadavg():
    """The 1, 5 and 15 minute load averages (NaN where unreadable)."""
    try:
        return tuple(float(x) for x in open("/proc/loadavg").read().split()[:3])
    except OSError:
        return (float("nan"),) * 3


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


def finish_process(code=0):
    """Ends a benchmark's worker process with `code` and nothing after it:
    the process group destroyed (if one is up), the output flushed, then
    os._exit. PyTorch's gloo teardown at interpreter exit can abort a
    process that has done its work ("terminate called without an active
    exception", issue 36); os._exit skips that teardown, so the exit status
    is the script's own."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
