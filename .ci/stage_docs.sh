#!/usr/bin/env bash
# CI stage: the doc comments of the public headers (include/osftrt/*.h).
#
#   1. The API reference: configures ./build-docs (CPU only, library, tests,
#      examples and benchmarks not built) and builds the osftrt_docs target
#      (Doxygen HTML, docs/Doxyfile.in): any Doxygen warning fails it
#      (an undocumented symbol, parameter or return value, a broken @ref).
#      Every header must have its page, the C++ header osftrt.hpp included.
#   2. The comments travel: `swig -python -doxygen` over every public header
#      must run without an error or warning, give every OSFT_API function a
#      docstring that starts with its own @brief, and glue no header's file
#      comment onto a declaration.
#
# Needs doxygen and swig (.ci/setup.sh installs both). Exit 0 only when all
# passes. Usage: bash .ci/stage_docs.sh   (from any directory)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

for tool in doxygen swig cmake python3; do
  command -v "$tool" >/dev/null 2>&1 || {
    echo "stage_docs: $tool not found (run .ci/setup.sh)" >&2
    exit 1
  }
done

build=build-docs
generator=()
[[ -f $build/CMakeCache.txt ]] || generator=(-G Ninja)

echo "== stage_docs: API reference (doxygen $(doxygen --version))"
cmake -S . -B "$build" "${generator[@]}" -DOSFTRT_CUDA=OFF -DOSFTRT_MPI=OFF \
  -DOSFTRT_NCCL=OFF -DOSFTRT_BUILD_TESTS=OFF -DOSFTRT_BUILD_EXAMPLES=OFF \
  -DOSFTRT_BUILD_BENCH=OFF -DOSFTRT_ABI_CHECK=OFF >"$build.configure.log" 2>&1 || {
  cat "$build.configure.log" >&2
  echo "stage_docs: configure failed" >&2
  exit 1
}
rm -f "$build/docs/osftrt_docs.stamp"  # always run doxygen again
log=$(mktemp)
trap 'rm -f "$log"; rm -rf "${swigdir:-}"' EXIT
if ! cmake --build "$build" --target osftrt_docs >"$log" 2>&1; then
  cat "$log" >&2
  echo "stage_docs: FAIL: osftrt_docs (Doxygen warnings are errors; see above)" >&2
  exit 1
fi
if grep -Ei '(warning|error):' "$log" >&2; then
  echo "stage_docs: FAIL: Doxygen printed warnings" >&2
  exit 1
fi
html=$build/docs/api/html
missing=0
for h in include/osftrt/*.h include/osftrt/*.hpp; do
  page=$html/$(basename "$h" | sed 's/\./_8/').html
  if [[ ! -f $page ]]; then
    echo "stage_docs: FAIL: no page for $h ($page)" >&2
    missing=1
  fi
done
[[ $missing -eq 0 ]]
echo "stage_docs: API reference OK: $html/index.html"

echo "== stage_docs: swig -python -doxygen ($(swig -version | awk '/SWIG Version/ {print $3}'))"
swigdir=$(mktemp -d)
{
  echo '%module osftrt_doccheck'
  echo '%{'
  echo '#include "osftrt/osftrt.h"'
  echo '%}'
  echo '#define OSFT_API'
  # Every header, in the order osftrt.h includes them.
  sed -n 's|^#include "\(osftrt/[a-z_]*\.h\)"$|%include "\1"|p' include/osftrt/osftrt.h
} >"$swigdir/doccheck.i"
if ! swig -python -doxygen -Iinclude -outdir "$swigdir" -o "$swigdir/wrap.c" \
    "$swigdir/doccheck.i" >"$log" 2>&1 || [[ -s $log ]]; then
  cat "$log" >&2
  echo "stage_docs: FAIL: swig -doxygen reported errors or warnings" >&2
  exit 1
fi
python3 - "$swigdir/osftrt_doccheck.py" include/osftrt <<'EOF'
import glob, os, re, sys

py = open(sys.argv[1], encoding="utf-8").read()
docs = dict(re.findall(r'^def (osft_\w+)\(.*?\):\n    r"""(.*?)"""', py, re.S | re.M))
errors = []
for header in sorted(glob.glob(os.path.join(sys.argv[2], "*.h"))):
    src = open(header, encoding="utf-8").read()
    for m in re.finditer(r"/\*\*((?:(?!\*/).)*)\*/\s*OSFT_API [^;]*?\b(osft_\w+)\(", src, re.S):
        body, name = m.groups()
        brief = re.search(r"@brief\s+(.*?)(?:\n \*\s*\n|\n \* @|\*/|$)", body + "*/", re.S)
        if name not in docs:
            errors.append("%s: %s has no docstring" % (header, name))
            continue
        first = " ".join(re.sub(r"\n\s*\*", " ", brief.group(1)).split()) if brief else ""
        got = " ".join(docs[name].split())
        if not first or not got.startswith(" ".join(first.split()[:4])):
            errors.append("%s: %s docstring does not start with its @brief (%r...)" %
                          (header, name, got[:60]))
leaks = [l for l in py.splitlines() if "libosftrt \u2014" in l]
for l in leaks:
    errors.append("a header's file comment was glued onto a declaration: %s" % l.strip())
for e in errors:
    print("stage_docs: FAIL: " + e, file=sys.stderr)
print("stage_docs: %d function docstrings checked" % len(docs))
sys.exit(1 if errors else 0)
EOF
echo "stage_docs: PASS"
