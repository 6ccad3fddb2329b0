"""The SWIG interface exposes the whole public API: every osft_* function of
the headers and of the library's dynamic symbol table, every OSFT_*_INIT
macro, every enum value and #define constant, every struct."""
import glob
import os
import re
import subprocess

import pytest

import osftrt
from osftrt import capi

from conftest import REPO

HEADERS = sorted(glob.glob(os.path.join(REPO, "include", "osftrt", "*.h")))


def _strip_comments(src):
    return re.sub(r"/\*.*?\*/", "", re.sub(r"//[^\n]*", "", src, flags=re.S), flags=re.S)


def _header_text():
    return "\n".join(_strip_comments(open(h).read()) for h in HEADERS)


def header_functions():
    return sorted(set(re.findall(r"OSFT_API\s+[^;(]*?\b(osft_\w+)\s*\(", _header_text())))


def library_functions():
    prefix = os.environ.get("OSFTRT_PREFIX", os.path.join(REPO, "build-release", "prefix"))
    lib = os.path.join(prefix, "lib", "libosftrt.so")
    if not os.path.exists(lib):
        pytest.skip("no installed library at %s" % lib)
    out = subprocess.run(["nm", "-D", "--defined-only", lib], check=True, capture_output=True, text=True).stdout
    return sorted({m.split("@")[0] for m in re.findall(r"\bT\s+(osft_\w+(?:@\S+)?)", out)})


def test_headers_found():
    assert len(HEADERS) >= 12
    assert len(header_functions()) > 80


def test_every_header_function_is_exposed():
    missing = [f for f in header_functions() if not callable(getattr(capi, f, None))]
    assert not missing, "not exposed by bindings/swig/osftrt.i: %s" % missing


def test_every_exported_symbol_is_exposed():
    syms = library_functions()
    assert len(syms) > 80
    missing = [f for f in syms if not callable(getattr(capi, f, None))]
    assert not missing, "exported by libosftrt but not exposed: %s" % missing


def test_every_init_macro_is_exposed_and_works():
    macros = sorted(set(re.findall(r"#define\s+(OSFT_\w+_INIT)\s*\(", _header_text())))
    assert len(macros) >= 16
    for name in macros:
        fn = getattr(capi, name, None)
        assert callable(fn), name
        # the struct it initializes: OSFT_FLCE_OPTIONS_INIT -> osft_flce_options_t
        struct = getattr(capi, "osft_" + name[len("OSFT_"):-len("_INIT")].lower() + "_t")
        s = struct()
        size = s.struct_size
        assert size >= 8, name
        s.struct_size = 0
        fn(s)  # the macro passes sizeof(*s)
        assert s.struct_size == size, name


def test_every_enum_value_and_constant_is_exposed():
    text = _header_text()
    names = set(re.findall(r"\b(OSFT_[A-Z0-9_]+)\s*=\s*-?\d", text))
    names |= set(re.findall(r"#define\s+(OSFT_[A-Z0-9_]+)\s+[^(\s]", text))
    names -= {"OSFT_API"}
    assert len(names) > 60
    missing = [n for n in sorted(names) if not hasattr(capi, n)]
    assert not missing, missing
    assert capi.OSFT_FLINEAR_ACCUMULATE_ALL == 0x1F
    assert capi.OSFT_VERSION_NUMBER == capi._built_version()


def test_every_struct_is_exposed_with_struct_size():
    structs = sorted(set(re.findall(r"typedef\s+struct\s+\w+\s*\{[^}]*\}\s*(osft_\w+_t)\s*;", _header_text(), flags=re.S)))
    assert len(structs) >= 20
    for name in structs:
        cls = getattr(capi, name, None)
        assert cls is not None, name
        s = cls()
        if hasattr(s, "struct_size"):
            assert s.struct_size > 0, name


def test_defaults_come_from_the_library():
    o = capi.osft_flce_options_t()
    assert o.ignore_index == -100 and o.reduction == capi.OSFT_FLCE_MEAN
    f = capi.osft_flinear_options_t()
    assert f.rank_ratio == 0.5
    c = capi.osft_comm_options_t()
    assert c.timeout_seconds == 300.0


def test_every_struct_field_is_exposed():
    """Every field of every public struct is an attribute of its SWIG class,
    with the header's type kind (the OSFT_*_INIT defaults of a field
    appended later are reachable like the others)."""
    structs = re.findall(r"typedef\s+struct\s+\w+\s*\{([^}]*)\}\s*(osft_\w+_t)\s*;", _header_text(), flags=re.S)
    n = 0
    missing = []
    for body, name in structs:
        s = getattr(capi, name)()
        for decl in (d.strip() for d in body.split(";")):
            if not decl:
                continue
            fn = re.search(r"\(\s*\*\s*(\w+)\s*\)", decl)
            fields = [fn.group(1)] if fn else [re.findall(r"\w+", p)[-1] for p in re.sub(r"\[[^\]]*\]", "", decl).split(",")]
            for f in fields:
                n += 1
                if not hasattr(s, f):
                    missing.append("%s.%s" % (name, f))
    assert n > 150
    assert not missing, missing


