#!/usr/bin/env bash
# Source this file (`source .ci/lib_prefix.sh`) to get a CPU-only release
# build of libosftrt installed into build-release/prefix, for the bindings,
# the fuzz/TSan/memcheck stages and anything else that links the installed
# library the way a user would (pkg-config, find_package).
#
# Idempotent: an up-to-date build is a no-op. Exports OSFTRT_PREFIX,
# PKG_CONFIG_PATH, LD_LIBRARY_PATH, CMAKE_PREFIX_PATH.
_osftrt_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OSFTRT_PREFIX="$_osftrt_root/build-release/prefix"
if ! {
  cmake -S "$_osftrt_root" -B "$_osftrt_root/build-release" -G Ninja \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DOSFTRT_CUDA=OFF \
    -DOSFTRT_BUILD_TESTS=OFF -DOSFTRT_BUILD_EXAMPLES=OFF \
    -DOSFTRT_BUILD_BENCH=OFF -DOSFTRT_ABI_CHECK=OFF \
    -DCMAKE_INSTALL_PREFIX="$OSFTRT_PREFIX" >/dev/null &&
    cmake --build "$_osftrt_root/build-release" -j2 >/dev/null &&
    cmake --install "$_osftrt_root/build-release" >/dev/null
}; then
  echo "lib_prefix.sh: building or installing libosftrt failed" >&2
  return 1 2>/dev/null || exit 1
fi
export OSFTRT_PREFIX
export PKG_CONFIG_PATH="$OSFTRT_PREFIX/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
export LD_LIBRARY_PATH="$OSFTRT_PREFIX/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export CMAKE_PREFIX_PATH="$OSFTRT_PREFIX${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
unset _osftrt_root
