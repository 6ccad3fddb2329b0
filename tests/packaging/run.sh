#!/usr/bin/env bash
# Packaging test for libosftrt (ctest: packaging).
#
# Installs the build tree into a scratch prefix and uses it the way a
# downstream project would:
#   1. cmake --install <build dir> --prefix <work dir>/prefix
#   2. the installed tree holds include/osftrt/*.h (identical to the
#      sources), <libdir>/libosftrt.so.1 (+ the libosftrt.so dev link),
#      <libdir>/cmake/osftrt/osftrtConfig.cmake (+ Version, Targets) and
#      <libdir>/pkgconfig/osftrt.pc; no installed CMake/pkg-config file
#      names the source or build tree; <libdir> (lib, lib64 or
#      lib/<multiarch>) is found, not assumed;
#   3. every installed header compiles on its own, as C11 (and C++ when a
#      C++ compiler is given), with warnings as errors, with no CUDA header
#      reachable (CPATH etc. cleared; the -H include trace is checked); the
#      C++ header osftrt.hpp compiles on its own as C++17 and C++20; the
#      libtorch glue osftrt/torch.hpp is installed like it and, where
#      libtorch's headers are given (--torch-include), compiles on its own
#      against them as C++17;
#   4. pkg-config (PKG_CONFIG_PATH=<libdir>/pkgconfig) reports the version
#      and a prefix equal to the install prefix; consumer.c is compiled with
#      `$CC $(pkg-config --cflags --libs osftrt)` and run with
#      LD_LIBRARY_PATH=<libdir>, and must load the installed library; with a
#      C++ compiler, consumer.cpp (the C++ API) likewise, and once more linked
#      with -Wl,-rpath,$(pkg-config --variable=libdir osftrt) and run without
#      LD_LIBRARY_PATH (the README's advice for a non-system prefix);
#   5. cmake_consumer/ (find_package(osftrt 1.0 REQUIRED) +
#      osftrt::osftrt) is configured with CMAKE_PREFIX_PATH=<prefix>,
#      built and run; with a C++ compiler, its C++ consumer too;
#   6. a CUDA (MPI) build installs libosftrt_cuda.so.1 (libosftrt_mpi.so.1)
#      beside the core (no dev link), and the installed core loads the CUDA
#      module from there by itself.
#
# Usage: run.sh --build-dir DIR --source-dir DIR --work-dir DIR --cc CC
#               [--cxx CXX] [--cmake CMAKE] [--generator GEN]
#               [--sanitize ON|OFF] [--version X.Y.Z]
#               [--torch-include DIR:DIR...] [--torch-flags FLAGS]
#   --sanitize ON: the library was built with -fsanitize=address,undefined,
#   so the consumers are too (the ASan runtime must be loaded first).
#   --torch-include: libtorch's include folders (TORCH_INCLUDE_DIRS, ':'
#   between them), --torch-flags its TORCH_CXX_FLAGS: torch.hpp is compiled.
set -euo pipefail

build_dir='' source_dir='' work_dir='' cc='' cxx='' cmake=cmake generator='' sanitize=OFF
version= torch_include= torch_flags=
while [[ $# -gt 0 ]]; do
  case $1 in
    --build-dir) build_dir=$2; shift 2 ;;
    --source-dir) source_dir=$2; shift 2 ;;
    --work-dir) work_dir=$2; shift 2 ;;
    --cc) cc=$2; shift 2 ;;
    --cxx) cxx=$2; shift 2 ;;
    --cmake) cmake=$2; shift 2 ;;
    --generator) generator=$2; shift 2 ;;
    --sanitize) sanitize=$2; shift 2 ;;
    --version) version=$2; shift 2 ;;
    --torch-include) torch_include=$2; shift 2 ;;
    --torch-flags) torch_flags=$2; shift 2 ;;
    *) echo "run.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
