#!/usr/bin/env bash
# The GPU benchmarks side by side with their PyTorch peers, on one machine in
# one call: libosftrt's bench_flce, bench_mlp, bench_flinear and bench_qr
# (--device cuda, full shapes) and bench/gpu/peers_torch.py (F.linear +
# F.cross_entropy, Liger-Kernel when its wheel is in .whl/, the three GEMMs,
# untiled SwiGLU, the mini_trainer OSFT formulation, torch.linalg.qr).
#
#   bench/gpu/run_cuda_bench.sh BUILD_DIR OUT_DIR
#
# BUILD_DIR holds a CUDA build with benchmarks (OSFTRT_CUDA=ON,
# OSFTRT_BUILD_BENCH=ON). Writes OUT_DIR/{flce,mlp,flinear,qr}_cuda.csv,
# OUT_DIR/peers_*_cuda.csv and OUT_DIR/bench.log. bench/results/*_h100.md
# record what an H100 gave.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${1:?usage: run_cuda_bench.sh BUILD_DIR OUT_DIR}
out=${2:?usage: run_cuda_bench.sh BUILD_DIR OUT_DIR}
mkdir -p "$out"
rc=0
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  "$build/bench/bench_flce" --device cuda --reps 5 --csv "$out/flce_cuda.csv" || rc=1
  "$build/bench/bench_mlp" --device cuda --reps 3 --csv "$out/mlp_cuda.csv" || rc=1
  "$build/bench/bench_flinear" --device cuda --reps 5 --csv "$out/flinear_cuda.csv" || rc=1
  "$build/bench/bench_qr" --device cuda --reps 3 --power --csv "$out/qr_cuda.csv" || rc=1
  PYTHONUNBUFFERED=1 python3 "$root/bench/gpu/peers_torch.py" --device cuda --outdir "$out" || rc=1
} 2>&1 | tee "$out/bench.log"
exit $rc
