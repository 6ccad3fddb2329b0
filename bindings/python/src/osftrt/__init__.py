"""osftrt: the Python binding of libosftrt.

Two layers:

* ``osftrt.capi`` -- the SWIG-generated module (bindings/swig/osftrt.i): every
  ``osft_*`` function, enum, struct and ``OSFT_*_INIT`` of the C headers, with
  statuses turned into exceptions, DLPack zero-copy tensors, released GIL and
  handle objects.
* this package -- a Pythonic layer: :class:`Context`, :class:`Communicator`,
  :func:`batched_qr`, :func:`power_iteration`, and ``osftrt.torch`` (the
  PyTorch modules: OSFTLinear, OSFTProjector, fused_linear_cross_entropy /
  FusedLinearCrossEntropyLoss, TiledMLP).
"""
from __future__ import annotations

import threading as _threading

from . import _openblas

_openblas.choose_core()  # before the extension loads libosftrt and its BLAS
_openblas.choose_thread_timeout()
_openblas.choose_omp_spin()  # before PyTorch loads its OpenMP, where it has not yet
# No CUDA library loads here: libosftrt loads its CUDA module on the first
# CUDA request, and osftrt.capi preloads PyTorch's copies of the libraries
# the module needs just before that (osftrt/_cudalibs.py).
from . import capi  # noqa: E402
from . import _threads  # noqa: E402
from ._threads import get_num_threads, set_num_threads  # noqa: E402,F401  (re-exported)
from ._errors import (  # noqa: F401  (re-exported)
    Error,
    InvalidArgument,
    InvalidHandle,
    InvalidStructSize,
    DtypeMismatch,
    ShapeMismatch,
    BadLayout,
    DeviceMismatch,
    Aliasing,
    IndexOutOfRange,
    OutOfMemory,
    NoDevice,
    NotSupported,
    BackendError,
    CommError,
    Timeout,
    NumericalError,
    InternalError,
    error_class,
)

__all__ = [
    "capi",
    "Error",
    "Context",
    "TorchCUDAAllocator",
    "Communicator",
    "batched_qr",
    "power_iteration",
    "QRResult",
    "QRStatus",
    "version",
    "build_info",
    "default_context",
    "set_num_threads",
    "get_num_threads",
]

