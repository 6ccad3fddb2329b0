#!/usr/bin/env bash
# Every GPU check of libosftrt in one device call (<= 9 minutes on a 16-core
# H100 machine): build for sm_90 with -Werror, every ctest test (the CUDA
# ones serially), the example trainer with --device cuda --check against the
# same run on the CPU, and the Python binding's pytest with the CUDA tests
# required (bindings/python/tests/test_cuda.py). One log per part under $OUT.
#
# Once per session, here (no GPU needed; needs apt-get download, as Debian
# has it, and ../shared/gpu/pack-deps.sh or OSFTRT_PACK_DEPS):
#   bash bench/gpu/run_gpu_checks.sh --prepare
#     packs .gpu/deps.tar.xz (OpenBLAS, LAPACKE, CMocka, DLPack: pack-deps.sh)
#     and .gpu/swig.tar.xz (SWIG, which the GPU machine lacks: the binding is
#     generated there, as CI does) and lists /.gpu/ in .git/info/exclude.
# Then the device tool's run, one call:
#   command: bash bench/gpu/run_gpu_checks.sh     carry: [".gpu"]     timeout_s: 570
# On the GPU machine it needs nvcc, cmake, ninja and a python3 with torch
# (CUDA), pytest and scikit-build-core (the image has them). Nothing is fetched.
#
# Here, without a GPU, the same script end to end (CPU-only build unless
# OSFTRT_GPU_CHECKS_CUDA=ON; GPU parts report "no GPU" and count as skipped):
#   bash bench/gpu/run_gpu_checks.sh --dry-run     (or OSFTRT_GPU_CHECKS_DRY=1)
#
# Parts, each under `timeout` within one overall budget, each a log:
#   env      env.log      machine, GPU, compilers, python packages
#   build    build.log    configure (Ninja, RelWithDebInfo as CI, OSFTRT_CUDA=ON,
#                         sm_90, OSFTRT_WERROR=ON, benchmarks off) + build + install
#                         into BUILD/prefix; a -Werror failure fails the part and
#                         the build is redone without it so the other parts still run
#   probe    probe.log    test_backend_module alone (issue 55): counting the GPUs
#                         maps the CUDA driver only (no module, cuBLAS, cuSOLVER,
#                         NCCL), the count is the driver's (> 0 on the GPU), and the
#                         first CUDA context then loads the module; the line
#                         "osft_device_count(CUDA) = N; VmRSS A -> B KiB" in the summary
#   ctest    ctest.log    every test but `packaging` in parallel, then the *_cuda
#                         tests and mpi_nccl_np2 one at a time; on a GPU a skipped
#                         *_cuda test fails the part (mpi_nccl_np2 may skip: 2 GPUs)
#   trainer  trainer.log  osftrt_train --check (ctest example_train_seed1's shortened
#                         run, --print-losses) with --device cuda and --device cpu,
#                         both tables, and every loss compared (relative, < 5e-2)
#   python   python.log   pip-installs bindings/python against BUILD/prefix into a
#                         temporary target (no network: --no-build-isolation --no-deps
#                         --no-index), then pytest bindings/python/tests with
#                         OSFTRT_REQUIRE_CUDA=1 on a GPU (test_cuda.py fails, never skips)
# summary.txt: one line per part (PASS, FAIL, SKIP, TIMEOUT) and the verdict.
# Exit status 0 when every part passed (a dry run also accepts skips).
#
# Environment: OUT (default /tmp/osftrt-gpu-checks), OSFTRT_GPU_CHECKS_BUILD
# (default build-gpu-checks), OSFTRT_GPU_CHECKS_BUDGET (seconds, default 530),
# OSFTRT_CUDA_ARCHS (default 90), OSFTRT_GPU_CHECKS_JOBS (default nproc),
# OSFTRT_GPU_CHECKS_CUDA (ON, OFF; default ON, OFF in a dry run),
# OSFTRT_GPU_CHECKS_BENCH (OFF), OSFTRT_GPU_CHECKS_PARTS (which of probe,
# ctest, trainer, python run after env and build; default all), OSFTRT_PYTHON (default: the first of python3,
# /usr/bin/python3, build-pyvenv/bin/python with torch, pytest and
# scikit_build_core).
set -uo pipefail
self=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")
root=$(cd "$(dirname "$self")/../.." && pwd)
cd "$root" || exit 2

