#!/usr/bin/env bash
# Issue 36 on the GPU machine, in one device call (<= 9 minutes on a 16-core
# H100 machine): the wheel built there as a user builds it (`pip install .`,
# CUDA on), the import-order check next to the machine's PyTorch, then
# bench/python/bench_hf_step.py --device cuda (six variants, --profile),
# printing the issue's table. One log per part under $OUT.
#
# Once per session, here (no GPU needed):
#   bash bench/gpu/run_hf_step_gpu.sh --prepare
#     runs `bash bench/gpu/run_gpu_checks.sh --prepare` (.gpu/: OpenBLAS,
#     LAPACKE, DLPack and SWIG, which the GPU machine lacks) and downloads
#     into .whl/ (git-ignored) the wheels the machine has no registry for:
#     liger-kernel 0.8.5 (pure Python over Triton) and peft 0.21.2 (its OSF
#     tuner; installed there only if the machine's peft lacks OSFConfig).
# Then the device tool's run, one call:
#   command: bash bench/gpu/run_hf_step_gpu.sh    carry: [".gpu", ".whl"]    timeout_s: 590
#
# Here, without a GPU, the same script end to end on the CPU at a tiny size
# (CUDA as `pip install .` finds it; bench on --device cpu --tiny):
#   bash bench/gpu/run_hf_step_gpu.sh --dry-run
#
# Parts (each under `timeout`): wheel (wheel.log: pip install . into the
# machine's python, --no-build-isolation --no-deps --no-index, CUDA ON for
# sm_90), imports (imports.log: pytest test_import_order.py and the CUDA
# libraries each order loaded), bench (bench.log, hf_step.md: the table).
# summary.txt: one line per part and the verdict; exit 0 when all passed.
#
# Environment: OUT (default /tmp/osftrt-hf-step), OSFTRT_PYTHON (default
# python3), OSFTRT_HF_STEP_ARGS (extra bench_hf_step.py arguments, e.g.
# "--batch 2" or "--variants hf,osftrt"), OSFTRT_CUDA_ARCHS (default 90),
# OSFTRT_HF_STEP_BUILD (the wheel's build folder, default build-hf-step),
# OSFTRT_HF_STEP_BUDGET (seconds for all parts, default 560),
# OSFTRT_HF_STEP_PART (the benchmark part: bench, the default, or long:
# issue 44's bench/python/bench_long_context.py --device cuda, Llama-3.2-1B
# shapes, bf16, OSFT rank ratio 0.5, Liger when carried, peaks at 3 lengths
# and the longest sequence within 20 GiB, long_context.md; dry run: the CPU
# at short lengths), OSFTRT_LONG_ARGS (extra bench_long_context.py
# arguments, e.g. "--model 8b --budget-mib 61440").
set -uo pipefail
self=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")
root=$(cd "$(dirname "$self")/../.." && pwd)
cd "$root" || exit 2
WHEELS=("liger-kernel==0.8.5" "peft==0.21.2")

prepare() {
  bash bench/gpu/run_gpu_checks.sh --prepare || return 1
  mkdir -p .whl
  local w
  for w in "${WHEELS[@]}"; do
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
      -d .whl "$w" || return 1
  done
  ls -la .whl
  echo "prepared; device call: command 'bash bench/gpu/run_hf_step_gpu.sh', carry [\".gpu\", \".whl\"], timeout_s 590"
}

mode=${OSFTRT_HF_MODE:-gpu}
case "${1:-}" in
  "") ;;
  --dry-run) mode=dry ;;
  --prepare) prepare; exit $? ;;
  --part) ;;
  -h | --help) sed -n '2,/^set -uo pipefail/p' "$self" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  *) echo "usage: $0 [--prepare | --dry-run]" >&2; exit 2 ;;
esac

# shellcheck source=gpu_deps.sh
source "$root/bench/gpu/gpu_deps.sh"
gpu_deps
out=${OUT:-/tmp/osftrt-hf-step}
mkdir -p "$out"
py=${OSFTRT_PYTHON:-python3}
export PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore TRANSFORMERS_VERBOSITY=error
budget=${OSFTRT_HF_STEP_BUDGET:-560}
start=$SECONDS

