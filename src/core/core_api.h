/* Internal: OSFT_CORE_API marks the core's functions that the CUDA module
 * (libosftrt_cuda.so.1, src/backend/cuda_module.h) calls back: errors,
 * logging, scratch memory, dtype names. They are exported under the
 * version node OSFTRT_CORE_PRIVATE_<exact version> (cmake/), which only a
 * module of the same build asks for; they are not part of the public ABI,
 * and no program should call them. Everything else stays hidden. */
#ifndef OSFTRT_SRC_CORE_CORE_API_H
#define OSFTRT_SRC_CORE_CORE_API_H

#if defined(__GNUC__) || defined(__clang__)
#define OSFT_CORE_API __attribute__((visibility("default")))
#else
#define OSFT_CORE_API
#endif

#endif