usage() { sed -n '2,/^set -uo pipefail/p' "$self" | sed '$d; s/^# \{0,1\}//'; }

mode=${OSFTRT_GC_MODE:-gpu}
case "${1:-}" in
  "" | --run) [[ ${OSFTRT_GPU_CHECKS_DRY:-0} == 1 ]] && mode=dry ;;
  --dry-run) mode=dry ;;
  --prepare) mode=prepare ;;
  --part) mode=part ;;
  -h | --help) usage; exit 0 ;;
  *) usage >&2; exit 2 ;;
esac

# ------------------------------------------------------------------ prepare
prepare() {
  mkdir -p .gpu
  local ex
  ex=$(git rev-parse --git-path info/exclude 2>/dev/null) || ex=.git/info/exclude
  mkdir -p "$(dirname "$ex")"
  grep -qx '/.gpu/' "$ex" 2>/dev/null || echo '/.gpu/' >> "$ex"
  if [[ ! -s .gpu/deps.tar.xz ]]; then
    local pd=${OSFTRT_PACK_DEPS:-$root/../shared/gpu/pack-deps.sh}
    [[ -f $pd ]] || { echo "prepare: no pack-deps.sh at $pd (set OSFTRT_PACK_DEPS)" >&2; return 1; }
    bash "$pd" .gpu/deps.tar.xz || return 1
  fi
  if [[ ! -s .gpu/swig.tar.xz ]]; then
    local w
    w=$(mktemp -d) || return 1
    mkdir -p "$w/debs" "$w/x" "$w/swig/bin" "$w/swig/libexec" "$w/swig/lib"
    # swig4.0 holds the program on Debian 12 (swig itself on later releases);
    # libpcre2 travels beside it, used only if the machine's is missing.
    (cd "$w/debs" && { apt-get download swig swig4.0 libpcre2-8-0 >/dev/null 2>&1 ||
      apt-get download swig libpcre2-8-0 >/dev/null; }) || { echo "prepare: apt-get download swig failed" >&2; rm -rf "$w"; return 1; }
    local f
    for f in "$w"/debs/*.deb; do dpkg -x "$f" "$w/x"; done
    local bin share
    bin=$(find "$w/x/usr/bin" -name 'swig*' -type f ! -name '*ccache*' | head -1)
    share=$(find "$w/x/usr/share" -maxdepth 1 -name 'swig*' -type d | head -1)
    [[ -n $bin && -n $share ]] || { echo "prepare: no swig program or library in the packages" >&2; rm -rf "$w"; return 1; }
    cp "$bin" "$w/swig/libexec/swig"
    cp -r "$share" "$w/swig/share"
    cp -P "$w"/x/usr/lib/x86_64-linux-gnu/libpcre2-8.so* "$w/swig/lib/" 2>/dev/null || true
    cat > "$w/swig/bin/swig" <<'SH'
#!/bin/sh
# SWIG unpacked anywhere: its library beside it, the bundled libpcre2 only if needed.
d=$(cd "$(dirname "$0")/.." && pwd)
export SWIG_LIB="$d/share"
"$d/libexec/swig" -version >/dev/null 2>&1 || export LD_LIBRARY_PATH="$d/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
exec "$d/libexec/swig" "$@"
SH
    chmod +x "$w/swig/bin/swig"
    tar cJf .gpu/swig.tar.xz -C "$w" swig
    rm -rf "$w"
  fi
  ls -la .gpu
  echo "prepared; device call: command 'bash bench/gpu/run_gpu_checks.sh', carry [\".gpu\"], timeout_s 570"
}

# -------------------------------------------------------------- common bits
setup_env() {
  export OSFTRT_GC_MODE=$mode
  export OSFTRT_GC_OUT=${OSFTRT_GC_OUT:-${OUT:-/tmp/osftrt-gpu-checks}}
  export OSFTRT_GC_STATE=${OSFTRT_GC_STATE:-$(mktemp -d "${TMPDIR:-/tmp}/osftrt-gpu-checks.XXXXXX")}
  export OSFTRT_GC_BUILD=${OSFTRT_GPU_CHECKS_BUILD:-$root/build-gpu-checks}
  export OSFTRT_GC_JOBS=${OSFTRT_GPU_CHECKS_JOBS:-$(nproc)}
  local cuda_default=ON
  [[ $mode == dry ]] && cuda_default=OFF
  export OSFTRT_GC_CUDA=${OSFTRT_GPU_CHECKS_CUDA:-$cuda_default}
  mkdir -p "$OSFTRT_GC_OUT"
}

deps() { # the packed Debian libraries and SWIG (from --prepare), where the machine lacks them
  # shellcheck source=gpu_deps.sh
  source "$root/bench/gpu/gpu_deps.sh"
  gpu_deps
}

nccl_dir() { # NCCL from the nvidia-nccl wheel that PyTorch brings, if any
  "$OSFTRT_GC_PY" -c 'import importlib.util as u; s = u.find_spec("nvidia.nccl"); print(list(s.submodule_search_locations)[0])' 2>/dev/null
}

find_python() {
  local c
  for c in ${OSFTRT_PYTHON:-} python3 /usr/bin/python3 "$root/build-pyvenv/bin/python"; do
    if command -v "$c" >/dev/null 2>&1 && "$c" -c 'import torch, pytest, scikit_build_core' >/dev/null 2>&1; then
      command -v "$c"
      return 0
    fi
  done
  command -v python3
}

has_gpu() { [[ -f $OSFTRT_GC_STATE/gpu ]]; }
detail() { echo "$*" > "$OSFTRT_GC_STATE/$part.detail"; }

# ------------------------------------------------------------------- parts
part_env() {
  {
    echo "date: $(date -u +%FT%TZ)   mode: $mode   budget: ${OSFTRT_GPU_CHECKS_BUDGET:-530} s"
    echo "commit: $(git rev-parse --short HEAD 2>/dev/null) ($(git status --porcelain 2>/dev/null | wc -l) changed files)"
    echo "cpu: $(nproc) cores; jobs: $OSFTRT_GC_JOBS; build: $OSFTRT_GC_BUILD (CUDA $OSFTRT_GC_CUDA, archs ${OSFTRT_CUDA_ARCHS:-90})"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 || echo "nvidia-smi: none"
    echo "nvcc: $(nvcc --version 2>/dev/null | tail -1 || echo none)"
    echo "cmake: $(cmake --version 2>/dev/null | head -1); ninja: $(ninja --version 2>/dev/null); cc: $(cc --version 2>/dev/null | head -1)"
    echo "swig: $(command -v swig) $(swig -version 2>/dev/null | grep -i version)"
    echo "python: $OSFTRT_GC_PY"
    "$OSFTRT_GC_PY" - <<'PY' 2>&1
import importlib, os, sysconfig
print("  python", sysconfig.get_python_version(), "Python.h:", os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))
for m in ("torch", "numpy", "pytest", "scikit_build_core"):
    try:
        v = importlib.import_module(m)
        print("  %s %s" % (m, getattr(v, "__version__", "?")))
    except Exception as e:
        print("  %s: MISSING (%s)" % (m, e))
try:
    import torch
    print("  torch CUDA %s, devices %d" % (torch.version.cuda, torch.cuda.device_count() if torch.cuda.is_available() else 0))
except Exception:
    pass
PY
  } > "$OSFTRT_GC_OUT/env.log" 2>&1
  local warn=""
  [[ -f .gpu/deps.tar.xz || -f /usr/include/dlpack/dlpack.h ]] || warn+="; no .gpu/deps.tar.xz nor system DLPack: run --prepare here first"
  command -v swig >/dev/null || warn+="; no swig: the binding cannot build (run --prepare here first)"
  local gpus=0
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ') || gpus=0
  if [[ $gpus -eq 0 ]]; then
    gpus=$("$OSFTRT_GC_PY" -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)' 2>/dev/null) || gpus=0
  fi
  if [[ ${gpus:-0} -gt 0 ]]; then
    touch "$OSFTRT_GC_STATE/gpu"
    detail "$gpus GPU(s): $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)$warn"
  elif [[ $mode == dry ]]; then
    detail "no GPU (dry run: GPU parts report skips)$warn"
  else
    detail "no GPU here: run on the GPU machine, or use --dry-run$warn"
    return 1
  fi
  cat "$OSFTRT_GC_OUT/env.log"
}

configure_build() { # $1: ON|OFF for -Werror
  local b=$OSFTRT_GC_BUILD extra=() nd lib
  if [[ $OSFTRT_GC_CUDA == ON ]] && nd=$(nccl_dir) && [[ -f $nd/include/nccl.h ]]; then
    lib=$(ls "$nd"/lib/libnccl.so* 2>/dev/null | head -1)
    [[ -n $lib ]] && extra=(-DNCCL_INCLUDE_DIR="$nd/include" -DNCCL_LIBRARY="$lib")
  fi
  cmake -S . -B "$b" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DOSFTRT_CUDA="$OSFTRT_GC_CUDA" \
    -DCMAKE_CUDA_ARCHITECTURES="${OSFTRT_CUDA_ARCHS:-90}" -DOSFTRT_WERROR="$1" -DOSFTRT_ABI_CHECK=OFF \
    -DOSFTRT_BUILD_BENCH="${OSFTRT_GPU_CHECKS_BENCH:-OFF}" -DCMAKE_INSTALL_PREFIX="$b/prefix" "${extra[@]}" &&
    cmake --build "$b" -j "$OSFTRT_GC_JOBS" && cmake --install "$b" > /dev/null
}

part_build() {
  local log=$OSFTRT_GC_OUT/build.log t0=$SECONDS
  if configure_build ON > "$log" 2>&1; then
    touch "$OSFTRT_GC_STATE/built"
    detail "-Werror, $(grep -E '^-- +CUDA ' "$log" | tail -1 | sed 's/^-- *//' | tr -s ' '), $((SECONDS - t0)) s"
    grep -E '^-- +(CUDA|NCCL|MPI|BLAS)' "$log"
    return 0
  fi
  local werr
  werr=$(grep -c -- '\[-Werror' "$log")
  tail -40 "$log"
  if [[ $werr -gt 0 ]]; then
    echo "== -Werror failed ($werr warnings as errors); building again without -Werror so the other parts run" | tee -a "$log"
    if configure_build OFF >> "$log" 2>&1; then
      touch "$OSFTRT_GC_STATE/built"
      detail "FAILS with -Werror ($werr warnings, see build.log); built without it for the other parts"
      return 1
    fi
  fi
  detail "build failed (see build.log)"
  return 1
}

