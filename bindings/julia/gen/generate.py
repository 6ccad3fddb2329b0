#!/usr/bin/python3
"""Generates bindings/julia/Osftrt/src/LibOsftrt.jl from include/osftrt/*.h.

Usage: /usr/bin/python3 bindings/julia/gen/generate.py [--check] [-o FILE]

Needs libclang's Python bindings (Debian: python3-clang-14). The output is
the raw layer of the Julia package: one `ccall` wrapper per public function
(with its header comment as docstring), the enums as typed constants, the
opaque handles as `Ptr` types, every struct reachable from the API as an
`isbits` Julia struct with the C field names and types (so its layout is
the C layout), a keyword constructor filling the defaults through the
library's own `*_init` function, the integer macros, and a table of the C
compiler's sizes and offsets for the run-time check in test/runtests.jl.

--check: regenerate in memory and exit 1 if the committed file differs.
"""

import argparse
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cmodel  # noqa: E402
import clang.cindex as ci  # noqa: E402

OUT = os.path.join(cmodel.REPO, "bindings", "julia", "Osftrt", "src", "LibOsftrt.jl")

# C typedef names that have a Julia spelling of their own.
NAMED = {
    "size_t": "Csize_t", "int64_t": "Int64", "uint64_t": "UInt64", "int32_t": "Int32",
    "uint32_t": "UInt32", "int16_t": "Int16", "uint16_t": "UInt16", "int8_t": "Int8",
    "uint8_t": "UInt8",
}
BUILTIN = {
    ci.TypeKind.VOID: "Cvoid", ci.TypeKind.CHAR_S: "Cchar", ci.TypeKind.SCHAR: "Cchar",
    ci.TypeKind.UCHAR: "Cuchar", ci.TypeKind.SHORT: "Cshort", ci.TypeKind.USHORT: "Cushort",
    ci.TypeKind.INT: "Cint", ci.TypeKind.UINT: "Cuint", ci.TypeKind.LONG: "Clong",
    ci.TypeKind.ULONG: "Culong", ci.TypeKind.LONGLONG: "Clonglong",
    ci.TypeKind.ULONGLONG: "Culonglong", ci.TypeKind.FLOAT: "Cfloat",
    ci.TypeKind.DOUBLE: "Cdouble", ci.TypeKind.BOOL: "Bool",
}
JULIA_KEYWORDS = {
    "in", "end", "type", "function", "global", "local", "begin", "let", "quote", "do",
    "for", "while", "if", "else", "elseif", "try", "catch", "finally", "return", "break",
    "continue", "macro", "module", "baremodule", "using", "import", "export", "const",
    "struct", "mutable", "abstract", "primitive", "where", "isa", "outer",
}