# part NAME CAP: the function NAME in a process of its own under timeout, at
# most CAP seconds and no longer than the budget has left; output in NAME.log
part() {
  local name=$1 t=$2 t0=$SECONDS rc left
  left=$((budget - (SECONDS - start)))
  [[ $t -le $left ]] || t=$left
  echo "=== $name (at most $t s)"
  OSFTRT_HF_MODE=$mode timeout -k 10 "$t" bash "$self" --part "$name" > "$out/$name.log" 2>&1
  rc=$?
  tail -25 "$out/$name.log"
  [[ $rc -eq 0 ]] || verdict=1
  printf '%-8s %-5s %4d s\n' "$name" "$([[ $rc -eq 0 ]] && echo PASS || echo "FAIL ($rc)")" $((SECONDS - t0)) |
    tee -a "$out/summary.txt"
  return $rc
}

carried() { # the wheels of .whl/ that this machine lacks, into /tmp/site (first on PYTHONPATH)
  local args=()
  compgen -G ".whl/liger_kernel-*.whl" >/dev/null && ! "$py" -c 'import liger_kernel' 2>/dev/null &&
    args+=(.whl/liger_kernel-*.whl)
  compgen -G ".whl/peft-*.whl" >/dev/null && ! "$py" -c 'from peft import OSFConfig' 2>/dev/null &&
    args+=(.whl/peft-*.whl)
  [[ ${#args[@]} -eq 0 ]] && return 0
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "${args[@]}" &&
    echo "carried: ${args[*]}"
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
}

wheel() { # as a user: pip install . (CUDA as found; ON on the GPU machine)
  local cuda=AUTO
  [[ $mode == gpu ]] && cuda=ON
  echo "nvcc: $(command -v nvcc) $(nvcc --version 2>/dev/null | tail -1); swig: $(command -v swig)"
  "$py" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda)'
  "$py" -m pip install --no-build-isolation --no-deps --no-index --force-reinstall \
    --config-settings=cmake.define.OSFTRT_CUDA=$cuda \
    --config-settings=cmake.define.CMAKE_CUDA_ARCHITECTURES="${OSFTRT_CUDA_ARCHS:-90}" \
    --config-settings=build-dir="${OSFTRT_HF_STEP_BUILD:-$root/build-hf-step}/{wheel_tag}" . || return 1
  cd /tmp && "$py" -c 'import osftrt; print(osftrt.__file__); print(osftrt.build_info())'
}

imports() { # both orders, in fresh interpreters (test_import_order.py), and what each loaded
  (cd bindings/python/tests && "$py" -m pytest -q -p no:cacheprovider test_import_order.py) || return 1
  local first
  for first in "import osftrt.torch, torch" "import torch, osftrt.torch"; do
    (cd /tmp && "$py" -c "$first
import os
import osftrt
from osftrt import _cudalibs
try:  # the first CUDA request: preloads, then loads the CUDA module (a dry run has no GPU: NoDevice after loading)
    osftrt.Context('cuda:0', stream=0).close()
except osftrt.NoDevice as e:
    print('no GPU: %s' % e)
libs = sorted({l.split()[-1] for l in open('/proc/self/maps') if os.path.basename(l.split()[-1]).startswith(_cudalibs._ORDER)})
print('$first: ok; preloaded by osftrt: %s' % (sorted(_cudalibs.LOADED) or 'none'))
print('  ' + '\n  '.join(libs))") || return 1
  done
}

bench() {
  local args=(--device cuda --profile)
  [[ $mode == dry ]] && args=(--device cpu --tiny --profile --threads 2)
  # shellcheck disable=SC2086
  "$py" bench/python/bench_hf_step.py "${args[@]}" ${OSFTRT_HF_STEP_ARGS:-} --out "$out/hf_step.md"
}

long() { # issue 44: memory per token and the longest sequence in a budget
  local args=(--device cuda --model 1b --lengths 8192,16384,32768 --budget-mib 20480 --precision 0.1
    --child-timeout 150)
  [[ $mode == dry ]] && args=(--device cpu --lengths 256,512,1024 --budget-mib 0 --threads 2)
  # shellcheck disable=SC2086
  "$py" bench/python/bench_long_context.py "${args[@]}" ${OSFTRT_LONG_ARGS:-} --out "$out/long_context.md"
}

if [[ ${1:-} == --part ]]; then
  "$2"
  exit $?
fi
verdict=0
: > "$out/summary.txt"

echo "date: $(date -u +%FT%TZ); mode $mode; commit $(git rev-parse --short HEAD 2>/dev/null) ($(git status --porcelain 2>/dev/null | wc -l) changed files)"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
carried
part wheel 240 && part imports 90
part "${OSFTRT_HF_STEP_PART:-bench}" 560
echo "verdict: $([[ $verdict -eq 0 ]] && echo PASS || echo FAIL) ($mode run; logs in $out)" | tee -a "$out/summary.txt"
exit $verdict
