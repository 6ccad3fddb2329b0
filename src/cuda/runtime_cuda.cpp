/* The CUDA runtime, cuBLAS and cuSOLVER behind src/core/cuda_runtime.h, as
 * the CUDA module implements them (the core forwards to these through the
 * module's table: src/cuda/module_cuda.h). */
#include "core/cuda_runtime.h"

#include <cstdint>
#include <mutex>

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cusolverDn.h>

#include "core/cuda_arch.h"
#include "core/error.h"
#include "cuda/cuda_check.h"
#include "cuda/device_guard.h"
#include "cuda/module_cuda.h"
#include "osftrt_build_config.h"

/* A namespace of its own: the core declares the same names in osft::cuda
 * (its forwarders), and the static archive holds both. */
namespace osft::cuda_runtime {
namespace {

using cuda::DeviceGuard;

const char *blas_status_name(cublasStatus_t s) {
  return cublasGetStatusName(s);
}

const char *solver_status_name(cusolverStatus_t s) {
  switch (s) {
    case CUSOLVER_STATUS_NOT_INITIALIZED: return "CUSOLVER_STATUS_NOT_INITIALIZED";
    case CUSOLVER_STATUS_ALLOC_FAILED: return "CUSOLVER_STATUS_ALLOC_FAILED";
    case CUSOLVER_STATUS_INVALID_VALUE: return "CUSOLVER_STATUS_INVALID_VALUE";
    case CUSOLVER_STATUS_ARCH_MISMATCH: return "CUSOLVER_STATUS_ARCH_MISMATCH";
    case CUSOLVER_STATUS_EXECUTION_FAILED: return "CUSOLVER_STATUS_EXECUTION_FAILED";
    case CUSOLVER_STATUS_INTERNAL_ERROR: return "CUSOLVER_STATUS_INTERNAL_ERROR";
    default: return "cusolver error";
  }
}

int device_count() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError(); /* clear the sticky "no device" error */
    return 0;
  }
  return n;
}

void check_device(int device_id, const char *arg) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    raise(OSFT_STATUS_NO_DEVICE, "%s: no usable CUDA device (cudaGetDeviceCount: %s)",
          arg, cudaGetErrorString(e));
  }
  if (device_id >= n)
    raise(OSFT_STATUS_NO_DEVICE, "%s: CUDA device %d does not exist (%d visible)", arg,
          device_id, n);
  /* Attributes, not properties: no context is created for the query. */
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device_id) !=
          cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device_id) !=
          cudaSuccess) {
    cudaGetLastError();
    return; /* unknown: let the first kernel say */
  }
  if (!osfti_cuda_arch_supported(OSFTRT_CUDA_ARCHS, major, minor))
    raise(OSFT_STATUS_NOT_SUPPORTED,
          "%s: CUDA device %d has compute capability %d.%d, but this libosftrt was "
          "built for CUDA architectures %s (rebuild with "
          "-DCMAKE_CUDA_ARCHITECTURES=%d%d)",
          arg, device_id, major, minor, OSFTRT_CUDA_ARCHS, major, minor);
}

/* The library's own stream-ordered pool on each device: freed blocks stay
 * cached (release threshold: never), so a free never waits for the device
 * and a steady state allocates nothing from the driver. A pool of our own
 * leaves the device's default pool, which frameworks may tune, alone. */
cudaMemPool_t device_pool(int device_id) {
  constexpr int max_devices = 64;
  static cudaMemPool_t pools[max_devices] = {};
  static std::mutex lock;
  if (device_id < 0 || device_id >= max_devices)
    raise(OSFT_STATUS_NOT_SUPPORTED, "CUDA device %d: at most %d devices are supported",
          device_id, max_devices);
  std::lock_guard<std::mutex> hold(lock);
  if (pools[device_id] != nullptr) return pools[device_id];
  cudaMemPoolProps props = {};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = device_id;
  cudaMemPool_t pool = nullptr;
  check_cuda(cudaMemPoolCreate(&pool, &props), "cudaMemPoolCreate");
  uint64_t keep = UINT64_MAX;
  check_cuda(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep),
             "cudaMemPoolSetAttribute(release threshold)");
  pools[device_id] = pool;
  return pool;
}

void *device_malloc(size_t bytes, int device_id, void *stream) {
  DeviceGuard guard(device_id);
  void *p = nullptr;
  check_cuda(cudaMallocFromPoolAsync(&p, bytes, device_pool(device_id),
                                     static_cast<cudaStream_t>(stream)),
             "cudaMallocFromPoolAsync");
  return p;
}

