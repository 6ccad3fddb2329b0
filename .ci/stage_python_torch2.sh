#!/usr/bin/env bash
# CI stage: the Python package as a PyTorch user installs it, on a current
# PyTorch from PyPI (the Debian-torch run is .ci/stage_python.sh).
#
#   1. a venv (build-pyvenv/, Debian's /usr/bin/python3) with PyTorch 2.x,
#      transformers, peft and accelerate from PyPI (pip's cache serves the
#      next run: the torch wheel and its CUDA libraries are large);
#   2. `pip wheel .` from the repository root: the self-contained wheel
#      (libosftrt built from src/ and bundled, $ORIGIN run path), and an
#      sdist that builds a wheel too;
#   3. the wheel installed into the venv, and pytest on bindings/python/tests
#      (the Hugging Face and PEFT tests included), run from outside the tree;
#      test_import_order.py imports osftrt before and after torch, and makes
#      the first CUDA request before and after torch, in fresh interpreters:
#      with a CUDA toolkit here the wheel's CUDA module links CUDA and NCCL,
#      PyPI's torch brings its own as nvidia-* wheels, and every order must
#      load one copy of each, PyTorch's (issue 36); the imports and CPU work
#      map no CUDA library of osftrt's (issue 42);
#      then the README's Python example as written (.ci/readme_python.py) and
#      the Hugging Face and PEFT examples with --check;
#   4. the wheel installed into a fresh venv outside the repository, with no
#      environment variables: a smoke test of the import and one call.
#
# Usage: bash .ci/stage_python_torch2.sh [extra pytest args]
#   OSFTRT_TORCH_SPEC   pip requirement for torch (default "torch>=2.4")
#   OSFTRT_PYVENV       the venv (default build-pyvenv)
#   OSFTRT_PYBUILD      the wheels' build folders and dist/ (default build-python)
#   OSFTRT_WHEEL_CUDA   OSFTRT_CUDA for the wheel's library (default AUTO: with
#                       CUDA where nvcc is found, as `pip install .` does for a
#                       user; ON where nvcc is found is then checked); the sdist's
#                       wheel is built CPU-only (it checks the sdist, not CUDA)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
venv=${OSFTRT_PYVENV:-$root/build-pyvenv}
pybuild=${OSFTRT_PYBUILD:-$root/build-python}
dist=$pybuild/dist
torch_spec=${OSFTRT_TORCH_SPEC:-torch>=2.4}
cuda=${OSFTRT_WHEEL_CUDA:-AUTO}
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore

[[ -x $venv/bin/python ]] || /usr/bin/python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q -U pip
"$venv/bin/python" -m pip install -q "$torch_spec" transformers peft accelerate pytest numpy scikit-build-core build
"$venv/bin/python" - <<'PY'
import torch, transformers, peft
print("stage_python_torch2: torch %s, transformers %s, peft %s" % (torch.__version__, transformers.__version__, peft.__version__))
PY

rm -rf "$dist" && mkdir -p "$dist"
settings=(--config-settings="cmake.define.OSFTRT_CUDA=$cuda" --config-settings="build-dir=$pybuild/{wheel_tag}")
"$venv/bin/python" -m build --sdist --no-isolation --outdir "$dist" . >/dev/null
"$venv/bin/python" -m pip wheel -q --no-build-isolation --no-deps "${settings[@]}" -w "$dist" .
sdist=$(ls "$dist"/osftrt-*.tar.gz)
mkdir -p "$dist/from-sdist"
"$venv/bin/python" -m pip wheel -q --no-build-isolation --no-deps --config-settings=cmake.define.OSFTRT_CUDA=OFF \
  -w "$dist/from-sdist" "$sdist"
