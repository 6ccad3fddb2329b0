/* The element-wise kernels bench_qr needs to build its SOAP inputs and check
 * its results on the GPU (bench_qr.c --device cuda --workload ...), where
 * cuBLAS and cuSOLVER do the rest: a gather of permuted rows and columns
 * (fp64 to fp32, or fp64 to fp64) and a widening of fp32 to fp64. Each
 * enqueues on the legacy default stream and returns the launch's
 * cudaError_t as an int (C callers). */
#include <cuda_runtime.h>

namespace {

/* out[r][c] = src[rows[r]][cols[c]] (row-major n x n; cols NULL: c). */
template <class Out>
__global__ void gather_kernel(const double *__restrict__ src, int n,
                              const int *__restrict__ rows, const int *__restrict__ cols,
                              Out *__restrict__ out) {
  const size_t total = static_cast<size_t>(n) * n;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int r = static_cast<int>(i / n), c = static_cast<int>(i % n);
    const int sc = cols != nullptr ? cols[c] : c;
    out[i] = static_cast<Out>(src[static_cast<size_t>(rows[r]) * n + sc]);
  }
}

__global__ void widen_kernel(const float *__restrict__ src, size_t count,
                             double *__restrict__ out) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    out[i] = src[i];
}

unsigned blocks_for(size_t count) {
  const size_t b = (count + 255) / 256;
  return static_cast<unsigned>(b < 65535 * 16 ? (b > 0 ? b : 1) : 65535 * 16);
}

}  // namespace

extern "C" int bench_qr_gather_f32(const double *src, int n, const int *rows,
                                   const int *cols, float *out) {
  gather_kernel<float>
      <<<blocks_for(static_cast<size_t>(n) * n), 256>>>(src, n, rows, cols, out);
  return static_cast<int>(cudaGetLastError());
}

extern "C" int bench_qr_gather_f64(const double *src, int n, const int *rows,
                                   const int *cols, double *out) {
  gather_kernel<double>
      <<<blocks_for(static_cast<size_t>(n) * n), 256>>>(src, n, rows, cols, out);
  return static_cast<int>(cudaGetLastError());
}

extern "C" int bench_qr_widen(const float *src, size_t count, double *out) {
  widen_kernel<<<blocks_for(count), 256>>>(src, count, out);
  return static_cast<int>(cudaGetLastError());
}
