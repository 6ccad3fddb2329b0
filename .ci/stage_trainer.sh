#!/usr/bin/env bash
# CI stage of the example trainer (issue 12): runs the README's first
# command (bash .ci/example.sh: setup, build ./build, the default trainer run
# with --check), checks that it printed the results table, then runs the
# trainer's ctests in ./build (three seeds of a shortened run, a gradient check
# on --device cpu and on --device staged, --device staged against --device cpu,
# and the checkpoints: a bitwise resume, kill -9 at random instants, damaged
# files refused).
# Exit 0 only when all of it passed.
#
# Usage: bash .ci/stage_trainer.sh   (from any directory)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

log=$(mktemp)
trap 'rm -f "$log"' EXIT
bash .ci/example.sh 2>&1 | tee "$log"
grep -q '^| OSFT |' "$log" || { echo "stage_trainer: no results table" >&2; exit 1; }
grep -q '^osftrt_train: done' "$log" || { echo "stage_trainer: no final line" >&2; exit 1; }
cmake --build build --target osftrt_train -j2
ctest --test-dir build --output-on-failure -R '^example_train'
n=$(ctest --test-dir build -N -R '^example_train' | grep -c 'Test *#' || true)
[[ $n -eq 9 ]] || { echo "stage_trainer: expected 9 trainer tests, found $n" >&2; exit 1; }
echo "stage_trainer: PASS"
