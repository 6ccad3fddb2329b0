/* The CPU GEMM engine of src/core/cpu_blas.h on oneMKL (CMake
 * -DOSFTRT_CPU_BLAS=MKL; PyPI's mkl-devel or Debian's libmkl-dev), linked
 * with its GNU OpenMP threading layer. bf16 GEMMs go to
 * cblas_gemm_bf16bf16f32 (bf16 operands, fp32 accumulation and C), which
 * runs on AMX tiles or AVX512-BF16 where the CPU has them and on a
 * converting path elsewhere; LAPACK (QR, SVD) is MKL's too. */
#include <mkl.h>

#include <cstdio>

#include "core/cpu_blas.h"

namespace osft::blas {
namespace {

static_assert(sizeof(MKL_INT) == sizeof(int), "MKL's LP64 interface");
static_assert(sizeof(MKL_BF16) == sizeof(bf16), "bf16 is 16 bits");

CBLAS_LAYOUT order(Layout l) {
  return l == Layout::row ? CblasRowMajor : CblasColMajor;
}
CBLAS_TRANSPOSE trans(Op op) {
  return op == Op::N ? CblasNoTrans : CblasTrans;
}

}  // namespace

const char *describe() noexcept {
  static const char *const text = [] {
    static char buf[384];
    MKLVersion v;
    mkl_get_version(&v);
    /* 2026.2.0 is major 2026, update 2, minor 0 (PyPI's version order). */
    std::snprintf(buf, sizeof buf, "oneMKL %d.%d.%d (build %s; ISA: %s)", v.MajorVersion,
                  v.UpdateVersion, v.MinorVersion, v.Build ? v.Build : "?",
                  v.Processor ? v.Processor : "?");
    return buf;
  }();
  return text;
}

int threads() noexcept {
  return mkl_get_max_threads();
}
void set_threads(int n) noexcept {
  mkl_set_num_threads(n);
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
  return true;
}
void gemm_bf16(Layout layout, Op op_a, Op op_b, int m, int n, int k, float alpha,
               const bf16 *a, int lda, const bf16 *b, int ldb, float beta, float *c,
               int ldc) noexcept {
  cblas_gemm_bf16bf16f32(order(layout), trans(op_a), trans(op_b), m, n, k, alpha,
                         reinterpret_cast<const MKL_BF16 *>(a), lda,
                         reinterpret_cast<const MKL_BF16 *>(b), ldb, beta, c, ldc);
}

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

void transpose(int rows, int cols, const float *a, int lda, float *b, int ldb) noexcept {
  mkl_somatcopy('R', 'T', rows, cols, 1.0f, a, lda, b, ldb);
}
void transpose(int rows, int cols, const double *a, int lda, double *b,
               int ldb) noexcept {
  mkl_domatcopy('R', 'T', rows, cols, 1.0, a, lda, b, ldb);
}

void geqrfp(int m, int n, float *a, int lda, float *tau, float *work, int lwork,
            int *info) noexcept {
  sgeqrfp(&m, &n, a, &lda, tau, work, &lwork, info);
}
void geqrfp(int m, int n, double *a, int lda, double *tau, double *work, int lwork,
            int *info) noexcept {
  dgeqrfp(&m, &n, a, &lda, tau, work, &lwork, info);
}
void orgqr(int m, int n, int k, float *a, int lda, const float *tau, float *work,
           int lwork, int *info) noexcept {
  sorgqr(&m, &n, &k, a, &lda, tau, work, &lwork, info);
}
void orgqr(int m, int n, int k, double *a, int lda, const double *tau, double *work,
           int lwork, int *info) noexcept {
  dorgqr(&m, &n, &k, a, &lda, tau, work, &lwork, info);
}
void potrf_upper(int n, double *a, int lda, int *info) noexcept {
  dpotrf("U", &n, a, &lda, info);
}
void gesdd_thin(int m, int n, double *a, int lda, double *s, double *u, int ldu,
                double *vt, int ldvt, double *work, int lwork, int *iwork,
                int *info) noexcept {
  dgesdd("S", &m, &n, a, &lda, s, u, &ldu, vt, &ldvt, work, &lwork, iwork, info);
}

}  // namespace osft::blas
