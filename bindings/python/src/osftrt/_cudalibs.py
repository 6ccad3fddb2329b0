"""The CUDA libraries libosftrt's CUDA module shares with PyTorch, chosen
before the module loads.

libosftrt.so.1 (the core) links no CUDA library: ``import osftrt``,
``osftrt.torch`` and ``osftrt.transformers`` map none, and a CPU-only process
never does. The CUDA backend is a module of its own, ``libosftrt_cuda.so.1``
(CUDA kernels, cuBLAS, cuSOLVER, NCCL), which the core loads with ``dlopen``
on the first CUDA context, CUDA device query or NCCL communicator: from
``$OSFTRT_CUDA_MODULE`` (the file, or a folder that holds it), else beside
the running ``libosftrt.so.1`` (where the wheel bundles it), else the
loader's search path.

A process holds one library per soname: whichever ``libnccl.so.2`` (or
``libcublas.so.13``, ...) loads first serves everyone who needs that soname
afterwards. PyTorch from PyPI brings its CUDA libraries as ``nvidia-*`` wheels
(``site-packages/nvidia/cu13/lib``, ``nvidia/nccl/lib``; CUDA 12:
``nvidia/cublas/lib``, ...) and finds them relative to itself. A module
built against a CUDA toolkit would otherwise load the toolkit's copies by its
run path, and when the toolkit's NCCL is older than the wheel's, a later
``import torch`` fails (``libtorch_cuda.so: undefined symbol:
ncclCommResume``). So, once, just before the first request from Python that
loads the module (:func:`before_cuda`, called by ``osftrt.capi`` for
``osft_context_create`` with a CUDA device and
the three NCCL functions (not ``osft_device_count``: since 1.4 a count maps
the CUDA driver alone) ``osft_comm_nccl_unique_id``,
``osft_comm_create_nccl``, ``osft_comm_create_nccl_from_id``; so
``osftrt.Context("cuda")``, ``default_context`` and the ``osftrt.torch``
modules on a CUDA tensor all pass through it) (DESIGN.md section 6):

* the module is found as the core will find it (:func:`module_path`) and the
  CUDA sonames it needs are read from its ELF dynamic section
  (``DT_NEEDED``); no module (a CPU-only build) needs none and nothing
  happens;
* each one that the process has not loaded yet is looked up as
  ``ROOT/nvidia/*/lib/SONAME`` in: the folder that holds ``torch`` (found
  without importing it), the folder that holds this package, then
  ``sys.path``, in that order -- the copies PyTorch itself would load;
* the first found is loaded with ``RTLD_GLOBAL``; a soname no ``nvidia-*``
  wheel provides (e.g. ``libcublas.so.13`` next to a CUDA-12 PyTorch) falls
  back to the module's own run path: the toolkit it was built with. Sonames
  carry the CUDA major version, so a CUDA-13 module beside CUDA-12 wheels
  loads the toolkit's cuBLAS/cuSOLVER under their own sonames and shadows
  nothing of PyTorch's; NCCL's soname (``libnccl.so.2``) is the same for every
  CUDA version, so the wheel's NCCL serves both (NCCL 2.x keeps its API).

Import order is irrelevant: PyTorch imported before the first CUDA request
has loaded the same files already (nothing is loaded again); imported after
it, it finds them loaded. ``OSFTRT_CUDA_LIBS=system`` turns all this off
(the module's run path and the loader's path alone decide).

The bundled module (``pip install .``) also carries PyTorch's layout in its
own run path (DT_RPATH ``$ORIGIN/../nvidia/cu13/lib``,
``$ORIGIN/../nvidia/nccl/lib``, the CUDA-12 folders, then the toolkit it was
built with; bindings/python/CMakeLists.txt), so a process that loads
``osftrt/libosftrt.so.1`` without this package (ctypes, C code) and then
asks for CUDA gets the same files from the site-packages that holds it. The
preload here still decides where PyTorch lives elsewhere on ``sys.path``.
"""
from __future__ import annotations

