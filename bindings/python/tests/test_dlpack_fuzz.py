"""Seeded, bounded fuzz test of the DLPack argument path of the binding
(bindings/swig/osftrt.i, osftpy_import and the tensor typemaps).

Hostile objects go into the DLTensor parameters of osft_flinear_forward,
osft_flce_compute (through osftrt.capi structs and through
osftrt.torch.fused_linear_cross_entropy), osft_qr_batch (osftrt.batched_qr),
osft_mlp_forward and osft_comm_allreduce_sum: wrong dtypes, wrong ndim,
zero-size dims, transposed / strided / negative-stride / zero-stride views,
consumed capsules, capsules of the wrong name, __dlpack__ returning a
non-capsule or raising, objects claiming a CUDA device, objects without
__dlpack__, None, wrong shapes and out-of-range targets. Every call must
either succeed or raise one of ALLOWED (never SystemError, never a crash),
and a failed call must leave the outputs untouched (they are poisoned with
NaN first and compared after).

The fuzz loop runs in a child interpreter (this file run as a script), so a
segfault fails the test with the seed and the last case printed instead of
killing pytest. Each case prints one line before it runs.

    OSFTRT_PYFUZZ_CASES   cases (default 50000)
    OSFTRT_PYFUZZ_SEED    seed (default 20261125; "random": a fresh one)

By hand: python3 test_dlpack_fuzz.py --seed 1 --cases 100000 [--verbose]
"""
import argparse
import collections
import ctypes
import os
import random
import resource
import subprocess
import sys
import time

DEFAULT_CASES = 50000  # ~5-10 s on a loaded 2-core box
DEFAULT_SEED = 20261125


