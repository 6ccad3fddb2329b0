#!/usr/bin/python3
"""Structural checks of the Julia package, runnable without Julia.

Usage: /usr/bin/python3 bindings/julia/gen/check_bindings.py --lib PATH/libosftrt.so [--cc cc]

Reads bindings/julia/Osftrt/src/LibOsftrt.jl AS TEXT (not the generator's
data) and checks:
  (a) symbols: every function the installed library exports (nm -D) has a
      ccall wrapper and every wrapper names an exported function; each
      wrapper's argument count, argument types and return type, reduced to
      ABI kinds, equal the C prototype's (as libclang reads the headers);
      the Julia method takes as many arguments as the ccall passes.
  (b) layouts: for every Julia struct, its field names equal the C struct's,
      each field's ABI kind equals the C field's, and the offsets and size
      that C layout rules give for the Julia field types (Julia lays out
      isbits structs by the C rules) equal what the C compiler reports with
      offsetof/sizeof in a program compiled and run here; the C_LAYOUTS
      table that test/runtests.jl compares with fieldoffset() is checked
      against the same program.
  (c) constants: every enumerator and macro constant has the C value.
Exit status 0 when every check passes.
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cmodel  # noqa: E402

JL = os.path.join(cmodel.REPO, "bindings", "julia", "Osftrt", "src", "LibOsftrt.jl")

PRIM = {
    "Cint": "i32", "Cuint": "u32", "Csize_t": "u64", "Cssize_t": "i64", "Int64": "i64",
    "UInt64": "u64", "Int32": "i32", "UInt32": "u32", "Int16": "i16", "UInt16": "u16",
    "Int8": "i8", "UInt8": "u8", "Cchar": "i8", "Cuchar": "u8", "Cshort": "i16",
    "Cushort": "u16", "Clong": "i64", "Culong": "u64", "Clonglong": "i64",
    "Culonglong": "u64", "Cfloat": "f32", "Cdouble": "f64", "Cvoid": "void",
    "Cstring": "ptr(i8)", "Bool": "u8",
}
SIZE = {"i8": 1, "u8": 1, "i16": 2, "u16": 2, "i32": 4, "u32": 4, "i64": 8, "u64": 8,
        "f32": 4, "f64": 8}

failures = []


def fail(msg):
    failures.append(msg)
    print("FAIL: " + msg)


def split_top(s):
    """Splits "A, Ptr{B, C}, D" at top-level commas."""
    out, depth, cur = [], 0, ""
    for ch in s:
        if ch in "{(":
            depth += 1
        elif ch in "})":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        out.append(cur.strip())
    return out


class Julia:
    """What the generated Julia file declares, parsed from its text."""

    def __init__(self, path):
        src = open(path, encoding="utf-8").read()
        # Drop docstrings so that their text is never parsed as code.
        code = re.sub(r'"""(?:\\.|[^\\])*?"""', '""', src, flags=re.S)
        self.aliases, self.opaque, self.structs, self.ccalls, self.values = {}, set(), {}, {}, {}
        self.methods = {}
        for mm in re.finditer(r"^mutable struct (\w+) end$", code, re.M):
            self.opaque.add(mm.group(1))
        for mm in re.finditer(r"^struct (\w+)\n(.*?)^end$", code, re.M | re.S):
            fields = []
            for ln in mm.group(2).splitlines():
                f = re.match(r"^\s+(\w+)::(.+?)\s*$", ln)
                if f:
                    fields.append((f.group(1), f.group(2)))
            self.structs[mm.group(1)] = fields
        for mm in re.finditer(r"^const (\w+) = (.+?)(?:\s+#.*)?$", code, re.M):
            name, rhs = mm.group(1), mm.group(2).strip()
            if re.match(r"^(Ptr\{.*\}|C\w+|U?Int\d+|Bool)$", rhs):
                self.aliases[name] = rhs
            else:
                v = re.match(r"^(?:(\w+)\()?(0x[0-9a-fA-F]+|-?\d+)\)?$", rhs)
                if v:
                    self.values[name] = int(v.group(2), 0)
        for mm in re.finditer(
                r"^function (\w+)\(([^)]*)\)\n\s+ccall\(\(:(\w+), libosftrt\), (.+?), "
                r"\((.*?)\)((?:, \w+)*)\)\nend$", code, re.M):
            fname, params, sym, ret, types, args = mm.groups()
            types = [t for t in split_top(types)]
            self.ccalls[sym] = dict(method=fname, params=split_top(params), ret=ret,
                                    types=types, args=[a for a in args.split(", ") if a])

    def kind(self, t):
        t = t.strip()
        if t in PRIM:
            return PRIM[t]
        m = re.match(r"^Ptr\{(.*)\}$", t)
        if m:
            return "ptr(%s)" % self.kind(m.group(1))
        m = re.match(r"^NTuple\{(\d+), (.*)\}$", t)
        if m:
            return "array(%s,%s)" % (m.group(1), self.kind(m.group(2)))
        if t in self.aliases:
            return self.kind(self.aliases[t])
        if t in self.structs or t in self.opaque:
            return "struct(%s)" % t
        raise ValueError("unknown Julia type %r" % t)

    def size_align(self, k):
        if k in SIZE:
            return SIZE[k], SIZE[k]
        if k.startswith("ptr("):
            return 8, 8
        m = re.match(r"^array\((\d+),(.*)\)$", k)
        if m:
            s, a = self.size_align(m.group(2))
            return int(m.group(1)) * s, a
        m = re.match(r"^struct\((\w+)\)$", k)
        if m:
            size, _, align = self.layout(m.group(1))
            return size, align
        raise ValueError("no size for %s" % k)

    def layout(self, name):
        """C layout rules applied to the Julia field types: (size, offsets, align)."""
        off, align, offs = 0, 1, []
        for _, t in self.structs[name]:
            s, a = self.size_align(self.kind(t))
            off = (off + a - 1) // a * a
            offs.append(off)
            off += s
            align = max(align, a)
        return (off + align - 1) // align * align, offs, align


def exported(lib):
    """The public functions the library exports: those of the OSFTRT_1.x
    nodes (the core's private exports for its CUDA and MPI modules, node
    OSFTRT_CORE_PRIVATE_x.y.z, are not API; ABI.md)."""
    out = subprocess.run(["nm", "-D", "--defined-only", lib], check=True,
                         capture_output=True, text=True).stdout
    syms = set()
    for ln in out.splitlines():
        p = ln.split()
        if len(p) == 3 and p[1] in "TtWi" and "@OSFTRT_CORE_PRIVATE_" not in p[2]:
            syms.add(p[2].split("@")[0])
    return syms


def check_symbols(jl, m, lib):
    syms = exported(lib)
    if not syms:
        fail("nm found no function in %s" % lib)
    wrapped = set(jl.ccalls)
    for s in sorted(syms - wrapped):
        fail("exported symbol %s has no ccall wrapper in LibOsftrt.jl" % s)
    for s in sorted(wrapped - syms):
        fail("wrapper %s calls a symbol the library does not export" % s)
    protos = {f["name"]: f for f in m.functions}
    for s in sorted(set(protos) - syms):
        fail("header declares %s but the library does not export it" % s)
    for sym, c in sorted(jl.ccalls.items()):
        if c["method"] != sym:
            fail("%s: Julia method is named %s" % (sym, c["method"]))
        if len(c["params"]) != len(c["types"]) or len(c["args"]) != len(c["types"]):
            fail("%s: method takes %d arguments, ccall declares %d types and passes %d" % (
                sym, len(c["params"]), len(c["types"]), len(c["args"])))
        f = protos.get(sym)
        if f is None:
            continue
        if len(f["params"]) != len(c["types"]):
            fail("%s: %d arguments in Julia, %d in C" % (sym, len(c["types"]), len(f["params"])))
            continue
        for i, ((pn, pt), jt) in enumerate(zip(f["params"], c["types"])):
            ck, jk = m.kind(pt), jl.kind(jt)
            if ck != jk:
                fail("%s: argument %d (%s) is %s in C (%s), %s in Julia (%s)" % (
                    sym, i + 1, pn, ck, pt.spelling, jk, jt))
        ck, jk = m.kind(f["ret"]), jl.kind(c["ret"])
        if ck != jk:
            fail("%s: returns %s in C (%s), %s in Julia (%s)" % (
                sym, ck, f["ret"].spelling, jk, c["ret"]))
    print("symbols: %d exported, %d wrapped, %d prototypes compared" % (
        len(syms), len(wrapped), len(set(protos) & wrapped)))


def compile_and_run(cc, source):
    with tempfile.TemporaryDirectory() as d:
        c, exe = os.path.join(d, "layout.c"), os.path.join(d, "layout")
        open(c, "w").write(source)
        subprocess.run([cc, "-std=c11", "-Wall", "-Werror", "-I" + cmodel.INCLUDE, c, "-o", exe],
                       check=True)
        return subprocess.run([exe], check=True, capture_output=True, text=True).stdout


def c_layouts_table(path):
    """The C_LAYOUTS table of the generated file: name -> (size, [(field, offset)])."""
    src = open(path, encoding="utf-8").read()
    out = {}
    for mm in re.finditer(r"^    :(\w+) => \((\d+), \[(.*?)\]\),$", src, re.M):
        out[mm.group(1)] = (int(mm.group(2)), [
            (f, int(o)) for f, o in re.findall(r":(\w+) => (\d+)", mm.group(3))])
    return out


def check_layouts_and_values(jl, m, cc, path):
    lines = ["#include <stddef.h>", "#include <stdio.h>", "#include <osftrt/osftrt.h>",
             "int main(void) {"]
    for s, fields in sorted(jl.structs.items()):
        lines.append('  printf("size %s %%zu\\n", sizeof(%s));' % (s, s))
        for f, _ in fields:
            lines.append('  printf("off %s %s %%zu\\n", offsetof(%s, %s));' % (s, f, s, f))
    for name in sorted(jl.values):
        lines.append('  printf("val %s %%lld\\n", (long long)(%s));' % (name, name))
    lines += ["  return 0;", "}"]
    out = compile_and_run(cc, "\n".join(lines) + "\n")
    csize, coff, cval = {}, {}, {}
    for ln in out.splitlines():
        p = ln.split()
        if p[0] == "size":
            csize[p[1]] = int(p[2])
        elif p[0] == "off":
            coff[(p[1], p[2])] = int(p[3])
        else:
            cval[p[1]] = int(p[2])
    table = c_layouts_table(path)
    for s, fields in sorted(jl.structs.items()):
        if s not in m.structs:
            fail("Julia struct %s has no C struct of that name" % s)
            continue
        cf = m.structs[s]["fields"]
        if [f for f, _ in fields] != [f for f, _ in cf]:
            fail("%s: fields %s in Julia, %s in C" % (
                s, [f for f, _ in fields], [f for f, _ in cf]))
            continue
        for (f, jt), (_, ct) in zip(fields, cf):
            if jl.kind(jt) != m.kind(ct):
                fail("%s.%s: %s in Julia (%s), %s in C (%s)" % (
                    s, f, jl.kind(jt), jt, m.kind(ct), ct.spelling))
        size, offs, _ = jl.layout(s)
        if size != csize[s]:
            fail("%s: size %d by the Julia field types, %d by sizeof" % (s, size, csize[s]))
        for (f, _), o in zip(fields, offs):
            if o != coff[(s, f)]:
                fail("%s.%s: offset %d by the Julia field types, %d by offsetof" % (
                    s, f, o, coff[(s, f)]))
        t = table.get(s)
        if t is None:
            fail("C_LAYOUTS has no entry for %s" % s)
        elif t != (csize[s], [(f, coff[(s, f)]) for f, _ in fields]):
            fail("C_LAYOUTS entry of %s differs from sizeof/offsetof" % s)
    for s in sorted(set(table) - set(jl.structs)):
        fail("C_LAYOUTS names %s, which is not a Julia struct" % s)
    wanted = {e[0] for e in m.enums} | {n for e in m.enums for n, _ in e[2]}
    for name, val in sorted(jl.values.items()):
        if val != cval[name]:
            fail("constant %s is %d in Julia, %d in C" % (name, val, cval[name]))
    for e in m.enums:
        for n, _ in e[2]:
            if n not in jl.values:
                fail("enumerator %s has no Julia constant" % n)
    for n, _, _, _ in m.macros:
        if n not in jl.values:
            fail("macro %s has no Julia constant" % n)
    del wanted
    # Every struct the API uses is mirrored.
    for f in m.functions:
        for _, pt in f["params"]:
            for s in re.findall(r"struct\((\w+)\)", m.kind(pt)):
                if s not in jl.structs and s not in jl.opaque:
                    fail("%s uses struct %s, which has no Julia mirror" % (f["name"], s))
    print("layouts: %d structs, %d fields compared with offsetof; %d constants compared" % (
        len(jl.structs), sum(len(v) for v in jl.structs.values()), len(jl.values)))


def check_references(jl_path):
    """Every `L.name` / `LibOsftrt.name` the hand-written files use exists in the raw layer."""
    src = open(jl_path, encoding="utf-8").read()
    defined = set(re.findall(r"^(?:const|function|struct|mutable struct) (\w+)", src, re.M))
    pkg = os.path.dirname(os.path.dirname(jl_path))
    n = 0
    for rel in ("src/Osftrt.jl", "test/runtests.jl"):
        text = open(os.path.join(pkg, rel), encoding="utf-8").read()
        for name in sorted(set(re.findall(r"\b(?:L|LibOsftrt)\.(\w+)", text))):
            if name == "jl":  # include("LibOsftrt.jl")
                continue
            n += 1
            if name not in defined:
                fail("%s uses LibOsftrt.%s, which the raw layer does not define" % (rel, name))
    print("references: %d raw names used by Osftrt.jl and runtests.jl checked" % n)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True, help="the installed libosftrt.so")
    ap.add_argument("--cc", default=os.environ.get("CC", "cc"))
    ap.add_argument("--jl", default=JL, help="the Julia file to check (default: the package's)")
    a = ap.parse_args()
    m = cmodel.Model()
    jl = Julia(a.jl)
    if len(jl.ccalls) == 0 or len(jl.structs) == 0:
        fail("could not parse %s" % a.jl)
    check_symbols(jl, m, a.lib)
    check_layouts_and_values(jl, m, a.cc, a.jl)
    check_references(a.jl)
    if failures:
        print("check_bindings.py: %d failure(s)" % len(failures))
        return 1
    print("check_bindings.py: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
