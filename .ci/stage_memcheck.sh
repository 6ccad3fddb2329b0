#!/usr/bin/env bash
# Memcheck stage (issue 16): a CPU-only build (no CUDA, so no driver probing;
# no MPI; no sanitizer) in build-memcheck/, and valgrind's memcheck on the
# example program (examples/c/osftrt_demo.c: every capability), the runtime
# tests and, per capability, its numerics test and its error-path test.
# Zero errors and zero definite leaks, or the stage fails (--error-exitcode,
# --errors-for-leak-kinds=definite). Two valgrinds run at a time.
#
# The demo runs at full size (GEMMs of 1024 tokens x 688, an fp64 SVD of
# 384 x 256, ...), which valgrind makes ~100x slower: about 5 minutes on an
# idle 2-core machine (it starts first, the tests run beside it). To skip it:
#   OSFTRT_MEMCHECK_DEMO=0 bash .ci/stage_memcheck.sh
#
# Usage: bash .ci/stage_memcheck.sh   (from any directory)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

build=build-memcheck
if ! command -v valgrind >/dev/null; then
  echo "stage_memcheck: valgrind is missing (bash .ci/setup.sh installs it)" >&2
  exit 1
fi

# program [filter]: CMOCKA_SKIP_FILTER patterns keep the run bounded (the
# skipped tests run in every other stage).
runs=()
[[ ${OSFTRT_MEMCHECK_DEMO:-1} == 1 ]] && runs+=("examples/osftrt_demo")
runs+=(
  "tests/test_context"
  "tests/test_allocator"
  "tests/test_comm"
  "tests/test_flinear_numerics"
  "tests/test_flinear_errors"
  "tests/test_projection_numerics"
  "tests/test_projection_errors"
  "tests/test_mlp_numerics"
  "tests/test_mlp_errors"
  "tests/test_flce_numerics"
  "tests/test_flce_errors"
  "tests/test_qr_precision test_near_singular_fp32"
  "tests/test_qr_errors"
)

targets=()
for r in "${runs[@]}"; do
  p=${r%% *}
  targets+=("$(basename "$p")")
done

cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DOSFTRT_CUDA=OFF \
  -DOSFTRT_MPI=OFF -DOSFTRT_NCCL=OFF -DOSFTRT_SANITIZE=OFF -DOSFTRT_ABI_CHECK=OFF \
  -DOSFTRT_BUILD_BENCH=OFF >/dev/null
cmake --build "$build" -j2 --target "${targets[@]}"
# LD_PRELOAD helper: CMOCKA_TEST_FILTER / CMOCKA_SKIP_FILTER from the environment.
cc -shared -fPIC -O1 -o "$build/libcmocka_filter.so" tests/memcheck/cmocka_filter.c -lcmocka

logs=$build/memcheck
rm -rf "$logs"
mkdir -p "$logs"
export OPENBLAS_NUM_THREADS=1 CMOCKA_MESSAGE_OUTPUT=stdout
valgrind_args=(--error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite
               --show-leak-kinds=definite --num-callers=40)

one() {
  local prog=$1 skip=${2:-} name start rc
  name=$(basename "$prog")
  start=$SECONDS
  rc=0
  CMOCKA_SKIP_FILTER=$skip LD_PRELOAD=$PWD/$build/libcmocka_filter.so \
    valgrind "${valgrind_args[@]}" --log-file="$logs/$name.valgrind" "$build/$prog" \
    >"$logs/$name.out" 2>&1 || rc=$?
  if [[ $rc -eq 0 ]]; then
    echo "  $name: clean ($((SECONDS - start))s)"
  else
    echo "  $name: FAILED (exit $rc, $((SECONDS - start))s)"
    grep -E "ERROR SUMMARY|definitely lost|Invalid|uninitialised|FAILED" "$logs/$name.valgrind" \
      "$logs/$name.out" | head -20
    return 1
  fi
}
export -f one
export build logs
export valgrind_args_str="${valgrind_args[*]}"

echo "stage_memcheck: valgrind $(valgrind --version) on ${#runs[@]} programs, 2 at a time"
failed=0
# Two at a time; each line is "program [skip-filter]".
printf '%s\n' "${runs[@]}" | xargs -P 2 -I{} bash -c '
  valgrind_args=($valgrind_args_str)
  set -- {}
  one "$@"' || failed=1
[[ $failed -eq 0 ]] && echo "stage_memcheck: PASS (0 errors, 0 definite leaks)"
[[ $failed -eq 0 ]]
