#!/usr/bin/env bash
# Installs what libosftrt needs to build and test on Debian/Ubuntu.
#
# Idempotent and cheap when everything is there: packages are checked with
# dpkg-query first, and apt-get (update + install) runs only for missing
# ones. Runs as root, or through sudo when not root. The CUDA toolkit is not
# installed here (the build uses it when it finds it: OSFTRT_CUDA=AUTO).
#
# Usage: bash .ci/setup.sh   (from any directory)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

packages=(
  build-essential cmake ninja-build pkg-config
  libopenblas-dev liblapacke-dev libcmocka-dev libdlpack-dev
  swig libopenmpi-dev openmpi-bin
  abigail-tools clang-format python3-pip
)

as_root() {
  if [[ $(id -u) -eq 0 ]]; then
    "$@"
  elif command -v sudo >/dev/null 2>&1; then
    sudo "$@"
  else
    echo "setup.sh: need root or sudo to run: $*" >&2
    return 1
  fi
}

missing=()
for pkg in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Status}' "$pkg" 2>/dev/null || true)
  [[ "$status" == "installed" ]] || missing+=("$pkg")
done

if [[ ${#missing[@]} -gt 0 ]]; then
  echo "setup.sh: installing ${missing[*]}"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
    --no-install-recommends "${missing[@]}"
else
  echo "setup.sh: all ${#packages[@]} packages present"
fi

# numpy, for the Python binding tests.
if ! python3 -c "import numpy" >/dev/null 2>&1; then
  echo "setup.sh: installing numpy for $(command -v python3)"
  if ! PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1 \
      python3 -m pip install --quiet numpy; then
    # A Debian/Ubuntu system python refuses pip installs (PEP 668): use the
    # distribution's package instead.
    { as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q &&
      as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
        --no-install-recommends python3-numpy; } || true
  fi
  # Not fatal: nothing in the C build needs numpy; the Python tests that do
  # will fail on their own and say so.
  python3 -c "import numpy" >/dev/null 2>&1 ||
    echo "setup.sh: WARNING: numpy is still not importable by $(command -v python3)" >&2
fi
echo "setup.sh: done"
