#!/usr/bin/env bash
# Runs one multi-rank test under mpirun with a hard time limit, so that a
# hang can never stall CI.
#
#   run_mpi_test.sh all       NP PROGRAM [ARGS...]
#       every rank must finish, mpirun must exit 0, and the output must hold
#       no "FAIL" line.
#   run_mpi_test.sh survivors NP PROGRAM [ARGS...]
#       a peer leaves on purpose: exactly NP - 1 ranks must print a "PASS"
#       line and none a "FAIL" line; mpirun's own exit status is ignored
#       (it reports the peer that left). Uses --enable-recovery so that
#       Open MPI keeps the survivors running.
#
# Environment: MPIEXEC (default mpirun), MPI_TEST_TIMEOUT (seconds, default
# 100 for "all", 40 for "survivors").
set -uo pipefail
mode=$1 np=$2
shift 2
mpiexec=${MPIEXEC:-mpirun}
args=(--oversubscribe -np "$np")
[[ $(id -u) -eq 0 ]] && args=(--allow-run-as-root "${args[@]}")
if [[ $mode == survivors ]]; then
  args=(--enable-recovery "${args[@]}")
  limit=${MPI_TEST_TIMEOUT:-40}
else
  limit=${MPI_TEST_TIMEOUT:-100}
fi
out=$(mktemp)
trap 'rm -f "$out"' EXIT
start=$SECONDS
# --kill-after: a launcher that ignores SIGTERM is killed as well.
timeout --kill-after=5 "$limit" "$mpiexec" "${args[@]}" "$@" >"$out" 2>&1
rc=$?
cat "$out"
echo "run_mpi_test: mpirun exited $rc after $((SECONDS - start)) s"
if [[ $rc -eq 124 || $rc -eq 137 ]]; then
  echo "run_mpi_test: FAILED: killed after the ${limit} s limit (a hang)"
  exit 1
fi
if grep -q "FAIL" "$out"; then
  echo "run_mpi_test: FAILED: a rank reported a failure"
  exit 1
fi
if [[ $mode == survivors ]]; then
  passed=$(grep -c ": PASS " "$out")
  if [[ $passed -ne $((np - 1)) ]]; then
    echo "run_mpi_test: FAILED: $passed survivors reported PASS, expected $((np - 1))"
    exit 1
  fi
  exit 0
fi
if [[ $rc -ne 0 ]]; then
  echo "run_mpi_test: FAILED: mpirun exited $rc"
  exit 1
fi
exit 0