if [[ -z "$build_dir" || -z "$source_dir" || -z "$work_dir" || -z "$cc" ]]; then
  echo "usage: $0 --build-dir DIR --source-dir DIR --work-dir DIR --cc CC [...]" >&2
  exit 2
fi
build_dir=$(cd "$build_dir" && pwd -P)
source_dir=$(cd "$source_dir" && pwd -P)

step() { echo "== packaging: $*"; }
die() { echo "FAIL: $*" >&2; exit 1; }

san_flags=()
case ${sanitize^^} in
  ON | 1 | TRUE | YES) san_flags=('-fsanitize=address,undefined' -fno-omit-frame-pointer) ;;
  OFF | 0 | FALSE | NO | "") ;;
  *) die "--sanitize must be ON or OFF, not '$sanitize'" ;;
esac

# A clean scratch area; nothing from the caller's environment may point the
# compiler at other headers (CUDA in particular) or pkg-config elsewhere.
rm -rf "$work_dir"
mkdir -p "$work_dir"
work_dir=$(cd "$work_dir" && pwd -P)
prefix="$work_dir/prefix"
unset CPATH C_INCLUDE_PATH CPLUS_INCLUDE_PATH PKG_CONFIG_LIBDIR \
  PKG_CONFIG_SYSROOT_DIR CMAKE_PREFIX_PATH osftrt_DIR

# ---------------------------------------------------------------- 1. install
step "cmake --install $build_dir --prefix $prefix"
"$cmake" --install "$build_dir" --prefix "$prefix" >"$work_dir/install.log" 2>&1 ||
  { cat "$work_dir/install.log"; die "cmake --install failed"; }

# ---------------------------------------------------------------- 2. layout
step "installed tree"
pc_file=$(find "$prefix" -path '*/pkgconfig/osftrt.pc' -type f | head -n 1)
[[ -n "$pc_file" ]] || die "no pkgconfig/osftrt.pc under $prefix"
pc_dir=$(dirname "$pc_file")
libdir=$(dirname "$pc_dir")
echo "libdir: ${libdir#"$prefix"/}"

for f in libosftrt.so.1 libosftrt.so cmake/osftrt/osftrtConfig.cmake \
         cmake/osftrt/osftrtConfigVersion.cmake cmake/osftrt/osftrtTargets.cmake; do
  [[ -e "$libdir/$f" ]] || die "missing ${libdir#"$prefix"/}/$f"
done
real_lib=$(readlink -f "$libdir/libosftrt.so.1")
[[ "$real_lib" == "$libdir"/libosftrt.so.1.* ]] ||
  die "libosftrt.so.1 points outside $libdir: $real_lib"
