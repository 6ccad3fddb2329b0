#!/usr/bin/env bash
# Issue 53's GPU rows, in one device call (<= 9 minutes on a 16-core H100
# machine): the wheel built there (run_hf_step_gpu.sh's wheel part: `pip
# install .`, CUDA on, sm_90), then bench/python/bench_real_model.py --device
# cuda: SmolLM2-135M-Instruct's shapes (random weights: the machine cannot
# carry the 98 MB GGUF, and speed and memory do not depend on the values),
# bf16 autocast over fp32 weights, the step at 512 and 2048 tokens in eight
# variants (transformers, + checkpointing, apply_osftrt, OSFT at 0.5 and
# 0.9, PEFT LoRA, PEFT OSF at 0.5 and 0.9), two interleaved rounds, the
# profile per phase; the longest sequence within 4 GiB, plain against
# apply_osftrt(activation_memory="min"). Writes real_model_gpu.md (+ .json)
# and one log per part under $OUT; summary.txt: one line per part.
#
# Once per session, here (no GPU needed): bash bench/gpu/run_hf_step_gpu.sh --prepare
#   (.gpu/: the Debian libraries and SWIG the machine lacks; .whl/: peft 0.21.2
#   for its OSF tuner, installed there only if the machine's peft lacks OSFConfig)
# Then the device tool's run, one call:
#   command: bash bench/gpu/run_real_model_gpu.sh    carry: [".gpu", ".whl"]    timeout_s: 590
#
# Here, without a GPU, the same script on the CPU at a tiny size (random
# weights, 64/128 tokens, no wheel build; minutes):
#   bash bench/gpu/run_real_model_gpu.sh --dry-run
#
# Environment: OUT (default /tmp/osftrt-real-model), OSFTRT_PYTHON (default
# python3; the dry run: build-pyvenv's python when there), OSFTRT_REAL_ARGS
# (extra bench_real_model.py arguments, e.g. "--variants hf,osftrt,osft0.9"
# or "--rounds 1"), OSFTRT_REAL_BUDGET (seconds for all parts, default 560;
# the dry run 1800).
set -uo pipefail
self=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")
root=$(cd "$(dirname "$self")/../.." && pwd)
cd "$root" || exit 2

mode=gpu
case "${1:-}" in
  "") ;;
  --dry-run) mode=dry ;;
  -h | --help) sed -n '2,/^set -uo pipefail/p' "$self" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  *) echo "usage: $0 [--dry-run]" >&2; exit 2 ;;
esac

out=${OUT:-/tmp/osftrt-real-model}
mkdir -p "$out"
py=${OSFTRT_PYTHON:-python3}
[[ $mode == dry && -z ${OSFTRT_PYTHON:-} && -x build-pyvenv/bin/python ]] && py=build-pyvenv/bin/python
export PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore TRANSFORMERS_VERBOSITY=error
export HF_HUB_OFFLINE=1
budget=${OSFTRT_REAL_BUDGET:-$([[ $mode == gpu ]] && echo 560 || echo 1800)}
start=$SECONDS
verdict=0
: > "$out/summary.txt"

# part NAME CAP COMMAND...: under timeout, at most CAP seconds and what the budget has left
part() {
  local name=$1 t=$2 t0=$SECONDS rc left
  shift 2
  left=$((budget - (SECONDS - start)))
  [[ $t -le $left ]] || t=$left
  echo "=== $name (at most $t s)"
  timeout -k 10 "$t" "$@" > "$out/$name.log" 2>&1
  rc=$?
  tail -40 "$out/$name.log"
  [[ $rc -eq 0 ]] || verdict=1
  printf '%-8s %-5s %4d s\n' "$name" "$([[ $rc -eq 0 ]] && echo PASS || echo "FAIL ($rc)")" $((SECONDS - t0)) |
    tee -a "$out/summary.txt"
  return $rc
}

echo "date: $(date -u +%FT%TZ); mode $mode; commit $(git rev-parse --short HEAD 2>/dev/null)"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
if [[ $mode == gpu ]]; then
  # shellcheck source=gpu_deps.sh
  source "$root/bench/gpu/gpu_deps.sh"
  gpu_deps  # .gpu's libraries (OpenBLAS, LAPACKE) on the paths: the wheel's library links them
  # the wheel as run_hf_step_gpu.sh builds it (its gpu_deps: .gpu's libraries, SWIG, nvcc)
  part wheel 240 env OSFTRT_PYTHON="$py" OSFTRT_HF_MODE=gpu bash bench/gpu/run_hf_step_gpu.sh --part wheel || {
    echo "verdict: FAIL (wheel)" | tee -a "$out/summary.txt"; exit 1; }
  if compgen -G ".whl/peft-*.whl" >/dev/null && ! "$py" -c 'from peft import OSFConfig' 2>/dev/null; then
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/peft-*.whl &&
      echo "carried: $(ls .whl/peft-*.whl)"
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  fi
  args=(--device cuda --random-weights --lengths 512,2048 --rounds 2 --steps 5 --warmup 2 --profile
    --knob-lengths 8192,16384,32768 --budget-gib 4 --child-timeout 120)
else
  args=(--dry-run --threads 2)
fi
# shellcheck disable=SC2086
part bench "$([[ $mode == gpu ]] && echo 560 || echo 1800)" "$py" bench/python/bench_real_model.py "${args[@]}" ${OSFTRT_REAL_ARGS:-} \
  --out "$out/real_model_$([[ $mode == gpu ]] && echo gpu || echo dry).md"
echo "verdict: $([[ $verdict -eq 0 ]] && echo PASS || echo FAIL) ($mode run; logs in $out)" | tee -a "$out/summary.txt"
exit $verdict
