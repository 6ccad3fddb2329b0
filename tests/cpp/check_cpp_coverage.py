#!/usr/bin/env python3
"""Every public C function has a C++ path in include/osftrt/osftrt.hpp.

The functions are read from the public C headers as the bindings' coverage
tests read them (every `OSFT_API ... osft_name(` declaration of
include/osftrt/*.h, comments stripped). Each must be called by code of
osftrt.hpp: `osft_name(` outside comments, in a wrapper's body (a name that
appears only in documentation does not count). So a function added to a C
header fails this test until the C++ header wraps it.

Usage: check_cpp_coverage.py REPO_ROOT              (exit 0: covered; 1: gaps)
       check_cpp_coverage.py --self-test REPO_ROOT  (a new C function is caught)
"""
import glob
import os
import re
import shutil
import sys
import tempfile

DECL_RE = re.compile(r"OSFT_API\s[^;{]*?\b(osft_\w+)\s*\(")


def strip_comments(src):
    src = re.sub(r"/\*.*?\*/", " ", src, flags=re.S)
    return re.sub(r"//[^\n]*", " ", src)


def c_functions(root):
    names = set()
    for header in sorted(glob.glob(os.path.join(root, "include", "osftrt", "*.h"))):
        with open(header, encoding="utf-8") as fh:
            names.update(DECL_RE.findall(strip_comments(fh.read())))
    return sorted(names)


def cpp_calls(root):
    with open(os.path.join(root, "include", "osftrt", "osftrt.hpp"), encoding="utf-8") as fh:
        code = strip_comments(fh.read())
    # A call, or the address of a function taken for a deleter (&osft_x_destroy).
    return set(re.findall(r"\b(osft_\w+)\s*\(", code)) | set(re.findall(r"&(osft_\w+)\b", code))


def check(root):
    functions = c_functions(root)
    if len(functions) < 80:
        print("cpp_api_coverage: only %d functions found in include/osftrt/*.h" % len(functions))
        return 1
    used = cpp_calls(root)
    missing = [f for f in functions if f not in used]
    for f in missing:
        print("cpp_api_coverage: %s has no C++ path in include/osftrt/osftrt.hpp" % f)
    print("cpp_api_coverage: %d of %d public C functions used by osftrt.hpp"
          % (len(functions) - len(missing), len(functions)))
    return 1 if missing else 0


def self_test(root):
    """A copy of the headers with one more function must fail; as is, pass."""
    tmp = tempfile.mkdtemp()
    try:
        shutil.copytree(os.path.join(root, "include"), os.path.join(tmp, "include"))
        clean = check(tmp)
        with open(os.path.join(tmp, "include", "osftrt", "qr.h"), "a") as fh:
            fh.write("\nOSFT_API osft_status_t osft_qr_self_test_only(osft_context_t ctx);\n")
        with open(os.path.join(tmp, "include", "osftrt", "osftrt.hpp"), "a") as fh:
            fh.write("\n// osft_qr_self_test_only( is named in a comment only\n")
        seeded = check(tmp)
    finally:
        shutil.rmtree(tmp)
    ok = clean == 0 and seeded == 1
    print("cpp_api_coverage self-test: %s" % ("caught" if ok else "MISSED"))
    return 0 if ok else 1


def main():
    args = sys.argv[1:]
    if args and args[0] == "--self-test":
        return self_test(args[1] if len(args) > 1 else ".")
    return check(args[0] if args else ".")


if __name__ == "__main__":
    sys.exit(main())
