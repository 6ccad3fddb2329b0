# shellcheck shell=bash
# Shared by tests/abi/check_abi.sh and tests/abi/update_baseline.sh (sourced,
# not run): how an ABIXML description of libosftrt is written, so that the
# committed baseline and the one compared with it are made the same way.
#
# osftrt_abidw LIB SOURCE_DIR OUT
#   Writes the ABI of LIB (built from SOURCE_DIR, with DWARF debug info) to
#   OUT. Only exported interfaces and the types they reach are kept; the
#   corpus path, compilation directory and DT_NEEDED entries (which differ
#   between CUDA=ON and OFF builds) are left out, type ids are content
#   hashes (stable across rebuilds), and SOURCE_DIR/ is cut from every
#   recorded path, so the file does not depend on where the tree was built.
#   Locations are kept (relative to the source tree): they tell public types
#   (include/osftrt/) from private ones (src/), and libabigail drops a
#   location without its line number, which would let the private-type
#   suppression of osftrt.abignore match public types too.

osftrt_abidw_opts=(
  --no-corpus-path
  --no-comp-dir-path
  --no-elf-needed
  --exported-interfaces-only
  --drop-private-types
  --drop-undefined-syms
  --type-id-style hash
)

osftrt_abidw() {
  local lib=$1 src=$2 out=$3
  local abidw=${ABIDW:-abidw}
  local tmp="$out.tmp"
  "$abidw" --headers-dir "$src/include" "${osftrt_abidw_opts[@]}" \
    --suppressions "$src/tests/abi/osftrt.abignore" \
    --out-file "$tmp" "$lib"
  local esc
  esc=$(printf '%s' "${src%/}" | sed 's/[][\.*^$|]/\\&/g')
  sed "s|'$esc/|'|g" "$tmp" >"$out"
  rm -f "$tmp"
}

osftrt_has_debug_info() {
  "${READELF:-readelf}" -S "$1" | grep -q '\.debug_info'
}