part_ctest() {
  local b=$OSFTRT_GC_BUILD log=$OSFTRT_GC_OUT/ctest.log rc=0
  {
    echo "== parallel (-j $OSFTRT_GC_JOBS): every test but packaging, the *_cuda tests and mpi_nccl_np2"
    ctest --test-dir "$b" -E '_cuda$|^packaging$|^mpi_nccl_np2$' -j "$OSFTRT_GC_JOBS" --output-on-failure --timeout 240 || rc=1
    grep -h '^SKIPPED:' "$b/Testing/Temporary/LastTest.log" 2>/dev/null | sort | uniq -c
    echo
    echo "== serial: the *_cuda tests and mpi_nccl_np2"
    ctest --test-dir "$b" -R '_cuda$|^mpi_nccl_np2$' --output-on-failure --timeout 240 || rc=1
    grep -h '^SKIPPED:' "$b/Testing/Temporary/LastTest.log" 2>/dev/null | sort | uniq -c
  } > "$log" 2>&1
  local totals cuda_n cuda_skipped
  totals=$(grep -E 'tests passed, [0-9]+ tests? failed out of' "$log" | sed -E 's/.*tests passed, ([0-9]+) tests? failed out of ([0-9]+)/\1 failed of \2/' | paste -sd ';' -)
  cuda_n=$(grep -cE 'Test +#[0-9]+: [A-Za-z0-9_]+_cuda ' "$log")
  cuda_skipped=$(grep -E 'Test +#[0-9]+: [A-Za-z0-9_]+_cuda .*(Skipped|Not Run)' "$log" | awk '{print $4}' | paste -sd ' ' -)
  grep -E 'tests passed|\*\*\*(Failed|Exception|Timeout)|Skipped|Not Run' "$log" | tail -40
  if [[ -n $cuda_skipped ]]; then
    if has_gpu; then
      echo "FAIL: CUDA tests skipped on the GPU: $cuda_skipped" | tee -a "$log"
      rc=1
    else
      detail "$totals (parallel; serial); $cuda_n CUDA tests, skipped without a GPU; rc $rc"
      [[ $rc -eq 0 ]] && return 3
      return 1
    fi
  fi
  detail "$totals (parallel; serial); $cuda_n CUDA tests${cuda_skipped:+, skipped: $cuda_skipped}"
  return $rc
}