def test_defaults_of_the_1_2_fields():
    assert capi.osft_projector_options_t().arithmetic == capi.OSFT_PROJECTION_ARITHMETIC_AUTO
    o = capi.osft_flce_options_t()
    assert o.chunking == capi.OSFT_FLCE_CHUNKING_AUTO and o.slice_cols == 0
    assert capi.OSFT_QR_CHOLESKY_TF32 == 2 and capi.OSFT_PROJECTION_ARITHMETIC_BF16 == 3
    assert capi.OSFT_FLCE_CHUNKING_VOCAB == 2


def _flce_raw(ctx, chunking, slice_cols, x, w, y):
    """One osft_flce_compute + osft_flce_get_plan through the raw layer."""
    import torch

    o = capi.osft_flce_options_t()
    o.chunking, o.slice_cols = chunking, slice_cols
    h = capi.osft_flce_create(ctx.handle, o)
    try:
        back = capi.osft_flce_options_t()
        capi.osft_flce_get_options(h, back)
        assert (back.chunking, back.slice_cols) == (chunking, slice_cols)
        i = capi.osft_flce_inputs_t()
        i.x, i.weight, i.targets = x, w, y
        out = capi.osft_flce_outputs_t()
        loss, gx = torch.full((), float("nan")), torch.full(x.shape, float("nan"))
        out.loss, out.grad_x = loss, gx
        plan = capi.osft_flce_plan_t()
        capi.osft_flce_get_plan(h, i, out, plan)
        assert torch.isnan(loss) and torch.isnan(gx).all()  # the plan writes nothing
        capi.osft_flce_compute(h, i, out)
        return plan, loss, gx
    finally:
        capi.osft_flce_destroy(h)


def test_flce_chunking_and_plan_fields_reach_the_library(ctx, gen):
    import torch

    from conftest import rand

    M, H, V = 13, 24, 50
    x, w = rand(gen, M, H), rand(gen, V, H)
    y = torch.randint(0, V, (M,), generator=gen)
    xd = x.double().requires_grad_()
    ref = torch.nn.functional.cross_entropy(xd @ w.double().T, y)
    ref.backward()
    for chunking, cols, want in ((capi.OSFT_FLCE_CHUNKING_AUTO, 0, (capi.OSFT_FLCE_CHUNKING_TOKENS, 1, V)),
                                 (capi.OSFT_FLCE_CHUNKING_TOKENS, 0, (capi.OSFT_FLCE_CHUNKING_TOKENS, 1, V)),
                                 (capi.OSFT_FLCE_CHUNKING_VOCAB, 16, (capi.OSFT_FLCE_CHUNKING_VOCAB, 4, 16)),
                                 (capi.OSFT_FLCE_CHUNKING_VOCAB, 20, (capi.OSFT_FLCE_CHUNKING_VOCAB, 3, 20))):
        plan, loss, gx = _flce_raw(ctx, chunking, cols, x, w, y)
        assert (plan.chunking, plan.slices, plan.slice_cols) == want
        assert plan.tokens == M and plan.chunks == 1 and plan.scratch_bytes > 0
        assert abs(loss.item() - ref.item()) <= 1e-5 * abs(ref.item())
        err = (gx.double() - xd.grad).abs().max() / xd.grad.abs().max()
        assert err <= 1e-4, (chunking, err)
    for bad, field in ((("chunking", 7), "chunking"), (("slice_cols", -1), "slice_cols")):
        o = capi.osft_flce_options_t()
        setattr(o, *bad)
        with pytest.raises(osftrt.InvalidArgument, match=field):
            capi.osft_flce_create(ctx.handle, o)


def test_projector_arithmetic_option_and_counters_reach_the_library(ctx):
    o = capi.osft_projector_options_t()
    o.arithmetic = 9
    with pytest.raises(osftrt.InvalidArgument, match="arithmetic"):
        capi.osft_projector_create(ctx.handle, None, o)
    o.arithmetic = capi.OSFT_PROJECTION_ARITHMETIC_BF16
    p = capi.osft_projector_create(ctx.handle, None, o)
    try:
        i = capi.osft_projector_info_t()
        for k in ("last_gemms", "last_gemm_calls", "last_elementwise_calls", "last_collectives", "last_host_waits"):
            setattr(i, k, -1)  # poisoned: the call must write 0 (no call yet)
        capi.osft_projector_get_info(p, i)
        assert (i.last_gemms, i.last_gemm_calls, i.last_elementwise_calls, i.last_collectives,
                i.last_host_waits) == (0, 0, 0, 0, 0)
    finally:
        capi.osft_projector_destroy(p)


def test_batched_qr_cholesky_tf32(gen):
    import torch

    from conftest import rand

    a = [rand(gen, 40, 8), rand(gen, 16, 3), rand(gen, 6, 6, dtype=torch.float64)]
    res = osftrt.batched_qr(a, method="cholesky_tf32")
    assert res.ok
    for ai, q, r in zip(a, res.q, res.r):
        q, r, ad = q.double(), r.double(), ai.double()
        tol = 1e-12 if ai.dtype == torch.float64 else 1e-5
        assert (q.T @ q - torch.eye(q.shape[1], dtype=torch.float64)).abs().max() <= tol
        assert (q @ r - ad).abs().max() <= tol * ad.abs().max()
        assert torch.equal(r, r.triu()) and (r.diagonal() >= 0).all()
