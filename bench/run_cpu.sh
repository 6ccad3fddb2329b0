#!/usr/bin/env bash
# Runs the CPU benchmarks and writes bench/results/<capability>_cpu.{md,csv}
# with the machine they ran on. Needs a built tree (default ./build).
#
#   bash bench/run_cpu.sh [build dir]
#
# Every benchmark times libosftrt and its reference in the same run and
# reports ratios; run on an otherwise idle machine.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${1:-$root/build}
out=$root/bench/results
mkdir -p "$out"

machine() {
  echo "- machine: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB"
  echo "- date: $(date -u +%Y-%m-%d)"
}

run() { # name, then the command
  local name=$1
  shift
  echo "== $name: $*"
  {
    echo "# $name on the CPU"
    echo
    machine
    echo "- command: \`${*/#$build\//build/}\`"
    echo
    echo '```'
    "$@" --csv "$out/${name}_cpu.csv"
    echo '```'
  } > "$out/${name}_cpu.md.tmp"
  mv "$out/${name}_cpu.md.tmp" "$out/${name}_cpu.md"
  cat "$out/${name}_cpu.md"
}

run flinear "$build/bench/bench_flinear" --scale 4 --tokens 512,4096 --reps 3
run flinear_16k "$build/bench/bench_flinear" --scale 8 --tokens 16384 --reps 3
run mlp "$build/bench/bench_mlp" --tokens 1024,4096,16384 --reps 3
run flce "$build/bench/bench_flce" --scale 8 --reps 5
run qr "$build/bench/bench_qr" --scale 8 --reps 7 --settle 300