void device_free(void *ptr, int device_id, void *stream) noexcept {
  try {
    DeviceGuard guard(device_id);
    if (cudaFreeAsync(ptr, static_cast<cudaStream_t>(stream)) != cudaSuccess)
      cudaGetLastError();
  } catch (...) {
  }
}

void stream_wait(int device_id, void *waiting, void *waited_on) {
  if (waiting == waited_on) return;
  DeviceGuard guard(device_id);
  cudaEvent_t done = nullptr;
  check_cuda(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "cudaEventCreate");
  cudaError_t e = cudaEventRecord(done, static_cast<cudaStream_t>(waited_on));
  if (e == cudaSuccess)
    e = cudaStreamWaitEvent(static_cast<cudaStream_t>(waiting), done, 0);
  cudaEventDestroy(done); /* released once the wait has been satisfied */
  check_cuda(e, "cudaStreamWaitEvent");
}

void synchronize(int device_id, void *stream) {
  DeviceGuard guard(device_id);
  check_cuda(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)),
             "cudaStreamSynchronize");
}

void *create_blas(int device_id, void *stream) {
  DeviceGuard guard(device_id);
  cublasHandle_t h = nullptr;
  check_blas(cublasCreate(&h), "cublasCreate");
  try {
    check_blas(cublasSetStream(h, static_cast<cudaStream_t>(stream)), "cublasSetStream");
  } catch (...) {
    cublasDestroy(h);
    throw;
  }
  return h;
}

void *create_solver(int device_id, void *stream) {
  DeviceGuard guard(device_id);
  cusolverDnHandle_t h = nullptr;
  cusolverStatus_t s = cusolverDnCreate(&h);
  if (s != CUSOLVER_STATUS_SUCCESS)
    raise(s == CUSOLVER_STATUS_ALLOC_FAILED ? OSFT_STATUS_OUT_OF_MEMORY
                                            : OSFT_STATUS_BACKEND_ERROR,
          "cusolverDnCreate: %s", solver_status_name(s));
  s = cusolverDnSetStream(h, static_cast<cudaStream_t>(stream));
  if (s != CUSOLVER_STATUS_SUCCESS) {
    cusolverDnDestroy(h);
    raise(OSFT_STATUS_BACKEND_ERROR, "cusolverDnSetStream: %s", solver_status_name(s));
  }
  return h;
}

void set_blas_stream(void *blas, void *stream) {
  cublasStatus_t s = cublasSetStream(static_cast<cublasHandle_t>(blas),
                                     static_cast<cudaStream_t>(stream));
  if (s != CUBLAS_STATUS_SUCCESS)
    raise(OSFT_STATUS_BACKEND_ERROR, "cublasSetStream: %s", blas_status_name(s));
}

void set_solver_stream(void *solver, void *stream) {
  cusolverStatus_t s = cusolverDnSetStream(static_cast<cusolverDnHandle_t>(solver),
                                           static_cast<cudaStream_t>(stream));
  if (s != CUSOLVER_STATUS_SUCCESS)
    raise(OSFT_STATUS_BACKEND_ERROR, "cusolverDnSetStream: %s", solver_status_name(s));
}

void destroy_blas(int device_id, void *blas) noexcept {
  if (blas == nullptr) return;
  try {
    DeviceGuard guard(device_id);
    cublasDestroy(static_cast<cublasHandle_t>(blas));
  } catch (...) {
  }
}

void destroy_solver(int device_id, void *solver) noexcept {
  if (solver == nullptr) return;
  try {
    DeviceGuard guard(device_id);
    cusolverDnDestroy(static_cast<cusolverDnHandle_t>(solver));
  } catch (...) {
  }
}

}  // namespace
}  // namespace osft::cuda_runtime

namespace osft {

void fill_cuda_runtime(CudaModule &t) {
  t.device_count = cuda_runtime::device_count;
  t.check_device = cuda_runtime::check_device;
  t.device_malloc = cuda_runtime::device_malloc;
  t.device_free = cuda_runtime::device_free;
  t.stream_wait = cuda_runtime::stream_wait;
  t.synchronize = cuda_runtime::synchronize;
  t.copy = cuda_copy;
  t.create_blas = cuda_runtime::create_blas;
  t.create_solver = cuda_runtime::create_solver;
  t.set_blas_stream = cuda_runtime::set_blas_stream;
  t.set_solver_stream = cuda_runtime::set_solver_stream;
  t.destroy_blas = cuda_runtime::destroy_blas;
  t.destroy_solver = cuda_runtime::destroy_solver;
}

}  // namespace osft
