/* Internal: batched QR (osftrt/qr.h) — validating the caller's list,
 * planning it over the workers of a backend (src/backend/qr_backend.h) and
 * turning per-matrix outcomes into statuses. Written once for both
 * backends. */
#ifndef OSFTRT_SRC_OPS_QR_OPS_H
#define OSFTRT_SRC_OPS_QR_OPS_H

#include <cstddef>

#include "core/context_impl.h"
#include "backend/qr_backend.h"
#include "osftrt/qr.h"

namespace osft {

/* The caller's list as given to osft_qr_batch / osft_qr_power_iteration. */
struct QrList {
  size_t count = 0;
  const DLTensor *const *a = nullptr;
  DLTensor *const *q = nullptr; /* NULL: in place (batch only) */
  DLTensor *const *r = nullptr; /* NULL: no R */
  int iterations = 0;           /* 0: osft_qr_batch; >= 1: power iteration */
};

/* Validated options with their defaults applied (NULL: all defaults). */
osft_qr_options_t read_qr_options(const osft_qr_options_t *user);

/* Validates the whole list and fills jobs[0..count) (a, q, r, index; q ==
 * a for an in-place entry). Throws naming the entry; writes nothing else. */
void check_qr_list(Context &ctx, const QrList &list, QrJob *jobs);

/* Validates, plans, runs, and writes per_matrix_status (may be NULL).
 * Throws OSFT_STATUS_NUMERICAL_ERROR after writing if any matrix failed. */
void run_qr(Context &ctx, const osft_qr_options_t &opts, const QrList &list,
            osft_status_t *per_matrix_status);

}  // namespace osft

#endif