[[ -d "$prefix/include/osftrt" ]] || die "missing include/osftrt"
headers=()
for h in "$source_dir"/include/osftrt/*.h "$source_dir"/include/osftrt/*.hpp; do
  name=$(basename "$h")
  [[ -f "$prefix/include/osftrt/$name" ]] || die "missing include/osftrt/$name"
  cmp -s "$h" "$prefix/include/osftrt/$name" ||
    die "include/osftrt/$name differs from the source tree"
  headers+=("$name")
done
[[ ${#headers[@]} -gt 0 ]] || die "no headers in $source_dir/include/osftrt"
for f in "$prefix"/include/osftrt/*; do
  [[ -f "$source_dir/include/osftrt/$(basename "$f")" ]] ||
    die "unexpected installed file include/osftrt/$(basename "$f")"
done
# (Lines naming the install prefix itself are fine: it may lie under both.)
leaks=$(grep -rF -e "$source_dir" -e "$build_dir" "$libdir/cmake" "$pc_dir" |
  grep -vF "$prefix" || true)
[[ -z "$leaks" ]] || die "installed CMake/pkg-config files name the source or build tree:
$leaks"
echo "ok: ${#headers[@]} headers, $(basename "$real_lib"), CMake package, osftrt.pc"

# ---------------------------------------------------------------- 3. headers
step "public headers compile without CUDA"
hdr_dir="$work_dir/headers"
mkdir -p "$hdr_dir"
for name in "${headers[@]}"; do
  [[ $name == *.h ]] || continue
  tu="$hdr_dir/${name%.h}.c"
  printf '#include <osftrt/%s>\n#include <osftrt/%s>\nint osft_header_test_%s;\n' \
    "$name" "$name" "${name%.h}" >"$tu"
  if ! "$cc" -std=c11 -Wall -Wextra -Wpedantic -Werror -H -fsyntax-only \
      -I"$prefix/include" "$tu" 2>"$hdr_dir/${name%.h}.trace"; then
    cat "$hdr_dir/${name%.h}.trace" >&2
    die "include/osftrt/$name does not compile on its own as C11"
  fi
  if grep -Ei '(^|[/ ])(cuda|cuda_runtime[a-z_]*|cublas[a-zA-Z_]*|cusolver[a-zA-Z_]*|nccl)\.h$|/cuda[^/]*/' \
      "$hdr_dir/${name%.h}.trace" >&2; then
    die "include/osftrt/$name pulls in CUDA headers (above)"
  fi
  if [[ -n "$cxx" ]]; then
    cp "$tu" "$hdr_dir/${name%.h}.cpp"
    "$cxx" -std=c++11 -Wall -Wextra -Werror -fsyntax-only -I"$prefix/include" \
      "$hdr_dir/${name%.h}.cpp" ||
      die "include/osftrt/$name does not compile as C++11"
  fi
done
if [[ -n "$cxx" ]]; then
  for std in c++17 c++20; do
    printf '#include <osftrt/osftrt.hpp>\n#include <osftrt/osftrt.hpp>\n' >"$hdr_dir/hpp.cpp"
    "$cxx" -std=$std -Wall -Wextra -Wpedantic -Wshadow -Werror -fsyntax-only \
      -I"$prefix/include" "$hdr_dir/hpp.cpp" ||
      die "include/osftrt/osftrt.hpp does not compile on its own as $std"
  done
fi
[[ " ${headers[*]} " == *" torch.hpp "* ]] || die "include/osftrt/torch.hpp is not installed"
torch_ok=""
if [[ -n "$cxx" && -n "$torch_include" ]]; then
  torch_dirs=()
  IFS=: read -r -a torch_split <<<"$torch_include"
  for d in "${torch_split[@]}"; do # the compiler's own folders stay where they are
    [[ -n $d && $d != /usr/include && $d != /usr/local/include ]] && torch_dirs+=(-isystem "$d")
  done
  read -r -a torch_defs <<<"$torch_flags"
  printf '#include <osftrt/torch.hpp>\n#include <osftrt/torch.hpp>\n' >"$hdr_dir/torch.cpp"
  "$cxx" -std=c++17 -Wall -Wextra -Wshadow -Werror -fsyntax-only "${torch_defs[@]}" \
    -I"$prefix/include" "${torch_dirs[@]}" "$hdr_dir/torch.cpp" ||
    die "include/osftrt/torch.hpp does not compile on its own against libtorch"
  torch_ok=", torch.hpp against libtorch"
fi
echo "ok: ${#headers[@]} headers, C11${cxx:+ and C++11, osftrt.hpp as C++17/C++20}${torch_ok}, no CUDA header included"

# ---------------------------------------------------------------- 4. pkg-config
step "pkg-config consumer"
export PKG_CONFIG_PATH="$pc_dir"
pkg_config=${PKG_CONFIG:-pkg-config}
pc_version=$("$pkg_config" --modversion osftrt) || die "pkg-config cannot read osftrt.pc"
if [[ -n "$version" && "$pc_version" != "$version" ]]; then
  die "osftrt.pc says version $pc_version, the project is $version"
fi
pc_prefix=$("$pkg_config" --variable=prefix osftrt)
if [[ "$(cd "$pc_prefix" 2>/dev/null && pwd -P)" != "$prefix" ]]; then
  die "osftrt.pc has prefix=$pc_prefix, but was installed with --prefix $prefix:
