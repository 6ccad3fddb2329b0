#!/usr/bin/env bash
# Runs the Python binding's benchmarks (bench/python/bench_python.py) and
# writes bench/results/python_cpu.md with the machine. Needs the package
# installed for /usr/bin/python3 (bash .ci/stage_python.sh does it).
#
#   bash bench/python/run.sh [--quick]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
# shellcheck source=../../.ci/lib_prefix.sh
source .ci/lib_prefix.sh
py=${OSFTRT_PYTHON:-/usr/bin/python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# shellcheck disable=SC2046
cc -O2 bench/python/percall.c $(pkg-config --cflags --libs osftrt) -Wl,-rpath,"$OSFTRT_PREFIX/lib" -o "$tmp/percall"
out=bench/results/python_cpu.md
{
  echo "# Python binding on the CPU"
  echo
  echo "- machine: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB"
  echo "- date: $(date -u +%Y-%m-%d)"
  echo "- interpreter: $("$py" --version) ($py, Debian python3-torch)"
  echo "- command: \`bash bench/python/run.sh $*\`"
  echo "- load average when started: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo
  OPENBLAS_THREAD_TIMEOUT=4 "$py" bench/python/bench_python.py --percall "$tmp/percall" "$@"
} | tee "$out.tmp"
mv "$out.tmp" "$out"
echo "wrote $out"
