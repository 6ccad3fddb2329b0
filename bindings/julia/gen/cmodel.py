"""The C side of the Julia binding, read from the public headers with libclang.

Shared by generate.py (which writes src/LibOsftrt.jl from it) and
check_bindings.py (which checks the written file against it and against the
C compiler). Everything is normalized to an ABI-level description so that the
two sides can be compared:

  kind strings: "i8" "u8" "i16" "u16" "i32" "u32" "i64" "u64" "f32" "f64"
                "void", "ptr(<kind>)", "struct(<C typedef name>)",
                "array(<n>,<kind>)"; a pointer to a function is "ptr(void)".
"""

import os
import re
import sys

import clang.cindex as ci

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
INCLUDE = os.path.join(REPO, "include")
UMBRELLA = os.path.join(INCLUDE, "osftrt", "osftrt.h")


def _load_libclang():
    # Debian's python3-clang-14 finds libclang-14.so through its own default;
    # fall back to the versioned names if that fails.
    try:
        ci.Index.create()
        return
    except Exception:  # pragma: no cover - depends on the machine
        pass
    for cand in ("libclang-14.so.1", "libclang-14.so", "libclang.so"):
        for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib/llvm-14/lib", "/usr/lib"):
            p = os.path.join(d, cand)
            if os.path.exists(p):
                ci.Config.set_library_file(p)
                return
    sys.exit("cmodel.py: libclang not found (Debian: apt-get install python3-clang-14)")


_load_libclang()

_PRIM = {
    ci.TypeKind.VOID: "void",
    ci.TypeKind.BOOL: "u8",
    ci.TypeKind.CHAR_S: "i8",
    ci.TypeKind.SCHAR: "i8",
    ci.TypeKind.CHAR_U: "u8",
    ci.TypeKind.UCHAR: "u8",
    ci.TypeKind.SHORT: "i16",
    ci.TypeKind.USHORT: "u16",
    ci.TypeKind.INT: "i32",
    ci.TypeKind.UINT: "u32",
    ci.TypeKind.LONG: "i64",
    ci.TypeKind.ULONG: "u64",
    ci.TypeKind.LONGLONG: "i64",
    ci.TypeKind.ULONGLONG: "u64",
    ci.TypeKind.FLOAT: "f32",
    ci.TypeKind.DOUBLE: "f64",
}