the .pc file is not relocatable (cmake --install --prefix, or a moved install
tree, give a file pointing elsewhere). Define prefix relative to the file,
prefix=\${pcfiledir}/<path from libdir/pkgconfig to the prefix>."
fi
"$pkg_config" --exists 'osftrt >= 1.0' || die "pkg-config: osftrt >= 1.0 not satisfied"
read -r -a pc_flags <<<"$("$pkg_config" --cflags --libs osftrt)"
echo "pkg-config --cflags --libs osftrt: ${pc_flags[*]}"
"$cc" -std=c11 -Wall -Wextra -Werror "${san_flags[@]}" \
  "$source_dir/tests/packaging/consumer.c" "${pc_flags[@]}" \
  -o "$work_dir/pc_consumer" || die "compiling consumer.c via pkg-config failed"
loaded=$(LD_LIBRARY_PATH="$libdir" ldd "$work_dir/pc_consumer" | awk '/libosftrt\.so/ {print $3}')
[[ "$(readlink -f "$loaded")" == "$real_lib" ]] ||
  die "pc_consumer loads '$loaded', not the installed $real_lib"
LD_LIBRARY_PATH="$libdir" "$work_dir/pc_consumer" || die "pc_consumer failed"
if [[ -n "$cxx" ]]; then
  "$cxx" -std=c++17 -Wall -Wextra -Werror "${san_flags[@]}" \
    "$source_dir/tests/packaging/consumer.cpp" "${pc_flags[@]}" \
    -o "$work_dir/pc_consumer_cpp" || die "compiling consumer.cpp via pkg-config failed"
  LD_LIBRARY_PATH="$libdir" "$work_dir/pc_consumer_cpp" || die "pc_consumer_cpp failed"
  # A non-system prefix without LD_LIBRARY_PATH: the run path (README, Linking).
  "$cxx" -std=c++17 "${san_flags[@]}" "$source_dir/tests/packaging/consumer.cpp" \
    "${pc_flags[@]}" "-Wl,-rpath,$("$pkg_config" --variable=libdir osftrt)" \
    -o "$work_dir/pc_consumer_rpath" || die "linking consumer.cpp with a run path failed"
  loaded=$(env -u LD_LIBRARY_PATH ldd "$work_dir/pc_consumer_rpath" |
    awk '/libosftrt\.so/ {print $3}')
  [[ "$(readlink -f "$loaded")" == "$real_lib" ]] ||
    die "pc_consumer_rpath loads '$loaded', not the installed $real_lib"
  env -u LD_LIBRARY_PATH "$work_dir/pc_consumer_rpath" || die "pc_consumer_rpath failed"
fi

