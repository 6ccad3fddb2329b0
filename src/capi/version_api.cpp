/* C ABI: run-time version, build information and optional features. */
#include "osftrt/version.h"

#include <cstdio>

#include "core/cpu_blas.h"
#include "core/cuda_runtime.h"
#include "core/options.h"
#include "osftrt_build_config.h"

extern "C" {

OSFT_API unsigned osft_version(void) {
  return OSFT_VERSION_NUMBER;
}

OSFT_API const char *osft_version_string(void) {
#define OSFTI_STR2(x) #x
#define OSFTI_STR(x) OSFTI_STR2(x)
  return OSFTI_STR(OSFT_VERSION_MAJOR) "." OSFTI_STR(OSFT_VERSION_MINOR) "." OSFTI_STR(
      OSFT_VERSION_PATCH);
}

OSFT_API const char *osft_build_info(void) {
  static const char *const info = [] {
    static char buf[1024];
    const int cuda = osft::cuda::toolkit_version();
    char cuda_desc[96] = "off";
    if (cuda > 0)
      std::snprintf(cuda_desc, sizeof cuda_desc, "%d.%d (archs %s)", cuda / 1000,
                    cuda % 1000 / 10, OSFTRT_CUDA_ARCHS);
    std::snprintf(buf, sizeof buf,
                  "libosftrt %s; %s; build %s; BLAS %s: %s; CUDA %s; NCCL %s; MPI %s",
                  osft_version_string(), OSFTRT_COMPILER, OSFTRT_BUILD_TYPE,
                  OSFTRT_BLAS_NAME, osft::blas::describe(), cuda_desc,
                  OSFTRT_HAVE_NCCL ? "on" : "off", OSFTRT_HAVE_MPI ? "on" : "off");
    return buf;
  }();
  return info;
}

OSFT_API int osft_has_feature(osft_feature_t feature) {
  switch (osft::raw_enum(feature)) {
    case OSFT_FEATURE_CUDA: return osft::cuda::compiled() ? 1 : 0;
    case OSFT_FEATURE_NCCL: return OSFTRT_HAVE_NCCL;
    case OSFT_FEATURE_MPI: return OSFTRT_HAVE_MPI;
  }
  return 0;
}

}  // extern "C"