import ctypes
import glob
import importlib.util
import mmap
import os
import struct
import sys
import threading
import warnings

# the CUDA libraries (soname prefixes) that may come from nvidia-* wheels, in
# the order they are loaded (dependencies first: cuBLASLt before cuBLAS,
# cuBLAS, cuSPARSE and nvJitLink before cuSOLVER)
_ORDER = ("libcudart.", "libnvJitLink.", "libcublasLt.", "libcublas.", "libcusparse.", "libcusolver.", "libnccl.")

#: the CUDA module's file name (its soname)
MODULE = "libosftrt_cuda.so.1"

_DT_NEEDED, _DT_RPATH, _DT_RUNPATH = 1, 15, 29
_SHT_DYNAMIC = 6

#: soname -> the file loaded for it by :func:`preload` (for diagnostics)
LOADED = {}


def dynamic_entries(path):
    """(DT_NEEDED names, run path folders) of a 64-bit little-endian ELF shared
    object; ([], []) when `path` is not one (or cannot be read)."""
    # mapped, not read: only the headers and the dynamic section are touched
    # (the CUDA module is ~10 MB)
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


def _library_folders(package_dir, environ):
    """Where the extension finds libosftrt.so.1: the package (the bundled
    library), the extension's run path, then LD_LIBRARY_PATH."""
    folders = [package_dir]
    for ext in glob.glob(os.path.join(package_dir, "_capi*.so")):
        folders += [d.replace("$ORIGIN", package_dir) for d in dynamic_entries(ext)[1]]
    return folders + [d for d in environ.get("LD_LIBRARY_PATH", "").split(":") if d]


def library_path(package_dir, environ=os.environ):
    """The libosftrt.so.1 the extension will load: the one bundled in the
    package (``pip install .``), else (a build against an installed
    libosftrt) the first in the extension's run path or LD_LIBRARY_PATH;
    None when none is found."""
    for d in _library_folders(package_dir, environ):
        candidate = os.path.join(d, "libosftrt.so.1")
        if os.path.exists(candidate):
            return candidate
    return None


def module_path(package_dir, environ=os.environ):
    """The CUDA module the core will load (src/backend/cuda_module_load.cpp):
    ``$OSFTRT_CUDA_MODULE`` when set (the file, or MODULE in that folder, and
    only there), else MODULE beside :func:`library_path`, else in the
    extension's run path or LD_LIBRARY_PATH; None when none exists (a
    CPU-only build; or only the loader's cache has it, where its own run
    path decides)."""
    env = environ.get("OSFTRT_CUDA_MODULE", "")
    if env:
        path = os.path.join(env, MODULE) if os.path.isdir(env) else env
        return path if os.path.isfile(path) else None
    library = library_path(package_dir, environ)
    folders = _library_folders(package_dir, environ)
    if library is not None:
        folders.insert(0, os.path.dirname(library))
    for d in folders:
        candidate = os.path.join(d, MODULE)
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
    libraries the CUDA module needs; returns {soname: file} of those loaded
    so far. Call :func:`before_cuda` instead: this one does the work every
    time it is called."""
    if environ.get("OSFTRT_CUDA_LIBS", "").lower() == "system":
        return {}
    module = module_path(package_dir, environ)
    names = [n for n in cuda_sonames(module) if not _loaded(n)] if module else []
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
            warnings.warn("osftrt: could not load %s (%s); the CUDA module uses its own %s" % (path, e, name),
                          RuntimeWarning, stacklevel=3)
    return dict(LOADED)


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
_once = threading.Lock()
_done = False


def before_cuda(package_dir=_PACKAGE_DIR, environ=os.environ):
    """:func:`preload`, once per process, before the first request that
    loads the CUDA module (osftrt.capi calls it; thread-safe; later calls
    return at once). Returns {soname: file} of the copies it loaded."""
    global _done
    if _done:
        return dict(LOADED)
    with _once:
        if not _done:
            try:
                preload(package_dir, environ)
            finally:  # a failure is not retried: the module's run path decides then
                _done = True
    return dict(LOADED)