part_probe() { # the light GPU probe (issue 55), on its own so its figures show
  local t=$OSFTRT_GC_BUILD/tests/test_backend_module log=$OSFTRT_GC_OUT/probe.log rc
  [[ -x $t ]] || { detail "no $t (tests not built)"; echo "no test" > "$log"; return 1; }
  CMOCKA_MESSAGE_OUTPUT=stdout "$t" > "$log" 2>&1
  rc=$?
  local line
  line=$(grep -m1 'osft_device_count(CUDA) = ' "$log")
  tail -20 "$log"
  if has_gpu && [[ $line =~ \ =\ 0\; ]]; then
    echo "FAIL: a GPU is here, the probe counted none" | tee -a "$log"
    rc=1
  fi
  detail "${line:-no count line}; $(grep -m1 '^CUDA driver:' "$log"); exit $rc"
  [[ $rc -eq 0 ]] || return 1
  has_gpu || return 3
  return 0
}

TRAIN_FLAGS=(--check --seed 1 --pretrain-steps 150 --steps 60 --batch 4 --seq 64 --ft-lr 3e-3
  --eval-every 5 --eval-tokens 2048 --log-every 30 --print-losses)

part_trainer() {
  local t=$OSFTRT_GC_BUILD/examples/osftrt_train log=$OSFTRT_GC_OUT/trainer.log st=$OSFTRT_GC_STATE
  [[ -x $t ]] || { detail "no $t (examples not built)"; echo "no trainer" > "$log"; return 1; }
  local t0=$SECONDS rc_cpu rc_cuda=skip
  OPENBLAS_NUM_THREADS=1 "$t" "${TRAIN_FLAGS[@]}" --device cpu > "$st/train_cpu.out" 2>&1 &
  local cpu_pid=$!
  if has_gpu; then
    "$t" "${TRAIN_FLAGS[@]}" --device cuda > "$st/train_cuda.out" 2>&1
    rc_cuda=$?
  else
    echo "no GPU: --device cuda not run" > "$st/train_cuda.out"
  fi
  local t_cuda=$((SECONDS - t0))
  wait $cpu_pid
  rc_cpu=$?
  {
    echo "flags: ${TRAIN_FLAGS[*]}"
    for dev in cuda cpu; do
      echo
      echo "== --device $dev: exit $([[ $dev == cpu ]] && echo $rc_cpu || echo $rc_cuda)"
      grep -v '^loss-bits' "$st/train_$dev.out"
    done
    echo
    echo "== losses, cuda vs cpu"
  } > "$log"
  local cmp="" rc=0
  if [[ $rc_cuda != skip ]]; then
    cmp=$("$OSFTRT_GC_PY" - "$st/train_cpu.out" "$st/train_cuda.out" <<'PY' 2>&1
import sys
def losses(path):
    return [(l.rsplit(" ", 1)[0], float.fromhex(l.split()[-1])) for l in open(path) if l.startswith("loss-bits")]
a, b = losses(sys.argv[1]), losses(sys.argv[2])
if len(a) != len(b) or len(a) < 20:
    print("FAIL: the runs logged different losses (%d cpu, %d cuda)" % (len(a), len(b)))
    sys.exit(1)
rel = [abs(x - y) / max(abs(x), 1e-6) for (_, x), (_, y) in zip(a, b)]
k = max(range(len(rel)), key=rel.__getitem__)
print("%d losses, worst relative difference %.2e (%s: cpu %.6g, cuda %.6g), mean %.2e"
      % (len(a), rel[k], a[k][0], a[k][1], b[k][1], sum(rel) / len(rel)))
sys.exit(0 if rel[k] < 5e-2 else 1)
PY
)
    [[ $? -eq 0 ]] || rc=1
    echo "$cmp" >> "$log"
  else
    echo "no GPU: not compared" >> "$log"
  fi
  [[ $rc_cpu -eq 0 ]] || rc=1
  if [[ $rc_cuda == skip ]]; then
    detail "cpu exit $rc_cpu (--check); cuda not run (no GPU)"
    [[ $rc -eq 0 ]] && return 3
    return 1
  fi
  [[ $rc_cuda -eq 0 ]] || rc=1
  detail "cuda exit $rc_cuda in ${t_cuda} s, cpu exit $rc_cpu (--check both); ${cmp%%$'\n'*}"
  grep -E '^\||^device|done' "$st/train_cuda.out" | head -12
  return $rc
}

