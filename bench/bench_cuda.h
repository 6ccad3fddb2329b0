/* Helpers the CUDA modes of the benchmarks share (built with
 * OSFT_BENCH_CUDA): checks that exit with a message, a bf16 (or fp32)
 * device copy of host floats, and the cuBLAS bf16 GEMM that is the dense
 * reference. */
#ifndef OSFTRT_BENCH_CUDA_H
#define OSFTRT_BENCH_CUDA_H

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "bench_util.h"

static inline void cuda_check(cudaError_t e, const char *what) {
  if (e != cudaSuccess) {
    fprintf(stderr, "%s failed: %s\n", what, cudaGetErrorString(e));
    exit(1);
  }
}

static inline void cublas_check(cublasStatus_t s, const char *what) {
  if (s != CUBLAS_STATUS_SUCCESS) {
    fprintf(stderr, "%s failed: cuBLAS status %d\n", what, (int)s);
    exit(1);
  }
}

/* A device copy of n host floats, as bf16 (or fp32 if !narrow). */
static inline void *upload(const float *host, size_t n, int narrow) {
  void *dev = NULL;
  const size_t bytes = n * (narrow ? 2 : 4);
  cuda_check(cudaMalloc(&dev, bytes), "cudaMalloc");
  if (narrow) {
    uint16_t *b = (uint16_t *)xmalloc(n * 2);
    for (size_t i = 0; i < n; ++i) b[i] = to_bf16(host[i]);
    cuda_check(cudaMemcpy(dev, b, bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
    free(b);
  } else {
    cuda_check(cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
  }
  return dev;
}

/* C (m x n) = op(A) op(B), row-major, bf16 A and B, fp32 accumulation, C of
 * c_type. Row-major C = A B is column-major C^T = B^T A^T. */
static inline void gemm_bf16(cublasHandle_t h, int ta, int tb, int m, int n, int k,
                             const void *a, int lda, const void *b, int ldb, void *c,
                             int ldc, cudaDataType c_type) {
  const float one = 1.0f, zero = 0.0f;
  cublas_check(
      cublasGemmEx(h, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, n,
                   m, k, &one, b, CUDA_R_16BF, ldb, a, CUDA_R_16BF, lda, &zero, c, c_type,
                   ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
      "cublasGemmEx");
}

#endif
