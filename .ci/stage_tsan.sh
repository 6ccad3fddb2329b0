#!/usr/bin/env bash
# ThreadSanitizer stage (issue 16): builds the library (every object) and
# tests/tsan/test_tsan_concurrency.c with -fsanitize=thread into build-tsan/
# (CPU only, static archive), and runs it twice: with OPENBLAS_NUM_THREADS=1
# (results of all threads must then be bit-identical), and with OpenBLAS's
# own thread pool (OpenBLAS is not instrumented, so its internal
# synchronization is invisible to TSan; no report came from it, and no
# suppression is used). Any TSan report fails the stage (halt_on_error,
# exit code 66).
#
# Usage: bash .ci/stage_tsan.sh   (from any directory)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

build=build-tsan
cc=clang cxx=clang++
if ! command -v clang >/dev/null || ! command -v clang++ >/dev/null; then
  cc=gcc cxx=g++ # GCC's TSan works as well
fi
if [[ -f $build/CMakeCache.txt ]] && ! grep -q "^CMAKE_C_COMPILER:.*$cc" "$build/CMakeCache.txt"; then
  rm -rf "$build"
fi
CC=$cc CXX=$cxx cmake -S tests/tsan -B "$build" -G Ninja >/dev/null
cmake --build "$build" -j2 --target test_tsan_concurrency

export TSAN_OPTIONS="halt_on_error=1 exitcode=66 second_deadlock_stack=1"
# Kernels with more mmap randomization than TSan expects make older TSan
# runtimes abort ("unexpected memory mapping"): run without ASLR when we can.
run=()
if command -v setarch >/dev/null && setarch "$(uname -m)" -R true 2>/dev/null; then
  run=(setarch "$(uname -m)" -R)
fi
echo "stage_tsan: OPENBLAS_NUM_THREADS=1"
OPENBLAS_NUM_THREADS=1 "${run[@]}" "$build/test_tsan_concurrency"
echo "stage_tsan: OpenBLAS threads on"
OSFT_TSAN_COMPARE=0 "${run[@]}" "$build/test_tsan_concurrency"
echo "stage_tsan: PASS (no ThreadSanitizer report)"
