"""CUDA libraries next to PyTorch (osftrt/_cudalibs.py, DESIGN.md section 6).

libosftrt.so.1 links no CUDA library; its CUDA module (libosftrt_cuda.so.1,
bundled beside it in the wheel) is loaded by the core on the first CUDA
request, and osftrt.capi preloads PyTorch's copies of the libraries the
module needs just before that. So:

* ``import osftrt`` (``osftrt.torch``, ``osftrt.transformers``) and CPU work
  map no CUDA library that PyTorch itself has not mapped, and never the
  module;
* ``import osftrt`` before or after ``import torch``, and a CUDA request
  before or after ``import torch``, must all work and leave the process with
  one copy of each CUDA library, the one PyTorch's nvidia-* wheels provide
  where they provide it.

With a CPU-only libosftrt (or a torch without nvidia-* wheels) the same
checks run and must pass too; the CI stage on PyPI's PyTorch builds the wheel
with CUDA where a toolkit is installed (.ci/stage_python_torch2.sh), which is
where a wrong order used to fail (``libtorch_cuda.so: undefined symbol:
ncclCommResume``). A CUDA request without a GPU still loads the module (the
context then fails with osftrt.NoDevice), which is what the probes use.

Each order runs in a fresh interpreter (a subprocess): a library once loaded
stays loaded, so the order can only be tested from the start."""
import json
import os
import shutil
import subprocess
import sys
import threading

import pytest

import osftrt
from osftrt import _cudalibs, capi

PKG = os.path.dirname(os.path.abspath(osftrt.__file__))
HERE = os.path.dirname(os.path.abspath(__file__))
# every file name that counts as a CUDA library here: those _cudalibs may
# preload, and the module itself
CUDA_PREFIXES = _cudalibs._ORDER + ("libosftrt_cuda.",)

# The probes' common part: the files this process has mapped whose names
# start with one of `prefixes`, by library name (what precedes ".so"); its
# resident memory; and one request that loads the CUDA module (a CUDA
# context: without a GPU the module loads and the context fails NO_DEVICE; a
# CPU-only build fails NOT_SUPPORTED and loads nothing). stream=0: no torch.
MAPS = r"""
import json, os, sys
def mapped_files(prefixes):
    mapped = {}
    for line in open("/proc/self/maps"):
        path = line.split()[-1] if len(line.split()) >= 6 else ""
        base = os.path.basename(path)
        if base.startswith(prefixes):
            mapped.setdefault(base.split(".so")[0], set()).add(os.path.realpath(path))
    return mapped
def vmrss_kib():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
def cuda_request():
    import osftrt
    try:
        osftrt.Context("cuda:0", stream=0).close()
        return "a CUDA context"
    except (osftrt.NoDevice, osftrt.NotSupported) as e:
        return "%s: %s" % (type(e).__name__, e)
"""


def _run(code, *args, env=None):
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", **(env or {}))
    r = subprocess.run([sys.executable, "-c", code] + list(args), capture_output=True, text=True, env=env,
                       timeout=240, cwd=HERE)
    assert r.returncode == 0, "probe %s failed (exit %d):\n%s" % (args, r.returncode, r.stderr[-3000:])
    return json.loads(r.stdout.strip().splitlines()[-1])


def _module():
    return _cudalibs.module_path(PKG)


def _have(name):
    import importlib.util

    return importlib.util.find_spec(name) is not None


