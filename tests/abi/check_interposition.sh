#!/usr/bin/env bash
# No program of the build interposes a C library function (ctest:
# no_interposition).
#
# Usage: check_interposition.sh <build dir>
#   Environment: NM (default: nm).
#
# A program's global function is exported in its dynamic symbol table when a
# shared library it links (MPI, NCCL, the CUDA driver) references the same
# name, and then it replaces libc's for every library of the process. Seen on
# an H100: a test helper named bind() received the CUDA driver's socket
# bind() calls and crashed five tests. Fails when a function defined in the
# dynamic symbol table of any test_*, bench_* or osftrt_* executable is also
# exported by libc (copy-relocated variables such as stdout are fine).
set -euo pipefail

if [[ $# -ne 1 || ! -d $1 ]]; then
  echo "usage: $0 <build dir>" >&2
  exit 2
fi
NM=${NM:-nm}
# The C library the programs load (no pipeline that can end early: under
# pipefail a SIGPIPE would stop this script without a word).
libc=""
for candidate in /lib/x86_64-linux-gnu/libc.so.6 /lib/aarch64-linux-gnu/libc.so.6 \
  /usr/lib/x86_64-linux-gnu/libc.so.6 /usr/lib/aarch64-linux-gnu/libc.so.6 /lib64/libc.so.6; do
  if [[ -f $candidate ]]; then
    libc=$candidate
    break
  fi
done
[[ -n $libc ]] || { echo "FAIL: libc.so.6 not found" >&2; exit 1; }
libc_syms=$(mktemp)
trap 'rm -f "$libc_syms"' EXIT
"$NM" -D --defined-only "$libc" | awk '{print $3}' | sed 's/@.*//' | sort -u > "$libc_syms"

bad=0 checked=0
while IFS= read -r exe; do
  [[ $(head -c 4 "$exe" | tail -c 3) == ELF ]] || continue
  checked=$((checked + 1))
  clash=$("$NM" -D --defined-only "$exe" 2>/dev/null | awk '$2 ~ /^[TWi]$/ {print $3}' |
    sed 's/@.*//' | sort -u | comm -12 - "$libc_syms" | tr '\n' ' ')
  if [[ -n $clash ]]; then
    echo "FAIL: $exe defines C library function(s): $clash(make them static or rename them)"
    bad=1
  fi
done < <(find "$1" -type f -perm -u+x \( -name 'test_*' -o -name 'bench_*' -o -name 'osftrt_*' \) \
  ! -name '*.so*' ! -name '*.sh' ! -name '*.py')
if [[ $checked -eq 0 ]]; then
  echo "FAIL: no executables under $1" >&2
  exit 1
fi
[[ $bad -eq 0 ]] && echo "ok: $checked executables, none interposes libc"
exit $bad
