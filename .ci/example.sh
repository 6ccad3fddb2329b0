#!/usr/bin/env bash
# Builds and runs the example trainer (examples/c/osftrt_train.c): a byte-
# level language model pre-trained on English prose (task A), then fine-
# tuned on C code (task B) fully and with OSFT, printing the forgetting table.
#
# Configures ./build (Ninja, CUDA AUTO: used when a toolkit is found; in CI,
# i.e. when $CI is set, for sm_90 only, to keep the build short), builds the
# targets osftrt_train and osftrt_demo (the tour of every call, run it with
# ./build/examples/osftrt_demo), and runs the trainer with --check: the exit
# status is non-zero unless the losses fall, OSFT stays orthogonal after
# every step and OSFT forgets clearly less than full fine-tuning.
#
# Usage: bash .ci/example.sh [trainer flags...]   (from any directory;
#        e.g. --seed 2, --optimizer adamw; see --help)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash .ci/setup.sh

args=(-S . -B build -G Ninja -DOSFTRT_CUDA=AUTO)
if [[ -f build/CMakeCache.txt ]] &&
    ! grep -q '^CMAKE_GENERATOR:INTERNAL=Ninja$' build/CMakeCache.txt; then
  args=(-S . -B build -DOSFTRT_CUDA=AUTO) # keep the generator it was made with
fi
if [[ -n "${CI:-}" ]]; then
  args+=(-DCMAKE_CUDA_ARCHITECTURES=90)
fi
cmake "${args[@]}"
cmake --build build --target osftrt_train osftrt_demo -j2
./build/examples/osftrt_train --check "$@"
