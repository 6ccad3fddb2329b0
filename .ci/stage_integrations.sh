#!/usr/bin/env bash
# CI stage: osftrt inside the trainers people use (issue 54), tested against
# the real packages from PyPI on CPython 3.12 (axolotl and emerging-optimizers
# need >= 3.12; mini_trainer < 3.13):
#
#   1. CPython 3.12 from pyenv (/root/.pyenv/versions/3.12.*; the stage fails
#      with a clear message where it is absent), a venv build-py312/ with
#      pinned axolotl 0.21.0 (which brings torch 2.14, transformers 5.20, TRL
#      1.14, PEFT 0.21.2, Liger 0.8.4), emerging-optimizers 0.3.0,
#      rhai-innovation-mini-trainer 0.9.0 and training-hub 0.11.2 (about 8 GB
#      with PyTorch's CUDA wheels; pip's cache is not relied on: a fresh
#      machine downloads them, ~8 minutes here);
#   2. the osftrt wheel built for that interpreter (CPU: `pip wheel .`, the
#      library compiled from src/ and bundled) and installed into the venv;
#      SWIG 4.1's output does not compile under Python's limited API (its
#      runtime defines static type objects), so wheels are per version:
#      the stage builds cp310, cp311 and cp313 too (OSFTRT_WHEELS, default
#      "3.10 3.11 3.13"; "" for none), each from pyenv's interpreter into
#      build-py312/wheels/, through ccache (installed from Debian if
#      missing) so that the library compiles once;
#   3. pytest on bindings/python/tests/integrations (axolotl train runs, the
#      mini_trainer model code with 2 gloo ranks, SOAP against stock, TRL's
#      SFTTrainer) and test_qr_semantics.py, from the tests folder, with the
#      installed wheel.
#
# Usage: bash .ci/stage_integrations.sh [extra pytest args]
#   OSFTRT_PY312   the interpreter (default: pyenv's newest 3.12)
#   OSFTRT_WHEELS  other CPython versions to build wheels for (default "3.10 3.11 3.13")
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
start=$SECONDS

pyenv_python() {  # newest pyenv CPython of version $1, or nothing
  ls -d /root/.pyenv/versions/"$1".*/bin/python"$1" 2>/dev/null | sort -V | tail -1
}
py=${OSFTRT_PY312:-$(pyenv_python 3.12)}
if [[ -z $py || ! -x $py ]]; then
  echo "stage_integrations: no CPython 3.12 (looked for /root/.pyenv/versions/3.12.*/bin/python3.12;" \
       "set OSFTRT_PY312): axolotl and emerging-optimizers need Python >= 3.12" >&2
  exit 1
fi
venv=$root/build-py312
[[ -x $venv/bin/python ]] || "$py" -m venv "$venv"
"$venv/bin/python" -m pip install -q -U pip
"$venv/bin/python" -m pip install -q axolotl==0.21.0 emerging-optimizers==0.3.0 rhai-innovation-mini-trainer==0.9.0 \
  training-hub==0.11.2 pytest scikit-build-core build
"$venv/bin/python" - <<'PY'
import importlib.metadata as m
print("stage_integrations: " + ", ".join("%s %s" % (p, m.version(p)) for p in (
    "torch", "transformers", "axolotl", "trl", "peft", "liger-kernel", "emerging-optimizers",
    "rhai-innovation-mini-trainer", "training-hub")))
PY
# the packages must import here: a test that skipped for a missing one would pass unseen
"$venv/bin/python" -c "import axolotl, trl, emerging_optimizers.soap, mini_trainer.osft_utils, training_hub"
installed=$SECONDS

wheels=$venv/wheels
rm -rf "$wheels" && mkdir -p "$wheels"
others=${OSFTRT_WHEELS-3.10 3.11 3.13}
launcher=()
if [[ -n $others ]]; then
  command -v ccache >/dev/null || { apt-get install -y -qq ccache >/dev/null 2>&1 || true; }
  if command -v ccache >/dev/null; then
    export CCACHE_DIR=$root/build-py312/ccache CCACHE_BASEDIR=$root CCACHE_NOHASHDIR=1
    launcher=(--config-settings=cmake.define.CMAKE_C_COMPILER_LAUNCHER=ccache
              --config-settings=cmake.define.CMAKE_CXX_COMPILER_LAUNCHER=ccache)
  fi
fi
build_wheel() {  # $1: a Python with scikit-build-core
  "$1" -m pip wheel -q --no-build-isolation --no-deps --config-settings=cmake.define.OSFTRT_CUDA=OFF \
    "${launcher[@]}" --config-settings="build-dir=$venv/wheel-build/{wheel_tag}" -w "$wheels" .
}
build_wheel "$venv/bin/python"
for v in $others; do
  p=$(pyenv_python "$v")
  [[ -n $p ]] || { echo "stage_integrations: no CPython $v under /root/.pyenv/versions" >&2; exit 1; }
  wv=$root/build-py${v//./}-wheel
  [[ -x $wv/bin/python ]] || "$p" -m venv "$wv"
  "$wv/bin/python" -m pip install -q scikit-build-core numpy
  build_wheel "$wv/bin/python"
  # each wheel installs and runs in its own interpreter
  "$wv/bin/python" -m pip install -q --force-reinstall --no-deps "$wheels"/osftrt-*-cp${v//./}-*.whl
  (cd /tmp && "$wv/bin/python" -c "
import numpy as np, osftrt, sys
a = [np.random.default_rng(0).standard_normal((6, 4)).astype(np.float32)]
q, r, st = osftrt.batched_qr(a)
assert st == [0] and np.allclose(q[0] @ r[0], a[0], atol=1e-5), st
print('stage_integrations: the cp%d%d wheel runs (osftrt %s)' % (sys.version_info[:2] + (osftrt.version(),)))")
done
ls "$wheels"
wheel=$(ls "$wheels"/osftrt-*-cp312-*.whl)
"$venv/bin/python" -m pip install -q --force-reinstall --no-deps "$wheel"
built=$SECONDS

cd "$root/bindings/python/tests"
rc=0
HF_HUB_OFFLINE=1 AXOLOTL_DO_NOT_TRACK=1 WANDB_MODE=disabled CUDA_VISIBLE_DEVICES= OPENBLAS_THREAD_TIMEOUT=4 \
  "$venv/bin/python" -m pytest -q -p no:cacheprovider -rs "$@" integrations test_qr_semantics.py || rc=$?
[[ $rc -eq 0 ]] || { echo "stage_integrations: pytest failed ($rc)" >&2; exit 1; }
echo "stage_integrations: installs $((installed - start)) s, wheel(s) $((built - installed)) s, tests $((SECONDS - built)) s"
echo "stage_integrations: PASS"
