#!/usr/bin/env bash
# CI stage: the Python binding (bindings/swig/osftrt.i + bindings/python).
#
#   1. builds and installs libosftrt into build-release/prefix (lib_prefix.sh);
#   2. pip-installs the package (pyproject.toml at the root) for Debian's
#      /usr/bin/python3 (the interpreter that Debian's python3-torch serves;
#      not a pyenv/venv python3 that may come first on PATH) against that
#      installed library (OSFTRT_PYTHON_SYSTEM_LIBRARY=ON, the distributions'
#      route), building the SWIG extension with CMake through
#      scikit-build-core; .ci/stage_python_torch2.sh tests the self-contained
#      wheel on a current PyTorch;
#   3. runs pytest on bindings/python/tests and the example trainer.
#
# Needs what .ci/setup.sh installs (swig, python3-dev, python3-torch,
# python3-numpy, python3-pytest, scikit-build-core). Exit 0 only if all passes.
#
# Usage: bash .ci/stage_python.sh [extra pytest args]   (from any directory)
#   OSFTRT_PYTHON   the interpreter (default /usr/bin/python3)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
py=${OSFTRT_PYTHON:-/usr/bin/python3}

# shellcheck source=lib_prefix.sh
source .ci/lib_prefix.sh

echo "stage_python: $("$py" --version) at $py; libosftrt at $OSFTRT_PREFIX"
# Build isolation is off: scikit-build-core comes from .ci/setup.sh, so the
# build needs no network. (Without the flag pip fetches it from PyPI.)
user_flag=()
[[ $(id -u) -eq 0 ]] || user_flag=(--user)
PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1 \
  "$py" -m pip install --break-system-packages --no-build-isolation --force-reinstall --no-deps -q \
  "${user_flag[@]}" --config-settings=cmake.define.OSFTRT_PYTHON_SYSTEM_LIBRARY=ON .

# Run from outside the source tree so the installed package is imported.
cd "$root/bindings/python/tests"
OPENBLAS_THREAD_TIMEOUT=4 "$py" -m pytest -q -p no:cacheprovider "$@" .
cd "$root"
OPENBLAS_THREAD_TIMEOUT=4 "$py" examples/python/train_osft.py --steps 20 --check
echo "stage_python: PASS"
