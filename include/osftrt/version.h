/**
 * @file
 * @brief libosftrt — run-time version and build information.
 *
 * @code
 *   puts(osft_build_info());
 *   if (osft_has_feature(OSFT_FEATURE_CUDA)) {
 *     int gpus = 0;
 *     osft_device_count(OSFT_DEVICE_CUDA, &gpus);
 *   }
 * @endcode
 */
#ifndef OSFTRT_VERSION_H
#define OSFTRT_VERSION_H

#include "osftrt/export.h"

#ifdef __cplusplus
extern "C" {
#endif

/**
 * @defgroup osftrt_version Run-time version and build information
 * @brief The loaded library's version, build and optional components
 * (osftrt/version.h).
 * @{
 */

/**
 * @brief The version of the loaded library as MAJOR * 10000 + MINOR * 100 +
 * PATCH (compare with OSFT_VERSION_NUMBER from the headers).
 *
 * @return The version number, e.g. 10000 for 1.0.0.
 * @par Thread safety
 * Cannot fail; thread-safe.
 */
OSFT_API unsigned osft_version(void);

/**
 * @brief The loaded library's version as "MAJOR.MINOR.PATCH".
 *
 * @return Static string owned by the library; never NULL.
 * @par Thread safety
 * thread-safe.
 */
OSFT_API const char *osft_version_string(void);

/**
 * @brief One line describing how the library was built: version, compiler,
 * build type, BLAS, CUDA toolkit and architectures, NCCL and MPI.
 *
 * Meant for bug reports and logs.
 *
 * @return Static string owned by the library; never NULL.
 * @par Thread safety
 * thread-safe.
 */
OSFT_API const char *osft_build_info(void);

/** @brief Optional components. Values are fixed forever (ABI.md). */
typedef enum osft_feature_e {
  OSFT_FEATURE_CUDA = 1, /**< CUDA backend: cuBLAS, cuSOLVER, own kernels */
  OSFT_FEATURE_NCCL = 2, /**< NCCL communicators (needs OSFT_FEATURE_CUDA) */
  OSFT_FEATURE_MPI = 3   /**< MPI communicators for CPU ranks */
} osft_feature_t;

/**
 * @brief Whether an optional component was compiled into this library.
 *
 * Being compiled in says nothing about hardware: use
 * osft_device_count() (osftrt/context.h) to learn whether a GPU is present.
 *
 * @param[in] feature  The component (any value).
 * @return 1 if the component was compiled into this library, 0 if not or if
 * the value is unknown.
 * @par Thread safety
 * Cannot fail; thread-safe.
 */
OSFT_API int osft_has_feature(osft_feature_t feature);

/** @} */

#ifdef __cplusplus
}
#endif

#endif /* OSFTRT_VERSION_H */
