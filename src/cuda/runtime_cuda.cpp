/* The CUDA runtime, cuBLAS and cuSOLVER behind src/core/cuda_runtime.h.
 * Compiled only when CUDA is enabled. */
#include "core/cuda_runtime.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cusolverDn.h>

#include "core/error.h"
#include "cuda/device_guard.h"

namespace osft::cuda {
namespace {

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

}  // namespace

bool compiled() noexcept {
  return true;
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
}

void *device_malloc(size_t bytes, int device_id) noexcept {
  try {
    DeviceGuard guard(device_id);
    void *p = nullptr;
    if (cudaMalloc(&p, bytes) != cudaSuccess) {
      cudaGetLastError();
      return nullptr;
    }
    return p;
  } catch (...) {
    return nullptr;
  }
}

void device_free(void *ptr, int device_id) noexcept {
  try {
    DeviceGuard guard(device_id);
    cudaFree(ptr);
  } catch (...) {
  }
}

void synchronize(int device_id, void *stream) {
  DeviceGuard guard(device_id);
  cudaError_t e = cudaStreamSynchronize(static_cast<cudaStream_t>(stream));
  if (e != cudaSuccess)
    raise(OSFT_STATUS_BACKEND_ERROR, "cudaStreamSynchronize: %s", cudaGetErrorString(e));
}

void *create_blas(int device_id, void *stream) {
  DeviceGuard guard(device_id);
  cublasHandle_t h = nullptr;
  cublasStatus_t s = cublasCreate(&h);
  if (s != CUBLAS_STATUS_SUCCESS)
    raise(OSFT_STATUS_BACKEND_ERROR, "cublasCreate: %s", blas_status_name(s));
  s = cublasSetStream(h, static_cast<cudaStream_t>(stream));
  if (s != CUBLAS_STATUS_SUCCESS) {
    cublasDestroy(h);
    raise(OSFT_STATUS_BACKEND_ERROR, "cublasSetStream: %s", blas_status_name(s));
  }
  return h;
}

void *create_solver(int device_id, void *stream) {
  DeviceGuard guard(device_id);
  cusolverDnHandle_t h = nullptr;
  cusolverStatus_t s = cusolverDnCreate(&h);
  if (s != CUSOLVER_STATUS_SUCCESS)
    raise(OSFT_STATUS_BACKEND_ERROR, "cusolverDnCreate: %s", solver_status_name(s));
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

int toolkit_version() noexcept {
  return CUDART_VERSION;
}

}  // namespace osft::cuda
