#!/usr/bin/env bash
# ABI gate for libosftrt (ctest: abi_baseline; registered when
# OSFTRT_ABI_CHECK=ON). Compares the built library with the committed
# baseline tests/abi/libosftrt.abi and fails on anything but additions.
#
# Usage: check_abi.sh <built libosftrt.so> <source dir> <work dir>
#   Environment: ABIDW, ABIDIFF, PYTHON3, READELF (default: from PATH).
#
# Passes:  new functions (in a new version node OSFTRT_1.x, see ABI.md);
#          enumerators appended to an enum; members appended at the end of
#          a public struct that begins with `size_t struct_size`; any change
#          to private types behind opaque handles.
# Fails:   a removed function or symbol version; a changed parameter or
#          return type; a changed or removed enumerator; a struct member
#          inserted, removed, reordered, renamed or retyped; a member added
#          to a struct without struct_size; a changed SONAME.
#
# Two passes:
#   1. abidiff --no-added-syms with tests/abi/osftrt.abignore: everything
#      libabigail sees (symbols, versions, sizes, offsets, enum values,
#      sub-type changes);
#   2. tests/abi/check_layout.py on the ABIXML of both: member-by-member
#      prefix check of each public struct, enum values, typedefs and
#      function signatures (covers what the append suppression of pass 1
#      would otherwise hide, see osftrt.abignore).
#
# An intended break (a new major version) is recorded by regenerating the
# baseline with tests/abi/update_baseline.sh.
set -euo pipefail

if [[ $# -ne 3 ]]; then
  echo "usage: $0 <libosftrt.so> <source dir> <work dir>" >&2
  exit 2
fi
lib=$1
src=$(cd "$2" && pwd -P)
work=$3
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
# shellcheck source-path=SCRIPTDIR source=abi_common.sh
source "$here/abi_common.sh"

ABIDIFF=${ABIDIFF:-abidiff}
PYTHON3=${PYTHON3:-python3}
baseline="$here/libosftrt.abi"
suppr="$here/osftrt.abignore"
hint="If this change is intended (a new major version, see ABI.md), run
tests/abi/update_baseline.sh and commit tests/abi/libosftrt.abi."

mkdir -p "$work"
if [[ ! -f "$baseline" ]]; then
  echo "FAIL: no baseline $baseline (create it with tests/abi/update_baseline.sh)" >&2
  exit 1
fi
if ! osftrt_has_debug_info "$lib"; then
  echo "FAIL: $lib has no DWARF debug info; the ABI gate needs it." >&2
  echo "Build with CMAKE_BUILD_TYPE=RelWithDebInfo (the default) or Debug," >&2
  echo "or configure with -DOSFTRT_ABI_CHECK=OFF." >&2
  exit 1
fi

fail=0

# ---- pass 1: abidiff
set +e
"$ABIDIFF" --no-added-syms --fail-no-debug-info \
  --headers-dir1 "$src/include" --headers-dir2 "$src/include" \
  --suppressions "$suppr" \
  "$baseline" "$lib" >"$work/abidiff.txt" 2>&1
rc=$?
set -e
if [[ $rc -ne 0 ]]; then
  fail=1
  what=()
  (( rc & 1 )) && what+=("abidiff error")
  (( rc & 2 )) && what+=("abidiff usage error")
  (( rc & 4 )) && what+=("ABI change")
  (( rc & 8 )) && what+=("incompatible ABI change")
  echo "FAIL: abidiff exit status $rc (${what[*]:-unknown}) against $baseline:"
  cat "$work/abidiff.txt"
else
  echo "abidiff OK (additions only)"
fi

# ---- pass 2: member-by-member layout and signatures
osftrt_abidw "$lib" "$src" "$work/current.abi"
if ! "$PYTHON3" "$here/check_layout.py" "$baseline" "$work/current.abi"; then
  fail=1
  echo "FAIL: layout/signature check (baseline vs $work/current.abi)"
fi

if [[ $fail -ne 0 ]]; then
  echo "$hint"
  exit 1
fi
echo "OK: libosftrt ABI is compatible with $baseline"
