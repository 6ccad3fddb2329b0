#!/usr/bin/env bash
# libosftrt's CPU ops against PyTorch 2.x from PyPI in one process, once per
# CPU GEMM engine (issue 29), written to bench/results/engines_cpu.md with
# the CPU model and ISA.
#
#   bash bench/python/run_engines.sh VENV BUILD_DIR...
#
# VENV: a venv with PyPI's torch and the osftrt package (its extension
# loads the libosftrt.so.1 of each BUILD_DIR through LD_LIBRARY_PATH);
# BUILD_DIR: builds configured with -DOSFTRT_CPU_BLAS=OpenBLAS or MKL, e.g.
#   bash bench/python/run_engines.sh build-pyvenv build-eng-mkl build-eng-openblas
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
venv=$(cd "$1" && pwd)
shift
out=$root/bench/results/engines_cpu.md
{
  echo "# CPU GEMM engines: libosftrt vs PyTorch $("$venv/bin/python" -c 'import torch; print(torch.__version__)') in one process"
  echo
  echo "- machine: $(lscpu | sed -n 's/^Model name: *//p' | head -1) (family $(grep -m1 'cpu family' /proc/cpuinfo | cut -d: -f2 | tr -d ' '), model $(grep -m1 -E '^model\s' /proc/cpuinfo | cut -d: -f2 | tr -d ' ')), $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB"
  echo "- ISA: $(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|avx512f|avx512_bf16|amx_bf16|amx_tile)$' | tr '\n' ' ')"
  echo "- date: $(date -u +%Y-%m-%d)"
  echo "- command: \`bash bench/python/run_engines.sh $(basename "$venv") $*\`"
  for build in "$@"; do
    dir=$(cd "$build" && pwd)
    echo
    echo "## $(basename "$dir")"
    echo
    echo "\`LD_LIBRARY_PATH=$(basename "$dir") $(basename "$venv")/bin/python bench/python/bench_engines.py\`"
    echo
    LD_LIBRARY_PATH=$dir "$venv/bin/python" "$root/bench/python/bench_engines.py"
  done
} | tee "$out.tmp"
mv "$out.tmp" "$out"
echo "wrote $out"
