/* The CPU GEMM engine of src/core/cpu_blas.h on oneMKL (CMake
 * -DOSFTRT_CPU_BLAS=MKL; PyPI's mkl-devel or Debian's libmkl-dev), linked
 * with its GNU OpenMP threading layer. bf16 GEMMs go to
 * cblas_gemm_bf16bf16f32 (bf16 operands, fp32 accumulation and C), which
 * runs on AMX tiles or AVX512-BF16 where the CPU has them and on a
 * converting path elsewhere; LAPACK (QR, SVD) is MKL's too. */
#include <mkl.h>

#include <algorithm>
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
/* Exactly n (oneMKL's dynamic adjustment would lower it below the count
 * the library reports); 1 in a forked child, where GNU OpenMP cannot start
 * a team once the parent had one (the child hangs in its first threaded
 * GEMM). */
void set_threads(int n) noexcept {
  mkl_set_dynamic(0);
  mkl_set_num_threads(forked_child() ? 1 : n);
}
const char *threads_env() noexcept {
  return "MKL_NUM_THREADS";
}

/* The element-wise passes run on the library's pool
 * (src/cpu/parallel_cpu.cpp), not on an OpenMP team beside oneMKL's. They
 * used to run on GNU OpenMP teams of the library's count (measured then
 * against threads started per call, 2 shared cores, SwiGLU 4096 x 512 x
 * 1792: bf16 min 411 ms (team) vs 470 ms, median 919 vs 868; fp32 min
 * 1047 vs 1139, median 1670 vs 1598: no clear winner). But oneMKL picks
 * its own team size per GEMM, and GNU OpenMP ends the extra threads of a
 * larger team when a smaller one follows and starts them again for the
 * next larger one: with 3 threads on 2 cores, 3 threads created per round
 * of calls (threads_created_per_call), none with the pool. And a forked
 * child cannot start a GNU OpenMP team at all once its parent had one (it
 * hangs): the pool starts afresh there. On a shared machine,
 * OMP_WAIT_POLICY=PASSIVE keeps oneMKL's idle team from spinning beside
 * the passes. */
void parallel_for(int64_t n, int64_t grain, FunctionRef<void(int64_t, int64_t)> body) {
  parallel_for_pool(n, grain, body);
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

size_t gemm_bf16_pack_bytes(int m, int n, int k) noexcept {
  return cblas_gemm_bf16bf16f32_pack_get_size(CblasBMatrix, m, n, k);
}
void gemm_bf16_pack(Layout layout, Op op_b, int m, int n, int k, const bf16 *b, int ldb,
                    void *dst) noexcept {
  cblas_gemm_bf16bf16f32_pack(order(layout), CblasBMatrix, trans(op_b), m, n, k,
                              reinterpret_cast<const MKL_BF16 *>(b), ldb,
                              static_cast<MKL_BF16 *>(dst));
}
void gemm_bf16_packed(Layout layout, Op op_a, int m, int n, int k, float alpha,
                      const bf16 *a, int lda, const void *packed_b, float beta, float *c,
                      int ldc) noexcept {
  /* ldb is not read for a packed B */
  cblas_gemm_bf16bf16f32_compute(order(layout), trans(op_a), CblasPacked, m, n, k, alpha,
                                 reinterpret_cast<const MKL_BF16 *>(a), lda,
                                 static_cast<const MKL_BF16 *>(packed_b), 0, beta, c,
                                 ldc);
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
