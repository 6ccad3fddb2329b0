#!/usr/bin/env bash
# CI stage: the CPU GEMM engines besides the default OpenBLAS (issue 29).
# For each engine: install it (.ci/setup.sh --mkl), build the library, its
# tests, examples and benchmarks with -DOSFTRT_CPU_BLAS=<engine> (CPU only,
# warnings as errors) in ./build-engine-<engine>, check that
# osft_build_info() names the engine, and run the whole ctest suite on it
# (the numerics tests against float64 included, unchanged). The default
# engine is the main build's (stage "main build + ctest").
#
# MKL runs on GNU OpenMP threads; ctest -j2 runs two tests side by side on
# the two cores, so OMP_WAIT_POLICY=PASSIVE keeps idle OpenMP threads from
# spinning against the other test (the trainer tests took 10-20x longer
# spinning).
#
# Usage: bash .ci/stage_engines.sh   (from any directory)
#   OSFTRT_MKL_PREFIX   where setup.sh installs mkl-devel (default /opt/osftrt/mkl)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash .ci/setup.sh --mkl

rc=0
for engine in MKL; do
  dir=build-engine-$(echo "$engine" | tr '[:upper:]' '[:lower:]')
  echo "== engine $engine in $dir"
  extra=()
  [[ -n "${OSFTRT_MKL_PREFIX:-}" ]] && extra+=("-DOSFTRT_MKL_ROOT=$OSFTRT_MKL_PREFIX")
  generator=(-G Ninja)
  if [[ -f "$dir/CMakeCache.txt" ]] &&
      ! grep -q '^CMAKE_GENERATOR:INTERNAL=Ninja$' "$dir/CMakeCache.txt"; then
    generator=()
  fi
  cmake -S . -B "$dir" "${generator[@]}" -DOSFTRT_CPU_BLAS="$engine" -DOSFTRT_CUDA=OFF \
    -DOSFTRT_WERROR=ON -DOSFTRT_ABI_CHECK=OFF -DOSFTRT_SANITIZE=OFF "${extra[@]}"
  cmake --build "$dir" -j2
  # The build names its engine, version and ISA.
  info=$(python3 -c 'import ctypes, sys
lib = ctypes.CDLL(sys.argv[1]); lib.osft_build_info.restype = ctypes.c_char_p
print(lib.osft_build_info().decode())' "$dir/libosftrt.so")
  echo "osft_build_info: $info"
  if [[ "$info" != *"BLAS $engine: "* ]]; then
    echo "stage_engines: $dir does not report engine $engine" >&2
    rc=1
  fi
  OMP_WAIT_POLICY=PASSIVE ctest --test-dir "$dir" --output-on-failure -j2 || rc=1
done
exit $rc
