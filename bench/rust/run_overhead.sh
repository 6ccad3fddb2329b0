#!/usr/bin/env bash
# Per-call overhead of the Rust bindings against the same calls from C:
# a tiny fused cross-entropy call (4 tokens, H 16, V 32, loss + grad_x) and
# osft_qr_batch on 4 matrices of 8 x 8 (fp32, Q only, one worker), plus two
# calls where the library does almost nothing (osft_flce_get_plan on the
# same arguments; osft_qr_batch on 8 x 0 matrices), where the difference is
# the bindings' own cost.
#
#   bash bench/rust/run_overhead.sh [rounds]     (default 3)
#
# Builds libosftrt (source .ci/lib_prefix.sh; or set OSFTRT_BENCH_PREFIX to
# an installed prefix to measure that one), the C baseline
# (overhead_c.c with cc -O2 via pkg-config) and the Rust bench
# (overhead.rs, `cargo bench`, release), runs them alternately `rounds`
# times with OPENBLAS_NUM_THREADS=1, and writes
# bench/results/rust_overhead_cpu.{md,csv}: per case the ns per call in the
# calling thread's CPU time (minimum over all repeats, and the median of the
# per-round medians) and in wall-clock time (minimum). Each program times
# 31 repeats of ~10 ms per case.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
rounds=${1:-3}
if [[ -n ${OSFTRT_BENCH_PREFIX:-} ]]; then
  # An installed libosftrt to measure instead of building one.
  export PKG_CONFIG_PATH="$OSFTRT_BENCH_PREFIX/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
  export LD_LIBRARY_PATH="$OSFTRT_BENCH_PREFIX/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
else
  # shellcheck source=/dev/null
  source "$root/.ci/lib_prefix.sh"
fi
if ! command -v cargo >/dev/null 2>&1 && [[ -x "$HOME/.cargo/bin/cargo" ]]; then
  export PATH="$HOME/.cargo/bin:$PATH"
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# shellcheck disable=SC2046
cc -O2 -Wall -Wextra -o "$work/overhead_c" "$root/bench/rust/overhead_c.c" $(pkg-config --cflags --libs osftrt)
cd "$root/bindings/rust"
cargo bench --offline --bench overhead --no-run >/dev/null 2>&1
rust_bin=$(cargo bench --offline --bench overhead --no-run 2>&1 |
  sed -n 's/.*Executable .*(\(.*\))$/\1/p' | tail -1)
[[ -x "$rust_bin" ]] || { echo "run_overhead.sh: no bench executable" >&2; exit 1; }

export OPENBLAS_NUM_THREADS=1
raw="$work/raw.csv"
for ((r = 1; r <= rounds; ++r)); do
  echo "round $r/$rounds" >&2
  "$work/overhead_c" >>"$raw"
  "$rust_bin" >>"$raw"
done

out=$root/bench/results
mkdir -p "$out"
# case,impl,wall_min,cpu_min,cpu_median: the minima over all rounds, the
# median of the per-round CPU-time medians.
awk -F, '
  { k = $1 "," $2
    if (!(k in w) || $3 < w[k]) w[k] = $3
    if (!(k in c) || $5 < c[k]) c[k] = $5
    med[k] = med[k] " " $6 }
  END {
    for (k in w) {
      m = split(substr(med[k], 2), v, " ")
      for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (v[j] + 0 < v[i] + 0) { t = v[i]; v[i] = v[j]; v[j] = t }
      printf "%s,%.1f,%.1f,%.1f\n", k, w[k], c[k], v[int((m + 1) / 2)]
    }
  }' "$raw" | sort >"$out/rust_overhead_cpu.csv"

get() { awk -F, -v c="$1" -v i="$2" -v f="$3" '$1 == c && $2 == i { print $f }' "$out/rust_overhead_cpu.csv"; }
# "CPU min / CPU median / wall min" of one case and implementation.
cell() { echo "$(get "$1" "$2" 4) / $(get "$1" "$2" 5) / $(get "$1" "$2" 3)"; }
{
  echo "# Rust bindings: per-call overhead against C, on the CPU"
  echo
  echo "- machine: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB; load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "- date: $(date -u +%Y-%m-%d)"
  echo "- toolchains: $(cc --version | head -1); $(rustc --version)"
  echo "- library: libosftrt $(pkg-config --modversion osftrt), CPU-only RelWithDebInfo build (the flags of .ci/lib_prefix.sh)${OSFTRT_BENCH_PREFIX:+ installed in $(basename "$(dirname "$OSFTRT_BENCH_PREFIX")")/prefix}, OPENBLAS_NUM_THREADS=1"
  echo "- command: \`bash bench/rust/run_overhead.sh $rounds\` ($rounds rounds, C and Rust alternating; each program times 31 repeats of ~10 ms per case)"
  echo
  echo "ns per call as \"CPU min / CPU median / wall min\", from the calling thread's CPU time (every call runs on that thread: one QR worker,"
  echo "OPENBLAS_NUM_THREADS=1), so that waiting for a core on the loaded machine does not count: the"
  echo "minimum over all repeats, then the median of the per-round medians, then the wall-clock minimum."
  echo "\"Rust raw FFI\" is the same call through \`osftrt-sys\` from Rust, timed interleaved with the safe"
  echo "API in one process; \"added\" is the safe API minus C and minus the raw FFI (CPU-time minima)."
  echo
  echo "| case | C | Rust raw FFI | Rust safe API | added vs C | added vs raw FFI |"
  echo "| --- | ---: | ---: | ---: | ---: | ---: |"
  for c in flce_tiny qr_batch_small flce_plan qr_batch_empty; do
    cm=$(get $c c 4) sm=$(get $c rust-sys 4) fm=$(get $c rust-safe 4)
    # shellcheck disable=SC2016 # backticks are Markdown
    printf '| `%s` | %s | %s | %s | %+.0f ns | %+.0f ns |\n' "$c" \
      "$(cell $c c)" "$(cell $c rust-sys)" "$(cell $c rust-safe)" \
      "$(awk -v a="$fm" -v b="$cm" 'BEGIN { print a - b }')" "$(awk -v a="$fm" -v b="$sm" 'BEGIN { print a - b }')"
  done
  echo
  echo "Cases: \`flce_tiny\` = osft_flce_compute, 4 tokens, H 16, V 32, fp32, loss and grad_x;"
  echo "\`qr_batch_small\` = osft_qr_batch of 4 fp32 8 x 8 matrices, Q only, max_concurrency 1;"
  echo "\`flce_plan\` = osft_flce_get_plan on the flce_tiny arguments (validation only);"
  echo "\`qr_batch_empty\` = osft_qr_batch of 4 matrices 8 x 0 (validation only). The last two"
  echo "isolate the bindings' own cost: building the DLPack descriptors and option structs from"
  echo "slices and shapes, and mapping the status to a Result."
  echo
  echo "Goal (issue 14): at most 1 us added per call."
} >"$out/rust_overhead_cpu.md"
cat "$out/rust_overhead_cpu.md"
