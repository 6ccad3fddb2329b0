/* src/core/cuda_runtime.h for builds without CUDA: no devices, and every
 * request for one is OSFT_STATUS_NOT_SUPPORTED. */
#include "core/cuda_runtime.h"

#include "backend/linalg_backend.h"
#include "core/error.h"

namespace osft::cuda {

namespace {
[[noreturn]] void not_compiled(const char *what) {
  raise(OSFT_STATUS_NOT_SUPPORTED,
        "%s: CUDA support was not compiled into this "
        "libosftrt (configure with -DOSFTRT_CUDA=ON)",
        what);
}
}  // namespace

bool compiled() noexcept {
  return false;
}
int device_count() noexcept {
  return 0;
}
void check_device(int, const char *arg) {
  not_compiled(arg);
}
void *device_malloc(size_t, int, void *) {
  not_compiled("device memory");
}
void device_free(void *, int, void *) noexcept {}
void stream_wait(int, void *, void *) {
  not_compiled("stream_wait");
}
void synchronize(int, void *) {
  not_compiled("synchronize");
}
void copy(int, void *, void *, const void *, size_t, CopyKind) {
  not_compiled("copy");
}
void *create_blas(int, void *) {
  not_compiled("cuBLAS");
}
void *create_solver(int, void *) {
  not_compiled("cuSOLVER");
}
void set_blas_stream(void *, void *) {
  not_compiled("cuBLAS");
}
void set_solver_stream(void *, void *) {
  not_compiled("cuSOLVER");
}
void destroy_blas(int, void *) noexcept {}
void destroy_solver(int, void *) noexcept {}
int toolkit_version() noexcept {
  return 0;
}

}  // namespace osft::cuda

namespace osft {

const Backend &cuda_backend() {
  cuda::not_compiled("the CUDA backend");
}

}  // namespace osft