class Model:
    """Everything the binding mirrors: enums, structs, handles, functions, macros."""

    def __init__(self):
        idx = ci.Index.create()
        args = ["-x", "c", "-std=c11", "-I" + INCLUDE, "-fparse-all-comments"]
        opts = (ci.TranslationUnit.PARSE_DETAILED_PROCESSING_RECORD
                | ci.TranslationUnit.PARSE_SKIP_FUNCTION_BODIES)
        self.tu = idx.parse(UMBRELLA, args=args, options=opts)
        errs = [d for d in self.tu.diagnostics if d.severity >= ci.Diagnostic.Error]
        if errs:
            sys.exit("cmodel.py: cannot parse the headers:\n" +
                     "\n".join(str(d) for d in errs))
        self.enums = []       # (c_name, underlying kind, [(name, value)], comment, header)
        self.structs = {}     # typedef name -> dict(fields=[(name, type)], tag, comment, header)
        self.struct_order = []
        self.handles = []     # (typedef name, tag)
        self.fnptrs = []      # typedef names of function-pointer types
        self.functions = []   # dict(name, ret, params=[(name, type)], comment, header)
        self.macros = []      # (name, python int, unsigned?, header)
        self.typedef_to_tag = {}
        self._collect()

    # ---- helpers -------------------------------------------------------
    @staticmethod
    def header_of(cur):
        f = cur.location.file
        return os.path.relpath(f.name, REPO) if f is not None and f.name.startswith(INCLUDE) \
            else (os.path.basename(f.name) if f is not None else "")

    def ours(self, cur):
        f = cur.location.file
        return f is not None and (f.name.startswith(INCLUDE) or f.name.endswith("dlpack.h"))

    def kind(self, t):
        """ABI-level kind string of a clang type (typedefs resolved)."""
        t = t.get_canonical()
        if t.kind in _PRIM:
            return _PRIM[t.kind]
        if t.kind == ci.TypeKind.POINTER:
            p = t.get_pointee().get_canonical()
            if p.kind in (ci.TypeKind.FUNCTIONPROTO, ci.TypeKind.FUNCTIONNOPROTO):
                return "ptr(void)"
            return "ptr(%s)" % self.kind(p)
        if t.kind == ci.TypeKind.ENUM:
            return self.kind(t.get_declaration().enum_type)
        if t.kind == ci.TypeKind.RECORD:
            return "struct(%s)" % self.record_name(t.get_declaration())
        if t.kind == ci.TypeKind.CONSTANTARRAY:
            return "array(%d,%s)" % (t.element_count, self.kind(t.element_type))
        raise ValueError("unsupported C type %r (%s)" % (t.spelling, t.kind))

    def record_name(self, decl):
        """The typedef name of a struct where there is one (DLTensor, osft_x_t), else its tag."""
        tag = decl.spelling
        for td, tg in self.typedef_to_tag.items():
            if tg == decl.get_usr():
                return td
        return tag

    # ---- collection ----------------------------------------------------
    def _collect(self):
        top = [c for c in self.tu.cursor.get_children() if self.ours(c)]
        # typedef name <-> record USR first, so record_name works.
        for c in top:
            if c.kind == ci.CursorKind.TYPEDEF_DECL:
                u = c.underlying_typedef_type.get_canonical()
                if u.kind == ci.TypeKind.RECORD:
                    self.typedef_to_tag[c.spelling] = u.get_declaration().get_usr()
        seen_enums = set()
        for c in top:
            if c.kind == ci.CursorKind.TYPEDEF_DECL:
                u = c.underlying_typedef_type.get_canonical()
                if u.kind == ci.TypeKind.ENUM:
                    d = u.get_declaration()
                    if d.get_usr() in seen_enums:
                        continue
                    seen_enums.add(d.get_usr())
                    vals = [(e.spelling, e.enum_value) for e in d.get_children()
                            if e.kind == ci.CursorKind.ENUM_CONSTANT_DECL]
                    self.enums.append((c.spelling, self.kind(d.enum_type), vals,
                                       d.raw_comment or c.raw_comment or "", self.header_of(c)))
                elif u.kind == ci.TypeKind.RECORD:
                    d = u.get_declaration()
                    if d.is_definition():
                        fields = [(f.spelling, f.type) for f in d.get_children()
                                  if f.kind == ci.CursorKind.FIELD_DECL]
                        self.structs[c.spelling] = dict(
                            fields=fields, tag=d.spelling, decl=d, type=u,
                            comment=d.raw_comment or c.raw_comment or "",
                            header=self.header_of(c))
                        self.struct_order.append(c.spelling)
                elif u.kind == ci.TypeKind.POINTER:
                    p = u.get_pointee().get_canonical()
                    if p.kind == ci.TypeKind.RECORD and not p.get_declaration().is_definition():
                        self.handles.append((c.spelling, p.get_declaration().spelling))
                    elif p.kind in (ci.TypeKind.FUNCTIONPROTO, ci.TypeKind.FUNCTIONNOPROTO):
                        self.fnptrs.append(c.spelling)
            elif c.kind == ci.CursorKind.FUNCTION_DECL and c.spelling.startswith("osft_"):
                self.functions.append(dict(
                    name=c.spelling, ret=c.result_type,
                    params=[(a.spelling, a.type) for a in c.get_arguments()],
                    comment=c.raw_comment or "", header=self.header_of(c), cursor=c))
            elif c.kind == ci.CursorKind.MACRO_DEFINITION:
                self._macro(c)
        # DLPack's anonymous enums are typedefs of anonymous enums: handled above.

    _TOK = re.compile(r"^(0x[0-9a-fA-F]+|\d+)([uUlL]*)$")

    def _macro(self, c):
        name = c.spelling
        if not (name.startswith("OSFT_") or name.startswith("DLPACK_VERSION")):
            return
        toks = [t.spelling for t in c.get_tokens()][1:]
        if not toks:
            return
        # function-like macros: the name token is directly followed by "(".
        ext = c.extent
        src = open(ext.start.file.name, encoding="utf-8").read().splitlines()[ext.start.line - 1]
        if re.search(r"#\s*define\s+%s\(" % re.escape(name), src):
            return
        expr, unsigned = [], False
        known = {m[0]: m[1] for m in self.macros}
        for t in toks:
            m = self._TOK.match(t)
            if m:
                expr.append(str(int(m.group(1), 0)))
                unsigned = unsigned or "u" in m.group(2).lower()
            elif t in ("(", ")", "<<", "|", "*", "+", "-"):
                expr.append(t)
            elif t in known:
                expr.append(str(known[t]))
            else:
                return  # not a plain integer constant (e.g. OSFT_API)
        self.macros.append((name, int(eval(" ".join(expr), {"__builtins__": {}})), unsigned,
                            self.header_of(c)))

    # ---- layout from the compiler front end ----------------------------
    def layout(self, name):
        s = self.structs[name]
        t = s["type"]
        return t.get_size(), [(f, t.get_offset(f) // 8) for f, _ in s["fields"]]
