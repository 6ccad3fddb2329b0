/* Internal: the CPU GEMM engine, chosen at build time (CMake
 * OSFTRT_CPU_BLAS): the BLAS and LAPACK calls of the CPU kernels and what
 * osft_build_info() says about the engine. Built from
 * src/cpu/blas_openblas_cpu.cpp (OpenBLAS + LAPACK, the default) or
 * src/cpu/blas_mkl_cpu.cpp (oneMKL), so no other file tests a macro or
 * includes an engine's headers. Arguments arrive checked (32-bit
 * dimensions); the calls have the CBLAS/LAPACK semantics of their names. */
#ifndef OSFTRT_SRC_CORE_CPU_BLAS_H
#define OSFTRT_SRC_CORE_CPU_BLAS_H

#include <cstdint>
#include <functional>

#include "core/bf16.h"
#include "core/matrix_view.h"

namespace osft::blas {

/* "OpenBLAS 0.3.21 (core SkylakeX, ...)" or "oneMKL 2026.2.0 (ISA ...)":
 * the engine, its version and the instruction set it dispatches to on
 * this CPU. Static storage. */
const char *describe() noexcept;

/* The engine's thread count for one call, and setting it process-wide. */
int threads() noexcept;
void set_threads(int n) noexcept;

/* Runs body(begin, end) over [0, n) split into up to hardware_concurrency
 * parts of at least `grain` items, the calling thread taking the first:
 * the element-wise passes between the GEMMs (src/cpu/parallel_cpu.cpp, the
 * same for every engine). Threads of their own, joined before return: an
 * OpenMP team (oneMKL's) would be faster on an idle machine but, with
 * OpenMP's default active waiting, its spinning threads made the tiled MLP
 * 2-3x slower whenever the cores were shared. body must not throw. */
void parallel_for(int64_t n, int64_t grain,
                  const std::function<void(int64_t, int64_t)> &body);

enum class Layout { row, col };

/* C = alpha op(A) op(B) + beta C. */
void gemm(Layout layout, Op op_a, Op op_b, int m, int n, int k, float alpha,
          const float *a, int lda, const float *b, int ldb, float beta, float *c,
          int ldc) noexcept;
void gemm(Layout layout, Op op_a, Op op_b, int m, int n, int k, double alpha,
          const double *a, int lda, const double *b, int ldb, double beta, double *c,
          int ldc) noexcept;

/* True when the engine multiplies bf16 operands itself (fp32 accumulation,
 * fp32 C); gemm_bf16 may be called only then. Otherwise the caller widens
 * bf16 to fp32 and calls gemm. */
bool has_bf16_gemm() noexcept;
void gemm_bf16(Layout layout, Op op_a, Op op_b, int m, int n, int k, float alpha,
               const bf16 *a, int lda, const bf16 *b, int ldb, float beta, float *c,
               int ldc) noexcept;

/* Column-major fp64: c (n x n, upper) = a^T a, a m x n. */
void syrk_upper_t(int n, int m, const double *a, int lda, double *c, int ldc) noexcept;
/* Column-major fp64: b (m x n) = b r^-1, r upper n x n. */
void trsm_right_upper(int m, int n, const double *r, int ldr, double *b,
                      int ldb) noexcept;
/* Column-major fp64: b (n x n) = r b, r upper n x n. */
void trmm_left_upper(int n, const double *r, int ldr, double *b, int ldb) noexcept;

/* Row-major b (cols x rows) = a^T, a rows x cols. */
void transpose(int rows, int cols, const float *a, int lda, float *b, int ldb) noexcept;
void transpose(int rows, int cols, const double *a, int lda, double *b, int ldb) noexcept;

/* LAPACK (column-major); lwork == -1 is a workspace query. */
void geqrfp(int m, int n, float *a, int lda, float *tau, float *work, int lwork,
            int *info) noexcept;
void geqrfp(int m, int n, double *a, int lda, double *tau, double *work, int lwork,
            int *info) noexcept;
void orgqr(int m, int n, int k, float *a, int lda, const float *tau, float *work,
           int lwork, int *info) noexcept;
void orgqr(int m, int n, int k, double *a, int lda, const double *tau, double *work,
           int lwork, int *info) noexcept;
void potrf_upper(int n, double *a, int lda, int *info) noexcept;
/* dgesdd with jobz "S". iwork holds 8 min(m, n) ints. */
void gesdd_thin(int m, int n, double *a, int lda, double *s, double *u, int ldu,
                double *vt, int ldvt, double *work, int lwork, int *iwork,
                int *info) noexcept;

}  // namespace osft::blas

#endif