class Gen:
    def __init__(self, m):
        self.m = m
        self.enum_names = {e[0] for e in m.enums}
        self.handle_names = {h[0] for h in m.handles}
        self.struct_names = set(m.structs)

    def jtype(self, t, ret=False):
        """Julia spelling of a clang type; typedef names of the API are kept."""
        while t.kind == ci.TypeKind.ELABORATED:
            t = t.get_named_type()
        if t.kind == ci.TypeKind.TYPEDEF:
            n = t.get_declaration().spelling
            if n in NAMED:
                return NAMED[n]
            if (n in self.enum_names or n in self.handle_names or n in self.struct_names
                    or n in self.m.fnptrs):
                return n
            return self.jtype(t.get_declaration().underlying_typedef_type, ret)
        if t.kind in BUILTIN:
            return BUILTIN[t.kind]
        if t.kind == ci.TypeKind.POINTER:
            p = t.get_pointee()
            pc = p.get_canonical()
            if pc.kind in (ci.TypeKind.FUNCTIONPROTO, ci.TypeKind.FUNCTIONNOPROTO):
                return "Ptr{Cvoid}"
            if ret and pc.kind in (ci.TypeKind.CHAR_S, ci.TypeKind.SCHAR):
                return "Cstring"
            return "Ptr{%s}" % self.jtype(p)
        if t.kind == ci.TypeKind.CONSTANTARRAY:
            return "NTuple{%d, %s}" % (t.element_count, self.jtype(t.element_type))
        if t.kind == ci.TypeKind.RECORD:
            return self.m.record_name(t.get_declaration())
        if t.kind == ci.TypeKind.ENUM:
            return self.jtype(t.get_declaration().enum_type)
        raise ValueError("no Julia type for %s" % t.spelling)

    def reachable_structs(self):
        """Structs used by the API (directly or through fields), in dependency order."""
        need, order = set(), []

        def visit_type(t):
            k = self.m.kind(t)
            for name in re.findall(r"struct\(([A-Za-z_0-9]+)\)", k):
                visit(name)

        def visit(name):
            if name in need or name not in self.m.structs:
                return
            need.add(name)
            for _, ft in self.m.structs[name]["fields"]:
                visit_type(ft)
            order.append(name)

        for f in self.m.functions:
            visit_type(f["ret"])
            for _, pt in f["params"]:
                visit_type(pt)
        return order

    @staticmethod
    def doc(comment):
        """A C comment as the text of a Julia docstring."""
        lines = []
        for ln in comment.splitlines():
            ln = ln.strip()
            ln = re.sub(r"^/\*+", "", ln)
            ln = re.sub(r"\*+/$", "", ln)
            ln = re.sub(r"^\* ?", "", ln)
            lines.append(ln.rstrip())
        while lines and not lines[0].strip():
            lines.pop(0)
        while lines and not lines[-1].strip():
            lines.pop()
        text = "\n".join(lines).replace("\\", "\\\\").replace("$", "\\$").replace('"""', '\\"\\"\\"')
        return text

    def emit(self):
        m, o = self.m, []
        w = o.append
        w("# GENERATED by bindings/julia/gen/generate.py from include/osftrt/*.h")
        w("# (and <dlpack/dlpack.h>). DO NOT EDIT: change the headers and regenerate:")
        w("#   /usr/bin/python3 bindings/julia/gen/generate.py")
        w("# The test .ci/stage_julia.sh fails when this file and the headers differ.")
        w("#")
        w("# The raw C API: names, types and layouts exactly as in C. The idiomatic")
        w("# layer (exceptions, finalizers, arrays as DLTensors) is ../src/Osftrt.jl.")
        w("module LibOsftrt")
        w("")
        w('"""')
        w("The shared library every wrapper calls: `ENV[\"OSFTRT_LIBRARY\"]` when set at")
        w("precompile time (a path), else `libosftrt.so.1`, found by the dynamic loader")
        w("(LD_LIBRARY_PATH; `pkg-config --variable=libdir osftrt` names the directory).")
        w('"""')
        w('const libosftrt = get(ENV, "OSFTRT_LIBRARY", "libosftrt.so.1")')
        w("")
        w("# ---- integer macros " + "-" * 58)
        for name, val, unsigned, hdr in m.macros:
            v = "UInt32(0x%x)" % val if unsigned else "%d" % val
            w("const %s = %s  # %s" % (name, v, hdr))
        w("")
        w("# ---- enums: the C enum's integer type, and one constant per enumerator " + "-" * 5)
        for name, kind, vals, comment, hdr in m.enums:
            base = {"u32": "Cuint", "i32": "Cint"}[kind]
            w("")
            d = self.doc(comment)
            if d:
                w('"""\n%s\n"""' % d)
            w("const %s = %s  # %s" % (name, base, hdr))
            for en, ev in vals:
                w("const %s = %s(%d)" % (en, name, ev))
        w("")
        w("# ---- opaque handles " + "-" * 58)
        for name, tag in m.handles:
            w("mutable struct %s end" % tag)
            w("const %s = Ptr{%s}" % (name, tag))
        w("")
        w("# ---- function-pointer types (a Julia `@cfunction` pointer) " + "-" * 19)
        for name in m.fnptrs:
            w("const %s = Ptr{Cvoid}" % name)
        w("")
        w("# ---- structs: isbits, field for field as in C (so the layout is C's) " + "-" * 7)
        structs = self.reachable_structs()
        inits = {}
        for f in m.functions:
            mm = re.match(r"^osft_(.*)_init$", f["name"])
            if mm and len(f["params"]) == 2:
                tname = self.jtype(f["params"][0][1].get_pointee()) \
                    if f["params"][0][1].kind == ci.TypeKind.POINTER else None
                if tname in m.structs:
                    inits[tname] = f["name"]
        for s in structs:
            info = m.structs[s]
            w("")
            d = self.doc(info["comment"])
            w('"""\n%s%s\n"""' % ("`%s` (%s)" % (s, info["header"]), "\n\n" + d if d else ""))
            w("struct %s" % s)
            for fname, ft in info["fields"]:
                w("    %s::%s" % (fname, self.jtype(ft)))
            w("end")
            if s in inits:
                fields = [f for f, _ in info["fields"]]
                w("")
                w('"""')
                w("    %s(; field = value, ...)" % s)
                w("")
                w("The defaults of `%s` (the library's own, as `%s` writes them" % (
                    inits[s], inits[s]))
                w("for `struct_size = sizeof(%s)`), with the given fields replaced." % s)
                w('"""')
                w("function %s(; kwargs...)" % s)
                w("    r = Ref{%s}()" % s)
                w("    st = %s(r, Csize_t(sizeof(%s)))" % (inits[s], s))
                w("    st == OSFT_STATUS_SUCCESS || error(\"%s failed: \", unsafe_string(osft_last_error()))"
                  % inits[s])
                w("    d = r[]")
                w("    for k in keys(kwargs)")
                w("        k in fieldnames(%s) || throw(ArgumentError(\"%s has no field $k\"))" % (s, s))
                w("    end")
                w("    return %s(%s)" % (s, ", ".join(
                    "get(kwargs, :%s, d.%s)" % (f, f) for f in fields)))
                w("end")
        w("")
        w("# ---- functions: one ccall per exported symbol " + "-" * 32)
        for f in m.functions:
            ret = self.jtype(f["ret"], ret=True)
            names = []
            for i, (pn, _) in enumerate(f["params"]):
                pn = pn or "arg%d" % (i + 1)
                names.append(pn + "_" if pn in JULIA_KEYWORDS else pn)
            types = [self.jtype(pt) for _, pt in f["params"]]
            w("")
            d = self.doc(f["comment"])
            sig = ", ".join("%s" % n for n in names)
            w('"""\n    %s(%s) -> %s\n\n%s\n\nC header: `%s`.\n"""' % (f["name"], sig, ret, d,
                                                                   f["header"]))
            w("function %s(%s)" % (f["name"], sig))
            tt = "(" + ", ".join(types) + ("," if len(types) == 1 else "") + ")"
            args = "".join(", " + n for n in names)
            w("    ccall((:%s, libosftrt), %s, %s%s)" % (f["name"], ret, tt, args))
            w("end")
        w("")
        w("# ---- the C compiler's layouts, checked against fieldoffset() at test time " + "-" * 3)
        w("const C_LAYOUTS = Dict{Symbol, Tuple{Int, Vector{Pair{Symbol, Int}}}}(")
        for s in structs:
            size, offs = m.layout(s)
            w("    :%s => (%d, [%s])," % (s, size, ", ".join(":%s => %d" % fo for fo in offs)))
        w(")")
        w("")
        w("# Every public function, for the completeness test.")
        w("const FUNCTIONS = [%s]" % ", ".join(":" + f["name"] for f in m.functions))
        w("")
        w("end # module LibOsftrt")
        return "\n".join(o) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true")
    ap.add_argument("-o", default=OUT)
    a = ap.parse_args()
    text = Gen(cmodel.Model()).emit()
    if a.check:
        old = open(a.o, encoding="utf-8").read() if os.path.exists(a.o) else ""
        if old != text:
            import difflib
            sys.stdout.writelines(difflib.unified_diff(
                old.splitlines(True), text.splitlines(True), a.o, "regenerated"))
            print("generate.py --check: %s is out of date with the headers; run "
                  "/usr/bin/python3 bindings/julia/gen/generate.py" % a.o, file=sys.stderr)
            return 1
        print("generate.py --check: %s is up to date" % os.path.relpath(a.o, cmodel.REPO))
        return 0
    os.makedirs(os.path.dirname(a.o), exist_ok=True)
    with open(a.o, "w", encoding="utf-8") as fh:
        fh.write(text)
    print("generate.py: wrote %s" % os.path.relpath(a.o, cmodel.REPO))
    return 0


if __name__ == "__main__":
    sys.exit(main())
