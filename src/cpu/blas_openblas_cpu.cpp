/* The CPU GEMM engine of src/core/cpu_blas.h on OpenBLAS and the LAPACK it
 * is installed with (Debian's libopenblas-dev, liblapacke-dev): the
 * default engine. OpenBLAS has no bf16 GEMM here, so bf16 operands are
 * widened to fp32 by the caller (has_bf16_gemm() is false). */
#include <cblas.h>
#include <lapack.h>

#include <cstdio>

#include "core/cpu_blas.h"

namespace osft::blas {
namespace {

static_assert(sizeof(lapack_int) == sizeof(int), "LAPACK with 32-bit integers");

CBLAS_ORDER order(Layout l) {
  return l == Layout::row ? CblasRowMajor : CblasColMajor;
}
CBLAS_TRANSPOSE trans(Op op) {
  return op == Op::N ? CblasNoTrans : CblasTrans;
}

}  // namespace

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

void gemm(Layout layout, Op op_a, Op op_b, int m, int n, int k, float alpha,
          const float *a, int lda, const float *b, int ldb, float beta, float *c,
          int ldc) noexcept {
  cblas_sgemm(order(layout), trans(op_a), trans(op_b), m, n, k, alpha, a, lda, b, ldb,
              beta, c, ldc);
}
void gemm(Layout layout, Op op_a, Op op_b, int m, int n, int k, double alpha,
          const double *a, int lda, const double *b, int ldb, double beta, double *c,
          int ldc) noexcept {
  cblas_dgemm(order(layout), trans(op_a), trans(op_b), m, n, k, alpha, a, lda, b, ldb,
              beta, c, ldc);
}

bool has_bf16_gemm() noexcept {
  return false;
}
void gemm_bf16(Layout, Op, Op, int, int, int, float, const bf16 *, int, const bf16 *, int,
               float, float *, int) noexcept {}

void syrk_upper_t(int n, int m, const double *a, int lda, double *c, int ldc) noexcept {
  cblas_dsyrk(CblasColMajor, CblasUpper, CblasTrans, n, m, 1.0, a, lda, 0.0, c, ldc);
}
void trsm_right_upper(int m, int n, const double *r, int ldr, double *b,
                      int ldb) noexcept {
  cblas_dtrsm(CblasColMajor, CblasRight, CblasUpper, CblasNoTrans, CblasNonUnit, m, n,
              1.0, r, ldr, b, ldb);
}
void trmm_left_upper(int n, const double *r, int ldr, double *b, int ldb) noexcept {
  cblas_dtrmm(CblasColMajor, CblasLeft, CblasUpper, CblasNoTrans, CblasNonUnit, n, n, 1.0,
              r, ldr, b, ldb);
}

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
