/* Internal: which GPUs a build's CUDA architecture list can run on, so that
 * creating a context on an unsupported GPU fails at once, naming what was
 * built, instead of every later kernel failing with "no kernel image".
 * Pure string logic: C-callable and testable without a GPU. */
#ifndef OSFTRT_SRC_CORE_CUDA_ARCH_H
#define OSFTRT_SRC_CORE_CUDA_ARCH_H

#include "core/core_api.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 1 if a GPU of compute capability major.minor can run code built for
 * `archs`, a CMAKE_CUDA_ARCHITECTURES list joined by ',' or ';' ("80,90",
 * "90-real", "90a", "native" and "all" are accepted), else 0.
 *   NN / NNa       device code (sm_NN) and PTX (compute_NN)
 *   NN-real        device code only
 *   NN-virtual     PTX only
 * Device code runs on the same major version with a minor >= the built one;
 * PTX is compiled by the driver for any GPU at or above it; an "a" (arch-
 * specific) build runs only on exactly that GPU, an "f" (family) build on
 * its major version.  "native", "all" and
 * "all-major": 1 (CMake chose for the machine or built everything). */
OSFT_CORE_API int osfti_cuda_arch_supported(const char *archs, int major, int minor);

#ifdef __cplusplus
}
#endif

#endif
