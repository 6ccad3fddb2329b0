#!/usr/bin/env bash
# Runs a test program under strace and fails if it created any thread
# between its two trace markers (tests/c/test_threads_steady.c): the
# library must create no thread per call (issue 55). Counts clone/clone3
# calls with CLONE_THREAD; processes (fork) are not threads. Exits 77
# (skipped) where strace is missing or may not trace (no ptrace).
#   check_threads_created.sh PROGRAM [ARGS...]
set -uo pipefail
if ! command -v strace >/dev/null 2>&1; then
  echo "check_threads_created: strace is not installed (bash .ci/setup.sh installs it); skipped"
  exit 77
fi
# LeakSanitizer cannot run under ptrace; the program's own ctest case keeps
# leak checking in the sanitizer build.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
strace -f -qq -e trace=clone,clone3,openat -e signal=none -o "$log" "$@"
rc=$?
if [[ $rc -ne 0 ]]; then
  if grep -q "PTRACE_TRACEME\|Operation not permitted" "$log" 2>/dev/null || [[ ! -s "$log" ]]; then
    echo "check_threads_created: strace could not trace here (rc $rc); skipped"
    exit 77
  fi
  echo "check_threads_created: the program failed (rc $rc)"
  exit 1
fi
awk 'BEGIN { phase = 0 }
  /osftrt-threads-test-marker\/steady/ { phase = 1; next }
  /osftrt-threads-test-marker\/end/ { phase = 2; next }
  /clone3?\(/ && /CLONE_THREAD/ { created[phase]++ }
  END {
    printf "threads created: %d before the steady rounds, %d during them, %d after\n",
           created[0], created[1], created[2]
    if (phase != 2) { print "check_threads_created: markers missing from the trace"; exit 1 }
    if (created[1] > 0) {
      print "check_threads_created: FAIL: the library created threads after the first call"
      exit 1
    }
  }' "$log"
