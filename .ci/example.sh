#!/usr/bin/env bash
# Builds and runs the example program (examples/c/osftrt_demo.c).
#
# Configures ./build (Ninja, CUDA AUTO: used when a toolkit is found; in CI,
# i.e. when $CI is set, for sm_90 only, to keep the build short), builds the
# target osftrt_demo and runs it.
#
# Usage: bash .ci/example.sh   (from any directory)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash .ci/setup.sh

args=(-S . -B build -G Ninja -DOSFTRT_CUDA=AUTO)
if [[ -n "${CI:-}" ]]; then
  args+=(-DCMAKE_CUDA_ARCHITECTURES=90)
fi
cmake "${args[@]}"
cmake --build build --target osftrt_demo -j2
./build/examples/osftrt_demo
