#!/usr/bin/env python3
"""Layout and signature half of the libosftrt ABI gate (tests/abi/check_abi.sh).

Usage: check_layout.py BASELINE.abi CURRENT.abi

Both files are ABIXML written by abidw (tests/abi/abi_common.sh). abidiff,
run first by check_abi.sh, catches removed functions, changed enumerator
values, changed sizes and so on. This script closes the holes that
libabigail 2.x leaves once the "members appended at the end" suppression
(tests/abi/osftrt.abignore) is active: that suppression only looks at the
*inserted* members of a struct, so a struct that both grows and has an
existing member reordered, retyped or renamed is suppressed as a whole. It
also rejects changes that libabigail considers harmless but that break the
source API or the append-only rule (enum parameter turned into int, a
member renamed).

Rules, for every public type (defined under include/osftrt/) and every
function of the baseline:
  struct  the baseline members are a prefix of the current members: same
          order, name, bit offset and type. Members may be appended only
          if the struct begins with `size_t struct_size`; otherwise the
          member list and the size must be unchanged.
  enum    every baseline enumerator keeps its name and value (appending
          new enumerators is allowed).
  typedef the aliased type is unchanged.
  function present in the current ABI with the same return and parameter
          types.
Exit status: 0 if every rule holds, 1 otherwise (each violation printed).
"""

import re
import sys
import xml.etree.ElementTree as ET

PUBLIC_PATH = re.compile(r"(^|/)include/osftrt/[^/]+\.h$")


def norm_base(name):
    """Spell a base type the same way for GCC and Clang DWARF."""
    words = name.split()
    if len(words) > 1 and ("long" in words or "short" in words) and "int" in words:
        words.remove("int")
    if words == ["unsigned"] or words == ["signed"]:
        words.append("int")
    order = {"signed": 0, "unsigned": 0, "short": 1, "long": 1}
    return " ".join(sorted(words, key=lambda w: (order.get(w, 2), w)))


