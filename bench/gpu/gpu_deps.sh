# shellcheck shell=bash
# Sourced by the GPU device scripts (run_gpu_checks.sh, run_hf_step_gpu.sh):
# gpu_deps puts what `bash bench/gpu/run_gpu_checks.sh --prepare` packed
# here on the GPU machine's paths: the Debian libraries of .gpu/deps.tar.xz
# (OpenBLAS, LAPACKE, CMocka, DLPack; its env.sh sets CMAKE_PREFIX_PATH,
# CPATH, LIBRARY_PATH, LD_LIBRARY_PATH) and SWIG from .gpu/swig.tar.xz where
# the machine has none; nvcc on PATH where only /usr/local/cuda has it.
# Run from the repository root.
gpu_deps() {
  if [[ -f .gpu/deps.tar.xz ]]; then
    local d=/tmp/osftrt-deps
    [[ -f $d/env.sh ]] || { mkdir -p $d && tar xJf .gpu/deps.tar.xz -C $d; }
    # shellcheck source=/dev/null
    source $d/env.sh
  fi
  if ! command -v swig >/dev/null && [[ -f .gpu/swig.tar.xz ]]; then
    [[ -x /tmp/osftrt-swig/swig/bin/swig ]] || { mkdir -p /tmp/osftrt-swig && tar xJf .gpu/swig.tar.xz -C /tmp/osftrt-swig; }
    export PATH=/tmp/osftrt-swig/swig/bin:$PATH
  fi
  command -v nvcc >/dev/null || [[ ! -x /usr/local/cuda/bin/nvcc ]] || export PATH=/usr/local/cuda/bin:$PATH
}
