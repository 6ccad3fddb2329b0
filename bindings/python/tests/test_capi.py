"""The SWIG layer: exceptions per status, DLPack zero-copy and the capsule
protocol, handles (close, with, finalizer, use after close), bad inputs
leaving outputs untouched, the GIL, and leaks."""
import ctypes
import gc
import sys
import threading
import time

import numpy as np
import pytest
import torch

import osftrt
from osftrt import capi

from conftest import assert_close, poison, rand

ctypes.pythonapi.PyCapsule_GetPointer.restype = ctypes.c_void_p
ctypes.pythonapi.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
ctypes.pythonapi.PyCapsule_IsValid.restype = ctypes.c_int
ctypes.pythonapi.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]


class Producer:
    """A DLPack producer over a numpy array that records what the consumer
    did; optionally claims another device (patched into the DLTensor)."""

    def __init__(self, arr, device_type=None):
        self.arr = arr
        self.device_type = device_type
        self.capsules = []
        self.streams = []

    def __dlpack_device__(self):
        return (self.device_type or 1, 0)

    def __dlpack__(self, stream=None):
        self.streams.append(stream)
        cap = self.arr.__dlpack__()
        if self.device_type is not None:
            ptr = ctypes.pythonapi.PyCapsule_GetPointer(cap, b"dltensor")
            ctypes.c_int32.from_address(ptr + 8).value = self.device_type
        self.capsules.append(cap)
        return cap


def _layer(ctx, gen, n=6, k=5, dtype=torch.float32):
    w = rand(gen, n, k, dtype=dtype)
    return w, capi.osft_flinear_create_from_weight(ctx.handle, w, capi.osft_flinear_options_t())


def _raises(cls, fn, *args, contains=None):
    capi.osft_clear_last_error()
    with pytest.raises(cls) as ei:
        fn(*args)
    e = ei.value
    assert isinstance(e, osftrt.Error)
    assert type(e) is cls
    assert e.status == [k for k, v in osftrt._errors._by_status.items() if v is cls][0]
    assert e.message, "no message"
    if contains:
        assert contains in e.message, e.message
    return e


# --------------------------------------------------------------- exceptions
def test_exception_classes_cover_every_status():
    statuses = {getattr(capi, n) for n in dir(capi) if n.startswith("OSFT_STATUS_")} - {0}
    assert len(statuses) >= 17
    for s in statuses:
        cls = osftrt.error_class(s)
        assert cls is not osftrt.Error and issubclass(cls, osftrt.Error)
        e = cls(s, "msg")
        assert e.status == s and e.message == "msg" and capi.osft_status_string(s) in str(e)
    assert osftrt.error_class(999) is osftrt.Error
    assert issubclass(osftrt.InvalidArgument, ValueError)
    assert issubclass(osftrt.IndexOutOfRange, IndexError)
    assert issubclass(osftrt.OutOfMemory, MemoryError)
    assert issubclass(osftrt.Timeout, TimeoutError)
    assert osftrt.BackendError is osftrt.error_class(capi.OSFT_STATUS_BACKEND_ERROR)
    assert osftrt.InternalError is osftrt.error_class(capi.OSFT_STATUS_INTERNAL_ERROR)


def test_library_errors_raise_their_class_with_the_message(ctx, gen):
    h = ctx.handle
    o = capi.osft_flinear_options_t()
    o.rank_ratio = 1.5
    e = _raises(osftrt.InvalidArgument, capi.osft_flinear_create_from_weight, h, rand(gen, 4, 4), o, contains="rank_ratio")
    assert e.message == capi.osft_last_error()
    _raises(osftrt.InvalidHandle, capi.osft_context_get_device, None)
    co = capi.osft_context_options_t()
    co.struct_size = 4
    _raises(osftrt.InvalidStructSize, capi.osft_context_create, co, contains="struct_size")
    _raises(osftrt.DtypeMismatch, capi.osft_flinear_create_from_weight, h, torch.ones(4, 4, dtype=torch.int32), None, contains="weight")
    w, layer = _layer(ctx, gen)
    x = rand(gen, 3, 5)
    _raises(osftrt.ShapeMismatch, capi.osft_flinear_forward, layer, rand(gen, 3, 4), None, poison(3, 6), contains="x")
    _raises(osftrt.BadLayout, capi.osft_flinear_forward, layer, rand(gen, 5, 3).T, None, poison(3, 6), contains="x")
    cuda_claim = Producer(np.random.rand(3, 5).astype(np.float32), device_type=2)
    _raises(osftrt.DeviceMismatch, capi.osft_flinear_forward, layer, cuda_claim, None, poison(3, 6))
    assert cuda_claim.streams == [1], "a CUDA producer must get a stream argument"
    sq = capi.osft_flinear_create_from_weight(h, rand(gen, 4, 4), None)
    xy = rand(gen, 3, 4)
    _raises(osftrt.Aliasing, capi.osft_flinear_forward, sq, xy, None, xy)
    _raises(osftrt.NumericalError, capi.osft_flinear_create_from_weight, h, torch.full((4, 4), float("nan")), None)
    small = osftrt.Context("cpu", workspace_limit=1024)
    _raises(osftrt.OutOfMemory, small.reserve_workspace, 1 << 20)
    small.close()
    if capi.osft_has_feature(capi.OSFT_FEATURE_CUDA):
        if capi.osft_device_count(capi.OSFT_DEVICE_CUDA) == 0:
            _raises(osftrt.NoDevice, osftrt.Context, "cuda")
    else:
        _raises(osftrt.NotSupported, osftrt.Context, "cuda")
    if not capi.osft_has_feature(capi.OSFT_FEATURE_NCCL):
        _raises(osftrt.NotSupported, capi.osft_comm_nccl_unique_id, capi.osft_nccl_unique_id_t())
    sq.close()
    layer.close()


