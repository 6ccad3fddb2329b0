#!/usr/bin/env bash
# Exported-symbol gate for libosftrt (ctest: exported_symbols).
#
# Usage: check_symbols.sh <path to libosftrt.so.X.Y.Z>
#   Environment: NM, READELF (default: nm, readelf).
#
# Fails unless
#   - every defined dynamic symbol is an osft_* function or variable, except
#     the absolute symbols (type A) that name the version nodes (OSFTRT_1.0,
#     OSFTRT_1.1, ...);
#   - every one of them carries a default version OSFTRT_1.<minor>
#     (nm shows "name@@OSFTRT_1.x"), i.e. the linker version script was used;
#   - there is at least one such symbol (osft_version);
#   - the SONAME (readelf -d) is libosftrt.so.1.
set -euo pipefail

if [[ $# -ne 1 ]]; then
  echo "usage: $0 <libosftrt.so>" >&2
  exit 2
fi
lib=$1
NM=${NM:-nm}
READELF=${READELF:-readelf}
expected_soname=libosftrt.so.1

if [[ ! -f "$lib" ]]; then
  echo "FAIL: $lib does not exist" >&2
  exit 1
fi

fail=0
count=0
# Lines look like "0000000000007080 T osft_allocator_init@@OSFTRT_1.0" or, for
# the version node, "0000000000000000 A OSFTRT_1.0".
syms=$("$NM" -D --defined-only "$lib")
while read -r _addr type name; do
  [[ -n "${name:-}" ]] || continue
  if [[ "$type" == "A" && "$name" =~ ^OSFTRT_1\.[0-9]+$ ]]; then
    continue
  fi
  base=${name%%@*}
  if [[ ! "$base" =~ ^osft_[A-Za-z0-9_]+$ ]]; then
    echo "FAIL: exported symbol '$name' (type $type) is not osft_*" >&2
    fail=1
    continue
  fi
  if [[ ! "$name" =~ ^osft_[A-Za-z0-9_]+@@OSFTRT_1\.[0-9]+$ ]]; then
    echo "FAIL: exported symbol '$name' is not versioned @@OSFTRT_1.x" >&2
    fail=1
    continue
  fi
  count=$((count + 1))
done <<<"$syms"

if [[ $count -eq 0 ]]; then
  echo "FAIL: no versioned osft_* symbol exported by $lib" >&2
  fail=1
fi
if ! grep -Eq '^[0-9a-fA-F]+ T osft_version@@OSFTRT_1\.0$' <<<"$syms"; then
  echo "FAIL: osft_version@@OSFTRT_1.0 is not exported" >&2
  fail=1
fi

soname=$("$READELF" -d "$lib" | sed -n 's/.*(SONAME).*\[\(.*\)\].*/\1/p')
if [[ "$soname" != "$expected_soname" ]]; then
  echo "FAIL: SONAME is '${soname}', expected '${expected_soname}'" >&2
  fail=1
fi

if [[ $fail -ne 0 ]]; then
  echo "--- nm -D --defined-only $lib" >&2
  echo "$syms" >&2
  exit 1
fi
echo "OK: $count osft_* symbols, all @@OSFTRT_1.x; SONAME $soname"
