#!/usr/bin/env bash
# Runs test programs as on a machine without the CUDA runtime (ctest:
# cpu_tests_without_cuda_runtime, issue 42): each is started by the dynamic
# loader itself with its cache ignored (--inhibit-cache: the CUDA toolkit's
# folders are not default ones) and the CUDA module's own run path ignored
# (--inhibit-rpath MODULE), so libcudart & co. cannot be found, while the
# programs' and the core's run paths (libosftrt, OpenMPI) still work.
#
# Usage: without_cuda_runtime.sh MODULE TEST_PROGRAM...
#   MODULE: the module as the core names it (<libdir>/libosftrt_cuda.so.1).
# test_backend_module runs in its "hidden" mode (a CUDA context must fail
# with NO_DEVICE naming libcudart); every other program must pass as it is.
set -uo pipefail
module=$1
shift
interp=$(readelf -l "$1" | sed -n 's/.*Requesting program interpreter: \(.*\)\]/\1/p')
if [[ ! -x "$interp" ]]; then
  echo "FAIL: no program interpreter found in $1" >&2
  exit 1
fi
passed=0
failed=()
for t in "$@"; do
  mode=
  [[ "$(basename "$t")" == test_backend_module ]] && mode=hidden
  if OSFT_TEST_MODULE_MODE=$mode "$interp" --inhibit-cache --inhibit-rpath "$module" "$t" \
      >"$t.without_cuda.log" 2>&1; then
    passed=$((passed + 1))
  else
    failed+=("$(basename "$t")")
    tail -20 "$t.without_cuda.log"
  fi
done
echo "without the CUDA runtime: ${passed} passed, ${#failed[@]} failed ${failed[*]}"
[[ ${#failed[@]} -eq 0 ]]
