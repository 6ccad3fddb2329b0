/**
 * @file
 * @brief libosftrt — status codes and the thread-local error message.
 *
 * Every fallible function returns an osft_status_t. On failure it also
 * records a human-readable message for the calling thread that names the
 * function, the offending argument and the reason, e.g.
 *
 * @code{.unparsed}
 *   osft_context_create: opts->struct_size: 4 is smaller than the 1.0
 *   layout of osft_context_options_t (32 bytes)
 * @endcode
 *
 * and, where the caller installed one, sends it to the log callback
 * (osftrt/log.h) at OSFT_LOG_ERROR.
 *
 * Guarantee on failure: nothing the caller passed is modified — no output
 * tensor, no out-parameter, no gradient accumulator, no handle state. All
 * arguments are validated before the first write.
 *
 * @code
 *   osft_context_t ctx;
 *   osft_status_t st = osft_context_create(&ctx, NULL);
 *   if (st != OSFT_STATUS_SUCCESS) {
 *     syslog(LOG_ERR, "%s: %s", osft_status_string(st), osft_last_error());
 *     return 1;
 *   }
 * @endcode
 *
 * @par Non-finite values (NaN, Inf)
 * OSFT_STATUS_NUMERICAL_ERROR is returned only by the calls that check values:
 * the SVD of osft_flinear_create_from_weight / osft_flinear_redecompose (NaN
 * or Inf in the weight, or no convergence) and osft_qr_batch /
 * osft_qr_power_iteration (per matrix: NaN or Inf, rank deficiency, overflow
 * of the result). Every other call propagates NaN/Inf into its outputs and
 * returns OSFT_STATUS_SUCCESS; a trainer that skips bad steps tests the loss
 * (osft_flce_compute propagates non-finite values into it) or its gradients.
 */
#ifndef OSFTRT_STATUS_H
#define OSFTRT_STATUS_H

#include "osftrt/export.h"

#ifdef __cplusplus
extern "C" {
#endif

/**
 * @defgroup osftrt_status Status codes and errors
 * @brief What every fallible function returns, and the thread-local message
 * that says why it failed (osftrt/status.h).
 *
 * Each function's documentation lists, with @c retval, the statuses it
 * returns. Any function may also return OSFT_STATUS_INTERNAL_ERROR (a bug).
 * @{
 */

/**
 * @brief Status codes.
 *
 * Values are fixed forever (ABI.md): new codes are appended
 * with new numbers, existing ones are never renumbered or reused. A caller
 * must treat an unknown value as a failure.
 */
typedef enum osft_status_e {
  /** The call did what it documents. */
  OSFT_STATUS_SUCCESS = 0,
  /** A pointer argument is NULL where it must not be, or a scalar argument is
   * outside its documented range (rank ratio, tile size, log level, ...). */
  OSFT_STATUS_INVALID_ARGUMENT = 1,
  /** A handle argument is NULL, was never created by this library, or has
   * already been destroyed (detected while its address is not reused). */
  OSFT_STATUS_INVALID_HANDLE = 2,
  /** An options/descriptor struct's struct_size is smaller than its 1.0
   * layout, or larger than this library knows with non-zero bytes in the
   * part it does not know. */
  OSFT_STATUS_INVALID_STRUCT_SIZE = 3,
  /** A tensor's dtype is not one the function accepts, or differs from the
   * dtype another argument requires it to share. */
  OSFT_STATUS_DTYPE_MISMATCH = 4,
  /** A tensor's rank or shape is wrong, or disagrees with another argument. */
  OSFT_STATUS_SHAPE_MISMATCH = 5,
  /** A tensor's strides (or byte_offset alignment, or lanes) describe a
   * memory layout the function does not accept. */
  OSFT_STATUS_BAD_LAYOUT = 6,
  /** A tensor lives on a device other than the context's. */
  OSFT_STATUS_DEVICE_MISMATCH = 7,
  /** An output overlaps in memory with an input (or another output) where
   * the function forbids it. */
  OSFT_STATUS_ALIASING = 8,
  /** A value inside a tensor is out of range, e.g. a class target outside
   * [0, V) that is not the ignore index. */
  OSFT_STATUS_INDEX_OUT_OF_RANGE = 9,
  /** An allocation failed: the built-in allocator, a caller's allocator
   * callback returning NULL, or a request above the workspace limit. */
  OSFT_STATUS_OUT_OF_MEMORY = 10,
  /** The requested device type is compiled in, but no such device is present
   * (e.g. no CUDA driver or GPU), or the device ordinal does not exist. */
  OSFT_STATUS_NO_DEVICE = 11,
  /** The feature is not available in this build (e.g. CUDA, NCCL or MPI was
   * not compiled in) or not for this backend/dtype combination. */
  OSFT_STATUS_NOT_SUPPORTED = 12,
  /** A backend library failed: CUDA runtime, cuBLAS, cuSOLVER, BLAS/LAPACK.
   * The message carries the backend's own error name. */
  OSFT_STATUS_BACKEND_ERROR = 13,
  /** A collective failed (NCCL, MPI or a host callback reported an error). */
  OSFT_STATUS_COMM_ERROR = 14,
  /** An operation did not complete within its configured timeout. */
  OSFT_STATUS_TIMEOUT = 15,
  /** The input is numerically unusable: non-finite values, a rank-deficient
   * matrix where full rank is required. */
  OSFT_STATUS_NUMERICAL_ERROR = 16,
  /** A bug in libosftrt (an invariant failed). Please report it with the
   * message and osft_build_info(). */
  OSFT_STATUS_INTERNAL_ERROR = 17
} osft_status_t;

/**
 * @brief A short, static, English name for a status code, e.g. "shape
 * mismatch".
 *
 * Unknown codes give "unknown status".
 *
 * @param[in] status  Any value, known or not.
 * @return Never NULL; the string is owned by the
 * library and valid for the life of the process.
 * @par Thread safety
 * Thread-safe.
 */
OSFT_API const char *osft_status_string(osft_status_t status);

/**
 * @brief The message of the most recent failure on the calling thread, or ""
 * when this thread has seen none since it started or since
 * osft_clear_last_error().
 *
 * Successful calls do not clear it.
 *
 * @return Never NULL. The string is owned by the
 * library; it stays valid on this thread until the next failing call or
 * osft_clear_last_error() on this thread.
 * @par Thread safety
 * Thread-local: failures on other
 * threads never change what this thread sees.
 */
OSFT_API const char *osft_last_error(void);

/**
 * @brief Forget the calling thread's last error message (osft_last_error()
 * then returns "").
 *
 * @par Thread safety
 * Thread-local; cannot fail.
 */
OSFT_API void osft_clear_last_error(void);

/** @} */

#ifdef __cplusplus
}
#endif

#endif /* OSFTRT_STATUS_H */