def test_index_out_of_range_leaves_outputs_untouched(ctx, gen):
    fl = capi.osft_flce_create(ctx.handle, None)
    x, w = rand(gen, 4, 8), rand(gen, 10, 8)
    t = torch.tensor([1, 2, 10, 3])
    i = capi.osft_flce_inputs_t()
    i.x, i.weight, i.targets = x, w, t
    o = capi.osft_flce_outputs_t()
    loss, gx, gw = poison(), poison(4, 8), poison(10, 8)
    o.loss, o.grad_x, o.grad_weight = loss, gx, gw
    e = _raises(osftrt.IndexOutOfRange, capi.osft_flce_compute, fl, i, o, contains="10")
    assert "targets" in e.message
    assert torch.isnan(loss).all() and torch.isnan(gx).all() and torch.isnan(gw).all()
    fl.close()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_comm_callback_failures(ctx):
    class Failing:
        rank, size = 0, 2

        def __init__(self, exc):
            self.exc = exc

        def allreduce_sum(self, buf):
            raise self.exc

        def allgather(self, send, recv, counts):
            raise self.exc

    for exc, cls in ((RuntimeError("peer gone"), osftrt.CommError), (TimeoutError("slow"), osftrt.Timeout)):
        c = capi.osft_comm_create_callbacks(ctx.handle, Failing(exc), None)
        buf = torch.ones(3)
        with pytest.raises(cls):
            capi.osft_comm_allreduce_sum(c, buf)
        c.close()


def test_callbacks_communicator_roundtrip(ctx):
    class Fake:  # one "rank" playing two: the sum doubles, gather repeats
        rank, size = 0, 2
        calls = []

        def allreduce_sum(self, buf):
            t = torch.from_dlpack(buf)
            t.mul_(2)
            self.calls.append("ar")

        def allgather(self, send, recv, counts):
            s, r = torch.from_dlpack(send), torch.from_dlpack(recv)
            r[: counts[0]] = s
            r[counts[0]:] = s[: counts[1]] * 10
            self.calls.append(("ag", tuple(counts)))

        def barrier(self):
            self.calls.append("b")

    f = Fake()
    with osftrt.Communicator.from_callbacks(ctx, f) as comm:
        assert (comm.rank, comm.size) == (0, 2)
        b = torch.arange(1.0, 5.0)
        ptr = b.data_ptr()
        comm.allreduce_sum(b)
        assert b.data_ptr() == ptr and b.tolist() == [2.0, 4.0, 6.0, 8.0]
        recv = poison(5)
        comm.allgather(torch.tensor([1.0, 2.0, 3.0]), recv, [3, 2])
        assert recv.tolist() == [1.0, 2.0, 3.0, 10.0, 20.0]
        comm.barrier()
        assert comm.stats()["allreduce_calls"] == 1
    assert f.calls == ["ar", ("ag", (3, 2)), "b"]


def test_log_callback():
    got = []
    osftrt.set_log_callback(lambda lvl, msg: got.append((lvl, msg)), capi.OSFT_LOG_ERROR)
    try:
        with pytest.raises(osftrt.InvalidHandle):
            capi.osft_context_get_device(None)
    finally:
        osftrt.set_log_callback(None)
    assert got and got[-1][0] == capi.OSFT_LOG_ERROR and "osft_context_get_device" in got[-1][1]


