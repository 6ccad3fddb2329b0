#!/usr/bin/env bash
# The example trainer on a GPU against the CPU, for a machine with one:
# the shortened seed-1 run of ctest example_train_staged with --device cuda
# and --device cpu, every training and evaluation loss compared (GPU GEMMs
# round differently, so within a relative tolerance rather than bit for
# bit), then the default run with --device cuda and --check (losses fall,
# orthogonality residual <= 1e-5, OSFT forgets less) and its table.
#
#   bench/gpu/run_trainer_gpu.sh BUILD_DIR [OUT_DIR]
#
# BUILD_DIR holds a CUDA build with examples (OSFTRT_CUDA=ON).
set -uo pipefail
build=${1:?usage: run_trainer_gpu.sh BUILD_DIR [OUT_DIR]}
out=${2:-/tmp/trainer-gpu}
mkdir -p "$out"
trainer=$build/examples/osftrt_train
short=(--seed 1 --pretrain-steps 40 --steps 20 --batch 4 --seq 64 --ft-lr 3e-3
  --eval-every 5 --eval-tokens 1024 --log-every 10 --print-losses)
for d in cpu cuda; do
  OPENBLAS_NUM_THREADS=1 "$trainer" "${short[@]}" --device "$d" > "$out/short_$d.log" 2>&1 ||
    { echo "FAIL: --device $d exited $?"; tail -5 "$out/short_$d.log"; exit 1; }
done
python3 - "$out/short_cpu.log" "$out/short_cuda.log" <<'PY'
import sys
def losses(path):
    return [(l.rsplit(' ', 1)[0], float.fromhex(l.split()[-1]))
            for l in open(path) if l.startswith('loss-bits')]
a, b = losses(sys.argv[1]), losses(sys.argv[2])
assert len(a) == len(b) and len(a) > 20, (len(a), len(b))
worst = max(abs(x - y) / max(abs(x), 1e-6) for (_, x), (_, y) in zip(a, b))
print(f"{len(a)} losses, cpu vs cuda: worst relative difference {worst:.2e}")
sys.exit(0 if worst < 2e-2 else 1)
PY
rc=$?
"$trainer" --device cuda --check > "$out/default_cuda.log" 2>&1 || rc=1
grep -E '^device:|^osftrt_train: done|^\|' "$out/default_cuda.log" | head -20
exit $rc
