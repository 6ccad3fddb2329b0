#!/usr/bin/env bash
# Regenerates the committed ABI baseline tests/abi/libosftrt.abi ON PURPOSE.
#
# The baseline is what the ABI gate (ctest abi_baseline, tests/abi/
# check_abi.sh) compares every build with. Run this only
#   - when a release adds to the ABI (new functions, appended struct
#     members or enumerators) and the new surface should become the
#     reference that later changes are checked against, or
#   - for an intended break, which needs a new major version (SONAME
#     libosftrt.so.2, version node OSFTRT_2.0; see ABI.md).
# Never run it just to make a failing gate pass: read the abidiff report
# first. Commit the regenerated file together with the change, and say why
# in the commit message.
#
# Usage: tests/abi/update_baseline.sh [build dir]
#   The build dir (default: build, relative to the repository root) must
#   hold a libosftrt built with debug info (RelWithDebInfo, the default, or
#   Debug); with or without CUDA gives the same baseline. If the build dir
#   does not exist yet it is configured (CUDA OFF) and built.
#   Environment: ABIDW (default abidw), CMAKE (default cmake).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd -P)
# shellcheck source-path=SCRIPTDIR source=abi_common.sh
source "$root/tests/abi/abi_common.sh"
CMAKE=${CMAKE:-cmake}

build=${1:-build}
[[ "$build" = /* ]] || build="$root/$build"

if [[ ! -f "$build/CMakeCache.txt" ]]; then
  echo "configuring $build (CUDA OFF)"
  "$CMAKE" -S "$root" -B "$build" -DOSFTRT_CUDA=OFF
fi
"$CMAKE" --build "$build" --target osftrt -j2

lib=$(find "$build" -maxdepth 1 -name 'libosftrt.so.*.*.*' -type f | sort | tail -n 1)
if [[ -z "$lib" ]]; then
  echo "error: no libosftrt.so.X.Y.Z in $build" >&2
  exit 1
fi
if ! osftrt_has_debug_info "$lib"; then
  echo "error: $lib has no debug info; build with RelWithDebInfo or Debug" >&2
  exit 1
fi

out="$root/tests/abi/libosftrt.abi"
osftrt_abidw "$lib" "$root" "$out"
echo "wrote $out from $lib"
if command -v git >/dev/null && git -C "$root" rev-parse >/dev/null 2>&1; then
  git -C "$root" diff --stat -- tests/abi/libosftrt.abi || true
fi
