#!/usr/bin/env bash
# Exported-symbol gate for libosftrt (ctest: exported_symbols).
#
# Usage: check_symbols.sh <path to libosftrt.so.X.Y.Z> [<module .so> ...]
#   Environment: NM, READELF (default: nm, readelf).
#
# Fails unless
#   - every defined dynamic symbol is an osft_* function or variable, except
#     the absolute symbols (type A) that name the version nodes (OSFTRT_1.0,
#     OSFTRT_1.1, ...) and the core's internal functions that the CUDA
#     module calls (osft:: C++ names or osfti_*, all versioned
#     @@OSFTRT_CORE_PRIVATE_X.Y.Z, the library's exact version, ABI.md);
#   - every one of them carries a default version OSFTRT_1.<minor>
#     (nm shows "name@@OSFTRT_1.x"), i.e. the linker version script was used;
#   - there is at least one such symbol (osft_version);
#   - the SONAME (readelf -d) is libosftrt.so.1;
#   - the core needs no CUDA library (no DT_NEEDED libcuda*, libcublas*,
#     libcusolver*, libnccl*, libnvJitLink*);
#   - the core needs no MPI library either (libmpi*);
#   - each module given (libosftrt_cuda.so.X.Y.Z, libosftrt_mpi.so.X.Y.Z)
#     exports only its entry osftrt_<name>_module_entry, has SONAME
#     libosftrt_<name>.so.1, and needs libosftrt.so.1.
set -euo pipefail

if [[ $# -lt 1 ]]; then
  echo "usage: $0 <libosftrt.so> [<module .so> ...]" >&2
  exit 2
fi
lib=$1
shift
modules=("$@")
NM=${NM:-nm}
READELF=${READELF:-readelf}
expected_soname=libosftrt.so.1

if [[ ! -f "$lib" ]]; then
  echo "FAIL: $lib does not exist" >&2
  exit 1
fi

fail=0
count=0
private=0
# Lines look like "0000000000007080 T osft_allocator_init@@OSFTRT_1.0" or, for
# the version node, "0000000000000000 A OSFTRT_1.0".
syms=$("$NM" -D --defined-only "$lib")
while read -r _addr type name; do
  [[ -n "${name:-}" ]] || continue
  if [[ "$type" == "A" && "$name" =~ ^OSFTRT_1\.[0-9]+$ ]]; then
    continue
  fi
  if [[ "$type" == "A" && "$name" =~ ^OSFTRT_CORE_PRIVATE_[0-9]+\.[0-9]+\.[0-9]+$ ]]; then
    continue
  fi
  base=${name%%@*}
  if [[ "$name" == *@@OSFTRT_CORE_PRIVATE_* ]]; then
    if [[ ! "$base" =~ ^(_ZN4osft|_ZNK4osft|_ZT[ISV]N4osft|osfti_) ]]; then
      echo "FAIL: '$name' is in the private node but is not an osft:: or osfti_ name" >&2
      fail=1
    fi
    private=$((private + 1))
    continue
  fi
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
cuda_needed=$("$READELF" -d "$lib" |
  sed -n 's/.*(NEEDED).*\[\(.*\)\].*/\1/p' |
  grep -E '^lib(cuda|cublas|cusolver|nccl|nvJitLink|mpi|open-pal|osftrt_)' || true)
if [[ -n "$cuda_needed" ]]; then
  echo "FAIL: the core needs $cuda_needed (they belong to its modules)" >&2
  fail=1
fi

for module in "${modules[@]}"; do
  mname=$(basename "$module")
  mname=${mname#libosftrt_}
  mname=${mname%%.so*}
  msyms=$("$NM" -D --defined-only "$module" | awk '$2 != "A" {print $3}')
  want="osftrt_${mname}_module_entry@@OSFTRT_${mname^^}_MODULE"
  if [[ "$msyms" != "$want" ]]; then
    echo "FAIL: $module exports more or other than $want:" >&2
    echo "$msyms" >&2
    fail=1
  fi
  msoname=$("$READELF" -d "$module" | sed -n 's/.*(SONAME).*\[\(.*\)\].*/\1/p')
  if [[ "$msoname" != "libosftrt_${mname}.so.1" ]]; then
    echo "FAIL: $module has SONAME '${msoname}', expected 'libosftrt_${mname}.so.1'" >&2
    fail=1
  fi
  if ! "$READELF" -d "$module" | grep -q 'NEEDED.*\[libosftrt\.so\.1\]'; then
    echo "FAIL: $module does not link libosftrt.so.1" >&2
    fail=1
  fi
done

if [[ $fail -ne 0 ]]; then
  echo "--- nm -D --defined-only $lib" >&2
  echo "$syms" >&2
  exit 1
fi
echo "OK: $count osft_* symbols, all @@OSFTRT_1.x; $private private for the modules;" \
  "SONAME $soname; no CUDA or MPI library needed; ${#modules[@]} module(s), each exporting its entry only"