# ---------------------------------------------------------------- 5. CMake
step "find_package(osftrt) consumer"
gen_args=()
[[ -n "$generator" ]] && gen_args=(-G "$generator")
cmake_flags=()
if [[ ${#san_flags[@]} -gt 0 ]]; then
  cmake_flags=("-DCMAKE_C_FLAGS=${san_flags[*]}" "-DCMAKE_EXE_LINKER_FLAGS=${san_flags[*]}")
  cmake_flags+=("-DCMAKE_CXX_FLAGS=${san_flags[*]}")
fi
[[ -n "$cxx" ]] && cmake_flags+=("-DCMAKE_CXX_COMPILER=$cxx")
"$cmake" -S "$source_dir/tests/packaging/cmake_consumer" -B "$work_dir/cmake_consumer" \
  "${gen_args[@]}" -DCMAKE_C_COMPILER="$cc" -DCMAKE_BUILD_TYPE=Debug \
  -DCMAKE_PREFIX_PATH="$prefix" -DOSFTRT_EXPECT_PREFIX="$prefix" \
  -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF "${cmake_flags[@]}" \
  >"$work_dir/cmake_consumer.log" 2>&1 ||
  { cat "$work_dir/cmake_consumer.log"; die "configuring cmake_consumer failed"; }
grep -m1 'osftrt .* from ' "$work_dir/cmake_consumer.log" || true
"$cmake" --build "$work_dir/cmake_consumer" >>"$work_dir/cmake_consumer.log" 2>&1 ||
  { cat "$work_dir/cmake_consumer.log"; die "building cmake_consumer failed"; }
# No LD_LIBRARY_PATH: CMake puts the imported library's directory in the
# executable's build RPATH.
loaded=$(ldd "$work_dir/cmake_consumer/cmake_consumer" | awk '/libosftrt\.so/ {print $3}')
[[ "$(readlink -f "$loaded")" == "$real_lib" ]] ||
  die "cmake_consumer loads '$loaded', not the installed $real_lib"
"$work_dir/cmake_consumer/cmake_consumer" || die "cmake_consumer failed"
if [[ -n "$cxx" ]]; then
  [[ -x "$work_dir/cmake_consumer/cmake_consumer_cpp" ]] ||
    die "cmake_consumer did not build its C++ consumer"
  "$work_dir/cmake_consumer/cmake_consumer_cpp" || die "cmake_consumer_cpp failed"
fi

# ---------------------------------------------------------------- 6. CUDA module
# A CUDA build installs its module beside the core (no dev link: it is
# loaded, never linked), and the installed core finds it there by itself:
# a CUDA context then fails only for want of a GPU (or succeeds on one),
# never for want of the module.
module_checked=
if [[ -e "$build_dir/libosftrt_mpi.so.1" ]]; then
  [[ -e "$libdir/libosftrt_mpi.so.1" && ! -e "$libdir/libosftrt_mpi.so" ]] ||
    die "libosftrt_mpi.so.1 is not installed beside the core (or has a dev link)"
  module_checked=", MPI module"
fi
if [[ -e "$build_dir/libosftrt_cuda.so.1" ]]; then
  step "CUDA module beside the installed core"
  module_checked+=", CUDA module"
  [[ -e "$libdir/libosftrt_cuda.so.1" ]] || die "missing ${libdir#"$prefix"/}/libosftrt_cuda.so.1"
  [[ ! -e "$libdir/libosftrt_cuda.so" ]] || die "the module has a dev link (it is never linked)"
  [[ "$(readlink -f "$libdir/libosftrt_cuda.so.1")" == "$libdir"/libosftrt_cuda.so.1.* ]] ||
    die "libosftrt_cuda.so.1 points outside $libdir"
  cat >"$work_dir/module_probe.c" <<'PROBE'
#include <stdio.h>
#include <string.h>
#include <osftrt/osftrt.h>
int main(void) {
  osft_context_options_t o;
  osft_context_t ctx = NULL;
  if (OSFT_CONTEXT_OPTIONS_INIT(&o) != OSFT_STATUS_SUCCESS) return 1;
  o.device_type = OSFT_DEVICE_CUDA;
  osft_status_t st = osft_context_create(&ctx, &o);
  if (st == OSFT_STATUS_SUCCESS) return osft_context_destroy(ctx) == OSFT_STATUS_SUCCESS ? 0 : 1;
  printf("%s\n", osft_last_error());
  return st == OSFT_STATUS_NO_DEVICE && strstr(osft_last_error(), "libosftrt_cuda") == NULL ? 0 : 1;
}
PROBE
  "$cc" -std=c11 "${san_flags[@]}" "$work_dir/module_probe.c" "${pc_flags[@]}" \
    -o "$work_dir/module_probe" || die "compiling module_probe.c failed"
  LD_LIBRARY_PATH="$libdir" OSFTRT_CUDA_MODULE= "$work_dir/module_probe" ||
    die "the installed core does not load its installed module (above)"
fi

echo "OK: packaging (install, headers, pkg-config, find_package$module_checked)"