class Corpus:
    def __init__(self, path):
        self.path = path
        root = ET.parse(path).getroot()
        if root.tag == "abi-corpus-group":
            corpora = root.findall("abi-corpus")
        else:
            corpora = [root]
        self.by_id = {}
        self.structs = {}
        self.enums = {}
        self.typedefs = {}
        self.functions = {}
        for corpus in corpora:
            for el in corpus.iter():
                tid = el.get("id")
                if tid is not None:
                    prev = self.by_id.get(tid)
                    if prev is None or prev.get("is-declaration-only") == "yes":
                        self.by_id[tid] = el
                if el.tag in ("class-decl", "union-decl"):
                    if el.get("is-declaration-only") == "yes":
                        continue
                    if not self._public(el):
                        continue
                    self.structs.setdefault(el.get("name"), el)
                elif el.tag == "enum-decl" and self._public(el):
                    self.enums.setdefault(el.get("name"), el)
                elif el.tag == "typedef-decl" and self._public(el):
                    self.typedefs.setdefault(el.get("name"), el)
                elif el.tag == "function-decl" and el.get("elf-symbol-id"):
                    self.functions.setdefault(el.get("name"), el)

    @staticmethod
    def _public(el):
        path = el.get("filepath")
        if path is not None:
            return bool(PUBLIC_PATH.search(path))
        # Without locations, fall back to the naming convention.
        return (el.get("name") or "").startswith("osft_")

    def tname(self, tid, depth=0):
        """A spelling of the type `tid` that is equal iff the type is."""
        if depth > 50:
            return "..."
        el = self.by_id.get(tid)
        if el is None:
            return "?" + str(tid)
        tag = el.tag
        if tag == "type-decl":
            return norm_base(el.get("name"))
        if tag == "typedef-decl":
            return el.get("name")
        if tag in ("class-decl", "union-decl"):
            kind = "union" if tag == "union-decl" else "struct"
            if el.get("is-anonymous") == "yes":
                members = ", ".join(
                    f"{n}@{o}:{t}" for n, o, t in self.members(el, depth + 1))
                return f"{kind} {{{members}}}"
            return f"{kind} {el.get('name')}"
        if tag == "enum-decl":
            return f"enum {el.get('name')}"
        if tag == "pointer-type-def":
            return self.tname(el.get("type-id"), depth + 1) + "*"
        if tag == "reference-type-def":
            return self.tname(el.get("type-id"), depth + 1) + "&"
        if tag == "qualified-type-def":
            quals = [q for q in ("const", "volatile", "restrict") if el.get(q) == "yes"]
            return " ".join(quals + [self.tname(el.get("type-id"), depth + 1)])
        if tag == "array-type-def":
            dims = "".join(
                f"[{s.get('length', '')}]" for s in el.findall("subrange"))
            # libabigail 2.x names the element type `type-id`, older ones
            # `element-type-id`.
            element = el.get("element-type-id") or el.get("type-id")
            return self.tname(element, depth + 1) + dims
        if tag in ("function-type", "function-decl"):
            return self.signature(el, depth + 1)
        return f"<{tag} {el.get('name', '')}>"

    def signature(self, el, depth=0):
        params = []
        for p in el.findall("parameter"):
            if p.get("is-variadic") == "yes":
                params.append("...")
            else:
                params.append(self.tname(p.get("type-id"), depth + 1))
        ret = el.find("return")
        rtype = self.tname(ret.get("type-id"), depth + 1) if ret is not None else "void"
        return f"{rtype}({', '.join(params)})"

    def members(self, el, depth=0):
        out = []
        for dm in el.findall("data-member"):
            var = dm.find("var-decl")
            if var is None or dm.get("static") == "yes":
                continue
            out.append((var.get("name"), int(dm.get("layout-offset-in-bits", "0")),
                        self.tname(var.get("type-id"), depth + 1)))
        return out


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    base, cur = Corpus(sys.argv[1]), Corpus(sys.argv[2])
    errors = []
    for corpus in (base, cur):
        if not corpus.functions:
            errors.append(f"{corpus.path}: no function declarations (written "
                          "from a library without debug info?)")

    for name, b in sorted(base.structs.items()):
        c = cur.structs.get(name)
        if c is None:
            errors.append(f"struct {name}: missing from the current ABI")
            continue
        bm, cm = base.members(b), cur.members(c)
        for i, want in enumerate(bm):
            got = cm[i] if i < len(cm) else None
            if got != want:
                errors.append(
                    f"struct {name}: member #{i} was {want[0]} (offset {want[1]} bits, "
                    f"type {want[2]}), is now "
                    + ("missing" if got is None else
                       f"{got[0]} (offset {got[1]} bits, type {got[2]})"))
                break
        bsize = int(b.get("size-in-bits", "0"))
        csize = int(c.get("size-in-bits", "0"))
        extensible = bool(bm) and bm[0] == ("struct_size", 0, "size_t")
        if extensible:
            if csize < bsize:
                errors.append(f"struct {name}: size shrank from {bsize} to {csize} bits")
        elif len(cm) != len(bm) or csize != bsize:
            errors.append(
                f"struct {name}: does not begin with `size_t struct_size`, so no "
                f"member may be added (members {len(bm)} -> {len(cm)}, size "
                f"{bsize} -> {csize} bits)")

    for name, b in sorted(base.enums.items()):
        c = cur.enums.get(name)
        if c is None:
            errors.append(f"enum {name}: missing from the current ABI")
            continue
        cvals = {e.get("name"): e.get("value") for e in c.findall("enumerator")}
        for e in b.findall("enumerator"):
            n, v = e.get("name"), e.get("value")
            if n not in cvals:
                errors.append(f"enum {name}: enumerator {n} = {v} removed or renamed")
            elif cvals[n] != v:
                errors.append(f"enum {name}: enumerator {n} changed from {v} to {cvals[n]}")

    for name, b in sorted(base.typedefs.items()):
        c = cur.typedefs.get(name)
        if c is None:
            errors.append(f"typedef {name}: missing from the current ABI")
            continue
        bt, ct = base.tname(b.get("type-id")), cur.tname(c.get("type-id"))
        if bt != ct:
            errors.append(f"typedef {name}: was {bt}, is now {ct}")

    for name, b in sorted(base.functions.items()):
        c = cur.functions.get(name)
        if c is None:
            errors.append(f"function {name}: missing from the current ABI")
            continue
        bs, cs = base.signature(b), cur.signature(c)
        if bs != cs:
            errors.append(f"function {name}: signature was {bs}, is now {cs}")

    for e in errors:
        print("ABI: " + e)
    if errors:
        return 1
    print(f"layout check OK: {len(base.structs)} structs, {len(base.enums)} enums, "
          f"{len(base.typedefs)} typedefs, {len(base.functions)} functions unchanged "
          "or only appended to")
    return 0


if __name__ == "__main__":
    sys.exit(main())
