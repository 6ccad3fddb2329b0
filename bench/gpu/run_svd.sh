#!/usr/bin/env bash
# The decomposition benchmark side by side: libosftrt's bench_svd and
# torch.linalg.svd (bench/gpu/svd_torch.py) on the same shapes and device.
#
#   bench/gpu/run_svd.sh [BUILD_DIR] [REPS]
#
# BUILD_DIR (default build) holds bench_svd of a CUDA build (on a machine
# without a GPU both fall back to the CPU at 1/4 scale). Writes
# bench/results/svd_<device>.csv and svd_torch_<device>.csv.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${1:-$root/build}
reps=${2:-3}
[[ $build = /* ]] || build=$root/$build
device=cpu
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  device=cuda
  nvidia-smi -L
fi
mkdir -p "$root/bench/results"
"$build/bench/bench_svd" --reps "$reps" --csv "$root/bench/results/svd_${device}.csv"
python3 "$root/bench/gpu/svd_torch.py" --device "$device" --reps "$reps" \
  --csv "$root/bench/results/svd_torch_${device}.csv"
