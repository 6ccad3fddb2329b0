/* Internal: what the core needs from the CUDA runtime and libraries. The
 * core implements it by forwarding to the CUDA module, loaded on the first
 * request that needs a GPU (src/backend/cuda_module.cpp); the module's own
 * implementation is src/cuda/runtime_cuda.cpp (copy(): memcpy_cuda.cpp).
 * In a build without CUDA, or where the module cannot be loaded, there are
 * no devices, and every request for one throws (see check_device). */
#ifndef OSFTRT_SRC_CORE_CUDA_RUNTIME_H
#define OSFTRT_SRC_CORE_CUDA_RUNTIME_H

#include <cstddef>

namespace osft::cuda {

bool compiled() noexcept;

/* Visible GPUs; 0 when there is no driver or device (or CUDA is not
 * compiled in). Maps only the CUDA driver (libcuda.so.1, cuInit and
 * cuDeviceGetCount) until the CUDA module is loaded (the first context,
 * check_device or NCCL communicator), then asks the module's runtime. A
 * count above 0 does not promise a context: the module or a library it
 * needs may still be missing (check_device says so). */
int device_count() noexcept;

/* Throws OSFT_STATUS_NOT_SUPPORTED (not compiled in) or
 * OSFT_STATUS_NO_DEVICE (no CUDA module or CUDA runtime, no driver, no GPU,
 * ordinal too large), naming `arg`. */
void check_device(int device_id, const char *arg);

/* Device memory in stream order on `stream`, from the library's own pool
 * on `device_id` (freed blocks stay cached: a free never waits for the
 * device, and a steady state asks the driver for nothing). device_malloc
 * throws OSFT_STATUS_OUT_OF_MEMORY when the device is out of memory and
 * OSFT_STATUS_BACKEND_ERROR with the CUDA error's name otherwise (a sticky
 * error from an earlier fault, a refusal during capture). The block may be
 * used by work on `stream`, or on another stream ordered after it; free it
 * on the stream that used it last. */
void *device_malloc(size_t bytes, int device_id, void *stream);
void device_free(void *ptr, int device_id, void *stream) noexcept;

/* Makes later work on `waiting` wait (on the device, not the host) for the
 * work enqueued so far on `waited_on`. No-op when they are the same. */
void stream_wait(int device_id, void *waiting, void *waited_on);

/* Waits for `stream` (NULL: the legacy default stream). Throws
 * OSFT_STATUS_BACKEND_ERROR with the CUDA error name. */
void synchronize(int device_id, void *stream);

/* Direction of a copy(). */
enum class CopyKind { to_host, from_host, on_device };

/* cudaMemcpyAsync of `bytes` on `stream`. A copy that reads or writes host
 * memory (to_host, from_host: pageable memory may be staged later) has
 * finished when this returns; an on_device copy is ordered by the stream.
 * Throws OSFT_STATUS_BACKEND_ERROR with the CUDA error name. */
void copy(int device_id, void *stream, void *dst, const void *src, size_t bytes,
          CopyKind kind);

/* Library handles, created on `device_id` and bound to `stream`. Create
 * functions throw OSFT_STATUS_BACKEND_ERROR (OSFT_STATUS_OUT_OF_MEMORY when
 * the library could not allocate); destroy accepts NULL. */
void *create_blas(int device_id, void *stream);
void *create_solver(int device_id, void *stream);
void set_blas_stream(void *blas, void *stream);
void set_solver_stream(void *solver, void *stream);
void destroy_blas(int device_id, void *blas) noexcept;
void destroy_solver(int device_id, void *solver) noexcept;

/* CUDART_VERSION the library was built with (13000 for 13.0), 0 without
 * CUDA; for osft_build_info(). Loads nothing. */
int toolkit_version() noexcept;

}  // namespace osft::cuda

#endif
