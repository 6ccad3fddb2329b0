/**
 * @file
 * @brief libosftrt — export macro and compile-time version.
 *
 * This header is included by every other public header; a consumer never
 * needs to include it directly.
 *
 * @code
 *   unsigned v = osft_version();  // the loaded library: 10000 for 1.0.0
 *   if (v / 10000 != OSFT_VERSION_MAJOR || v / 100 % 100 < OSFT_VERSION_MINOR)
 *     return -1;  // osft_version_string() names the library that was found
 * @endcode
 */
#ifndef OSFTRT_EXPORT_H
#define OSFTRT_EXPORT_H

/**
 * @defgroup osftrt_export Export macro and compile-time version
 * @brief The OSFT_API marker of the public ABI and the version of the
 * headers (osftrt/export.h).
 * @{
 */

#if defined(_WIN32)
#if defined(OSFTRT_BUILDING_LIBRARY)
#define OSFT_API __declspec(dllexport)
#else
#define OSFT_API __declspec(dllimport)
#endif
#elif defined(__GNUC__) || defined(__clang__)
#define OSFT_API __attribute__((visibility("default")))
#else
#define OSFT_API
#endif

/**
 * @name Version of the headers
 * Version of the headers being compiled against. Compare with osft_version()
 * at run time: a binding or plugin should refuse a library whose major version
 * differs, or whose minor version is older than the headers it was built
 * with (a newer minor only adds functions and fields; see ABI.md).
 */
/** @{ */
/** @brief The major version of the headers. */
#define OSFT_VERSION_MAJOR 1
/** @brief The minor version of the headers. */
#define OSFT_VERSION_MINOR 4
/** @brief The patch version of the headers. */
#define OSFT_VERSION_PATCH 0
/** @} */

/** @brief MAJOR * 10000 + MINOR * 100 + PATCH, e.g. 10000 for 1.0.0. */
#define OSFT_VERSION_NUMBER \
  (OSFT_VERSION_MAJOR * 10000 + OSFT_VERSION_MINOR * 100 + OSFT_VERSION_PATCH)

/**
 * @def OSFT_API
 * @brief OSFT_API marks every function of the public ABI.
 *
 * The library is built with
 * -fvisibility=hidden and a linker version script (node OSFTRT_1.0), so only
 * symbols carrying this macro are exported.
 */

/** @} */

#endif /* OSFTRT_EXPORT_H */