# --- the runtime library must match the one this module was built with ----
def _check_version(loaded, built):
    """ABI.md's rule: refuse another major version, or an older minor (a
    newer one only adds functions and fields)."""
    if loaded // 10000 != built // 10000 or loaded < built:
        raise ImportError(
            "osftrt: the loaded libosftrt is %d.%d.%d but this module was built against %d.%d.%d; "
            "rebuild the binding (pip install ./bindings/python) or fix LD_LIBRARY_PATH"
            % (loaded // 10000, loaded // 100 % 100, loaded % 100, built // 10000, built // 100 % 100, built % 100)
        )


_BUILT = capi._built_version()
_LOADED = capi.osft_version()
_check_version(_LOADED, _BUILT)

__version__ = capi.osft_version_string()


def version() -> str:
    """The loaded library's version, "MAJOR.MINOR.PATCH"."""
    return capi.osft_version_string()


def build_info() -> str:
    """How the loaded library was built (compiler, BLAS, CUDA, NCCL, MPI)."""
    return capi.osft_build_info()


# --- devices ---------------------------------------------------------------
def _parse_device(device):
    """(osft device type, ordinal) from "cpu", "cuda", "cuda:1", a torch.device or a tuple."""
    if device is None:
        return capi.OSFT_DEVICE_CPU, 0
    if isinstance(device, tuple):
        return int(device[0]), int(device[1])
    s = str(device)
    if s == "cpu":
        return capi.OSFT_DEVICE_CPU, 0
    if s.startswith("cuda"):
        idx = 0
        if ":" in s:
            idx = int(s.split(":", 1)[1])
        elif not isinstance(device, str) and getattr(device, "index", None) is not None:
            idx = device.index
        else:
            try:
                import torch

                idx = torch.cuda.current_device()
            except Exception:  # pragma: no cover
                idx = 0
        return capi.OSFT_DEVICE_CUDA, idx
    raise ValueError("unknown device %r (use 'cpu' or 'cuda[:N]')" % (device,))


def _torch_current_stream(device_id):
    try:
        import torch

        return int(torch.cuda.current_stream(device_id).cuda_stream)
    except Exception:  # pragma: no cover
        return 0


class Context:
    """A libosftrt context: one device (CPU or one CUDA GPU), one stream, a
    workspace. Use from one thread at a time.

    ``Context("cpu")``; ``Context("cuda:0")`` takes the stream from
    ``torch.cuda.current_stream()`` unless ``stream`` (a cudaStream_t as int)
    is given. ``workspace_limit`` bounds the scratch memory (bytes, 0: none).
    ``allocator``: an object with host_alloc(bytes, alignment) -> address /
    host_free(address, bytes) and/or device_alloc(bytes, device, stream) /
    device_free(address, bytes, device, stream) that then serves every byte
    the library allocates for this context (e.g. :class:`TorchCUDAAllocator`,
    PyTorch's caching allocator). ``allow_tf32``: fp32 GEMMs on CUDA may
    run on TF32 tensor cores (as ``torch.backends.cuda.matmul.allow_tf32``;
    ignored on the CPU). Close with :meth:`close` or a ``with`` block;
    collected contexts are destroyed as a backstop.
    """

    def __init__(self, device="cpu", *, stream=None, workspace_limit=0, allocator=None, allow_tf32=False):
        dtype_, dev_id = _parse_device(device)
        opts = capi.osft_context_options_t()
        opts.device_type = dtype_
        opts.device_id = dev_id
        if dtype_ == capi.OSFT_DEVICE_CUDA:
            opts.stream = int(stream) if stream is not None else _torch_current_stream(dev_id)
        opts.workspace_limit = int(workspace_limit)
        opts.allow_tf32 = 1 if allow_tf32 else 0
        if allocator is not None:
            opts.allocator = capi.python_allocator(allocator)
        self.allocator = allocator
        self.handle = capi.osft_context_create(opts)
        self.device_type = dtype_
        self.device_id = dev_id

    # lifetime
    def close(self):
        self.handle.close()

    @property
    def closed(self):
        return self.handle.closed

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __repr__(self):
        dev = "cpu" if self.device_type == capi.OSFT_DEVICE_CPU else "cuda:%d" % self.device_id
        return "<osftrt.Context %s%s>" % (dev, " closed" if self.closed else "")

    # A context is a shared resource: a deep copy of a module that holds one
    # shares it; a pickle carries its device and unpickles as that device's
    # default context.
    def __deepcopy__(self, memo):
        return self

    def __reduce__(self):
        return (default_context, ((self.device_type, self.device_id),))

    # streams and memory
    @property
    def is_cuda(self):
        return self.device_type == capi.OSFT_DEVICE_CUDA

    def set_stream(self, stream):
        capi.osft_context_set_stream(self.handle, int(stream) if stream else None)

    def stream(self):
        return capi.osft_context_get_stream(self.handle)

    def sync_torch_stream(self):
        """On CUDA: follow torch.cuda.current_stream() (and tell DLPack
        producers to order their work before it)."""
        if self.is_cuda:
            s = _torch_current_stream(self.device_id)
            if s != (self.stream() or 0):
                self.set_stream(s)
            capi._set_dlpack_stream(s if s else 1)

    def synchronize(self):
        capi.osft_context_synchronize(self.handle)

    def reserve_workspace(self, nbytes):
        capi.osft_context_reserve_workspace(self.handle, int(nbytes))

    def release_workspace(self):
        capi.osft_context_release_workspace(self.handle)

    def workspace_size(self):
        return capi.osft_context_get_workspace_size(self.handle)

    def memory_stats(self):
        st = capi.osft_memory_stats_t()
        capi.osft_context_get_memory_stats(self.handle, st)
        return {
            k: getattr(st, k)
            for k in (
                "host_in_use",
                "host_peak",
                "device_in_use",
                "device_peak",
                "host_allocs",
                "device_allocs",
                "workspace_bytes",
            )
        }

    def reset_peak_memory(self):
        capi.osft_context_reset_peak_memory(self.handle)


class TorchCUDAAllocator:
    """Routes a CUDA context's device memory to PyTorch's caching allocator
    (``Context("cuda", allocator=osftrt.TorchCUDAAllocator())``)."""

    def device_alloc(self, nbytes, device, stream):
        import torch

        return torch.cuda.caching_allocator_alloc(nbytes, device, stream or None)

    def device_free(self, ptr, nbytes, device, stream):
        import torch

        torch.cuda.caching_allocator_delete(ptr)


_local = _threading.local()


def default_context(device="cpu") -> Context:
    """A context per thread and device, created on first use (what the torch
    modules use when they are not given one)."""
    key = _parse_device(device)
    cache = getattr(_local, "contexts", None)
    if cache is None:
        cache = _local.contexts = {}
    ctx = cache.get(key)
    if ctx is None or ctx.closed:
        ctx = cache[key] = Context(key)
    return ctx


def _handle(ctx):
    _threads.follow_host()  # every call that takes a context: torch's thread count
    if ctx is None:
        return default_context().handle
    return ctx.handle if isinstance(ctx, Context) else ctx


# --- communicators -----------------------------------------------------------
class _TorchDistributedCallbacks:
    """The collectives libosftrt needs, done by torch.distributed (any backend;
    gloo lacks bf16 sums and uneven all-gathers, so both are emulated)."""

    def __init__(self, group=None):
        import torch.distributed as dist

        self._dist = dist
        self.group = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)

    def allreduce_sum(self, buf):
        import torch

        t = torch.from_dlpack(buf)
        if t.dtype == torch.bfloat16:
            tmp = t.float()
            self._dist.all_reduce(tmp, group=self.group)
            t.copy_(tmp)
        else:
            self._dist.all_reduce(t, group=self.group)
        return 0

    def allgather(self, send, recv, counts):
        import torch

        s = torch.from_dlpack(send)
        r = torch.from_dlpack(recv)
        width = max(max(counts), 1)
        dt = torch.float32 if s.dtype == torch.bfloat16 else s.dtype
        padded = torch.zeros(width, dtype=dt)
        padded[: counts[self.rank]] = s.to(dt)
        outs = [torch.empty(width, dtype=dt) for _ in counts]
        self._dist.all_gather(outs, padded, group=self.group)
        off = 0
        for p, c in enumerate(counts):
            r[off : off + c] = outs[p][:c].to(r.dtype)
            off += c
        return 0

    def barrier(self):
        self._dist.barrier(group=self.group)
        return 0


