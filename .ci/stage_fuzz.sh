#!/usr/bin/env bash
# Fuzz stage (issue 16): builds the libFuzzer harnesses of tests/fuzz/ (clang,
# libFuzzer + ASan + UBSan, the library coverage-instrumented, CPU only) into
# build-fuzz/, replays the committed reproducers (tests/fuzz/repro/), then runs
# every harness for a bounded time from its committed seed corpus
# (tests/fuzz/corpus/<name>/). Fails on any finding: a sanitizer report, a
# crash, a leak, a timeout, or a broken ABI promise (the harness aborts with
# "FUZZ FINDING: ..."). Crash inputs are kept in build-fuzz/artifacts/.
#
# Usage: bash .ci/stage_fuzz.sh   (from any directory)
#   OSFTRT_FUZZ_SECONDS   seconds per harness (default 30)
#   OSFTRT_FUZZ_ONLY      run only these harnesses (e.g. "qr flce")
#   OSFTRT_FUZZ_JOBS      parallel fuzzing processes per harness (default 1)
# A long run (e.g. an hour per harness on 8 cores):
#   OSFTRT_FUZZ_SECONDS=3600 OSFTRT_FUZZ_JOBS=8 bash .ci/stage_fuzz.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

seconds=${OSFTRT_FUZZ_SECONDS:-30}
jobs=${OSFTRT_FUZZ_JOBS:-1}
harnesses=(${OSFTRT_FUZZ_ONLY:-tensor flinear projection mlp flce qr})
build=build-fuzz

if ! command -v clang >/dev/null || ! command -v clang++ >/dev/null; then
  echo "stage_fuzz: clang is missing (bash .ci/setup.sh installs clang and libclang-rt-dev)" >&2
  exit 1
fi

# A build dir configured with another compiler cannot switch: start over.
if [[ -f $build/CMakeCache.txt ]] && ! grep -q "^CMAKE_C_COMPILER:.*clang" "$build/CMakeCache.txt"; then
  rm -rf "$build"
fi
CC=clang CXX=clang++ cmake -S tests/fuzz -B "$build" -G Ninja >/dev/null
cmake --build "$build" -j2 --target fuzzers

# Sanitizers: every report is fatal. Allocations the library attempts on a
# caller's hostile sizes may fail (the library must then return
# OSFT_STATUS_OUT_OF_MEMORY), so the allocator returns NULL instead of
# aborting, and libFuzzer's RSS/malloc limit is off (-rss_limit_mb=0).
# OpenBLAS runs single-threaded: faster per input, deterministic.
export ASAN_OPTIONS=allocator_may_return_null=1:detect_leaks=1:abort_on_error=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export OPENBLAS_NUM_THREADS=1
fuzz_args=(-rss_limit_mb=0 -timeout=30 -print_final_stats=1)

artifacts=$build/artifacts
work=$build/work
mkdir -p "$artifacts"
failed=0

# 1. Reproducers of every finding so far (a regression replays them).
for f in tests/fuzz/repro/*; do
  [[ -f $f ]] || continue
  name=$(basename "$f")
  h=${name%%_*}
  if ! "$build/fuzz_$h" "${fuzz_args[@]}" "$f" >"$artifacts/repro-$name.log" 2>&1; then
    echo "stage_fuzz: reproducer $f fails again:" >&2
    tail -30 "$artifacts/repro-$name.log" >&2
    failed=1
  fi
done

# 2. Bounded fuzzing from the seed corpus.
summary=()
for h in "${harnesses[@]}"; do
  rm -rf "${work:?}/$h"
  mkdir -p "$work/$h"
  log=$artifacts/$h.log
  echo "stage_fuzz: fuzz_$h for ${seconds}s"
  rc=0
  if [[ $jobs -gt 1 ]]; then
    "$build/fuzz_$h" "${fuzz_args[@]}" -max_total_time="$seconds" -jobs="$jobs" \
      -workers="$jobs" -artifact_prefix="$artifacts/$h-" "$work/$h" "tests/fuzz/corpus/$h" \
      >"$log" 2>&1 || rc=$?
    cat fuzz-*.log >>"$log" 2>/dev/null || true
    rm -f fuzz-*.log
  else
    "$build/fuzz_$h" "${fuzz_args[@]}" -max_total_time="$seconds" \
      -artifact_prefix="$artifacts/$h-" "$work/$h" "tests/fuzz/corpus/$h" >"$log" 2>&1 || rc=$?
  fi
  execs=$(grep -h "stat::number_of_executed_units" "$log" | awk '{s += $2} END {print s + 0}')
  cov=$(grep -ho "cov: [0-9]*" "$log" | awk '{print $2}' | sort -n | tail -1)
  ft=$(grep -ho "ft: [0-9]*" "$log" | awk '{print $2}' | sort -n | tail -1)
  corp=$(find "$work/$h" -type f | wc -l)
  if [[ $rc -ne 0 ]]; then
    echo "stage_fuzz: fuzz_$h FAILED (exit $rc); log $log, inputs $artifacts/$h-*:" >&2
    grep -h -A12 -E "FUZZ FINDING|ERROR: |runtime error" "$log" | head -60 >&2 || tail -40 "$log" >&2
    failed=1
    summary+=("fuzz_$h: FAIL")
  else
    summary+=("fuzz_$h: ${execs} execs, cov ${cov:-?} edges, ft ${ft:-?}, +${corp} inputs")
  fi
done

echo
echo "stage_fuzz: ${seconds}s per harness"
for s in "${summary[@]}"; do echo "  $s"; done
[[ $failed -eq 0 ]]
