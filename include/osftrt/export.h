/*
 * libosftrt — export macro and compile-time version.
 *
 * This header is included by every other public header; a consumer never
 * needs to include it directly.
 */
#ifndef OSFTRT_EXPORT_H
#define OSFTRT_EXPORT_H

/*
 * OSFT_API marks every function of the public ABI. The library is built with
 * -fvisibility=hidden and a linker version script (node OSFTRT_1.0), so only
 * symbols carrying this macro are exported.
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

/*
 * Version of the headers being compiled against. Compare with osft_version()
 * at run time: a binding or plugin should refuse a library whose major version
 * differs, or whose minor version is older than the headers it was built
 * with (a newer minor only adds functions and fields; see ABI.md).
 */
#define OSFT_VERSION_MAJOR 1
#define OSFT_VERSION_MINOR 0
#define OSFT_VERSION_PATCH 0

/* MAJOR * 10000 + MINOR * 100 + PATCH, e.g. 10000 for 1.0.0. */
#define OSFT_VERSION_NUMBER \
  (OSFT_VERSION_MAJOR * 10000 + OSFT_VERSION_MINOR * 100 + OSFT_VERSION_PATCH)

#endif /* OSFTRT_EXPORT_H */
