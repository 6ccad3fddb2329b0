/**
 * @file
 * @brief libosftrt — batched QR factorization, for optimizers that keep
 * orthonormal eigenbases (SOAP, Shampoo): one call factors a whole list of
 * matrices of mixed shapes, and a fused call runs the power-iteration step
 * Q_i <- qr(A_i Q_i) for a list of pairs.
 *
 * For each m x n matrix A (m >= n) the thin QR factorization A = Q R gives
 * Q (m x n, orthonormal columns) and R (n x n, upper triangular) with the
 * sign convention diag(R) >= 0. For a matrix of full rank this makes Q and
 * R unique, so the CPU and CUDA backends (and both methods below) agree up
 * to rounding.
 *
 * Methods (osft_qr_method_t):
 * @code{.unparsed}
 *   OSFT_QR_HOUSEHOLDER   blocked Householder (LAPACK geqrfp + orgqr on
 *     the CPU, cuSOLVER geqrf + orgqr on CUDA; on CUDA, matrices small
 *     enough to sit in one block's shared memory are factored together by
 *     one batched kernel).
 *     Backward stable at any condition number. The default.
 *   OSFT_QR_CHOLESKY_QR2  the Cholesky path (all level-3 BLAS: Gram
 *     matrix, Cholesky, triangular solve), meant for GPUs, where such
 *     kernels run far closer to peak than a Householder panel; on a 2-core
 *     CPU it measured slower than Householder. It is shifted CholeskyQR3
 *     with every pass in fp64, fp32 inputs included (the first pass's Gram
 *     matrix gets a shift of 11 (m n + n (n + 1)) u ||A||_F^2, u = 2^-53,
 *     then two plain passes): unlike the CholeskyQR2 it is named after
 *     (which fails in fp32 from kappa(A) ~ 1e3), it needs no fall-back up
 *     to kappa ~ 1e11, so over the whole range an fp32 matrix can carry
 *     (SOAP's products P Q reach 1e4 to 1e7), and its Q is orthonormal to
 *     fp32 rounding. About 3x Householder's flops, in fp64. Each matrix is
 *     checked: if a Cholesky factorization fails, or the loss of
 *     orthogonality before the last pass, ||Q2^T Q2 - I||_F, exceeds
 *     opts->orthogonality_threshold, that matrix alone is redone with
 *     Householder (logged at OSFT_LOG_DEBUG). The result then meets the
 *     same accuracy as Householder. Small matrices on CUDA always use the
 *     batched Householder kernel, which is faster for them.
 *   OSFT_QR_CHOLESKY_TF32  (since 1.2) the Cholesky path with its large
 *     products on the tensor cores, for fp32 matrices: three passes of
 *     G = W^T W as a TF32 GEMM (operands rounded to 10 mantissa bits,
 *     products summed in fp32), R = chol(G + s I) in fp64 rounded to fp32,
 *     W = W R^-1 solved by blocks of 256 columns whose updates are 3xTF32
 *     GEMMs (each operand split into two TF32 parts: ~2^-20 relative) and
 *     whose diagonal blocks are fp32 solves; the first two passes shifted
 *     by s = sqrt(m) 2^-26 ||G||_F, the third not; then a last pass whose
 *     Gram matrix and Cholesky factorization R = U D (U unit upper) are
 *     fp64 and whose solve W D^-1 U^-1 takes the same 3xTF32 block updates
 *     but finishes each block in fp64, so that every entry of Q is rounded
 *     to fp32 once (the fp32 floor, ||Q^T Q - I||_F ~ 0.6 u sqrt(n)),
 *     without an fp64 solve of the whole matrix. A TF32 Gram
 *     matrix is the exact Gram matrix of the rounded W, so its rounding acts
 *     like a small extra shift and does not make the factorization fail;
 *     each shifted pass divides kappa by about ||A|| / sqrt(s) (~1e3 on
 *     SOAP's inputs), and matrices up to kappa 1e7 reach the last pass
 *     nearly orthogonal (||W^T W - I||_F <= 0.12 measured up to n = 2048,
 *     SOAP's inputs and log-spaced spectra alike). The solves
 *     are accurate to fp32 level, so Q R = A holds like Householder's, and
 *     the last pass makes Q orthonormal to fp32 rounding. Four Cholesky
 *     factorizations per matrix. The check and the fall-back are those of
 *     OSFT_QR_CHOLESKY_QR2: a failed Cholesky factorization, or a loss of
 *     orthogonality before the last pass beyond
 *     opts->orthogonality_threshold, redoes that matrix with Householder.
 *     fp64 matrices run OSFT_QR_CHOLESKY_QR2 unchanged. The CPU has no
 *     TF32: it computes the same thing, rounding the operands to TF32 by
 *     truncation (the coarser of the roundings a GPU may use) and
 *     multiplying in fp32, and is slower there than OSFT_QR_CHOLESKY_QR2
 *     (it exists on the CPU to be tested and to give the same results).
 * @endcode
 *
 * @par Execution
 * Execution: matrices are grouped by dtype and shape and spread over
 * several workers (opts->max_concurrency): threads of the library's pool on
 * the CPU, CUDA streams (each with its own cuBLAS and cuSOLVER handle) on a
 * GPU. The result for a matrix does not depend on the other matrices of the
 * list, on their order, or on how many workers ran (except that with one
 * worker on the CPU the BLAS engine runs at the library's thread count
 * rather than on one thread, which can change the last bits).
 *
 * @par Per-matrix failures
 * A matrix that contains NaN or Inf, that is
 * rank-deficient to the tolerance opts->rank_tolerance, or whose result
 * overflows, is a failure of that matrix only: its outputs (Q, R; for an
 * in-place call, its A) are left exactly as they were, the others are
 * computed as if it were not in the list, its entry of per_matrix_status
 * is OSFT_STATUS_NUMERICAL_ERROR, and the call returns
 * OSFT_STATUS_NUMERICAL_ERROR with a message naming the first failed
 * index and its reason ("a[3]: contains NaN or Inf") and how many failed
 * (each failure and its reason is also logged at OSFT_LOG_DEBUG).
 * This is the one case where a failing call has written outputs: those of
 * the matrices that succeeded. Every other error (a malformed list, bad
 * options, out of memory) is detected before anything is written.
 * With opts->rank_deficient set (since 1.4), a rank-deficient matrix is
 * factored, written and reported there instead of failing; only NaN, Inf
 * and overflow remain failures.
 *
 * @par Threading and streams
 * Like every operation, a call uses its context from one thread at a time.
 * On the CPU the workers run on the library's persistent thread pool (the
 * process-wide count of osft_set_num_threads(), context.h; no thread is
 * created per call): they are the parts of one pool job, each taking the
 * next matrix (largest first) whenever it is free, and the calling thread
 * works as one of them. If the pool is busy (a call on another context from
 * another thread), the calling thread runs every worker's share itself, one
 * after another. While a call with more than one worker runs, the BLAS
 * engine (OpenBLAS or oneMKL) is held at one thread, since the workers are
 * the threads (the engine's count is process-wide, so other BLAS work in the
 * process meanwhile runs on one thread too); when the last such QR call on
 * any context returns, the engine gets the library's count back, including a
 * count set meanwhile. With one worker (max_concurrency 1, one matrix, or a
 * workspace limit that fits only one) the matrices run one after another on
 * the calling thread, each with the engine at the library's count. After a
 * multithreaded BLAS call, OpenBLAS's own idle threads keep polling for a
 * while (2^28 cycles, ~0.1 s, unless the environment sets
 * OPENBLAS_THREAD_TIMEOUT) and compete with the workers for the cores: on
 * two cores that made a QR call right after a large GEMM up to ~1.4x slower
 * (measured with 1.3.0); OPENBLAS_THREAD_TIMEOUT=4 avoids it.
 *
 * On CUDA the workers' streams wait for the context's stream on entry and
 * the context's stream waits for them on exit; the call then waits for the
 * device (it must, to report per-matrix results), so the outputs are ready
 * when it returns, and it cannot be captured into a CUDA graph. The worker
 * streams and their library handles are created on first use, kept per
 * device for the life of the process, and shared by all contexts of that
 * device (never by two calls at once).
 *
 * @par Memory
 * Memory: scratch comes from the context's workspace, sized by the
 * largest matrices and the number of workers. With a workspace_limit the
 * call uses fewer workers to fit, and fails with OSFT_STATUS_OUT_OF_MEMORY
 * only if one worker does not fit.
 *
 * @code
 *   const DLTensor *a[3] = {&g0, &g1, &g2};  // mixed shapes, m_i >= n_i
 *   DLTensor *q[3] = {&q0, &q1, &q2};
 *   osft_status_t each[3];
 *   osft_status_t st = osft_qr_batch(ctx, NULL, 3, a, q, NULL, each);
 *   if (st == OSFT_STATUS_NUMERICAL_ERROR)  // some failed; the rest are written
 *     for (int i = 0; i < 3; ++i)
 *       if (each[i] != OSFT_STATUS_SUCCESS) keep_old_basis[i] = 1;
 * @endcode
 *
 * @par Non-finite values (NaN, Inf)
 * A matrix (batch: A; power iteration: A or the starting Q) with NaN or Inf,
 * or whose result overflows, is a per-matrix failure:
 * OSFT_STATUS_NUMERICAL_ERROR in per_matrix_status, its outputs (Q, R; in
 * place: A) untouched, the others computed; the call returns
 * OSFT_STATUS_NUMERICAL_ERROR. Entries with n_i = 0 need nothing and their
 * values are not examined (a power-iteration pair with an m x 0 Q succeeds
 * even when A has NaN). opts->orthogonality_threshold must be finite and >= 0
 * and opts->rank_tolerance must not be NaN (OSFT_STATUS_INVALID_ARGUMENT,
 * nothing written); a negative rank_tolerance, including -INFINITY, turns the
 * rank check off (a matrix with NaN/Inf still fails).
 */