# Imports osftrt and torch, and makes the first CUDA request, in the order of
# argv[1]: "osftrt" (osftrt, torch, CUDA), "torch" (torch, osftrt, CUDA) or
# "cuda" (osftrt, CUDA, then torch); then a CPU call. Reports every mapped
# file with a CUDA library prefix, what _cudalibs loaded, and torch's CUDA.
PROBE = MAPS + r"""
order = sys.argv[1]
if order == "osftrt":
    import osftrt.torch, torch
    request = cuda_request()
elif order == "torch":
    import torch, osftrt.torch
    request = cuda_request()
else:
    import osftrt
    request = cuda_request()
    import torch, osftrt.torch
from osftrt import _cudalibs
x = torch.ones(3)
assert float(osftrt.torch.fused_linear_cross_entropy(x.view(1, 3), torch.eye(3), torch.tensor([1]))) > 0
mapped = mapped_files(tuple(sys.argv[2].split(",")))
print(json.dumps({"mapped": {k: sorted(v) for k, v in mapped.items()}, "loaded": _cudalibs.LOADED,
                  "request": request, "torch_cuda": torch.version.cuda}))
"""


def test_every_order_of_import_and_cuda_request_loads_one_copy_of_each_cuda_library():
    module = _module()
    wanted = _cudalibs.cuda_sonames(module) if module else []
    roots = _cudalibs.search_roots(PKG)
    results = {order: _run(PROBE, order, ",".join(CUDA_PREFIXES)) for order in ("osftrt", "torch", "cuda")}
    for order, r in results.items():
        for name, files in r["mapped"].items():
            assert len(files) == 1, "order %s: %s mapped from %d files: %s" % (order, name, len(files), files)
        if module is not None:  # the request loaded it, from beside the core
            assert r["mapped"].get("libosftrt_cuda") == [os.path.realpath(module)], (order, r["request"], module)
        for soname in wanted:
            files = r["mapped"].get(soname.split(".so")[0], [])
            assert files, "order %s: the CUDA module needs %s but it is not mapped" % (order, soname)
            wheel = _cudalibs.find(soname, roots)
            if wheel is not None:  # PyTorch's copy, not the toolkit's
                assert files == [os.path.realpath(wheel)], (order, soname, files, wheel)
    assert results["osftrt"]["mapped"] == results["torch"]["mapped"] == results["cuda"]["mapped"]


# Step by step in one fresh interpreter: import osftrt alone, then each layer
# after what it depends on (torch, transformers), then a CPU fused
# cross-entropy call; at each step the mapped CUDA libraries and VmRSS. Then
# (argv[1] == "direct") `import osftrt.transformers` as the first line of a
# program, as `python -c "import osftrt.transformers"` does.
STEPS = MAPS + r"""
prefixes = tuple(sys.argv[2].split(","))
steps = [("start", vmrss_kib(), mapped_files(prefixes))]
def step(name):
    steps.append((name, vmrss_kib(), mapped_files(prefixes)))
if sys.argv[1] == "direct":
    import osftrt.transformers
    step("import osftrt.transformers")
else:
    import osftrt
    step("import osftrt")
    import torch
    step("import torch")
    import osftrt.torch
    step("import osftrt.torch")
    try:
        import transformers
        step("import transformers")
    except ImportError:
        pass
    import osftrt.transformers
    step("import osftrt.transformers")
import torch, osftrt.torch
g = torch.Generator().manual_seed(int.from_bytes(os.urandom(2), "little"))
h, w = torch.randn(4, 8, generator=g), torch.randn(16, 8, generator=g)
y = torch.randint(0, 16, (4,), generator=g)
loss = osftrt.torch.fused_linear_cross_entropy(h, w, y)
ref = torch.nn.functional.cross_entropy(h.double() @ w.double().T, y)
assert abs(float(loss) - float(ref)) <= 1e-5 * abs(float(ref)), (float(loss), float(ref))
step("CPU fused cross-entropy")
print(json.dumps([(n, kib, {k: sorted(v) for k, v in m.items()}) for n, kib, m in steps]))
"""


def _mib(kib):
    return kib / 1024.0