# ------------------------------------------------------------------ zero-copy
def test_zero_copy_torch(ctx, gen):
    n, k, r = 7, 6, 3
    u, s, vt = torch.linalg.svd(rand(gen, n, k, dtype=torch.float64), full_matrices=False)
    u, s, vt = u.float().contiguous(), s.float().contiguous(), vt.float().contiguous()
    f = capi.osft_flinear_factors_t()
    f.u_high, f.s_high, f.v_high = u[:, :r], s[:r], vt[:r]
    f.u_low, f.s_low, f.v_low = u[:, r:], s[r:], vt[r:]
    layer = capi.osft_flinear_create_from_factors(ctx.handle, f, None)
    del f  # the layer keeps what it borrows alive
    gc.collect()
    x = rand(gen, 4, k)
    y = poison(4, n)
    ptr = y.data_ptr()
    capi.osft_flinear_forward(layer, x, None, y)
    assert y.data_ptr() == ptr
    assert_close(y, x.double() @ (u.double() * s.double()) @ vt.double() if False else x.double() @ ((u.double() * s.double()) @ vt.double()).T, 1e-5, 1e-5, "y")
    # the library reads the caller's factors: change one in place
    s[r:] *= 3.0
    capi.osft_flinear_forward(layer, x, None, y)
    w = (u.double() * s.double()) @ vt.double()
    assert_close(y, x.double() @ w.T, 1e-5, 1e-5, "y after an in-place update")
    # and writes gradients into the caller's tensors
    g = capi.osft_flinear_grads_t()
    gu = poison(n, k - r)
    g.grad_u_low = gu
    ptr = gu.data_ptr()
    capi.osft_flinear_backward(layer, x, rand(gen, 4, n), g)
    assert gu.data_ptr() == ptr and torch.isfinite(gu).all()
    layer.close()


def test_zero_copy_numpy(ctx):
    rng = np.random.default_rng()
    w = rng.standard_normal((6, 5)).astype(np.float32)
    layer = capi.osft_flinear_create_from_weight(ctx.handle, w, None)
    x = rng.standard_normal((3, 5)).astype(np.float32)
    y = np.full((3, 6), np.nan, dtype=np.float32)
    addr = y.__array_interface__["data"][0]
    capi.osft_flinear_forward(layer, x, None, y)
    assert y.__array_interface__["data"][0] == addr
    np.testing.assert_allclose(y, x.astype(np.float64) @ w.T.astype(np.float64), rtol=1e-5, atol=1e-5)
    # a factor view is the layer's own memory (numpy imports DLPack
    # read-only, so torch writes through it)
    view = capi.osft_flinear_get_factor(layer, capi.OSFT_FACTOR_S_LOW)
    s_low = np.from_dlpack(view)
    assert s_low.shape == tuple(view.shape) and view.data_ptr == s_low.__array_interface__["data"][0]
    torch.from_dlpack(view).zero_()
    assert (s_low == 0).all()
    merged = np.full((6, 5), np.nan, dtype=np.float32)
    capi.osft_flinear_merge(layer, merged)
    uh = np.from_dlpack(capi.osft_flinear_get_factor(layer, capi.OSFT_FACTOR_U_HIGH))
    sh = np.from_dlpack(capi.osft_flinear_get_factor(layer, capi.OSFT_FACTOR_S_HIGH))
    vh = np.from_dlpack(capi.osft_flinear_get_factor(layer, capi.OSFT_FACTOR_V_HIGH))
    np.testing.assert_allclose(merged, (uh * sh) @ vh, rtol=1e-5, atol=1e-5)
    with pytest.raises(osftrt.InvalidArgument):
        layer.close()  # numpy arrays still use its memory
    del view, s_low, uh, sh, vh
    gc.collect()
    layer.close()


def test_dlpack_capsule_protocol(ctx, gen):
    w, layer = _layer(ctx, gen)
    arr = np.random.rand(3, 5).astype(np.float32)
    p = Producer(arr)
    base = sys.getrefcount(arr)
    y = np.full((3, 6), np.nan, dtype=np.float32)
    capi.osft_flinear_forward(layer, p, None, y)
    assert p.streams == [None]  # CPU producers get no stream
    cap = p.capsules[0]
    assert ctypes.pythonapi.PyCapsule_IsValid(cap, b"used_dltensor") == 1
    assert ctypes.pythonapi.PyCapsule_IsValid(cap, b"dltensor") == 0
    p.capsules.clear()
    del cap
    gc.collect()
    assert sys.getrefcount(arr) == base, "the producer's deleter was not called"
    assert np.isfinite(y).all()
    with pytest.raises(TypeError, match="__dlpack__"):
        capi.osft_flinear_forward(layer, [[1.0] * 5] * 3, None, y)
    layer.close()