# ----------------------------------------------------------------- pytest side
def test_dlpack_fuzz_no_crash(capsys):
    cases = int(os.environ.get("OSFTRT_PYFUZZ_CASES", DEFAULT_CASES))
    s = os.environ.get("OSFTRT_PYFUZZ_SEED", str(DEFAULT_SEED))
    seed = random.SystemRandom().randrange(1 << 31) if s == "random" else int(s)
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    t0 = time.monotonic()
    # streamed, keeping only the tail: a long run prints a line per case
    p = subprocess.Popen([sys.executable, "-X", "faulthandler", os.path.abspath(__file__), "--seed", str(seed),
                          "--cases", str(cases)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    last = collections.deque(maxlen=40)
    summary = []
    for line in p.stdout:
        last.append(line.rstrip("\n"))
        if line.startswith("pyfuzz:"):
            summary.append(line.rstrip("\n"))
    rc = p.wait()
    dt = time.monotonic() - t0
    with capsys.disabled():  # shown in the (-q) pytest output
        print("\npyfuzz seed %d, %d cases, %.1f s, rc %d" % (seed, cases, dt, rc))
        print("\n".join(summary))
    assert rc == 0, ("the fuzz child failed (rc %d; a negative rc is a signal, i.e. a crash). Rerun with:\n"
                     "  python3 %s --seed %d --cases %d [--verbose]\n--- last lines ---\n%s"
                     % (rc, __file__, seed, cases, "\n".join(last)))
    assert any(x.startswith("pyfuzz: done") for x in summary), "\n".join(last)


# ------------------------------------------------------------------ child side
def _child(seed, cases, verbose, only=None):
    import numpy as np
    import torch

    import osftrt
    from osftrt import capi
    import osftrt.torch as otorch

    torch.set_num_threads(1)
    ALLOWED = (osftrt.Error, TypeError, ValueError, BufferError)

    ctypes.pythonapi.PyCapsule_GetPointer.restype = ctypes.c_void_p
    ctypes.pythonapi.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    ctypes.pythonapi.PyCapsule_New.restype = ctypes.py_object
    ctypes.pythonapi.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]

    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    ctx = osftrt.Context("cpu")

    def randn(*shape, dtype=torch.float32):
        return (torch.randn(*shape, generator=gen, dtype=torch.float64) + 0.25).to(dtype)

    def nan(*shape, dtype=torch.float32):  # poison (a sentinel for integer tensors)
        return torch.full(shape, float("nan") if dtype.is_floating_point else 77, dtype=dtype)

    def same(o, b):
        if o.dtype.is_floating_point:
            return torch.equal(o.isnan(), b.isnan()) and torch.equal(o.nan_to_num(7.0), b.nan_to_num(7.0))
        return torch.equal(o, b)

    # ---------------------------------------------------------- hostile objects
    class Wrap:
        """A producer with a scripted __dlpack__ / __dlpack_device__."""

        def __init__(self, dlpack, device=None):
            self._dlpack, self._device = dlpack, device

        def __dlpack__(self, stream=None):
            return self._dlpack()

        def __dlpack_device__(self):
            return self._device if self._device is not None else (1, 0)

    class NoStreamKw:  # claims CUDA, but its __dlpack__ takes no stream
        def __init__(self, a):
            self.a = a

        def __dlpack_device__(self):
            return (2, 0)

        def __dlpack__(self):
            return self.a.__dlpack__()

    class Detachable:  # __dlpack__ raises RuntimeError, detach() gives junk
        def __init__(self, junk):
            self.junk = junk

        def __dlpack__(self, stream=None):
            raise RuntimeError("requires grad")

        def detach(self):
            return self.junk

    def consumed(a):
        cap = torch.as_tensor(a).__dlpack__() if isinstance(a, np.ndarray) else a.__dlpack__()
        torch.utils.dlpack.from_dlpack(cap)  # renames it "used_dltensor"
        return cap

    def device_patched(a, devtype):
        cap = np.ascontiguousarray(a).__dlpack__()
        ptr = ctypes.pythonapi.PyCapsule_GetPointer(cap, b"dltensor")
        ctypes.c_int32.from_address(ptr + 8).value = devtype
        return cap

    def to_np(t):
        return t.detach().numpy().copy()

    # Each kind: (name, must_raise, fn(valid) -> (obj, watch)); `valid` is a
    # valid torch tensor for the slot; `watch` is a poisoned tensor whose
    # memory the object views (checked untouched on failure) or None.
    NP_BAD = [np.int8, np.float16, np.complex64, np.bool_, np.uint16]
    TORCH_BAD = [torch.int8, torch.float16, torch.complex64, torch.bool, torch.int16, torch.uint8]

    def k_dtype(v):
        if rng.random() < 0.5:
            return np.ones(tuple(v.shape), dtype=rng.choice(NP_BAD)), None
        d = rng.choice(TORCH_BAD)
        return torch.ones(tuple(v.shape), dtype=d), None

    def k_float64(v):  # valid for QR only
        return v.to(torch.float64), None

    def k_ndim(v):
        if v.dim() == 0 or rng.random() < 0.5:
            return v.reshape(tuple(v.shape) + (1,) * rng.randint(1, 3)).clone(), None
        return v.reshape(-1).clone(), None

    def k_zero(v):
        shape = list(v.shape) or [0]
        shape[rng.randrange(len(shape))] = 0
        return nan(*shape, dtype=v.dtype), None

    def k_shape(v):
        shape = list(v.shape) or [1]
        i = rng.randrange(len(shape))
        shape[i] = shape[i] + rng.choice([-1, 1, 2, 7]) if shape[i] > 1 else shape[i] + rng.choice([1, 2, 7])
        return nan(*shape, dtype=v.dtype), None

    def k_transposed(v):
        if v.dim() < 2:
            base = nan(v.numel(), 2, dtype=v.dtype)
            base[:, 0] = v.reshape(-1)
            return base[:, 0].reshape(v.shape), base
        base = nan(*reversed(tuple(v.shape)), dtype=v.dtype)
        base.copy_(v.T)
        return base.T, base

    def k_strided(v):
        shape = list(v.shape) or [1]
        i = rng.randrange(len(shape))
        big = list(shape)
        big[i] *= 2
        base = nan(*big, dtype=v.dtype)
        sl = [slice(None)] * len(shape)
        sl[i] = slice(None, None, 2)
        view = base[tuple(sl)]
        view.copy_(v.reshape(shape))
        if rng.random() < 0.5:
            return base.numpy()[tuple(sl)], base
        return view, base

    def k_negative(v):
        a = to_np(v) if v.dim() else to_np(v.reshape(1))
        if rng.random() < 0.5:
            return a[::-1], None
        return a[..., ::-1], None

    def k_expanded(v):
        shape = tuple(v.shape) or (1,)
        if rng.random() < 0.5:
            return v.reshape(-1)[:1].reshape((1,) * len(shape)).expand(*shape), None
        return np.broadcast_to(to_np(v.reshape(-1)[:1]).reshape((1,) * len(shape)), shape), None

    def k_consumed_obj(v):
        cap = consumed(v.clone())
        return Wrap(lambda: cap), None

    def k_used_capsule(v):
        return consumed(v.clone()), None

    def k_wrong_name_capsule(v):
        t = v.clone()
        ptr = t.data_ptr()
        cap = ctypes.pythonapi.PyCapsule_New(ptr, rng.choice([b"DLTensor", b"dltensor_versioned", b"x"]), None)
        return (Wrap(lambda: cap) if rng.random() < 0.5 else cap), None

    def k_non_capsule(v):
        junk = rng.choice([None, 0, -1, "dltensor", b"dltensor", 3.5, [], v, object()])
        return Wrap(lambda: junk), None

    def k_raises(v):
        exc = rng.choice([RuntimeError("no"), BufferError("no"), TypeError("no"), ValueError("no"), MemoryError(),
                          KeyError("no"), ZeroDivisionError()])

        def f():
            raise exc

        if rng.random() < 0.3:  # detach() giving a usable array may work
            junk = rng.choice([None, 1, object(), v.numpy(), Wrap(f)])
            return Detachable(junk), ("maybe" if isinstance(junk, np.ndarray) else None)
        return Wrap(f), None

    def k_cuda_claim(v):
        a = to_np(v)
        r = rng.random()
        if r < 0.4:  # claims CUDA, hands out a CPU capsule: either works or is refused
            return Wrap(lambda: a.__dlpack__(), (2, 0)), "maybe"
        if r < 0.55:
            return NoStreamKw(a), None
        if r < 0.7:  # garbage from __dlpack_device__
            junk = rng.choice([None, "cuda", (), ("x",), (1 << 70, 0), (-5, 0), 2])
            return Wrap(lambda: a.__dlpack__(), junk), "maybe"
        devtype = rng.choice([2, 3, 4, 7, 8, 10, 13, 14, 99])  # a capsule that says CUDA/ROCm/...
        return device_patched(a, devtype), ("maybe" if devtype == 3 else None)  # 3: kDLCUDAHost, host memory

    def k_no_dlpack(v):
        return rng.choice([object(), 1, 2.5, "tensor", b"\0" * 16, [[1.0] * 3] * 2, {"a": 1}, (1, 2), ctx,
                           np.float32(1.0), bytearray(8), memoryview(b"abcd")]), None

    def k_requires_grad(v):  # torch refuses to export these; the binding exports the detached alias
        t = v.clone().requires_grad_(v.dtype.is_floating_point)
        return t, (t.detach() if not t.requires_grad else None)

    def k_readonly(v):
        a = to_np(v)
        a.setflags(write=False)
        return a, None

    def k_unaligned(v):  # a float32/64 array at an odd address
        a = to_np(v)
        raw = np.zeros(a.nbytes + 1, dtype=np.uint8)
        u = np.frombuffer(raw.data, dtype=a.dtype, count=a.size, offset=1).reshape(a.shape)
        u[...] = a
        return u, None

    def k_fortran(v):
        return np.asfortranarray(to_np(v)), None

    def k_none(v):
        return None, None

    KINDS = [
        ("dtype", True, k_dtype), ("float64", "maybe", k_float64), ("ndim", "maybe", k_ndim),
        ("zero_size", "maybe", k_zero), ("shape", True, k_shape), ("transposed", "maybe", k_transposed),
        ("strided", "maybe", k_strided), ("negative_stride", "maybe", k_negative),
        ("zero_stride", "maybe", k_expanded), ("consumed_capsule_obj", True, k_consumed_obj),
        ("used_dltensor_capsule", True, k_used_capsule), ("wrong_name_capsule", True, k_wrong_name_capsule),
        ("non_capsule", True, k_non_capsule), ("dlpack_raises", True, k_raises),
        ("cuda_claim", True, k_cuda_claim), ("no_dlpack", True, k_no_dlpack), ("none", "none", k_none),
        ("requires_grad", "maybe", k_requires_grad), ("readonly", "maybe", k_readonly),
        ("unaligned", "maybe", k_unaligned), ("fortran", "maybe", k_fortran),
    ]

    # --------------------------------------------------------------- targets
    # Each target builds fresh valid args: (slots, outputs, call). slots: name
    # -> (valid tensor, role "in"/"out", none_ok); call(args) runs it.
    layer_w = randn(6, 5)
    layer = capi.osft_flinear_create_from_weight(ctx.handle, layer_w, capi.osft_flinear_options_t())
    wt = capi.osft_mlp_weights_t()
    mlp_w = [randn(8, 8) * 0.3 for _ in range(3)]
    wt.gate, wt.up, wt.down = mlp_w
    mlp = capi.osft_mlp_create(ctx.handle, capi.OSFT_MLP_SWIGLU, 8, 8, wt, None)
    del wt
    comm = osftrt.Communicator.single(ctx)
    flce = capi.osft_flce_create(ctx.handle, None)

    def t_flinear():
        slots = {"x": (randn(3, 5), "in", False), "bias": (randn(6), "in", True), "y": (nan(3, 6), "out", False)}
        return slots, lambda a: capi.osft_flinear_forward(layer, a["x"], a["bias"], a["y"])

    def t_mlp():
        slots = {"x": (randn(4, 8), "in", False), "y": (nan(4, 8), "out", False)}
        return slots, lambda a: capi.osft_mlp_forward(mlp, a["x"], a["y"], rng.choice([0, 1, 2, 4]))

    def t_allreduce():
        slots = {"buf": (randn(rng.randint(1, 9)), "inout", False)}
        return slots, lambda a: capi.osft_comm_allreduce_sum(comm.handle, a["buf"])

    def t_flce_capi():
        slots = {"x": (randn(4, 8), "in", False), "weight": (randn(10, 8), "in", False),
                 "targets": (torch.tensor([rng.randrange(10) for _ in range(4)]), "in", False),
                 "bias": (randn(10), "in", True),
                 "loss": (nan(), "out", True), "grad_x": (nan(4, 8), "out", True),
                 "grad_weight": (nan(10, 8), "out", True)}

        def call(a):
            i = capi.osft_flce_inputs_t()
            i.x, i.weight, i.targets, i.bias = a["x"], a["weight"], a["targets"], a["bias"]
            o = capi.osft_flce_outputs_t()
            o.loss, o.grad_x, o.grad_weight = a["loss"], a["grad_x"], a["grad_weight"]
            capi.osft_flce_compute(flce, i, o)

        return slots, call

    def t_flce_torch():
        slots = {"x": (randn(4, 8), "in", False), "weight": (randn(10, 8), "in", False),
                 "target": (torch.tensor([rng.randrange(10) for _ in range(4)]), "in", False),
                 "bias": (randn(10), "in", True)}
        red = rng.choice(["mean", "sum", "none"])
        return slots, lambda a: otorch.fused_linear_cross_entropy(a["x"], a["weight"], a["target"], a["bias"],
                                                                  reduction=red, context=ctx)

    def t_qr():
        n = rng.randint(1, 3)
        shapes = [(rng.randint(3, 6), rng.randint(1, 3)) for _ in range(n)]
        slots = {}
        for j, (m, k) in enumerate(shapes):
            slots["a%d" % j] = (randn(m, k), "in", False)
            slots["q%d" % j] = (nan(m, k), "out", False)
            slots["r%d" % j] = (nan(k, k), "out", True)

        def call(a):
            r = [a["r%d" % j] for j in range(n)]
            osftrt.batched_qr([a["a%d" % j] for j in range(n)], q=[a["q%d" % j] for j in range(n)],
                              r=r, want_r=any(x is not None for x in r), context=ctx)

        return slots, call

    TARGETS = [("flinear_forward", t_flinear), ("mlp_forward", t_mlp), ("comm_allreduce_sum", t_allreduce),
               ("flce_compute(capi)", t_flce_capi), ("fused_linear_cross_entropy", t_flce_torch),
               ("qr_batch", t_qr)]
    if only:  # --target: one API only (to bisect a finding)
        TARGETS = [t for t in TARGETS if t[0] == only]
    # the torch wrapper also runs torch code of its own (reshape, autograd)
    TORCH_EXTRA = (RuntimeError, AttributeError, IndexError)

    def bad_targets(v):
        r = rng.random()
        if r < 0.4:
            bad = rng.choice([10, 11, 1 << 40, -1, -2, -(1 << 40)])
            t = v.clone()
            t[rng.randrange(t.numel())] = bad
            return t, None
        if r < 0.7:
            return v.to(rng.choice([torch.int32, torch.int16, torch.uint8, torch.float32, torch.bool])), "maybe"
        return v.to(torch.int32), "maybe"

    stats, per_target = {}, {}
    raised = succeeded = 0
    t0 = time.monotonic()
    rss_mark = None
    for case in range(cases):
        if case == cases // 5:
            rss_mark = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB
        tname, tfn = TARGETS[rng.randrange(len(TARGETS))]
        slots, call = tfn()
        args = {k: s[0] for k, s in slots.items()}
        n_mut = 1 if rng.random() < 0.8 else 2
        names = rng.sample(sorted(slots), min(n_mut, len(slots)))
        must_kinds = []
        watches = []
        desc = []
        for nm in names:
            valid, role, none_ok = slots[nm]
            if nm.startswith("target") and rng.random() < 0.5:
                kname, obj, w = "bad_target", *bad_targets(valid)
                mr = w != "maybe"
                w = None
            else:
                kname, mr, kfn = KINDS[rng.randrange(len(KINDS))]
                obj, w = kfn(valid)
                if isinstance(w, str):
                    mr, w = False, None
                if mr == "none":
                    mr = not none_ok
                elif mr == "maybe" or (kname == "shape" and (role == "inout" or nm == "weight")):
                    # allreduce takes any length; more weight rows (vocab) with no bias is valid
                    mr = False
            must_kinds.append((kname, bool(mr)))
            args[nm] = obj
            if w is not None:
                watches.append(w)
            desc.append("%s=%s(%s)" % (nm, kname, type(obj).__name__))
        if len(slots) > 1 and rng.random() < 0.03:  # one raw capsule in two slots: the 2nd import sees it used
            a2, b2 = rng.sample(sorted(slots), 2)
            args[a2] = args[b2] = slots[a2][0].clone().__dlpack__()
            must_kinds.append(("same_capsule_twice", True))
            desc.append("%s=%s=same_capsule_twice" % (a2, b2))
        # two wrong shapes may agree with each other (x and y both 5 rows)
        must = any(mr and not (k == "shape" and len(must_kinds) > 1) for k, mr in must_kinds)
        line = "case %d seed %d: %s %s" % (case, seed, tname, " ".join(desc))
        per_target[tname] = per_target.get(tname, 0) + 1
        print(line, flush=True)
        outs = [s[0] for s in slots.values() if s[1] in ("out", "inout")] + watches
        before = [o.clone() for o in outs]
        allowed = ALLOWED + (TORCH_EXTRA if tname == "fused_linear_cross_entropy" else ())
        try:
            call(args)
        except BaseException as e:  # noqa: B902 - anything else is a finding
            if not isinstance(e, allowed) or isinstance(e, SystemError):
                print("FAIL: %s raised %s: %s" % (line, type(e).__name__, e), flush=True)
                sys.exit(3)
            for o, b in zip(outs, before):
                if not same(o, b):
                    print("FAIL: %s raised %s but changed an output" % (line, type(e).__name__), flush=True)
                    sys.exit(4)
            raised += 1
            key = "%s:%s" % (type(e).__module__.split(".")[0], type(e).__name__)
            stats[key] = stats.get(key, 0) + 1
            if verbose:
                print("  -> %s: %s" % (type(e).__name__, str(e)[:200]))
        else:
            succeeded += 1
            if must:
                print("FAIL: %s succeeded, but a must-raise input was given" % line, flush=True)
                sys.exit(5)
        del args, slots, outs, before, watches
    dt = time.monotonic() - t0
    print("pyfuzz: done %d cases (seed %d) in %.1f s, %.0f cases/s: %d raised, %d succeeded"
          % (cases, seed, dt, cases / max(dt, 1e-9), raised, succeeded))
    print("pyfuzz: exceptions " + ", ".join("%s %d" % kv for kv in sorted(stats.items())))
    print("pyfuzz: targets " + ", ".join("%s %d" % kv for kv in sorted(per_target.items())))
    grow = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - (rss_mark or 0)
    print("pyfuzz: peak RSS grew %.1f MiB over the last %d cases" % (grow / 1024.0, cases - cases // 5))
    # an import that leaks its capsule (or the producer's tensor) leaks ~3 KiB
    # per case (126 MiB over 40000 cases when the deleter is skipped); a clean
    # run grows ~12 B per case (the test's own Python/torch churn, 0 B/call
    # for the binding's paths measured one by one)
    limit_kib = 32 * 1024 + cases * 64 // 1024
    assert cases < 50000 or grow < limit_kib, "memory grows by %d KiB (limit %d): a leak on some path" % (grow, limit_kib)
    # a fuzz run where nothing (or everything) raised tests nothing
    assert raised > cases // 4 and (succeeded > 0 or cases < 50), (raised, succeeded)
    comm.close()
    flce.close()
    mlp.close()
    layer.close()  # ctx stays open: osftrt.torch caches FLCE handles on it


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=DEFAULT_SEED)
    ap.add_argument("--cases", type=int, default=DEFAULT_CASES)
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument("--target", help="fuzz one API only, e.g. qr_batch")
    a = ap.parse_args()
    _child(a.seed, a.cases, a.verbose, a.target)