class Communicator:
    """A libosftrt communicator (osftrt/comm.h) on a context.

    ``Communicator.single(ctx)``: one rank. ``Communicator.torch_distributed(
    ctx, group=None)``: the host-callback engine over torch.distributed.
    ``Communicator.from_callbacks(ctx, obj)``: any object with ``rank``,
    ``size``, ``allreduce_sum(buf)``, ``allgather(send, recv, counts)`` and
    optionally ``barrier()`` (buffers are DLPack views, valid for the call).
    """

    def __init__(self, handle, context, callbacks=None):
        self.handle = handle
        self.context = context
        self.callbacks = callbacks

    @staticmethod
    def _opts(timeout):
        o = capi.osft_comm_options_t()
        if timeout is not None:
            o.timeout_seconds = float(timeout)
        return o

    @classmethod
    def single(cls, context=None, *, timeout=None):
        context = context or default_context()
        return cls(capi.osft_comm_create_self(context.handle, cls._opts(timeout)), context)

    @classmethod
    def from_callbacks(cls, context, callbacks, *, timeout=None):
        context = context or default_context()
        return cls(capi.osft_comm_create_callbacks(context.handle, callbacks, cls._opts(timeout)), context, callbacks)

    @classmethod
    def torch_distributed(cls, context=None, group=None, *, timeout=None):
        return cls.from_callbacks(context, _TorchDistributedCallbacks(group), timeout=timeout)

    @property
    def rank(self):
        return capi.osft_comm_get_info(self.handle)[0]

    @property
    def size(self):
        return capi.osft_comm_get_info(self.handle)[1]

    def allreduce_sum(self, buf):
        capi.osft_comm_allreduce_sum(self.handle, buf)

    def allgather(self, send, recv, counts):
        capi.osft_comm_allgather(self.handle, send, recv, list(counts))

    def barrier(self):
        capi.osft_comm_barrier(self.handle)

    def stats(self):
        st = capi.osft_comm_stats_t()
        capi.osft_comm_get_stats(self.handle, st)
        return {
            k: getattr(st, k)
            for k in ("allreduce_calls", "allgather_calls", "barrier_calls", "allreduce_bytes", "allgather_bytes", "failures")
        }

    def close(self):
        self.handle.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


