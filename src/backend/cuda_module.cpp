/* The core's side of the CUDA module (src/backend/cuda_module.h): the CUDA
 * runtime of src/core/cuda_runtime.h and the CUDA kernel tables, each
 * forwarded to the module, which the first request loads. Requests that
 * need no GPU (a NULL handle to destroy, the toolkit's version) never load
 * it, so a CPU-only program maps no CUDA library; counting the devices
 * asks the CUDA driver alone (libcuda.so.1), so a program that asks
 * whether it has a GPU and finds none maps no cuBLAS, cuSOLVER or NCCL
 * either. */
#include "backend/cuda_module.h"

#include <dlfcn.h>

#include <string>

#include "backend/flce_backend.h"
#include "backend/linalg_backend.h"
#include "backend/mlp_backend.h"
#include "backend/qr_backend.h"
#include "core/error.h"
#include "core/logging.h"
#include "osftrt/version.h"
#include "osftrt_build_config.h"

namespace osft {
namespace {

LoadedModule<CudaModule> &cuda_slot() {
  static LoadedModule<CudaModule> slot(find_cuda_module);
  return slot;
}

/* The CUDA driver API's device count (cuDeviceGetCount), from
 * libcuda.so.1 alone: opened once per process, with cuInit. Where the
 * driver is missing, its major version is older than the toolkit's the
 * module was built with (the module's runtime would refuse it:
 * cudaErrorInsufficientDriver) or cuInit fails (no device), the library
 * is closed again and the count is 0 for the life of the process, as the
 * runtime's would be (a failed cuInit is final). */
class CudaDriver {
 public:
  CudaDriver() noexcept {
    handle_ = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (handle_ == nullptr) {
      log_message(OSFT_LOG_DEBUG, "CUDA devices: no CUDA driver (libcuda.so.1): 0");
      return;
    }
    using Init = int (*)(unsigned);
    using Version = int (*)(int *);
    const auto init = reinterpret_cast<Init>(dlsym(handle_, "cuInit"));
    const auto version = reinterpret_cast<Version>(dlsym(handle_, "cuDriverGetVersion"));
    count_ = reinterpret_cast<Count>(dlsym(handle_, "cuDeviceGetCount"));
    int v = 0;
    const char *why = nullptr;
    if (init == nullptr || version == nullptr || count_ == nullptr || version(&v) != 0)
      why = "lacks the driver API";
    else if (v / 1000 < OSFTRT_CUDA_TOOLKIT_VERSION / 1000)
      why = "is older than this libosftrt's CUDA";
    else if (init(0) != 0)
      why = "found no usable device (cuInit failed)";
    if (why != nullptr) {
      log_message(OSFT_LOG_DEBUG, "CUDA devices: the CUDA driver %d.%d %s: 0", v / 1000,
                  v % 1000 / 10, why);
      count_ = nullptr;
      dlclose(handle_);
      handle_ = nullptr;
    }
  }
  CudaDriver(const CudaDriver &) = delete;
  CudaDriver &operator=(const CudaDriver &) = delete;

  int device_count() const noexcept {
    int n = 0;
    if (count_ == nullptr || count_(&n) != 0) return 0;
    return n;
  }

 private:
  using Count = int (*)(int *);
  void *handle_ = nullptr; /* stays open once initialized: the runtime shares it */
  Count count_ = nullptr;
};

const CudaDriver &cuda_driver() noexcept {
  static const CudaDriver driver;
  return driver;
}

}  // namespace

const CudaModule &cuda_module(const char *what) {
  if (!OSFTRT_HAVE_CUDA)
    raise(OSFT_STATUS_NOT_SUPPORTED,
          "%s: CUDA support was not compiled into this libosftrt (configure with "
          "-DOSFTRT_CUDA=ON where the CUDA toolkit is installed)",
          what);
  std::string why;
  bool now = false;
  const CudaModule *m = cuda_slot().load(&why, &now);
  if (m == nullptr)
    raise(OSFT_STATUS_NO_DEVICE, "%s: the CUDA backend is not available: %s", what,
          why.c_str());
  if (now)
    log_message(OSFT_LOG_INFO, "loaded the CUDA module (CUDA %d.%d)",
                m->toolkit_version / 1000, m->toolkit_version % 1000 / 10);
  return *m;
}

const CudaModule *cuda_module_loaded() noexcept {
  return cuda_slot().loaded();
}

/* ---- src/core/cuda_runtime.h */
namespace cuda {

bool compiled() noexcept {
  return OSFTRT_HAVE_CUDA;
}

/* The module's count once it is loaded (the runtime's, as a context sees
 * it); before, the driver's alone: loading the module (cuBLAS, cuSOLVER,
 * NCCL: ~180 MiB resident) waits for the first request that uses a GPU. */
int device_count() noexcept {
  if (!OSFTRT_HAVE_CUDA) return 0;
  if (const CudaModule *m = cuda_module_loaded()) return m->device_count();
  return cuda_driver().device_count();
}

void check_device(int device_id, const char *arg) {
  cuda_module(arg).check_device(device_id, arg);
}

void *device_malloc(size_t bytes, int device_id, void *stream) {
  return cuda_module("device memory").device_malloc(bytes, device_id, stream);
}

/* Only blocks that device_malloc gave come here, so the module is loaded. */
void device_free(void *ptr, int device_id, void *stream) noexcept {
  if (const CudaModule *m = cuda_module_loaded()) m->device_free(ptr, device_id, stream);
}

void stream_wait(int device_id, void *waiting, void *waited_on) {
  if (waiting == waited_on) return;
  cuda_module("stream_wait").stream_wait(device_id, waiting, waited_on);
}

void synchronize(int device_id, void *stream) {
  cuda_module("synchronize").synchronize(device_id, stream);
}

void copy(int device_id, void *stream, void *dst, const void *src, size_t bytes,
          CopyKind kind) {
  cuda_module("copy").copy(device_id, stream, dst, src, bytes, kind);
}

void *create_blas(int device_id, void *stream) {
  return cuda_module("cuBLAS").create_blas(device_id, stream);
}

void *create_solver(int device_id, void *stream) {
  return cuda_module("cuSOLVER").create_solver(device_id, stream);
}

void set_blas_stream(void *blas, void *stream) {
  cuda_module("cuBLAS").set_blas_stream(blas, stream);
}

void set_solver_stream(void *solver, void *stream) {
  cuda_module("cuSOLVER").set_solver_stream(solver, stream);
}

/* A handle exists only where the module made it; NULL is a no-op. */
void destroy_blas(int device_id, void *blas) noexcept {
  const CudaModule *m = cuda_module_loaded();
  if (blas != nullptr && m != nullptr) m->destroy_blas(device_id, blas);
}

void destroy_solver(int device_id, void *solver) noexcept {
  const CudaModule *m = cuda_module_loaded();
  if (solver != nullptr && m != nullptr) m->destroy_solver(device_id, solver);
}

int toolkit_version() noexcept {
  return OSFTRT_CUDA_TOOLKIT_VERSION; /* known at configure time: loads nothing */
}

}  // namespace cuda

/* ---- the kernel tables of src/backend/ */
const Backend &cuda_backend() {
  return *cuda_module("the CUDA backend").linalg;
}

const MlpKernels &cuda_mlp_kernels() {
  return *cuda_module("the CUDA MLP kernels").mlp;
}

const QrKernels &cuda_qr_kernels() {
  return *cuda_module("batched QR on CUDA").qr;
}

const FlceKernels &cuda_flce_kernels() {
  return *cuda_module("fused linear cross-entropy on CUDA").flce;
}

}  // namespace osft
