#!/usr/bin/env bash
# The Rust bindings (bindings/rust: osftrt-sys and osftrt), their example
# and their benchmark, built against the INSTALLED library through the
# pkg-config command (.ci/lib_prefix.sh), the way a Rust user links it.
# Offline: no crates.io dependencies.
#
#   1. osftrt-sys/src/bindings.rs is what bindgen makes from the headers
#      (regenerated into a temp file and compared byte for byte; the same
#      check also runs as a cargo test);
#   2. cargo test --offline: the FFI layout tests, the drift test, the safe
#      crate's tests against float64 references, error mapping, drop order,
#      threads, the 20-step training loop of examples/rust (run as a test
#      target), and the doctests (compile_fail ones included);
#   3. cargo doc with warnings as errors; cargo clippy --all-targets
#      -D warnings and cargo fmt --check, where the toolchain has them
#      (Debian's cargo package has neither);
#   4. the overhead benchmark (bench/rust) builds and runs once against its
#      C baseline (the committed figures come from
#      `bash bench/rust/run_overhead.sh 3`).
# Needs: bindgen + libclang (Debian packages, .ci/setup.sh) and cargo: a
# rustup toolchain on PATH or in ~/.cargo/bin, else Debian's `cargo`
# package, installed here through apt if none is found (rustc 1.63 is
# enough: the crates' rust-version).
# Usage: bash .ci/stage_rust.sh   (from any directory). Exit 0 when all pass.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$(pwd)
# shellcheck source=/dev/null
source .ci/lib_prefix.sh
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
export CARGO_TERM_COLOR=never

if ! command -v cargo >/dev/null 2>&1 && [[ -x "$HOME/.cargo/bin/cargo" ]]; then
  export PATH="$HOME/.cargo/bin:$PATH"
fi
if ! command -v cargo >/dev/null 2>&1; then
  echo "stage_rust: no cargo on PATH: installing Debian's cargo"
  sudo_=()
  [[ $(id -u) -eq 0 ]] || sudo_=(sudo)
  "${sudo_[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
  "${sudo_[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends cargo
fi
cargo --version
rustc --version
command -v bindgen >/dev/null || { echo "stage_rust: no bindgen (apt-get install bindgen)"; exit 1; }
bindgen --version
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

echo "--- 1. bindings.rs up to date with include/osftrt/*.h"
sys=bindings/rust/osftrt-sys
bash "$sys/generate.sh" "$tmp/bindings.rs"
if ! cmp -s "$sys/src/bindings.rs" "$tmp/bindings.rs"; then
  diff -u "$sys/src/bindings.rs" "$tmp/bindings.rs" | head -40 || true
  echo "FAIL: $sys/src/bindings.rs is out of date: run bash $sys/generate.sh"
  exit 1
fi
echo "ok: $sys/src/bindings.rs matches the headers"

cd "$root/bindings/rust"
echo "--- 2. cargo test --offline (tests, example, doctests)"
cargo test --offline

echo "--- 3. rustdoc, clippy and rustfmt"
RUSTDOCFLAGS="-D warnings" cargo doc --offline --no-deps
if cargo clippy --version >/dev/null 2>&1; then
  cargo clippy --offline --all-targets -- -D warnings
else
  echo "skipped: cargo clippy is not installed with this toolchain"
fi
if cargo fmt --version >/dev/null 2>&1; then
  cargo fmt --all -- --check
else
  echo "skipped: cargo fmt is not installed with this toolchain"
fi

echo "--- 4. overhead benchmark (one short run against the C baseline)"
# shellcheck disable=SC2046
cc -O2 -Wall -Wextra -Werror -o "$tmp/overhead_c" "$root/bench/rust/overhead_c.c" \
  $(pkg-config --cflags --libs osftrt)
"$tmp/overhead_c"
cargo bench --offline --bench overhead
echo "stage_rust: PASS"