def test_bad_inputs_leave_outputs_untouched(ctx, gen):
    w, layer = _layer(ctx, gen)
    x = rand(gen, 3, 5)
    for bad_x, cls in (
        (x.double(), osftrt.DtypeMismatch),
        (rand(gen, 5, 3).T, osftrt.BadLayout),
        (rand(gen, 3, 4), osftrt.ShapeMismatch),
        (Producer(x.numpy(), device_type=2), osftrt.DeviceMismatch),
    ):
        y = poison(3, 6)
        with pytest.raises(cls):
            capi.osft_flinear_forward(layer, bad_x, None, y)
        assert torch.isnan(y).all()
    g = capi.osft_flinear_grads_t()
    gx, gu = poison(3, 5), poison(6, 2)
    g.grad_x, g.grad_u_low = gx, gu
    with pytest.raises(osftrt.BadLayout):
        capi.osft_flinear_backward(layer, x, rand(gen, 6, 3).T, g)
    assert torch.isnan(gx).all() and torch.isnan(gu).all()
    layer.close()
    y = poison(3, 6)
    with pytest.raises(osftrt.InvalidHandle, match="closed"):
        capi.osft_flinear_forward(layer, x, None, y)
    assert torch.isnan(y).all()


# -------------------------------------------------------------------- handles
def test_handle_lifecycle(gen):
    with osftrt.Context("cpu") as c:
        h = c.handle
        assert not h.closed and h.kind == "context"
        assert capi.osft_context_get_device(h) == [capi.OSFT_DEVICE_CPU, 0]
    assert h.closed
    with pytest.raises(osftrt.InvalidHandle):
        capi.osft_context_get_device(h)
    h.close()  # idempotent
    with pytest.raises(TypeError):
        capi.osft_flinear_get_dims(capi.osft_context_create(None))  # wrong kind


def test_dependent_handles_cannot_be_closed_first(ctx, gen):
    w, layer = _layer(ctx, gen, 8, 8)
    with pytest.raises(osftrt.InvalidArgument):
        ctx.close()
    assert not ctx.closed
    wt = capi.osft_mlp_weights_t()
    wt.gate, wt.down = rand(gen, 8, 8), rand(gen, 8, 8)
    wt.up_layer = layer
    mlp = capi.osft_mlp_create(ctx.handle, capi.OSFT_MLP_SWIGLU, 8, 8, wt, None)
    del wt
    with pytest.raises(osftrt.InvalidArgument, match="in use"):
        layer.close()
    with pytest.raises(osftrt.InvalidArgument):
        capi.osft_flinear_destroy(layer)
    x = rand(gen, 3, 8)
    y = poison(3, 8)
    capi.osft_mlp_forward(mlp, x, y, 0)
    assert torch.isfinite(y).all()
    capi.osft_mlp_destroy(mlp)  # the raw destroy marks the handle closed too
    assert mlp.closed
    with pytest.raises(osftrt.InvalidHandle):
        capi.osft_mlp_forward(mlp, x, y, 0)
    layer.close()
    assert ctx.handle.users == 0


def test_finalizer_is_a_backstop(ctx, gen):
    for _ in range(5):
        _layer(ctx, gen)  # dropped without close()
    gc.collect()
    assert ctx.handle.users == 0
    ctx.close()  # would fail with live layers
    assert ctx.closed


# ------------------------------------------------------------------------ GIL
def test_gil_is_released_during_compute(ctx, gen):
    w = rand(gen, 256, 256)
    layer = capi.osft_flinear_create_from_weight(ctx.handle, w, None)
    capi.osft_flinear_set_strategy(layer, capi.OSFT_FLINEAR_FACTORIZED)
    rows = 8192
    while True:  # a call long enough on this machine (a 16-core one runs 8192 rows in ~13 ms)
        x = rand(gen, rows, 256)
        y = torch.empty(rows, 256)
        t = time.perf_counter()
        capi.osft_flinear_forward(layer, x, None, y)  # also the warm-up
        if time.perf_counter() - t > 10 * sys.getswitchinterval() or rows >= 16 * 8192:
            break
        rows *= 2
    count = [0]
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            count[0] += 1

    th = threading.Thread(target=spin)
    th.start()
    time.sleep(0.05)
    c0, t0 = count[0], time.perf_counter()
    time.sleep(0.1)  # the spinner's rate with the GIL mostly free
    rate = (count[0] - c0) / (time.perf_counter() - t0)
    c0, t0 = count[0], time.perf_counter()
    capi.osft_flinear_forward(layer, x, None, y)  # one long C call
    dt = time.perf_counter() - t0
    progressed = count[0] - c0
    stop.set()
    th.join()
    layer.close()
    # Holding the GIL, the call would let the spinner run at most one switch
    # interval (5 ms) of its time; released, it runs a good part of dt.
    assert dt > 4 * sys.getswitchinterval(), dt
    assert progressed > 0.1 * rate * dt + rate * sys.getswitchinterval(), (progressed, rate, dt)


