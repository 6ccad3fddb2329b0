#!/usr/bin/env bash
# What loading libosftrt costs a CPU program (issue 42): bench/bench_startup.c
# built against each given library build, then run as fresh processes in
# turn (A B A B ...), so that the figures of one run compare. Prints, per
# build: the median wall time of the whole process (start to first FLCE call
# and exit), VmRSS at main and after the call, the CUDA-side mappings, and
# the ratios to the first build.
#
# Usage: bench/run_startup.sh [-n RUNS] [-s "TOKENS HIDDEN VOCAB"] NAME=LIBDIR ...
#   LIBDIR: a folder with libosftrt.so.1 (a build tree or an install's lib).
#   The first is the reference, e.g. cpu-only=build-cpu cuda=build.
set -euo pipefail
runs=21
shape="8 64 1024"
while [[ ${1:-} == -* ]]; do
  case $1 in
    -n) runs=$2; shift 2 ;;
    -s) shape=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
[[ $# -ge 1 ]] || { echo "usage: $0 [-n RUNS] NAME=LIBDIR ..." >&2; exit 2; }
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
names=()
for spec in "$@"; do
  name=${spec%%=*} dir=$(cd "${spec#*=}" && pwd)
  cc -O2 -std=gnu11 -I"$here/../include" "$here/bench_startup.c" -L"$dir" -losftrt \
    -Wl,-rpath,"$dir" -o "$work/$name"
  names+=("$name")
done
python3 - "$work" "$runs" "$shape" "${names[@]}" <<'PY'
import os, statistics, subprocess, sys, time
work, runs, shape, names = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4:]
env = dict(os.environ, OPENBLAS_NUM_THREADS=os.environ.get("OPENBLAS_NUM_THREADS", "1"))
wall = {n: [] for n in names}
last = {}
for r in range(runs + 1):  # the first round warms the page cache
    for n in names:
        t = time.perf_counter()
        out = subprocess.run([os.path.join(work, n)] + shape, capture_output=True, text=True, env=env, check=True).stdout
        if r:
            wall[n].append(time.perf_counter() - t)
        last[n] = dict(kv.split("=") for kv in out.split())
ref = names[0]
print("FLCE call: %s tokens, hidden %s, vocabulary %s; OPENBLAS_NUM_THREADS=%s" % (*shape, env["OPENBLAS_NUM_THREADS"]))
print("| build | wall ms (median of %d) | / %s | VmRSS at main MiB | after FLCE MiB | CUDA mappings main/after |" % (runs, ref))
print("| --- | ---: | ---: | ---: | ---: | ---: |")
for n in names:
    m = statistics.median(wall[n]) * 1e3
    print("| %s | %.1f | %.3f | %.1f | %.1f | %s/%s |" % (
        n, m, m / (statistics.median(wall[ref]) * 1e3), int(last[n]["rss_main_kib"]) / 1024,
        int(last[n]["rss_after_kib"]) / 1024, last[n]["cuda_maps_main"], last[n]["cuda_maps_after"]))
PY
