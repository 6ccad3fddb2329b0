"""The SWIG interface exposes the whole public API: every osft_* function of
the headers and of the library's dynamic symbol table, every OSFT_*_INIT
macro, every enum value and #define constant, every struct."""
import glob
import os
import re
import subprocess

import pytest

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