wheel=$(ls "$dist"/osftrt-*.whl)
echo "stage_python_torch2: $(basename "$wheel") ($(du -k "$wheel" | cut -f1) KiB), sdist $(basename "$sdist") builds $(basename "$(ls "$dist"/from-sdist/*.whl)")"
listing=$("$venv/bin/python" -m zipfile -l "$wheel")
[[ $listing == *"osftrt/libosftrt.so.1 "* ]] || { echo "the wheel lacks osftrt/libosftrt.so.1" >&2; exit 1; }
# The core links no CUDA library (import osftrt maps none); with CUDA, the
# module beside it does (loaded on the first CUDA request). With a toolkit
# here the wheel must have the module linking CUDA (else the import-order
# test proves nothing).
needed=$("$venv/bin/python" - "$wheel" <<'PY'
import sys, tempfile, zipfile
sys.path.insert(0, "bindings/python/src/osftrt")
import _cudalibs
wheel = zipfile.ZipFile(sys.argv[1])
with tempfile.TemporaryDirectory() as d:
    core = _cudalibs.cuda_sonames(wheel.extract("osftrt/libosftrt.so.1", d))
    names = wheel.namelist()
    module = "osftrt/" + _cudalibs.MODULE
    cuda = _cudalibs.cuda_sonames(wheel.extract(module, d)) if module in names else []
print("core=%s module=%s" % (",".join(core), ",".join(cuda) if module in names else "absent"))
PY
)
echo "stage_python_torch2: the wheel's CUDA libraries: $needed"
if [[ $needed != core=\ * ]]; then
  echo "stage_python_torch2: osftrt/libosftrt.so.1 links CUDA libraries (the module alone should)" >&2
  exit 1
fi
if [[ $cuda != OFF ]] && command -v nvcc >/dev/null && [[ $needed != *module=*libcudart* ]]; then
  echo "stage_python_torch2: nvcc is here but the wheel has no CUDA module (osftrt/libosftrt_cuda.so.1) linking CUDA" >&2
  exit 1
fi
if [[ $cuda == OFF && $needed != *module=absent ]]; then
  echo "stage_python_torch2: a wheel built with OSFTRT_CUDA=OFF bundles a CUDA module" >&2
  exit 1
fi

"$venv/bin/python" -m pip install -q --force-reinstall --no-deps "$wheel"
cd "$root/bindings/python/tests"
rc=0
OPENBLAS_THREAD_TIMEOUT=4 "$venv/bin/python" -m pytest -q -p no:cacheprovider "$@" . || rc=$?
[[ $rc -eq 0 ]] || { echo "stage_python_torch2: pytest failed ($rc)" >&2; exit 1; }
# The README's Python example as written, and the examples a user starts from.
cd "$root"
"$venv/bin/python" .ci/readme_python.py
"$venv/bin/python" examples/python/hf_quickstart.py --steps 20 --check
"$venv/bin/python" examples/python/peft_interop.py --check

# A fresh venv outside the repository: the wheel alone, no variables set.
smoke=$(mktemp -d)
trap 'rm -rf "$smoke"' EXIT
/usr/bin/python3 -m venv "$smoke/venv"
"$smoke/venv/bin/python" -m pip install -q "$wheel" numpy
cd "$smoke"
env -i PATH=/usr/bin:/bin HOME="$smoke" "$smoke/venv/bin/python" - <<'PY'
import os, numpy as np, osftrt
here = os.path.dirname(osftrt.__file__)
assert os.path.exists(os.path.join(here, "libosftrt.so.1")), os.listdir(here)
a = [np.random.default_rng(0).standard_normal((6, 4)).astype(np.float32)]
q, r, status = osftrt.batched_qr(a)
assert status == [0] and np.allclose(q[0] @ r[0], a[0], atol=1e-5), status
cuda = [l.split()[-1] for l in open("/proc/self/maps") if "libosftrt_cuda" in l or "libcudart" in l]
assert not cuda, cuda  # the CUDA module loads on the first CUDA request only
try:  # with a CUDA wheel, loads the module (its run path: the toolkit here, no nvidia-* wheels)
    osftrt.Context("cuda:0", stream=0).close()
    request = "a CUDA context"
except (osftrt.NoDevice, osftrt.NotSupported) as e:
    request = "%s: %s" % (type(e).__name__, e)
print("smoke: osftrt %s from %s (%s); CUDA: %s" % (osftrt.version(), here, osftrt.build_info().splitlines()[0], request))
PY
echo "stage_python_torch2: PASS"
