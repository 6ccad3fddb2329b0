#!/usr/bin/env bash
# Installs what libosftrt needs to build and test on Debian/Ubuntu.
#
# Idempotent and cheap when everything is there: packages are checked with
# dpkg-query first, and apt-get (update + install) runs only for missing
# ones. Runs as root, or through sudo when not root. The CUDA toolkit is not
# installed here (the build uses it when it finds it: OSFTRT_CUDA=AUTO).
#
# Usage: bash .ci/setup.sh [--mkl]   (from any directory)
#   --mkl  also oneMKL, the optional CPU GEMM engine (-DOSFTRT_CPU_BLAS=MKL):
#          PyPI's mkl-devel into /opt/osftrt/mkl ($OSFTRT_MKL_PREFIX), about
#          1 GiB; the default build (OpenBLAS) needs only Debian's packages.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
want_mkl=0
for arg in "$@"; do
  case $arg in
    --mkl) want_mkl=1 ;;
    *) echo "setup.sh: unknown argument $arg (usage: setup.sh [--mkl])" >&2; exit 2 ;;
  esac
done

packages=(
  build-essential cmake ninja-build pkg-config
  libopenblas-dev liblapacke-dev libcmocka-dev libdlpack-dev
  swig libopenmpi-dev openmpi-bin
  abigail-tools clang-format python3-pip
  doxygen  # API reference: target osftrt_docs, .ci/stage_docs.sh
  clang libclang-rt-dev valgrind  # fuzz (libFuzzer), TSan, memcheck stages
  strace  # ctest threads_created_per_call: no thread created per call (issue 55)
  python3-clang-14 golang-go  # Julia binding generator/checks; Go binding
  bindgen libclang1-14 libclang-common-14-dev  # Rust binding: bindgen drift check, .ci/stage_rust.sh
  python3-dev python3-venv python3-torch python3-numpy python3-pytest  # Python binding (/usr/bin/python3), .ci/stage_python.sh
  libtorch-dev  # the C++ libtorch example, examples/cpp (ctest example_cpp_torch)
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
# ---- Python binding (.ci/stage_python.sh): scikit-build-core, the build
# backend of bindings/python, for Debian's /usr/bin/python3 (which has
# python3-torch; Debian has no scikit-build-core package, and its python
# refuses plain pip installs under PEP 668, hence --break-system-packages).
if ! /usr/bin/python3 -c "import scikit_build_core" >/dev/null 2>&1; then
  echo "setup.sh: installing scikit-build-core for /usr/bin/python3"
  as_root env PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1 \
    /usr/bin/python3 -m pip install --quiet --break-system-packages "scikit-build-core>=0.8"
fi
# ---- end Python binding
# ---- Rust binding (.ci/stage_rust.sh): cargo. A rustup toolchain (on PATH
# or in ~/.cargo/bin) is used as it is; without one, Debian's cargo package
# (rustc 1.63, the bindings' minimum).
if ! command -v cargo >/dev/null 2>&1 && [[ ! -x "$HOME/.cargo/bin/cargo" ]]; then
  echo "setup.sh: installing Debian's cargo for the Rust binding"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends cargo
fi
# ---- end Rust binding
# ---- Julia binding (.ci/stage_julia.sh): tree-sitter with its Julia grammar,
# to parse the Julia package's sources (there is no Julia to run them), for
# Debian's /usr/bin/python3 (PEP 668, hence --break-system-packages).
if ! /usr/bin/python3 -c "import tree_sitter, tree_sitter_julia" >/dev/null 2>&1; then
  echo "setup.sh: installing tree-sitter and tree-sitter-julia for /usr/bin/python3"
  as_root env PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1 \
    /usr/bin/python3 -m pip install --quiet --break-system-packages \
    "tree-sitter>=0.23,<0.26" "tree-sitter-julia==0.23.1"
fi
# ---- end Julia binding
# ---- CPU GEMM engine oneMKL (--mkl; .ci/stage_engines.sh): PyPI's
# mkl-devel (headers, libmkl_*.so.3, LAPACK, bf16 GEMM) under a prefix of
# its own, found by cmake/OsftrtCpuBlas.cmake. Debian's pip puts a --prefix
# install under PREFIX/local; CMake looks in both.
if [[ $want_mkl -eq 1 ]]; then
  mkl_version=2026.2.0
  mkl_prefix=${OSFTRT_MKL_PREFIX:-/opt/osftrt/mkl}
  if [[ -f "$mkl_prefix/.mkl-devel-$mkl_version" ]]; then
    echo "setup.sh: oneMKL $mkl_version present in $mkl_prefix"
  else
    echo "setup.sh: installing mkl-devel==$mkl_version into $mkl_prefix"
    as_root env PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1 \
      /usr/bin/python3 -m pip install --quiet --break-system-packages \
      --no-warn-script-location --prefix "$mkl_prefix" "mkl-devel==$mkl_version"
    as_root touch "$mkl_prefix/.mkl-devel-$mkl_version"
  fi
fi
# ---- end oneMKL
echo "setup.sh: done"
