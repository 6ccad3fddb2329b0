#!/usr/bin/python3
"""Parses the Julia package's sources with tree-sitter's Julia grammar.

Usage: /usr/bin/python3 bindings/julia/gen/check_syntax.py [FILE.jl ...]

Julia is not installed on the project's machines, so this is the check that
the generated and hand-written Julia files are at least syntactically valid
Julia: any ERROR or MISSING node in the parse tree fails, with its line.
Needs the PyPI packages tree-sitter and tree-sitter-julia (.ci/setup.sh).
With no arguments: every .jl file of bindings/julia/Osftrt.
"""

import glob
import os
import sys

try:
    import tree_sitter
    import tree_sitter_julia
except ImportError:
    sys.exit("check_syntax.py: needs tree-sitter and tree-sitter-julia "
             "(/usr/bin/python3 -m pip install --break-system-packages "
             "'tree-sitter>=0.23,<0.26' tree-sitter-julia==0.23.1; .ci/setup.sh does it)")

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.join(HERE, "..", "Osftrt")


def errors(parser, path):
    src = open(path, "rb").read()
    tree = parser.parse(src)
    out = []
    stack = [tree.root_node]
    while stack:
        n = stack.pop()
        if n.type == "ERROR" or n.is_missing:
            line = n.start_point[0] + 1
            text = src[n.start_byte:n.end_byte][:60].decode("utf-8", "replace")
            out.append("%s:%d: %s %r" % (path, line, "missing" if n.is_missing else "syntax error", text))
        stack.extend(n.children)
    return sorted(out)


def main():
    files = sys.argv[1:] or sorted(glob.glob(os.path.join(PKG, "**", "*.jl"), recursive=True))
    parser = tree_sitter.Parser(tree_sitter.Language(tree_sitter_julia.language()))
    bad = 0
    for f in files:
        errs = errors(parser, f)
        for e in errs:
            print(e)
        bad += len(errs)
    print("check_syntax.py: %d Julia file(s), %d error(s)" % (len(files), bad))
    return 1 if bad or not files else 0


if __name__ == "__main__":
    sys.exit(main())
