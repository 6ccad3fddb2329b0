#!/usr/bin/env bash
# Issue 34's table on one GPU in one device call (about 5 minutes on a
# 16-core H100 machine, at most OSFTRT_PROJ_TOTAL_S = 420 s of running):
#
#   1. bench_projection --device cuda --counts beside mini_trainer's
#      per-target PyTorch code (bench/gpu/run_cuda_bench.sh, lines projection
#      and peers_projection, which builds the benchmarks there first): the 224
#      Llama-3.1-8B targets, bf16 factors, the default arithmetic and the
#      exact one, each against its GEMM floor; GEMM calls and host waits;
#   2. the osftrt package built there as `pip install .` builds it (CUDA,
#      sm_90; no registry there: --no-build-isolation --no-deps --no-index),
#      then bench/python/bench_projection_orthogonality.py --device cuda:
#      300 AdamW steps on one full-size layer, every arithmetic and
#      mini_trainer's code, bf16 and fp32 factors, residuals and times.
#
# Here first (packs SWIG and the Debian libraries the build needs):
#   bash bench/gpu/run_gpu_checks.sh --prepare
# Then one device call:
#   run(carry=[".gpu"], timeout_s=480,
#       command='bash bench/gpu/run_projection_gpu.sh $OUT')
# Writes into OUT (default /tmp/osftrt-projection): bench.log, lines.csv,
# projection_cuda.csv, peers_projection_cuda.csv (step 1; bench.log ends with
# the summary rows), projection_orthogonality_cuda.md (step 2), summary.txt.
#
# OSFTRT_BENCH_DRY=1 runs it all on the CPU at small sizes (CPU-only builds):
#   OSFTRT_BENCH_DRY=1 OSFTRT_BENCH_PYTHON=/usr/bin/python3 \
#     bash bench/gpu/run_projection_gpu.sh /tmp/proj-dry
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root" || exit 2
out=${1:-${OUT:-/tmp/osftrt-projection}}
mkdir -p "$out"
out=$(cd "$out" && pwd)
dry=${OSFTRT_BENCH_DRY:-0}
py=${OSFTRT_BENCH_PYTHON:-python3}
total=${OSFTRT_PROJ_TOTAL_S:-420}
start=$(date +%s)
left() { echo $((total - ($(date +%s) - start))); }

# SWIG and the Debian libraries packed by --prepare, where the machine lacks them
# shellcheck source=gpu_deps.sh
source "$root/bench/gpu/gpu_deps.sh"
gpu_deps

summary=()
# 1. the benchmark lines (their own build, timeouts and log)
cuda=ON
[[ $dry == 1 ]] && cuda=OFF
OSFTRT_BENCH_BUILD=1 OSFTRT_BENCH_CUDA=$cuda OSFTRT_BENCH_ONLY=projection,peers_projection \
  OSFTRT_BENCH_TOTAL_S=200 OSFTRT_BENCH_PYTHON=$py \
  bash bench/gpu/run_cuda_bench.sh "$root/build-bench-projection" "$out"
summary+=("bench lines: rc $?")

# 2. the package, then the orthogonality run
pylog=$out/orthogonality.log
{
  echo "== pip install . (CUDA $cuda) into /tmp/osftrt-py"
  t0=$(date +%s)
  timeout --kill-after=5 $(($(left) > 240 ? 240 : $(left))) \
    "$py" -m pip install --no-build-isolation --no-deps --no-index --no-cache-dir -q \
    --target /tmp/osftrt-py --upgrade --config-settings=build-dir=/tmp/osftrt-pybuild \
    --config-settings=cmake.define.OSFTRT_CUDA=$cuda \
    --config-settings=cmake.define.CMAKE_CUDA_ARCHITECTURES="${OSFTRT_CUDA_ARCHS:-90}" .
  rc=$?
  echo "== pip install: rc $rc after $(($(date +%s) - t0))s"
} >"$pylog" 2>&1
if [[ $rc -eq 0 ]]; then
  args=(--device cuda --steps 300 --every 30)
  [[ $dry == 1 ]] && args=(--device cpu --scale 32 --steps 20 --every 10)
  (cd /tmp && PYTHONPATH=/tmp/osftrt-py PYTHONUNBUFFERED=1 timeout --kill-after=5 "$(left)" \
    "$py" "$root/bench/python/bench_projection_orthogonality.py" "${args[@]}" \
    --out "$out/projection_orthogonality_$([[ $dry == 1 ]] && echo cpu || echo cuda).md") \
    >>"$pylog" 2>&1
  rc=$?
fi
summary+=("orthogonality: rc $rc")
tail -40 "$pylog"
printf '%s\n' "${summary[@]}" "total $(($(date +%s) - start))s" | tee "$out/summary.txt"