def test_import_and_cpu_work_map_no_cuda_library(capsys):
    pytest.importorskip("torch")
    prefixes = ",".join(CUDA_PREFIXES)
    steps = _run(STEPS, "steps", prefixes)
    by_name = {n: (kib, mapped) for n, kib, mapped in steps}
    # osftrt alone maps none at all; every layer after its dependencies
    # adds none to what they mapped (a CUDA PyTorch maps its own)
    assert by_name["import osftrt"][1] == {}, by_name["import osftrt"][1]
    baseline = by_name.get("import transformers", by_name["import torch"])[1]
    assert by_name["import osftrt.torch"][1] == by_name["import torch"][1]
    for name in ("import osftrt.transformers", "CPU fused cross-entropy"):
        assert by_name[name][1] == baseline, (name, by_name[name][1], baseline)
    direct = _run(STEPS, "direct", prefixes)
    assert "libosftrt_cuda" not in direct[-1][2]
    assert direct[-1][2] == baseline, (direct[-1][2], baseline)
    # the figures (the issue asks for them): what each import adds to VmRSS
    lines = ["osftrt import cost (VmRSS, MiB; CUDA libraries mapped: %s):" % (sorted(baseline) or "none")]
    for (prev, prev_kib, _), (name, kib, _) in zip(steps, steps[1:]):
        lines.append("  %-28s %+8.1f  (%.1f -> %.1f)" % (name, _mib(kib - prev_kib), _mib(prev_kib), _mib(kib)))
    lines.append("  python -c 'import osftrt.transformers': %.1f -> %.1f MiB (%+.1f)" % (
        _mib(direct[0][1]), _mib(direct[1][1]), _mib(direct[1][1] - direct[0][1])))
    with capsys.disabled():
        print("\n" + "\n".join(lines))


def test_capi_preloads_once_before_each_request_that_loads_the_module(monkeypatch):
    """The four calls that load the module call _cudalibs.before_cuda()
    first; CPU requests and device counts (which map the CUDA driver alone)
    do not (the C calls are stand-ins here)."""
    calls = []
    monkeypatch.setattr(_cudalibs, "before_cuda", lambda: calls.append("before_cuda"))
    for name in ("osft_context_create", "osft_device_count", "osft_comm_nccl_unique_id", "osft_comm_create_nccl",
                 "osft_comm_create_nccl_from_id"):
        monkeypatch.setattr(capi._capi, name, lambda *a, _n=name: calls.append(_n))
    cpu, cuda = capi.osft_context_options_t(), capi.osft_context_options_t()
    cpu.device_type, cuda.device_type = capi.OSFT_DEVICE_CPU, capi.OSFT_DEVICE_CUDA
    capi.osft_context_create(cpu)
    capi.osft_context_create(None)
    capi.osft_device_count(capi.OSFT_DEVICE_CPU)
    assert calls == ["osft_context_create"] * 2 + ["osft_device_count"]
    del calls[:]
    capi.osft_context_create(cuda)
    capi.osft_device_count(capi.OSFT_DEVICE_CUDA)
    capi.osft_comm_nccl_unique_id(None)
    capi.osft_comm_create_nccl(None, 0, None)
    capi.osft_comm_create_nccl_from_id(None, None, 1, 0, None)
    assert calls == ["before_cuda", "osft_context_create", "osft_device_count", "before_cuda",
                     "osft_comm_nccl_unique_id", "before_cuda", "osft_comm_create_nccl", "before_cuda",
                     "osft_comm_create_nccl_from_id"]


