#!/usr/bin/env bash
# The Go binding (bindings/go/osftrt), its example and its benchmark, built
# against the INSTALLED library through pkg-config (.ci/lib_prefix.sh), the
# way a Go user links it. Offline: GOPROXY=off, no module dependencies.
#
#   1. the SWIG layer (internal/capi) is up to date with bindings/swig/osftrt.i
#      and the headers (regenerated into a temp dir and compared);
#   2. gofmt and go vet (unsafeptr off: the binding turns C addresses into
#      pointers on purpose) on the hand-written code;
#   3. go test ./..., go test -race ./..., and go test with GODEBUG=cgocheck=2
#      (cgo's full pointer-passing checks);
#   4. the completeness test fails when a header gains a function the Go
#      package does not expose (a header copy with one more function);
#   5. examples/go: the 20-step training loop (loss falls, orthogonality
#      <= 1e-5), also under -race;
#   6. bench/go builds and runs briefly (the committed figures come from
#      `OPENBLAS_NUM_THREADS=1 go run . -o ../results/go_overhead_cpu.md`).
# Needs: golang-go (Debian's Go 1.19) and swig, installed by .ci/setup.sh.
# Usage: bash .ci/stage_go.sh   (from any directory). Exit 0 when all pass.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$(pwd)
# shellcheck source=/dev/null
source .ci/lib_prefix.sh
export GOPROXY=off GONOSUMDB=* GOFLAGS=${GOFLAGS:-}
# Build cache and (empty) module cache inside the repository's ignored
# build-go/, so the stage needs no $HOME and leaves nothing elsewhere.
export GOCACHE=${GOCACHE:-$root/build-go/cache} GOPATH=${GOPATH:-$root/build-go/gopath}
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
command -v go >/dev/null || { echo "stage_go: no go toolchain (apt-get install golang-go)"; exit 1; }
go version
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

echo "--- 1. SWIG layer up to date"
capi=bindings/go/osftrt/internal/capi
bash "$capi/generate.sh" "$tmp"
for f in capi.go osftrt_wrap.c; do
  if ! diff -q "$capi/$f" "$tmp/$f" >/dev/null; then
    diff -u "$capi/$f" "$tmp/$f" | head -40 || true
    echo "FAIL: $capi/$f is out of date: run bash $capi/generate.sh"
    exit 1
  fi
done
echo "ok: capi.go and osftrt_wrap.c match bindings/swig/osftrt.i"

cd "$root/bindings/go"
echo "--- 2. gofmt, go vet"
bad=$(gofmt -l osftrt/*.go osftrt/internal/capi/callbacks.go osftrt/internal/capi/link.go \
  "$root"/examples/go/train/*.go "$root"/bench/go/*.go)
[[ -z "$bad" ]] || { echo "FAIL: not gofmt-formatted: $bad"; exit 1; }
go vet -unsafeptr=false ./...

echo "--- 3. go test, -race, cgocheck=2"
go test -count=1 ./...
go test -count=1 -race ./...
GODEBUG=cgocheck=2 go test -count=1 ./...

echo "--- 4. a header function the package does not expose fails the test"
cp -r "$root/include" "$tmp/include"
cat >>"$tmp/include/osftrt/qr.h" <<'H'
OSFT_API osft_status_t osft_stage_go_probe(osft_context_t ctx);
H
if OSFTRT_INCLUDE_DIR="$tmp/include" go test -count=1 -run TestEveryHeaderFunctionIsExposed ./osftrt >"$tmp/probe.log" 2>&1; then
  cat "$tmp/probe.log"
  echo "FAIL: the completeness test passed with an unexposed header function"
  exit 1
fi
grep -m1 "osft_stage_go_probe" "$tmp/probe.log"
echo "ok: the completeness test rejects it"

echo "--- 5. examples/go: 20-step training loop"
cd "$root/examples/go"
go vet -unsafeptr=false ./...
go run ./train
go run -race ./train | tail -2

echo "--- 6. bench/go (short run)"
cd "$root/bench/go"
go vet -unsafeptr=false ./...
go run . -rounds 3 -calls 20 | grep '^| tiny FLCE'
echo "stage_go: PASS"
