/* The CPU GEMM engine of src/core/cpu_blas.h on OpenBLAS and the LAPACK it
 * is installed with (Debian's libopenblas-dev, liblapacke-dev): the
 * default engine. OpenBLAS has no bf16 GEMM here, so bf16 operands are
 * widened to fp32 by the caller (has_bf16_gemm() is false). */
#include <cblas.h>
#include <lapack.h>

#include <algorithm>
#include <cstdio>

#include "core/cpu_blas.h"

namespace osft::blas {

static_assert(sizeof(lapack_int) == sizeof(int), "LAPACK with 32-bit integers");

const char *describe() noexcept {
  static const char *const text = [] {
    static char buf[256];
    std::snprintf(buf, sizeof buf, "%s (core %s)", openblas_get_config(),
                  openblas_get_corename());
    return buf;
  }();
  return text;
}

int threads() noexcept {
  return openblas_get_num_threads();
}
void set_threads(int n) noexcept {
  openblas_set_num_threads(n);
}
const char *threads_env() noexcept {
  return "OPENBLAS_NUM_THREADS";
}

/* The library's pool (src/cpu/parallel_cpu.cpp): OpenBLAS 0.3.21 cannot
 * run a caller's work on its own threads (its thread callback came in
 * 0.3.27), and its idle threads yield rather than spin on the cores. */
void parallel_for(int64_t n, int64_t grain, FunctionRef<void(int64_t, int64_t)> body) {
  parallel_for_pool(n, grain, body);
}

bool has_bf16_gemm() noexcept {
  return false;
}
void gemm_bf16(Layout, Op, Op, int, int, int, float, const bf16 *, int, const bf16 *, int,
               float, float *, int) noexcept {}
/* No packing: callers see 0 bytes and call the plain GEMM. */
size_t gemm_bf16_pack_bytes(int, int, int) noexcept {
  return 0;
}
void gemm_bf16_pack(Layout, Op, int, int, int, const bf16 *, int, void *) noexcept {}
void gemm_bf16_packed(Layout, Op, int, int, int, float, const bf16 *, int, const void *,
                      float, float *, int) noexcept {}

/* OpenBLAS's transposing copy: about 8x faster than a tiled loop (fp32). */
void transpose(int rows, int cols, const float *a, int lda, float *b, int ldb) noexcept {
  cblas_somatcopy(CblasRowMajor, CblasTrans, rows, cols, 1.0f, a, lda, b, ldb);
}
void transpose(int rows, int cols, const double *a, int lda, double *b,
               int ldb) noexcept {
  cblas_domatcopy(CblasRowMajor, CblasTrans, rows, cols, 1.0, a, lda, b, ldb);
}

void geqrfp(int m, int n, float *a, int lda, float *tau, float *work, int lwork,
            int *info) noexcept {
  LAPACK_sgeqrfp(&m, &n, a, &lda, tau, work, &lwork, info);
}
void geqrfp(int m, int n, double *a, int lda, double *tau, double *work, int lwork,
            int *info) noexcept {
  LAPACK_dgeqrfp(&m, &n, a, &lda, tau, work, &lwork, info);
}
void orgqr(int m, int n, int k, float *a, int lda, const float *tau, float *work,
           int lwork, int *info) noexcept {
  LAPACK_sorgqr(&m, &n, &k, a, &lda, tau, work, &lwork, info);
}
void orgqr(int m, int n, int k, double *a, int lda, const double *tau, double *work,
           int lwork, int *info) noexcept {
  LAPACK_dorgqr(&m, &n, &k, a, &lda, tau, work, &lwork, info);
}
void potrf_upper(int n, double *a, int lda, int *info) noexcept {
  LAPACK_dpotrf("U", &n, a, &lda, info);
}
void gesdd_thin(int m, int n, double *a, int lda, double *s, double *u, int ldu,
                double *vt, int ldvt, double *work, int lwork, int *iwork,
                int *info) noexcept {
  LAPACK_dgesdd("S", &m, &n, a, &lda, s, u, &ldu, vt, &ldvt, work, &lwork, iwork, info);
}

}  // namespace osft::blas
