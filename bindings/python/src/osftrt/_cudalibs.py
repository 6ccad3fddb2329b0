"""The CUDA libraries libosftrt shares with PyTorch, chosen before it loads.

A process holds one library per soname: whichever ``libnccl.so.2`` (or
``libcublas.so.13``, ...) loads first serves everyone who needs that soname
afterwards. PyTorch from PyPI brings its CUDA libraries as ``nvidia-*`` wheels
(``site-packages/nvidia/cu13/lib``, ``nvidia/nccl/lib``; CUDA 12:
``nvidia/cublas/lib``, ...) and finds them relative to itself. A libosftrt
built against a CUDA toolkit would otherwise load the toolkit's copies by its
run path, and when the toolkit's NCCL is older than the wheel's, a later
``import torch`` fails (``libtorch_cuda.so: undefined symbol:
ncclCommResume``). So, before libosftrt loads (DESIGN.md section 6):

* the CUDA sonames libosftrt needs are read from its ELF dynamic section
  (``DT_NEEDED``); a CPU-only library needs none and nothing happens;
* each one that a process has not loaded yet is looked up as
  ``ROOT/nvidia/*/lib/SONAME`` in: the folder that holds ``torch`` (found
  without importing it), the folder that holds this package, then
  ``sys.path``, in that order -- the copies PyTorch itself would load;
* the first found is loaded with ``RTLD_GLOBAL``; a soname no ``nvidia-*``
  wheel provides (e.g. ``libcublas.so.13`` next to a CUDA-12 PyTorch) falls
  back to libosftrt's own run path: the toolkit it was built with. Sonames
  carry the CUDA major version, so a CUDA-13 library beside CUDA-12 wheels
  loads the toolkit's cuBLAS/cuSOLVER under their own sonames and shadows
  nothing of PyTorch's; NCCL's soname (``libnccl.so.2``) is the same for every
  CUDA version, so the wheel's NCCL serves both (NCCL 2.x keeps its API).

Import order is irrelevant: PyTorch imported first has loaded the same files
already (nothing is loaded again); imported second, it finds them loaded.
``OSFTRT_CUDA_LIBS=system`` turns all this off (libosftrt's run path and the
loader's path alone decide, as before).

The bundled library (``pip install .``) also carries PyTorch's layout in
its own run path (DT_RPATH ``$ORIGIN/../nvidia/cu13/lib``,
``$ORIGIN/../nvidia/nccl/lib``, the CUDA-12 folders, then the toolkit it
was built with; bindings/python/CMakeLists.txt), so a process that loads
``osftrt/libosftrt.so.1`` without importing this package gets the same
files from the site-packages that holds it. The preload here still decides
where PyTorch lives elsewhere on ``sys.path``.
"""
from __future__ import annotations

import ctypes
import glob
import importlib.util
import mmap
import os
import struct
import sys
import warnings

# the CUDA libraries (soname prefixes) that may come from nvidia-* wheels, in
# the order they are loaded (dependencies first: cuBLASLt before cuBLAS,
# cuBLAS, cuSPARSE and nvJitLink before cuSOLVER)
_ORDER = ("libcudart.", "libnvJitLink.", "libcublasLt.", "libcublas.", "libcusparse.", "libcusolver.", "libnccl.")

_DT_NEEDED, _DT_RPATH, _DT_RUNPATH = 1, 15, 29
_SHT_DYNAMIC = 6

#: soname -> the file loaded for it by :func:`preload` (for diagnostics)
LOADED = {}


def dynamic_entries(path):
    """(DT_NEEDED names, run path folders) of a 64-bit little-endian ELF shared
    object; ([], []) when `path` is not one (or cannot be read)."""
    # mapped, not read: only the headers and the dynamic section are touched
    # (a CUDA build of libosftrt is ~10 MB, read whole at every import)
    try:
        f = open(path, "rb")
    except OSError:
        return [], []
    with f:
        try:
            data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError):  # ValueError: an empty file, not an ELF
            return [], []
        with data:
            return _dynamic(data)