# --- batched QR ---------------------------------------------------------------
class QRResult(tuple):
    """(q, r, status): lists. status[i] is 0 (success) or
    capi.OSFT_STATUS_NUMERICAL_ERROR for a matrix that failed (its outputs are
    left as they were). .rank_deficient[i] is True for a matrix that is
    rank-deficient to the tolerance and was factored anyway
    (rank_deficient="factor"), False elsewhere."""

    def __new__(cls, q, r, status, rank_deficient=None):
        self = tuple.__new__(cls, (q, r, status))
        self.rank_deficient = list(rank_deficient) if rank_deficient is not None else [False] * len(status)
        return self

    q = property(lambda self: self[0])
    r = property(lambda self: self[1])
    status = property(lambda self: self[2])

    @property
    def ok(self):
        return all(s == capi.OSFT_STATUS_SUCCESS for s in self[2])


class QRStatus(list):
    """power_iteration's per-pair statuses (a list of 0 or
    capi.OSFT_STATUS_NUMERICAL_ERROR), with .rank_deficient as in QRResult."""

    def __init__(self, status, rank_deficient=None):
        super().__init__(status)
        self.rank_deficient = list(rank_deficient) if rank_deficient is not None else [False] * len(status)


_QR_METHODS = {"householder": capi.OSFT_QR_HOUSEHOLDER, "cholesky_qr2": capi.OSFT_QR_CHOLESKY_QR2,
               "choleskyqr2": capi.OSFT_QR_CHOLESKY_QR2, "cholesky_tf32": capi.OSFT_QR_CHOLESKY_TF32}
_RANK_POLICIES = ("factor", "fail")
_FAILURES = ("raise", "status")


class _RankFlags:
    """The int array osft_qr_options_t.rank_deficient points to, alive for
    the call."""

    def __init__(self, count):
        import array

        self._buf = array.array("i", [0] * max(count, 1))
        self.count = count

    @property
    def address(self):
        return self._buf.buffer_info()[0]

    def values(self):
        return [bool(v) for v in self._buf[: self.count]]


def _qr_options(method, orthogonality_threshold, rank_tolerance, max_concurrency, rank_flags=None):
    o = capi.osft_qr_options_t()
    o.method = _QR_METHODS[method] if isinstance(method, str) else int(method)
    o.orthogonality_threshold = float(orthogonality_threshold)
    o.rank_tolerance = float(rank_tolerance)
    o.max_concurrency = int(max_concurrency)
    if rank_flags is not None:
        o.rank_deficient = rank_flags.address
    return o


def _check_policies(rank_deficient, failures):
    if rank_deficient not in _RANK_POLICIES:
        raise ValueError("rank_deficient must be one of %s, got %r" % (", ".join(_RANK_POLICIES), rank_deficient))
    if failures not in _FAILURES:
        raise ValueError("failures must be one of %s, got %r" % (", ".join(_FAILURES), failures))


def _qr_failure(err, status, what, result):
    bad = [i for i, s in enumerate(status) if s != capi.OSFT_STATUS_SUCCESS]
    e = NumericalError(err.status, "%s (%s failed: %s; the others were computed, .result has them)" % (
        err.message, what, ", ".join(map(str, bad))))
    e.result = result
    e.failed = bad
    return e


def _empty_like(a, shape):
    if hasattr(a, "new_empty"):  # torch
        return a.new_empty(shape)
    import numpy as np

    return np.empty(shape, dtype=a.dtype)