part_pybuild() { # in the background during ctest and the trainer; python.log
  local log=$OSFTRT_GC_OUT/python.log tgt=$OSFTRT_GC_STATE/py
  rm -rf "$tgt"
  {
    echo "== pip install ./bindings/python (against $OSFTRT_GC_BUILD/prefix, into $tgt)"
    CMAKE_PREFIX_PATH="$OSFTRT_GC_BUILD/prefix${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}" \
      PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore \
      "$OSFTRT_GC_PY" -m pip install --no-build-isolation --no-deps --no-index --no-cache-dir -q \
      --target "$tgt" --config-settings=build-dir="$OSFTRT_GC_BUILD/python" \
      --config-settings=cmake.define.OSFTRT_PYTHON_SYSTEM_LIBRARY=ON ./bindings/python
  } > "$log" 2>&1
}

part_python() {
  local log=$OSFTRT_GC_OUT/python.log tgt=$OSFTRT_GC_STATE/py rc=0
  if [[ ! -f $OSFTRT_GC_STATE/pybuild.rc ]]; then
    part_pybuild
    echo $? > "$OSFTRT_GC_STATE/pybuild.rc"
  fi
  if [[ $(cat "$OSFTRT_GC_STATE/pybuild.rc") != 0 ]]; then
    tail -30 "$log"
    detail "pip install of the binding failed (exit $(cat "$OSFTRT_GC_STATE/pybuild.rc"); see python.log)"
    return 1
  fi
  local req=0 cu
  has_gpu && req=1
  # the installed libosftrt has no RPATH to the toolkit; torch (imported first by
  # conftest.py) usually brings cuBLAS already, this is the fallback
  cu=$(dirname "$(command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)")/../lib64
  [[ $OSFTRT_GC_CUDA == ON && -d $cu ]] && export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$(cd "$cu" && pwd)"
  echo "== pytest bindings/python/tests (OSFTRT_REQUIRE_CUDA=$req)" >> "$log"
  (cd bindings/python/tests &&
    PYTHONPATH="$tgt${PYTHONPATH:+:$PYTHONPATH}" OSFTRT_PREFIX="$OSFTRT_GC_BUILD/prefix" OSFTRT_REQUIRE_CUDA=$req OPENBLAS_THREAD_TIMEOUT=4 PYTHONUNBUFFERED=1 \
      "$OSFTRT_GC_PY" -m pytest -q -p no:cacheprovider -rs --junitxml="$OSFTRT_GC_STATE/pytest.xml" .) >> "$log" 2>&1 || rc=1
  local counts
  counts=$("$OSFTRT_GC_PY" - "$OSFTRT_GC_STATE/pytest.xml" <<'PY' 2>&1
import sys, xml.etree.ElementTree as ET
n = {"all": [0, 0, 0, 0], "cuda": [0, 0, 0, 0]}  # passed, failed, skipped, total
for tc in ET.parse(sys.argv[1]).iter("testcase"):
    kind = 1 if tc.find("failure") is not None or tc.find("error") is not None else 2 if tc.find("skipped") is not None else 0
    for k in ("all", "cuda") if "test_cuda" in (tc.get("classname") or "") else ("all",):
        n[k][kind] += 1
        n[k][3] += 1
a, c = n["all"], n["cuda"]
print("%d passed, %d failed, %d skipped of %d; test_cuda.py: %d passed, %d failed, %d skipped of %d" % (*a, *c))
PY
)
  echo "$counts" >> "$log"
  tail -15 "$log"
  if [[ $counts =~ test_cuda.py:\ ([0-9]+)\ passed,\ ([0-9]+)\ failed,\ ([0-9]+)\ skipped\ of\ ([0-9]+) ]]; then
    local cp=${BASH_REMATCH[1]} cs=${BASH_REMATCH[3]} ct=${BASH_REMATCH[4]}
    if [[ $ct -eq 0 ]]; then
      counts="$counts (test_cuda.py not collected)"
      rc=1
    elif has_gpu && [[ $cp -ne $ct ]]; then
      rc=1
    elif ! has_gpu && [[ $rc -eq 0 && $cs -eq $ct ]]; then
      detail "$counts; CUDA tests skipped (no GPU)"
      return 3
    fi
  else
    rc=1
  fi
  detail "$counts"
  return $rc
}

