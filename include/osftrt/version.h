/*
 * libosftrt — run-time version and build information.
 */
#ifndef OSFTRT_VERSION_H
#define OSFTRT_VERSION_H

#include "osftrt/export.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * The version of the loaded library as MAJOR * 10000 + MINOR * 100 + PATCH
 * (compare with OSFT_VERSION_NUMBER from the headers). Cannot fail;
 * thread-safe.
 */
OSFT_API unsigned osft_version(void);

/* The loaded library's version as "MAJOR.MINOR.PATCH". Static string owned by
 * the library; never NULL; thread-safe. */
OSFT_API const char *osft_version_string(void);

/*
 * One line describing how the library was built: version, compiler, build
 * type, BLAS, CUDA toolkit and architectures, NCCL and MPI. Meant for bug
 * reports and logs. Static string owned by the library; never NULL;
 * thread-safe.
 */
OSFT_API const char *osft_build_info(void);

/* Optional components. Values are fixed forever (ABI.md). */
typedef enum osft_feature_e {
  OSFT_FEATURE_CUDA = 1, /* CUDA backend: cuBLAS, cuSOLVER, own kernels */
  OSFT_FEATURE_NCCL = 2, /* NCCL communicators (needs OSFT_FEATURE_CUDA) */
  OSFT_FEATURE_MPI = 3   /* MPI communicators for CPU ranks */
} osft_feature_t;

/*
 * 1 if the component was compiled into this library, 0 if not or if the
 * value is unknown. Being compiled in says nothing about hardware: use
 * osft_device_count() (osftrt/context.h) to learn whether a GPU is present.
 * Cannot fail; thread-safe.
 */
OSFT_API int osft_has_feature(osft_feature_t feature);

#ifdef __cplusplus
}
#endif

#endif /* OSFTRT_VERSION_H */
