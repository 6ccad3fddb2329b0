#!/usr/bin/env bash
# The GPU benchmarks of every goal side by side with their peers, on one
# machine in one call, each line under its own `timeout` and the whole run
# under OSFTRT_BENCH_TOTAL_S (default 470 s, i.e. at most 8 minutes on an
# H100): a line that fails or runs out of time fails only itself.
#
#   bench/gpu/run_cuda_bench.sh BUILD_DIR OUT_DIR
#
# BUILD_DIR holds a CUDA build with benchmarks (OSFTRT_CUDA=ON,
# OSFTRT_BUILD_BENCH=ON, sm_90). Writes into OUT_DIR:
#   flce_cuda.csv        bench_flce: 4 shapes (BT 2048/8192 x V 32000/128256,
#                        H 4096, bf16), the three-GEMM floor, the default
#                        budget (fp32 grad_W accumulation) and Liger's memory
#                        (memory_budget 64 MiB: mem_* columns), same run
#   flinear_cuda.csv     bench_flinear: Llama-3.1-8B q/o 4096x4096, k/v
#                        1024x4096, gate/up 14336x4096, down 4096x14336,
#                        8192 tokens, bf16, rank ratio 0.5, vs dense bf16
#   mlp_cuda.csv         bench_mlp: SwiGLU H 4096, I 14336, tiled vs untiled
#                        at 4K, 8K, 16K, 32K tokens
#   projection_cuda.csv  bench_projection --device cuda (224 targets, rank
#                        ratio 0.5, bf16 factors, one-rank communicator):
#                        NOT IMPLEMENTED YET, the line fails on its own
#   qr_soap{1024,2048}.csv, peers_qr_soap{1024,2048}.csv   the QR lines
#   peers_{flce,flinear,mlp}_cuda.csv   bench/gpu/peers_torch.py (PyTorch
#                        linear + CE, Liger, the three GEMMs; dense bf16 and
#                        mini_trainer's OSFT layer; untiled SwiGLU)
#   bench.log            everything printed;  lines.csv  name,rc,seconds
#
# The device call (build here first, then carry the build; the machine
# gets the working tree, files come back from $OUT, at most 8 of them):
#   cmake -S . -B build-gpu -G Ninja -DOSFTRT_CUDA=ON \
#     -DCMAKE_CUDA_ARCHITECTURES=90 -DOSFTRT_BUILD_TESTS=OFF \
#     -DOSFTRT_BUILD_EXAMPLES=OFF -DCMAKE_BUILD_TYPE=Release
#   ninja -C build-gpu -j2 -k 0   # -k 0: one broken bench does not stop the rest
#   run(kind=nvidia-h100-x1, timeout_s=540, carry=["build-gpu", ".whl"],
#       command='bash bench/gpu/run_cuda_bench.sh build-gpu /tmp/r;
#                tar -C /tmp/r -czf $OUT/bench_results.tgz .;
#                cp /tmp/r/bench.log /tmp/r/lines.csv $OUT/')
#
# OSFTRT_BENCH_DRY=1 runs every line on the CPU at reduced sizes (the
# benchmarks' --device cpu and small shapes): proves the script end to end
# except the GPU itself. E.g. (a CPU build of the benchmarks in build-flce):
#   OSFTRT_BENCH_DRY=1 OSFTRT_BENCH_PYTHON=/usr/bin/python3 \
#     bash bench/gpu/run_cuda_bench.sh build-flce /tmp/dry
# bench/results/*_h100.md record what an H100 gave.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=$(cd "${1:?usage: run_cuda_bench.sh BUILD_DIR OUT_DIR}" && pwd)
out=${2:?usage: run_cuda_bench.sh BUILD_DIR OUT_DIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
dry=${OSFTRT_BENCH_DRY:-0}
total=${OSFTRT_BENCH_TOTAL_S:-470}
py=${OSFTRT_BENCH_PYTHON:-python3} # one with torch (and liger_kernel, or .whl/)
# A carried build keeps the RPATH of the machine it was built on.
export LD_LIBRARY_PATH="$build${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PYTHONUNBUFFERED=1
start=$(date +%s)
rc=0
echo "name,rc,seconds" >"$out/lines.csv"

# run_line NAME SECONDS CMD...: CMD under `timeout` (at most what is left of
# the total), its rc and time in lines.csv; a failure fails only this line.
run_line() {
  local name=$1 secs=$2
  shift 2
  local left=$((total - ($(date +%s) - start)))
  if ((left < 5)); then
    echo "== $name: skipped, the ${total}s total is spent"
    echo "$name,skipped,0" >>"$out/lines.csv"
    rc=1
    return
  fi
  ((secs > left)) && secs=$left
  echo "== $name (timeout ${secs}s): $*"
  local t0 r
  t0=$(date +%s)
  timeout --kill-after=5 "$secs" "$@"
  r=$?
  echo "== $name: rc $r after $(($(date +%s) - t0))s"
  echo "$name,$r,$(($(date +%s) - t0))" >>"$out/lines.csv"
  ((r != 0)) && rc=1
  return 0
}

if [[ $dry == 1 ]]; then
  dev=cpu
  flce_args=(--scale 32 --reps 1 --mem-mib 2 --dtype bf16 --counts)
  flinear_args=(--scale 16 --tokens 256 --reps 1)
  mlp_args=(--hidden 256 --inter 896 --tokens 256,512 --reps 1)
  proj_args=(--scale 32 --reps 1)
  qr_args=(--scale 16 --layers 1 --reps 1)
  peers_args=(--scale 32 --reps 1 --warmup 1 --flinear-tokens 256)
  peers_qr_args=(--scale 16 --layers 1 --reps 1 --warmup 1)
else
  dev=cuda
  flce_args=(--reps 3 --mem-mib 64 --counts)
  flinear_args=(--tokens 8192 --reps 5)
  mlp_args=(--hidden 4096 --inter 14336 --tokens 4096,8192,16384,32768 --reps 3)
  proj_args=(--reps 5)
  qr_args=()
  peers_args=(--reps 5 --flinear-tokens 8192)
  peers_qr_args=()
fi

{
  if [[ $dry == 1 ]]; then
    echo "dry run on the CPU: $(lscpu | sed -n 's/^Model name: *//p')"
  else
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  fi
  # FLCE: the floor, the default budget and Liger's memory in one run
  run_line flce 100 "$build/bench/bench_flce" --device $dev "${flce_args[@]}" \
    --csv "$out/flce_$dev.csv"
  # OSFT layer vs dense bf16, Llama-3.1-8B shapes, rank ratio 0.5
  run_line flinear 60 "$build/bench/bench_flinear" --device $dev "${flinear_args[@]}" \
    --csv "$out/flinear_$dev.csv"
  # tiled vs untiled SwiGLU
  run_line mlp 45 "$build/bench/bench_mlp" --device $dev "${mlp_args[@]}" \
    --csv "$out/mlp_$dev.csv"
  # gradient + parameter projection, 224 targets, one rank
  if [[ $dry == 1 ]]; then
    run_line projection 30 mpirun --allow-run-as-root --oversubscribe -np 1 \
      "$build/bench/bench_projection" "${proj_args[@]}" --csv "$out/projection_$dev.csv"
  else
    run_line projection 20 "$build/bench/bench_projection" --device cuda \
      "${proj_args[@]}" --csv "$out/projection_cuda.csv"
  fi
  # QR (another agent's flags)
  run_line qr_soap1024 40 "$build/bench/bench_qr" --device $dev --workload soap-gpt2-1024 \
    --reps 3 --power "${qr_args[@]}" --csv "$out/qr_soap1024.csv"
  run_line qr_soap2048 40 "$build/bench/bench_qr" --device $dev --workload soap-gpt2-2048 \
    --reps 3 --power "${qr_args[@]}" --csv "$out/qr_soap2048.csv"
  # the PyTorch peers
  run_line peers 100 "$py" "$root/bench/gpu/peers_torch.py" --device $dev \
    --only flce,flinear,mlp "${peers_args[@]}" --outdir "$out"
  run_line peers_qr_soap1024 25 "$py" "$root/bench/gpu/peers_qr_torch.py" --device $dev \
    --workload soap-gpt2-1024 "${peers_qr_args[@]}" --csv "$out/peers_qr_soap1024.csv"
  run_line peers_qr_soap2048 25 "$py" "$root/bench/gpu/peers_qr_torch.py" --device $dev \
    --workload soap-gpt2-2048 "${peers_qr_args[@]}" --csv "$out/peers_qr_soap2048.csv"
  echo "== total $(($(date +%s) - start))s, rc $rc"
  exit $rc
} 2>&1 | tee "$out/bench.log"
exit "${PIPESTATUS[0]}"