def test_before_cuda_preloads_once_across_threads(monkeypatch):
    runs = []
    monkeypatch.setattr(_cudalibs, "preload", lambda package_dir, environ: runs.append(package_dir))
    monkeypatch.setattr(_cudalibs, "_done", False)
    threads = [threading.Thread(target=_cudalibs.before_cuda) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    _cudalibs.before_cuda()
    assert runs == [PKG]


# Loads libosftrt.so.1 (argv[1]) by itself, as a C-level user of the wheel
# would (no osftrt import, so no preload), checks it mapped no CUDA library,
# asks it for a CUDA context (which loads the module, GPU or not: its own run
# path decides; a device count maps the driver alone), then imports torch, which must find what it needs (the defect: an
# older NCCL loaded first made libtorch_cuda fail on a missing symbol).
DIRECT = MAPS + r"""
import ctypes
prefixes = tuple(sys.argv[3].split(","))
core = ctypes.CDLL(sys.argv[1])
at_load = mapped_files(prefixes)
# a CUDA context (the 1.0 layout: size_t struct_size, then the device type)
opts = ctypes.create_string_buffer(int(sys.argv[4]))
assert core.osft_context_options_init(opts, ctypes.c_size_t(len(opts))) == 0
ctypes.c_int.from_buffer(opts, ctypes.sizeof(ctypes.c_size_t)).value = int(sys.argv[2])
ctx = ctypes.c_void_p()
status = core.osft_context_create(ctypes.byref(ctx), opts)
mapped = mapped_files(prefixes)
if ctx.value:
    core.osft_context_destroy(ctx)
import torch
print(json.dumps({"at_load": {k: sorted(v) for k, v in at_load.items()}, "status": status,
                  "mapped": {k: sorted(v) for k, v in mapped.items()}}))
"""


def test_direct_load_maps_nothing_then_the_module_takes_the_wheel_copies_beside_the_package():
    lib, module = _cudalibs.library_path(PKG), _module()
    if module is None:
        pytest.skip("a CPU-only libosftrt has no CUDA module")
    if os.path.dirname(module) != PKG:
        # a binding against an installed library: without `import osftrt` nothing preloads, and the installed
        # module's own run path decides (a toolkit's older NCCL then breaks `import torch`: not ours to set)
        pytest.skip("the CUDA module is not bundled with the package (%s)" % module)
    wanted = _cudalibs.cuda_sonames(module)
    _, runpath = _cudalibs.dynamic_entries(module)
    beside = os.path.dirname(PKG)  # site-packages, where PyTorch's nvidia-* wheels are
    # the bundled module (pip install .): PyTorch's layout first
    assert runpath[:2] == ["$ORIGIN/../nvidia/cu13/lib", "$ORIGIN/../nvidia/nccl/lib"], runpath
    # the defect's setting: the toolkit the module was built with (its absolute run path folders) also in
    # the loader's path, ahead of everything else
    toolkit = [d for d in runpath if d and not d.startswith("$ORIGIN")]
    env = {"LD_LIBRARY_PATH": ":".join(toolkit + [os.environ.get("LD_LIBRARY_PATH", "")]).rstrip(":")}
    r = _run(DIRECT, lib, str(capi.OSFT_DEVICE_CUDA), ",".join(CUDA_PREFIXES),
             str(capi.osft_context_options_t().struct_size), env=env)
    assert r["at_load"] == {}, r["at_load"]
    assert r["status"] in (capi.OSFT_STATUS_SUCCESS, capi.OSFT_STATUS_NO_DEVICE), r
    mapped = r["mapped"]
    for name, files in mapped.items():
        assert len(files) == 1, "%s mapped from %d files: %s" % (name, len(files), files)
    assert mapped.get("libosftrt_cuda") == [os.path.realpath(module)], (mapped, module)
    for soname in wanted:
        wheel = _cudalibs.find(soname, [beside])
        if wheel is not None:
            assert mapped.get(soname.split(".so")[0]) == [os.path.realpath(wheel)], (soname, mapped, wheel)


def test_core_needs_no_cuda_library_and_the_module_its_cuda_libraries():
    lib, module = _cudalibs.library_path(PKG), _module()
    assert lib is not None and os.path.exists(lib), "no libosftrt.so.1 found for %s" % PKG
    assert _cudalibs.cuda_sonames(lib) == [], _cudalibs.dynamic_entries(lib)[0]
    if osftrt.capi.osft_has_feature(capi.OSFT_FEATURE_CUDA):
        assert module is not None, "libosftrt has CUDA but no %s beside %s" % (_cudalibs.MODULE, lib)
        assert any(n.startswith("libcudart.") for n in _cudalibs.cuda_sonames(module)), module
    else:
        assert module is None or os.path.dirname(module) != os.path.dirname(lib), module


def test_needed_libraries_match_readelf():
    readelf = shutil.which("readelf")
    if readelf is None:
        pytest.skip("no readelf (binutils) to compare with")
    for lib in filter(None, (_cudalibs.library_path(PKG), _module())):
        out = subprocess.run([readelf, "-d", lib], capture_output=True, text=True, check=True).stdout
        want = [l.split("[", 1)[1].rstrip("]") for l in out.splitlines() if "(NEEDED)" in l]
        want_rp = [d for l in out.splitlines() if "(RUNPATH)" in l or "(RPATH)" in l
                   for d in l.split("[", 1)[1].rstrip("]").split(":") if d]
        needed, runpath = _cudalibs.dynamic_entries(lib)
        assert needed == want and runpath == want_rp and "libc.so.6" in needed, lib
        if os.path.dirname(lib) == PKG:  # bundled: no empty entry (the loader would search the current folder)
            raw = [l.split("[", 1)[1].rstrip("]") for l in out.splitlines() if "(RUNPATH)" in l or "(RPATH)" in l]
            assert all("" not in r.split(":") for r in raw), (lib, raw)
    assert _cudalibs.dynamic_entries(os.path.join(PKG, "__init__.py")) == ([], [])  # not an ELF file


def _touch(path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    open(path, "w").close()
    return path


def test_search_order_prefers_earlier_roots_and_skips_folders_without_nvidia(tmp_path):
    a, b, c = (str(tmp_path / n) for n in "abc")
    _touch(os.path.join(b, "nvidia", "cu13", "lib", "libcublas.so.13"))
    want = _touch(os.path.join(a, "nvidia", "nccl", "lib", "libnccl.so.2"))
    _touch(os.path.join(b, "nvidia", "nccl", "lib", "libnccl.so.2"))
    os.makedirs(c)
    pkg = os.path.join(c, "osftrt")
    roots = _cudalibs.search_roots(pkg, path=[a, c, b, a])
    assert roots[-2:] == [a, b] and c not in roots  # c has no nvidia/; a once
    assert _cudalibs.find("libnccl.so.2", [a, b]) == want
    assert _cudalibs.find("libnccl.so.2", [b, a]).startswith(b)
    assert _cudalibs.find("libcublas.so.13", [a, b]).startswith(b)
    assert _cudalibs.find("libcublas.so.12", [a, b]) is None  # another CUDA major: not this soname


def test_cuda_sonames_in_dependency_order(tmp_path, monkeypatch):
    names = ["libstdc++.so.6", "libnccl.so.2", "libcusolver.so.12", "libcublas.so.13", "libcudart.so.13"]
    monkeypatch.setattr(_cudalibs, "dynamic_entries", lambda path: (names, []))
    assert _cudalibs.cuda_sonames("x") == ["libcudart.so.13", "libcublas.so.13", "libcusolver.so.12", "libnccl.so.2"]


def test_system_setting_loads_nothing():
    assert _cudalibs.preload(PKG, environ={"OSFTRT_CUDA_LIBS": "system"}) == {}


def _fake_roots(monkeypatch, root, sonames):
    """preload() as if the CUDA module needed `sonames` and only `root` had wheels."""
    monkeypatch.setattr(_cudalibs, "module_path", lambda package_dir, environ: _cudalibs.MODULE)
    monkeypatch.setattr(_cudalibs, "cuda_sonames", lambda library: list(sonames))
    monkeypatch.setattr(_cudalibs, "search_roots", lambda package_dir: [str(root)])
    monkeypatch.setattr(_cudalibs, "LOADED", {})


def test_preload_loads_the_wheel_copy_once(tmp_path, monkeypatch):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build a stand-in library")
    soname = "libcudart.so.%d" % (900 + os.getpid() % 99)  # a soname no process has loaded
    lib = os.path.join(tmp_path, "nvidia", "cu99", "lib", soname)
    os.makedirs(os.path.dirname(lib))
    src = tmp_path / "stub.c"
    src.write_text("int osftrt_stub_symbol(void) { return 7; }\n")
    subprocess.run([cc, "-shared", "-fPIC", "-Wl,-soname," + soname, "-o", lib, str(src)], check=True)
    _fake_roots(monkeypatch, tmp_path, [soname])
    assert not _cudalibs._loaded(soname)
    assert _cudalibs.preload("pkg", environ={}) == {soname: lib}
    assert _cudalibs._loaded(soname)  # by soname: what the module's DT_NEEDED entry will match
    monkeypatch.setattr(_cudalibs, "LOADED", {})
    assert _cudalibs.preload("pkg", environ={}) == {}  # loaded already: left alone


def test_unloadable_wheel_copy_warns_and_falls_back(tmp_path, monkeypatch):
    bad = _touch(os.path.join(tmp_path, "nvidia", "nccl", "lib", "libnccl.so.77"))
    with open(bad, "w") as f:
        f.write("not an ELF file")
    _fake_roots(monkeypatch, tmp_path, ["libnccl.so.77"])
    with pytest.warns(RuntimeWarning, match="could not load"):
        assert _cudalibs.preload("pkg", environ={}) == {}


def test_library_path_bundled_first_then_run_path_then_ld_library_path(tmp_path):
    pkg, sysdir = str(tmp_path / "osftrt"), str(tmp_path / "lib")
    os.makedirs(pkg)
    env = {"LD_LIBRARY_PATH": "%s:%s" % (tmp_path / "none", sysdir)}
    assert _cudalibs.library_path(pkg, env) is None
    installed = _touch(os.path.join(sysdir, "libosftrt.so.1"))
    assert _cudalibs.library_path(pkg, env) == installed  # a binding against an installed library
    bundled = _touch(os.path.join(pkg, "libosftrt.so.1"))
    assert _cudalibs.library_path(pkg, env) == bundled  # pip install .
    assert _cudalibs.library_path(PKG) is not None  # this test run's own


def test_module_path_as_the_core_looks_for_it(tmp_path):
    pkg, sysdir, other = str(tmp_path / "osftrt"), str(tmp_path / "lib"), str(tmp_path / "other")
    os.makedirs(pkg)
    os.makedirs(other)
    env = {"LD_LIBRARY_PATH": sysdir}
    _touch(os.path.join(sysdir, "libosftrt.so.1"))
    assert _cudalibs.module_path(pkg, env) is None  # a CPU-only build
    installed = _touch(os.path.join(sysdir, _cudalibs.MODULE))
    assert _cudalibs.module_path(pkg, env) == installed  # beside the installed core
    _touch(os.path.join(pkg, "libosftrt.so.1"))
    assert _cudalibs.module_path(pkg, env) == installed  # the bundled core has none beside it: the path's
    bundled = _touch(os.path.join(pkg, _cudalibs.MODULE))
    assert _cudalibs.module_path(pkg, env) == bundled  # beside the bundled core
    # $OSFTRT_CUDA_MODULE: a file, a folder that holds it, and only there
    named = _touch(os.path.join(other, "custom.so"))
    assert _cudalibs.module_path(pkg, dict(env, OSFTRT_CUDA_MODULE=named)) == named
    assert _cudalibs.module_path(pkg, dict(env, OSFTRT_CUDA_MODULE=other)) is None
    in_other = _touch(os.path.join(other, _cudalibs.MODULE))
    assert _cudalibs.module_path(pkg, dict(env, OSFTRT_CUDA_MODULE=other)) == in_other
    assert _cudalibs.module_path(pkg, dict(env, OSFTRT_CUDA_MODULE=os.path.join(other, "none.so"))) is None
