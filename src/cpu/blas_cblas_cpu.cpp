/* The CBLAS calls of src/core/cpu_blas.h, the same for every engine: its
 * <cblas.h> (OpenBLAS's, or cmake/mkl_compat's over oneMKL's) has the
 * reference CBLAS prototypes. What differs per engine (describe, threads,
 * parallel_for, bf16 GEMM, transposing copies, LAPACK names) stays in
 * src/cpu/blas_<engine>_cpu.cpp. */
#include <cblas.h>

#include "core/cpu_blas.h"

namespace osft::blas {
namespace {

CBLAS_LAYOUT order(Layout l) {
  return l == Layout::row ? CblasRowMajor : CblasColMajor;
}
CBLAS_TRANSPOSE trans(Op op) {
  return op == Op::N ? CblasNoTrans : CblasTrans;
}

}  // namespace

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

void syrk_upper_t(int n, int m, const double *a, int lda, double *c, int ldc) noexcept {
  cblas_dsyrk(CblasColMajor, CblasUpper, CblasTrans, n, m, 1.0, a, lda, 0.0, c, ldc);
}
void trsm_right_upper(int m, int n, const double *r, int ldr, double *b,
                      int ldb) noexcept {
  cblas_dtrsm(CblasColMajor, CblasRight, CblasUpper, CblasNoTrans, CblasNonUnit, m, n,
              1.0, r, ldr, b, ldb);
}
void syrk_upper_t(int n, int m, const float *a, int lda, float *c, int ldc) noexcept {
  cblas_ssyrk(CblasColMajor, CblasUpper, CblasTrans, n, m, 1.0f, a, lda, 0.0f, c, ldc);
}
void trsm_right_upper(int m, int n, const float *r, int ldr, float *b, int ldb) noexcept {
  cblas_strsm(CblasColMajor, CblasRight, CblasUpper, CblasNoTrans, CblasNonUnit, m, n,
              1.0f, r, ldr, b, ldb);
}
void trmm_left_upper(int n, const double *r, int ldr, double *b, int ldb) noexcept {
  cblas_dtrmm(CblasColMajor, CblasLeft, CblasUpper, CblasNoTrans, CblasNonUnit, n, n, 1.0,
              r, ldr, b, ldb);
}

}  // namespace osft::blas
