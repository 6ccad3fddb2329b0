#!/usr/bin/env bash
# Structural checks of the Julia package bindings/julia/Osftrt (Julia itself
# is not installed on the project's machines; see bindings/julia/README.md).
#
#   1. the generated raw layer src/LibOsftrt.jl is up to date with the headers
#      (regenerated in memory with libclang and compared);
#   2. against the INSTALLED library (.ci/lib_prefix.sh, as a user links it):
#      every exported symbol has a ccall wrapper with the C argument count and
#      types; every mirrored struct's field offsets and size equal the C
#      compiler's (offsetof/sizeof in a program compiled here); every enum and
#      macro constant has the C value; the hand-written files use only names
#      the raw layer defines;
#   3. every .jl file of the package parses as Julia (tree-sitter's Julia
#      grammar: the closest to running Julia that these machines allow);
#   4. the checks themselves fail on a broken binding (mutated copies).
# Needs: python3-clang-14 (Debian), tree-sitter + tree-sitter-julia (PyPI),
# cc, nm; .ci/setup.sh installs them.
# Usage: bash .ci/stage_julia.sh   (from any directory). Exit 0 when all pass.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=/dev/null
source .ci/lib_prefix.sh

py=/usr/bin/python3
gen=bindings/julia/gen
jl=bindings/julia/Osftrt/src/LibOsftrt.jl
lib="$OSFTRT_PREFIX/lib/libosftrt.so"

echo "--- 1. generated file up to date"
"$py" "$gen/generate.py" --check

echo "--- 2. symbols, layouts, constants"
"$py" "$gen/check_bindings.py" --lib "$lib"

echo "--- 3. Julia syntax (tree-sitter-julia)"
"$py" "$gen/check_syntax.py"

echo "--- 4. the checks catch a broken binding"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf 'function f(x)\n    x +\nend\nstruct S\n    a::Int\n' >"$tmp/bad.jl"
if "$py" "$gen/check_syntax.py" "$tmp/bad.jl" >/dev/null 2>&1; then
  echo "FAIL: check_syntax.py accepted invalid Julia"
  exit 1
fi
echo "ok: rejected invalid Julia syntax"
expect_fail() {  # NAME FILE: check_bindings.py must fail on FILE
  if "$py" "$gen/check_bindings.py" --lib "$lib" --jl "$2" >"$tmp/out" 2>&1; then
    echo "FAIL: the check accepted a broken binding ($1)"
    return 1
  fi
  echo "ok: rejected $1: $(grep -m1 '^FAIL' "$tmp/out" || true)"
}
sed 's/^    ignore_index::Int64$/    ignore_index::Cint/' "$jl" >"$tmp/field.jl"
expect_fail "a field of the wrong C type" "$tmp/field.jl"
sed 's/^    softcap::Cdouble$/    softcap::Cfloat/' "$jl" >"$tmp/offset.jl"
expect_fail "a field that moves the later offsets" "$tmp/offset.jl"
sed 's/(osft_context_t, Ptr{osft_qr_options_t}, Csize_t,/(osft_context_t, Ptr{osft_qr_options_t}, Cint,/' "$jl" >"$tmp/arg.jl"
expect_fail "an argument of the wrong C type" "$tmp/arg.jl"
"$py" - "$jl" "$tmp/missing.jl" <<'PY'
import re, sys
s = open(sys.argv[1]).read()
s2 = re.sub(r"\nfunction osft_qr_batch\(.*?\nend\n", "\n", s, flags=re.S)
assert s2 != s
open(sys.argv[2], "w").write(s2)
PY
expect_fail "a missing wrapper" "$tmp/missing.jl"
sed 's/^const OSFT_FLCE_SUM = osft_flce_reduction_t(1)$/const OSFT_FLCE_SUM = osft_flce_reduction_t(2)/' "$jl" >"$tmp/value.jl"
expect_fail "a wrong enumerator value" "$tmp/value.jl"
cp "$jl" "$tmp/stale.jl"
echo "# edited by hand" >>"$tmp/stale.jl"
if "$py" "$gen/generate.py" --check -o "$tmp/stale.jl" >/dev/null 2>&1; then
  echo "FAIL: generate.py --check accepted a stale file"
  exit 1
fi
echo "ok: rejected a stale generated file"
echo "stage_julia: PASS"