def batched_qr(
    matrices,
    *,
    in_place=False,
    want_r=True,
    method="householder",
    orthogonality_threshold=0.0,
    rank_tolerance=0.0,
    max_concurrency=0,
    q=None,
    r=None,
    context=None,
    rank_deficient="factor",
    failures="raise",
) -> QRResult:
    """Thin QR of every m x n (m >= n) matrix of a list of mixed shapes and
    dtypes (fp32/fp64; torch tensors or numpy arrays, zero-copy), in one call.

    Returns QRResult(q, r, status) with .rank_deficient.

    rank_deficient: "factor" (default): a matrix that is rank-deficient to
    rank_tolerance (default max(m, n) eps of its dtype) is still factored
    (Householder QR is defined for any finite matrix: Q orthonormal, Q R = A,
    diag(R) >= 0; the columns beyond the numerical rank are not unique),
    written, and reported in result.rank_deficient; "fail": such a matrix
    fails like a non-finite one (osft_qr_options_t.rank_deficient NULL).
    failures: what a matrix that still fails (NaN or Inf, overflow; and
    rank-deficient under "fail") does: "raise" (default) raises
    osftrt.NumericalError after the call, naming the failed indices, with
    .result (the QRResult: the others were computed) and .failed; "status":
    no exception, status[i] == OSFT_STATUS_NUMERICAL_ERROR and its outputs
    untouched. Other errors always raise, before anything is written.
    """
    _check_policies(rank_deficient, failures)
    mats = list(matrices)
    if in_place:
        qs = mats
    elif q is not None:
        qs = list(q)
    else:
        qs = [_empty_like(a, tuple(a.shape)) for a in mats]
    if r is not None:
        rs = list(r)
    elif want_r:
        rs = [_empty_like(a, (a.shape[1], a.shape[1])) for a in mats]
    else:
        rs = None
    status = []
    flags = _RankFlags(len(mats)) if rank_deficient == "factor" else None
    opts = _qr_options(method, orthogonality_threshold, rank_tolerance, max_concurrency, flags)
    error = None
    try:
        capi.osft_qr_batch(_handle(context), opts, mats, None if in_place else qs, rs, status)
    except NumericalError as e:
        error = e
    result = QRResult(qs, rs, status, flags.values() if flags is not None else None)
    if error is not None and failures == "raise":
        raise _qr_failure(error, status, "matrices", result)
    return result


def power_iteration(
    a,
    q,
    iterations=1,
    *,
    method="householder",
    orthogonality_threshold=0.0,
    rank_tolerance=0.0,
    max_concurrency=0,
    context=None,
    rank_deficient="factor",
    failures="raise",
) -> QRStatus:
    """iterations times Q_i <- qr(A_i Q_i) for every pair, in place on q
    (SOAP/Shampoo's eigenbasis refresh, all pairs in one call).
    Returns the per-pair statuses (0 or OSFT_STATUS_NUMERICAL_ERROR) as a
    QRStatus list with .rank_deficient (True where a product A_i Q was
    rank-deficient and was factored anyway). rank_deficient and failures as
    for batched_qr; a failed pair keeps its Q (under failures="raise" the
    exception's .result is this list)."""
    _check_policies(rank_deficient, failures)
    a, q = list(a), list(q)
    status = []
    flags = _RankFlags(len(a)) if rank_deficient == "factor" else None
    opts = _qr_options(method, orthogonality_threshold, rank_tolerance, max_concurrency, flags)
    error = None
    try:
        capi.osft_qr_power_iteration(_handle(context), opts, a, q, int(iterations), status)
    except NumericalError as e:
        error = e
    result = QRStatus(status, flags.values() if flags is not None else None)
    if error is not None and failures == "raise":
        raise _qr_failure(error, status, "pairs", result)
    return result


def set_log_callback(callback, max_level=None):
    """Send the library's diagnostics to callback(level, message) (None:
    silence). max_level: capi.OSFT_LOG_ERROR ... OSFT_LOG_DEBUG."""
    capi.osft_set_log_callback(callback, capi.OSFT_LOG_DEBUG if max_level is None else max_level)