def _dynamic(data):
    """dynamic_entries() of the mapped file `data`."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return [], []
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)

    def section(i):  # (type, offset, size, link)
        sh_type, = struct.unpack_from("<I", data, shoff + i * shentsize + 4)
        off, size, link = struct.unpack_from("<QQI", data, shoff + i * shentsize + 0x18)
        return sh_type, off, size, link

    def string(base, at):
        return data[base + at : data.find(b"\0", base + at)].decode()

    for i in range(shnum):
        sh_type, off, size, link = section(i)
        if sh_type != _SHT_DYNAMIC:
            continue
        strtab = section(link)[1]
        needed, runpath = [], []
        for tag, val in struct.iter_unpack("<qQ", data[off : off + size]):
            if tag == _DT_NEEDED:
                needed.append(string(strtab, val))
            elif tag in (_DT_RPATH, _DT_RUNPATH):
                runpath += [d for d in string(strtab, val).split(":") if d]
        return needed, runpath
    return [], []


def library_path(package_dir, environ=os.environ):
    """The libosftrt.so.1 the extension will load: the one bundled in the
    package (``pip install .``), else (a build against an installed
    libosftrt) the first in the extension's run path or LD_LIBRARY_PATH;
    None when none is found."""
    folders = [package_dir]
    for ext in glob.glob(os.path.join(package_dir, "_capi*.so")):
        folders += [d.replace("$ORIGIN", package_dir) for d in dynamic_entries(ext)[1]]
    folders += [d for d in environ.get("LD_LIBRARY_PATH", "").split(":") if d]
    for d in folders:
        candidate = os.path.join(d, "libosftrt.so.1")
        if os.path.exists(candidate):
            return candidate
    return None


def cuda_sonames(library):
    """The CUDA sonames of :data:`_ORDER` that `library` needs, in load order."""
    needed = [n for n in dynamic_entries(library)[0] if n.startswith(_ORDER)]
    return sorted(needed, key=lambda n: next(i for i, p in enumerate(_ORDER) if n.startswith(p)))


def search_roots(package_dir, path=None):
    """The folders whose ``nvidia/*/lib`` are searched, in order: torch's
    site-packages, this package's, then `path` (default sys.path)."""
    roots = []
    try:
        spec = importlib.util.find_spec("torch")  # finds, does not import
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.origin:
        roots.append(os.path.dirname(os.path.dirname(spec.origin)))
    roots.append(os.path.dirname(os.path.abspath(package_dir)))
    roots += [p or os.getcwd() for p in (sys.path if path is None else path)]
    seen, out = set(), []
    for r in roots:
        r = os.path.abspath(r)
        if r not in seen and os.path.isdir(os.path.join(r, "nvidia")):
            seen.add(r)
            out.append(r)
    return out


def find(soname, roots):
    """The first ``ROOT/nvidia/*/lib/SONAME`` over `roots`, or None."""
    for root in roots:
        hits = sorted(glob.glob(os.path.join(glob.escape(root), "nvidia", "*", "lib", soname)))
        if hits:
            return hits[0]
    return None


def _loaded(soname):
    try:
        ctypes.CDLL(soname, mode=os.RTLD_NOLOAD | os.RTLD_GLOBAL)
        return True
    except OSError:
        return False


def preload(package_dir, environ=os.environ):
    """Loads, by the rules above, the nvidia-* wheel copies of the CUDA
    libraries libosftrt needs; returns {soname: file} of those it loaded."""
    if environ.get("OSFTRT_CUDA_LIBS", "").lower() == "system":
        return {}
    library = library_path(package_dir, environ)
    names = [n for n in cuda_sonames(library) if not _loaded(n)] if library else []
    if not names:
        return {}
    roots = search_roots(package_dir)
    for name in names:
        path = find(name, roots)
        if path is None:
            continue
        try:
            ctypes.CDLL(path, mode=os.RTLD_GLOBAL)
            LOADED[name] = path
        except OSError as e:  # the run path's copy then, as without this module
            warnings.warn("osftrt: could not load %s (%s); libosftrt uses its own %s" % (path, e, name),
                          RuntimeWarning, stacklevel=3)
    return dict(LOADED)