#ifndef OSFTRT_QR_H
#define OSFTRT_QR_H

#include <stddef.h>

#include "osftrt/context.h"
#include "osftrt/export.h"
#include "osftrt/status.h"
#include "osftrt/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/**
 * @defgroup osftrt_qr Batched QR
 * @brief Thin QR factorizations of lists of matrices, and fused power
 * iteration, for SOAP/Shampoo eigenbases (osftrt/qr.h).
 * @{
 */

/** @brief How each matrix is factored. Values are fixed forever (ABI.md). */
typedef enum osft_qr_method_e {
  OSFT_QR_HOUSEHOLDER = 0,  /**< blocked Householder: stable, the default */
  OSFT_QR_CHOLESKY_QR2 = 1, /**< shifted CholeskyQR3 in fp64, checked, Householder
                               fall-back */
  OSFT_QR_CHOLESKY_TF32 = 2 /**< fp32: three CholeskyQR passes whose Gram
                               matrices are TF32 GEMMs, then a last pass
                               with an fp64 Gram matrix; checked,
                               Householder fall-back (since 1.2) */
} osft_qr_method_t;

/**
 * @brief Options of osft_qr_batch() and osft_qr_power_iteration().
 *
 * Initialize
 * with OSFT_QR_OPTIONS_INIT(&o); every default is 0.
 */
typedef struct osft_qr_options_s {
  size_t struct_size; /**< sizeof(osft_qr_options_t) as compiled */
  /** Default OSFT_QR_HOUSEHOLDER. */
  osft_qr_method_t method;
  /** OSFT_QR_CHOLESKY_QR2 and OSFT_QR_CHOLESKY_TF32 only: the largest loss
   * of orthogonality before
   * the last pass, ||Q2^T Q2 - I||_F (Frobenius norm; Q2 = A R1^-1 R2^-1),
   * that is still accepted. It is read from the last pass's Gram matrix at
   * no extra cost. Below 1 it bounds kappa(Q2)^2 <= (1 + t) / (1 - t), and
   * the last pass then restores orthogonality to the level of Householder
   * (Yamamoto et al., 2015). Must be >= 0; 0 means the default 0.5. */
  double orthogonality_threshold;
  /** A matrix is reported rank-deficient (a per-matrix
   * OSFT_STATUS_NUMERICAL_ERROR, nothing of it written) when
   * min_j |R_jj| <= rank_tolerance * max_j |R_jj|; an all-zero matrix
   * always is. 0 means the default max(m, n) * eps of the dtype (eps =
   * 2^-23 for fp32, 2^-52 for fp64): rank-deficient to working precision.
   * A negative value turns the check off: every finite matrix then gets an
   * orthonormal Q with Q R = A, whose columns beyond the rank are not
   * unique (e.g. for power iteration on a singular preconditioner). */
  double rank_tolerance;
  /** The most workers (CPU threads, CUDA streams) one call uses; never more
   * than the number of matrices. 0 means the default: on the CPU the
   * library's thread count (osft_get_num_threads(): the count set with
   * osft_set_num_threads(), else the environment's, else the CPUs'), on
   * CUDA 8. 1 runs the matrices one after another (on the CPU with the BLAS
   * engine at the library's thread count). Must be >= 0. */
  int max_concurrency;
  /** (since 1.4) What a rank-deficient matrix gets. NULL (the default, and
   * what callers built against older headers pass): it is a per-matrix
   * failure, its outputs untouched (see "Per-matrix failures").
   * Non-NULL: an array of `count` ints, one per matrix (power iteration:
   * per pair), owned by the caller and written by the call when it writes
   * per_matrix_status (after validation, so never on an error detected
   * before any output is written): 1 where the matrix (power iteration: the
   * product A_i Q at any iteration) is rank-deficient to rank_tolerance, 0
   * elsewhere. Such a matrix is then factored anyway and is not a failure:
   * Householder QR is defined for any finite matrix, so its Q (orthonormal
   * to working precision, Q R = A, diag(R) >= 0) and R are written, and its
   * per_matrix_status is OSFT_STATUS_SUCCESS; the columns of Q beyond the
   * numerical rank are an orthonormal complement that rounding chose (not
   * unique). With a Cholesky method such a matrix is redone with
   * Householder where the Cholesky path cannot factor it. Each one is
   * logged at OSFT_LOG_DEBUG. Matrices with NaN or Inf, or whose result
   * overflows, still fail as described above (0 here). This suits
   * optimizers that refresh eigenbases by power iteration (SOAP, Shampoo),
   * whose Kronecker factors are often singular (a parameter with fewer
   * columns than rows, rows that no gradient reached): keeping the previous
   * basis there would be silently wrong. Must not overlap the tensors. */
  int *rank_deficient;
} osft_qr_options_t;

/**
 * @brief Fills *opts with the defaults (all 0: Householder, default
 * thresholds, default concurrency) for a struct of struct_size bytes.
 *
 * @param[out] opts         The struct to fill.
 * @param[in]  struct_size  sizeof(*opts) as the caller compiled it.
 * @return OSFT_STATUS_SUCCESS, or an error.
 * On error nothing is written.
 * @retval OSFT_STATUS_SUCCESS  The defaults were written.
 * @retval OSFT_STATUS_INVALID_ARGUMENT  (opts NULL)
 * @retval OSFT_STATUS_INVALID_STRUCT_SIZE  struct_size below the 1.0 layout.
 */
OSFT_API osft_status_t osft_qr_options_init(osft_qr_options_t *opts, size_t struct_size);
#define OSFT_QR_OPTIONS_INIT(o) osft_qr_options_init((o), sizeof(*(o)))

/**
 * @brief QR factorizations of `count` matrices: A_i = Q_i R_i for i < count.
 *
 * @param[in]  ctx    The context.
 * @param[in]  opts   options; NULL for the defaults. Read during the call
 *                    only.
 * @param[in]  count  number of matrices; 0 does nothing and succeeds (the
 *                    arrays may then be NULL).
 * @param[in]  a      array of `count` tensors A_i: 2-D m_i x n_i with
 *                    m_i >= n_i, fp32 or fp64 (each its own), row-major with
 *                    unit column stride and a row stride >= n_i (padded rows
 *                    allowed), on the context's device. Shapes and dtypes may
 *                    differ between entries. Read only, unless the call is in
 *                    place.
 * @param[out] q      array of `count` output tensors Q_i (m_i x n_i, A_i's
 *                    dtype, same layout rules), or NULL to write each Q_i
 *                    over its A_i (in place). An entry that describes exactly
 *                    A_i's memory (same address, shape and row stride) is
 *                    also in place. An entry must not be NULL.
 * @param[out] r      NULL (no R wanted), or an array of `count` entries, each
 *                    NULL (no R for that matrix) or an n_i x n_i tensor of
 *                    A_i's dtype (padded rows allowed) that receives R_i: the
 *                    upper triangle, with zeros below the diagonal.
 * @param[out] per_matrix_status  NULL, or an array of `count` statuses:
 *                    written once the list has been validated and the
 *                    factorizations have run, each OSFT_STATUS_SUCCESS or
 *                    OSFT_STATUS_NUMERICAL_ERROR.
 *
 * Outputs must not overlap any input or other output (except a Q_i that is
 * exactly its own A_i); inputs may overlap each other. Matrices with
 * n_i == 0 are accepted and need nothing. Units: elements.
 *
 * @return OSFT_STATUS_SUCCESS when every matrix was factored, or
 * OSFT_STATUS_NUMERICAL_ERROR when one or more failed (see "Per-matrix
 * failures" above; the others are written). Errors detected before
 * anything is written (per_matrix_status included) are listed below.
 * Every message names the offending entry, e.g. "q[7]: shape [64, 32],
 * expected [64, 48]" or "q[1] and a[2] share memory; they must not overlap".
 * @retval OSFT_STATUS_SUCCESS  every matrix was factored.
 * @retval OSFT_STATUS_NUMERICAL_ERROR  one or more failed (see "Per-matrix
 *   failures" above; the others are written).
 * @retval OSFT_STATUS_INVALID_HANDLE  (ctx)
 * @retval OSFT_STATUS_INVALID_ARGUMENT  (a NULL array or entry with count >
 *   0, a NULL q entry, an unknown method, a negative or NaN threshold, a
 *   negative max_concurrency, a NaN rank_tolerance)
 * @retval OSFT_STATUS_INVALID_STRUCT_SIZE  (opts)
 * @retval OSFT_STATUS_DTYPE_MISMATCH  (not fp32/fp64, or q/r unlike a)
 * @retval OSFT_STATUS_SHAPE_MISMATCH  (not 2-D, m < n, q or r of another
 *   shape)
 * @retval OSFT_STATUS_BAD_LAYOUT  An entry's layout.
 * @retval OSFT_STATUS_DEVICE_MISMATCH  (an entry not on the context's device)
 * @retval OSFT_STATUS_ALIASING  An output overlaps an input or another
 *   output.
 * @retval OSFT_STATUS_NOT_SUPPORTED  (a dimension above 2^31 - 1)
 * @retval OSFT_STATUS_OUT_OF_MEMORY  (workspace)
 * @retval OSFT_STATUS_BACKEND_ERROR  (a CUDA library failed; on the device,
 *   work already enqueued may have written some outputs)
 */
OSFT_API osft_status_t osft_qr_batch(osft_context_t ctx, const osft_qr_options_t *opts,
                                     size_t count, const DLTensor *const *a,
                                     DLTensor *const *q, DLTensor *const *r,
                                     osft_status_t *per_matrix_status);

/**
 * @brief Power iteration on `count` pairs: `iterations` times, Q_i <- qr(A_i
 * Q_i) (the Q factor, diag(R) >= 0), as a refresh of SOAP/Shampoo eigenbases
 * from their preconditioner factors does.
 *
 * @param[in]     ctx         The context.
 * @param[in]     opts        options; NULL for the defaults (as for
 *                            osft_qr_batch()).
 * @param[in]     count       number of pairs (as for osft_qr_batch()).
 * @param[in]     a           array of `count` square m_i x m_i tensors A_i
 *                            (fp32 or fp64; padded rows allowed), read only.
 * @param[in,out] q           array of `count` m_i x n_i tensors Q_i (n_i <=
 *                            m_i, A_i's dtype; padded rows allowed): the
 *                            starting Q, overwritten with the result.
 * @param[in]     iterations  >= 1.
 * @param[out]    per_matrix_status  as for osft_qr_batch().
 *
 * Equal, up to rounding of the product, to `iterations` calls of
 * osft_qr_batch() on the products A_i Q_i, but the products stay in
 * scratch memory. A pair fails (per-matrix OSFT_STATUS_NUMERICAL_ERROR,
 * its Q_i unchanged) if A_i or Q_i contains NaN or Inf, or if a product is
 * rank-deficient (see rank_tolerance) or overflows at any iteration. Q_i
 * must not overlap any A_j or other Q_j.
 *
 * @return Errors: as for osft_qr_batch(), plus OSFT_STATUS_INVALID_ARGUMENT
 * for iterations < 1 and OSFT_STATUS_SHAPE_MISMATCH for an A_i that is not
 * square or a Q_i whose rows differ from A_i's.
 * @retval OSFT_STATUS_SUCCESS  every pair was iterated.
 * @retval OSFT_STATUS_NUMERICAL_ERROR  one or more pairs failed (their Q_i
 *   unchanged; the others are written).
 * @retval OSFT_STATUS_INVALID_HANDLE  As for osft_qr_batch().
 * @retval OSFT_STATUS_INVALID_ARGUMENT  As for osft_qr_batch(); iterations <
 *   1.
 * @retval OSFT_STATUS_INVALID_STRUCT_SIZE  As for osft_qr_batch().
 * @retval OSFT_STATUS_DTYPE_MISMATCH  As for osft_qr_batch().
 * @retval OSFT_STATUS_SHAPE_MISMATCH  As for osft_qr_batch(); an A_i that is
 *   not square or a Q_i whose rows differ from A_i's.
 * @retval OSFT_STATUS_BAD_LAYOUT  As for osft_qr_batch().
 * @retval OSFT_STATUS_DEVICE_MISMATCH  As for osft_qr_batch().
 * @retval OSFT_STATUS_ALIASING  As for osft_qr_batch().
 * @retval OSFT_STATUS_NOT_SUPPORTED  As for osft_qr_batch().
 * @retval OSFT_STATUS_OUT_OF_MEMORY  As for osft_qr_batch().
 * @retval OSFT_STATUS_BACKEND_ERROR  As for osft_qr_batch().
 */
OSFT_API osft_status_t osft_qr_power_iteration(osft_context_t ctx,
                                               const osft_qr_options_t *opts,
                                               size_t count, const DLTensor *const *a,
                                               DLTensor *const *q, int iterations,
                                               osft_status_t *per_matrix_status);

/**
 * @def OSFT_QR_OPTIONS_INIT(o)
 * @brief osft_qr_options_init() with the struct's own size.
 * @param o  Pointer to an osft_qr_options_t.
 */

/** @} */

#ifdef __cplusplus
}
#endif

#endif /* OSFTRT_QR_H */
