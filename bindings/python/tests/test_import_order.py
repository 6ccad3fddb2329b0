"""Import order next to PyTorch (osftrt/_cudalibs.py, DESIGN.md section 6):
``import osftrt`` before or after ``import torch`` must both work and leave
the process with one copy of each CUDA library, the one PyTorch's nvidia-*
wheels provide where they provide it. With a CPU-only libosftrt (or a torch
without nvidia-* wheels) the same checks run and must pass too; the CI stage
on PyPI's PyTorch builds the wheel with CUDA where a toolkit is installed
(.ci/stage_python_torch2.sh), which is where a wrong order used to fail
(``libtorch_cuda.so: undefined symbol: ncclCommResume``).

Each order runs in a fresh interpreter (a subprocess): a library once loaded
stays loaded, so the order can only be tested from the start."""
import json
import os
import shutil
import subprocess
import sys

import pytest

import osftrt
from osftrt import _cudalibs

PKG = os.path.dirname(os.path.abspath(osftrt.__file__))

# The probes' common part: the files this process has mapped whose names
# start with one of `prefixes`, by library name (what precedes ".so").
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
"""

# Imports osftrt and torch in the order given by argv[1] ("osftrt" or
# "torch" first), then reports every mapped file whose name starts with a
# CUDA library prefix of _cudalibs, what _cudalibs loaded, and torch's CUDA.
PROBE = MAPS + r"""
first = sys.argv[1]
if first == "osftrt":
    import osftrt.torch, torch
else:
    import torch, osftrt.torch
from osftrt import _cudalibs
mapped = mapped_files(_cudalibs._ORDER)
x = torch.ones(3)
assert float(osftrt.torch.fused_linear_cross_entropy(x.view(1, 3), torch.eye(3), torch.tensor([1]))) > 0
print(json.dumps({"mapped": {k: sorted(v) for k, v in mapped.items()}, "loaded": _cudalibs.LOADED,
                  "torch_cuda": torch.version.cuda}))
"""


def _probe(first):
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-c", PROBE, first], capture_output=True, text=True, env=env, timeout=240,
                       cwd=os.path.dirname(os.path.abspath(__file__)))
    assert r.returncode == 0, "import %s first failed (exit %d):\n%s" % (first, r.returncode, r.stderr[-3000:])
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_both_import_orders_load_one_copy_of_each_cuda_library():
    lib = _cudalibs.library_path(PKG)
    assert lib is not None and os.path.exists(lib), "no libosftrt.so.1 found for %s" % PKG
    wanted = _cudalibs.cuda_sonames(lib)
    roots = _cudalibs.search_roots(PKG)
    results = {first: _probe(first) for first in ("osftrt", "torch")}
    for first, r in results.items():
        for name, files in r["mapped"].items():
            assert len(files) == 1, "import %s first: %s mapped from %d files: %s" % (first, name, len(files), files)
        for soname in wanted:
            files = r["mapped"].get(soname.split(".so")[0], [])
            assert files, "import %s first: libosftrt needs %s but it is not mapped" % (first, soname)
            wheel = _cudalibs.find(soname, roots)
            if wheel is not None:  # PyTorch's copy, not the toolkit's
                assert files == [os.path.realpath(wheel)], (first, soname, files, wheel)
    assert results["osftrt"]["mapped"] == results["torch"]["mapped"]


# Loads libosftrt.so.1 (argv[1]) by itself, as a C-level user of the wheel
# would (no osftrt import, so no preload): its own run path decides. Then
# imports torch, which must find what it needs (the defect: an older NCCL
# loaded first made libtorch_cuda fail on a missing symbol).
DIRECT = MAPS + r"""
import ctypes
ctypes.CDLL(sys.argv[1])
mapped = mapped_files(tuple(sys.argv[2].split(",")))
import torch
print(json.dumps({k: sorted(v) for k, v in mapped.items()}))
"""


def test_direct_load_takes_the_wheel_copies_beside_the_package():
    lib = _cudalibs.library_path(PKG)
    wanted = _cudalibs.cuda_sonames(lib)
    if not wanted:
        pytest.skip("a CPU-only libosftrt needs no CUDA library")
    _, runpath = _cudalibs.dynamic_entries(lib)
    beside = os.path.dirname(PKG)  # site-packages, where PyTorch's nvidia-* wheels are
    if os.path.dirname(lib) == PKG:  # the bundled library (pip install .): PyTorch's layout first
        assert runpath[:2] == ["$ORIGIN/../nvidia/cu13/lib", "$ORIGIN/../nvidia/nccl/lib"], runpath
    # the defect's setting: the toolkit the library was built with (its absolute run path folders) also in
    # the loader's path, ahead of everything else
    toolkit = [d for d in runpath if d and not d.startswith("$ORIGIN")]
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
               LD_LIBRARY_PATH=":".join(toolkit + [os.environ.get("LD_LIBRARY_PATH", "")]).rstrip(":"))
    r = subprocess.run([sys.executable, "-c", DIRECT, lib, ",".join(_cudalibs._ORDER)], capture_output=True,
                       text=True, env=env, timeout=240, cwd=os.path.dirname(os.path.abspath(__file__)))
    assert r.returncode == 0, "loading %s, then import torch, failed (exit %d):\n%s" % (
        lib, r.returncode, r.stderr[-3000:])
    mapped = json.loads(r.stdout.strip().splitlines()[-1])
    for name, files in mapped.items():
        assert len(files) == 1, "%s mapped from %d files: %s" % (name, len(files), files)
    if os.path.dirname(lib) != PKG:
        return  # a binding against an installed library: its own run path, nothing beside it
    for soname in wanted:
        wheel = _cudalibs.find(soname, [beside])
        if wheel is not None:
            assert mapped.get(soname.split(".so")[0]) == [os.path.realpath(wheel)], (soname, mapped, wheel)


def test_needed_libraries_match_readelf():
    lib = _cudalibs.library_path(PKG)
    readelf = shutil.which("readelf")
    if readelf is None:
        pytest.skip("no readelf (binutils) to compare with")
    out = subprocess.run([readelf, "-d", lib], capture_output=True, text=True, check=True).stdout
    want = [l.split("[", 1)[1].rstrip("]") for l in out.splitlines() if "(NEEDED)" in l]
    want_rp = [d for l in out.splitlines() if "(RUNPATH)" in l or "(RPATH)" in l
               for d in l.split("[", 1)[1].rstrip("]").split(":") if d]
    needed, runpath = _cudalibs.dynamic_entries(lib)
    assert needed == want and runpath == want_rp and "libc.so.6" in needed
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
    """preload() as if libosftrt needed `sonames` and only `root` had wheels."""
    monkeypatch.setattr(_cudalibs, "library_path", lambda package_dir, environ: "libosftrt.so.1")
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
    assert _cudalibs._loaded(soname)  # by soname: what libosftrt's DT_NEEDED entry will match
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