# ----------------------------------------------------------------------- leaks
def _rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def test_no_leak_over_10000_cycles(gen):
    u, s, vt = torch.linalg.svd(rand(gen, 4, 4, dtype=torch.float64), full_matrices=False)
    u, s, vt = u.float().contiguous(), s.float().contiguous(), vt.float().contiguous()
    x, y = rand(gen, 2, 4), torch.empty(2, 4)
    xt, wt, tt, loss = rand(gen, 2, 4), rand(gen, 5, 4), torch.tensor([1, 4]), torch.empty(())

    def cycle():
        with osftrt.Context("cpu") as c:
            f = capi.osft_flinear_factors_t()
            f.u_high, f.s_high, f.v_high, f.u_low, f.s_low, f.v_low = u[:, :2], s[:2], vt[:2], u[:, 2:], s[2:], vt[2:]
            layer = capi.osft_flinear_create_from_factors(c.handle, f, None)
            capi.osft_flinear_forward(layer, x, None, y)
            fl = capi.osft_flce_create(c.handle, None)
            i = capi.osft_flce_inputs_t()
            i.x, i.weight, i.targets = xt, wt, tt
            o = capi.osft_flce_outputs_t()
            o.loss = loss
            capi.osft_flce_compute(fl, i, o)
            try:
                capi.osft_flinear_forward(layer, x.double(), None, y)
            except osftrt.DtypeMismatch:
                pass
            fl.close()
            layer.close()

    for _ in range(1000):
        cycle()
    gc.collect()
    before = _rss()
    for _ in range(10000):
        cycle()
    gc.collect()
    grown = _rss() - before
    assert grown < 2 << 20, "RSS grew by %d KiB over 10,000 cycles" % (grown >> 10)


# ------------------------------------------------------------------ allocator
class CountingAllocator:
    """Host memory from Python (bytearrays), counted."""

    def __init__(self, fail=False):
        self.blocks = {}
        self.in_use = 0
        self.calls = 0
        self.fail = fail

    def host_alloc(self, nbytes, alignment):
        self.calls += 1
        if self.fail:
            return 0
        buf = (ctypes.c_char * (nbytes + alignment))()
        addr = ctypes.addressof(buf)
        aligned = (addr + alignment - 1) // alignment * alignment
        self.blocks[aligned] = (buf, nbytes)
        self.in_use += nbytes
        return aligned

    def host_free(self, ptr, nbytes):
        buf, n = self.blocks.pop(ptr)
        assert n == nbytes
        self.in_use -= nbytes


def test_python_allocator_serves_every_byte(gen):
    a = CountingAllocator()
    c = osftrt.Context("cpu", allocator=a)
    w, layer = _layer(c, gen, 32, 24)
    y = poison(16, 32)
    capi.osft_flinear_forward(layer, rand(gen, 16, 24), None, y)
    assert torch.isfinite(y).all()
    st = c.memory_stats()
    assert a.calls > 0 and a.in_use == st["host_in_use"] > 0
    layer.close()
    c.close()
    assert a.in_use == 0 and not a.blocks, "every block is returned by destroy"
    with pytest.raises(osftrt.OutOfMemory):
        osftrt.Context("cpu", allocator=CountingAllocator(fail=True))


def test_runtime_version_check():
    assert osftrt._BUILT == capi.OSFT_VERSION_NUMBER and osftrt._LOADED == capi.osft_version()
    osftrt._check_version(10000, 10000)
    osftrt._check_version(10100, 10000)  # a newer minor only adds
    with pytest.raises(ImportError, match="built against 1.1.0"):
        osftrt._check_version(10000, 10100)  # older than the headers
    with pytest.raises(ImportError):
        osftrt._check_version(20000, 10000)  # another major