# ----------------------------------------------------------------- driver
if [[ $mode == prepare ]]; then
  prepare
  exit $?
fi
if [[ $mode == part ]]; then # one part, under timeout, in a process of its own
  mode=$OSFTRT_GC_MODE
  part=$2
  deps
  "part_$part"
  exit $?
fi

setup_env
deps
OSFTRT_GC_PY=$(find_python)
export OSFTRT_GC_PY
out=$OSFTRT_GC_OUT
state=$OSFTRT_GC_STATE
trap 'rm -rf "$state"' EXIT
budget=${OSFTRT_GPU_CHECKS_BUDGET:-530}
start=$SECONDS
verdict=0
: > "$out/summary.txt"

# run_part NAME CAP RESERVE: runs the part under timeout, at most CAP seconds
# and no later than RESERVE seconds before the budget ends.
run_part() {
  local name=$1 cap=$(($2 * budget / 530)) reserve=$3 left t rc t0=$SECONDS status
  if [[ ! " env build ${OSFTRT_GPU_CHECKS_PARTS:-probe ctest trainer python} " =~ \ $name\  ]]; then
    printf '%-8s %-7s %s\n' "$name" "-" "not selected (OSFTRT_GPU_CHECKS_PARTS)" | tee -a "$out/summary.txt"
    return 0
  fi
  left=$((budget - (SECONDS - start) - reserve))
  t=$((cap < left ? cap : left))
  if [[ $t -lt 15 ]]; then
    printf '%-8s %-7s %s\n' "$name" SKIP "no time left in the ${budget} s budget" | tee -a "$out/summary.txt"
    verdict=1
    return 1
  fi
  echo "=== $name (at most $t s)"
  timeout -k 10 "$t" bash "$self" --part "$name"
  rc=$?
  case $rc in
    0) status=PASS ;;
    3) status=SKIP; [[ $mode == dry ]] || verdict=1 ;;
    124 | 137) status=TIMEOUT; verdict=1; echo "timed out after $t s" > "$state/$name.detail" ;;
    *) status=FAIL; verdict=1 ;;
  esac
  printf '%-8s %-7s %4d s  %s\n' "$name" "$status" $((SECONDS - t0)) "$(cat "$state/$name.detail" 2>/dev/null)" |
    tee -a "$out/summary.txt"
  return $rc
}

run_part env 30 0 || { [[ -f $state/gpu || $mode == dry ]] || { echo "verdict: FAIL (no GPU)" | tee -a "$out/summary.txt"; exit 1; }; }
run_part build 330 150
if [[ -f $state/built ]]; then
  # the binding's build needs only the installed library: overlap it with ctest and the trainer
  (timeout -k 10 300 bash "$self" --part pybuild; echo $? > "$state/pybuild.rc") &
  pybuild_pid=$!
  run_part probe 20 130
  run_part ctest 200 110
  run_part trainer 120 60
  wait "$pybuild_pid"
  run_part python 240 0
else
  for p in probe ctest trainer python; do
    printf '%-8s %-7s %s\n' "$p" SKIP "no build" | tee -a "$out/summary.txt"
  done
  verdict=1
fi
echo "verdict: $([[ $verdict -eq 0 ]] && echo PASS || echo FAIL) ($mode run, $((SECONDS - start)) s; logs in $out)" |
  tee -a "$out/summary.txt"
exit $verdict
