/* Batched QR: planning the list over a backend's workers and reporting
 * per-matrix outcomes. The plan depends only on shapes, dtypes and
 * options, never on values, so a matrix's result is the same whatever
 * else is in the list. */
#include <algorithm>
#include <cfloat>
#include <cstdio>

#include "core/error.h"
#include "core/logging.h"
#include "ops/qr_ops.h"

namespace osft {
namespace {

double dtype_eps(osfti_dtype_t dt) {
  return dt == OSFTI_F64 ? DBL_EPSILON : FLT_EPSILON;
}

/* 0: max(m, n) eps; negative: no check. */
double resolve_rank_tol(double user, const QrJob &j) {
  if (user < 0.0) return -1.0;
  if (user > 0.0) return user;
  return static_cast<double>(std::max(j.m(), j.n())) * dtype_eps(j.q.dtype);
}

/* Longest job first, each to the least loaded lane (ties: lowest lane),
 * then each lane's jobs grouped by dtype and shape. Batched jobs (lane -1)
 * come first. */
void assign_lanes(Context &ctx, QrCall &call, int lanes) {
  QrJob *jobs = call.jobs;
  const int iters = call.iterations;
  std::sort(jobs, jobs + call.count, [&](const QrJob &x, const QrJob &y) {
    const double cx = qr_job_cost(x, iters), cy = qr_job_cost(y, iters);
    return cx != cy ? cx > cy : x.index < y.index;
  });
  HostArray<double> load(ctx, static_cast<size_t>(lanes));
  for (size_t i = 0; i < call.count; ++i) {
    if (jobs[i].lane < 0) continue;
    int best = 0;
    for (int l = 1; l < lanes; ++l)
      if (load[l] < load[best]) best = l;
    jobs[i].lane = best;
    load[best] += qr_job_cost(jobs[i], iters);
  }
  std::sort(jobs, jobs + call.count, [](const QrJob &x, const QrJob &y) {
    if (x.lane != y.lane) return x.lane < y.lane;
    if (x.q.dtype != y.q.dtype) return x.q.dtype < y.q.dtype;
    if (x.m() != y.m()) return x.m() > y.m();
    if (x.n() != y.n()) return x.n() > y.n();
    return x.index < y.index;
  });
  call.lanes = lanes;
}

/* Lays out the scratch for `lanes` lanes: lane_offset[l] and the total. */
size_t layout_scratch(Context &ctx, const QrKernels &k, QrCall &call, size_t *lane_offset,
                      const HostArray<size_t> &job_bytes) {
  HostArray<size_t> lane_max(ctx, static_cast<size_t>(call.lanes));
  for (size_t i = 0; i < call.count; ++i) {
    const QrJob &j = call.jobs[i];
    if (j.lane < 0) continue;
    const int lane = k.lanes_take_any_job ? 0 : j.lane;
    lane_max[lane] = std::max(lane_max[lane], job_bytes[j.index]);
  }
  if (k.lanes_take_any_job)
    for (int l = 1; l < call.lanes; ++l) lane_max[l] = lane_max[0];
  call.shared_bytes = qr_align(k.shared_bytes(ctx, call));
  size_t total = call.shared_bytes;
  for (int l = 0; l < call.lanes; ++l) {
    lane_offset[l] = total;
    total += qr_align(lane_max[l]);
  }
  return total;
}

/* Chooses the lanes (fewer if the workspace limit says so) and returns
 * the scratch bytes of the plan. */
size_t plan_call(Context &ctx, const QrKernels &k, QrCall &call, int concurrency,
                 HostArray<size_t> &lane_offset, size_t list_count) {
  HostArray<size_t> job_bytes(ctx, list_count);
  size_t lane_jobs = 0;
  for (size_t i = 0; i < call.count; ++i) {
    QrJob &j = call.jobs[i];
    j.lane = k.batched(ctx, j, call) ? -1 : 0;
    if (j.lane < 0) continue;
    ++lane_jobs;
    job_bytes[j.index] = k.lane_bytes(ctx, j, call);
  }
  int lanes =
      static_cast<int>(std::min<size_t>(static_cast<size_t>(concurrency), lane_jobs));
  lanes = std::max(lanes, 1);
  for (;; --lanes) {
    assign_lanes(ctx, call, lanes);
    const size_t total = layout_scratch(ctx, k, call, lane_offset.get(), job_bytes);
    if (ctx.workspace_limit == 0 || total <= ctx.workspace_limit || lanes == 1)
      return total;
  }
}

QrMethod qr_method(osft_qr_method_t method) {
  switch (method) {
    case OSFT_QR_CHOLESKY_QR2: return QrMethod::cholesky_qr2;
    case OSFT_QR_CHOLESKY_TF32: return QrMethod::cholesky_tf32;
    default: return QrMethod::householder;
  }
}

const char *reason(uint32_t flags, bool power) {
  if (flags & kQrNonfiniteInput)
    return power ? "contains NaN or Inf (in a or in the starting q)"
                 : "contains NaN or Inf";
  if (flags & kQrRankDeficient)
    return power ? "a product A Q is rank-deficient to the tolerance "
                   "(min |R_jj| <= rank_tolerance * max |R_jj|)"
                 : "is rank-deficient to the tolerance (min |R_jj| <= rank_tolerance * "
                   "max |R_jj|)";
  return "the factorization overflowed (NaN or Inf in the result)";
}

/* Writes the statuses (and opts->rank_deficient), logs fall-backs and
 * rank-deficient matrices, and throws if any matrix failed. */
void report(const QrCall &call, const uint32_t *flags, const QrList &list,
            osft_status_t *statuses, int *rank_deficient) {
  if (statuses != nullptr)
    for (size_t i = 0; i < list.count; ++i) statuses[i] = OSFT_STATUS_SUCCESS;
  if (rank_deficient != nullptr)
    for (size_t i = 0; i < list.count; ++i) rank_deficient[i] = 0;
  size_t failed = 0, fell_back = 0, deficient = 0, first = list.count;
  uint32_t first_flags = 0;
  for (size_t p = 0; p < call.count; ++p) {
    const size_t i = call.jobs[p].index;
    if (flags[p] & kQrRankReported) {
      ++deficient;
      if (rank_deficient != nullptr) rank_deficient[i] = 1;
      log_message(OSFT_LOG_DEBUG,
                  "qr: %s %zu is rank-deficient to the tolerance; factored and written "
                  "(opts->rank_deficient)",
                  list.iterations > 0 ? "pair" : "matrix", i);
    }
    if (flags[p] & kQrFellBack) {
      ++fell_back;
      log_message(OSFT_LOG_DEBUG,
                  "qr: a[%zu]: the Cholesky path lost orthogonality or a Cholesky "
                  "factorization failed; redone with Householder",
                  i);
    }
    if ((flags[p] & kQrFailureMask) == 0) continue;
    ++failed;
    log_message(OSFT_LOG_DEBUG, "qr: matrix %zu failed: %s", i,
                reason(flags[p], list.iterations > 0));
    if (statuses != nullptr) statuses[i] = OSFT_STATUS_NUMERICAL_ERROR;
    if (i < first) {
      first = i;
      first_flags = flags[p];
    }
  }
  if (fell_back > 0)
    log_message(OSFT_LOG_DEBUG, "qr: %zu of %zu matrices fell back to Householder",
                fell_back, list.count);
  if (deficient > 0)
    log_message(OSFT_LOG_DEBUG, "qr: %zu of %zu matrices rank-deficient, factored anyway",
                deficient, list.count);
  if (failed == 0) return;
  const bool power = list.iterations > 0;
  char name[64];
  if (power)
    std::snprintf(name, sizeof name, "pair %zu (a[%zu], q[%zu])", first, first, first);
  else
    std::snprintf(name, sizeof name, "a[%zu]", first);
  raise(OSFT_STATUS_NUMERICAL_ERROR,
        "%s: %s; its output was not written (%zu of %zu %s failed, the others were "
        "computed; per_matrix_status has each)",
        name, reason(first_flags, power), failed, list.count,
        power ? "pairs" : "matrices");
}

/* For kernels that fail a rank-deficient job even when it asked to be
 * factored (QrKernels::reports_rank_deficient false): those jobs alone run
 * again with the rank check off, on the scratch already reserved (a subset
 * of the jobs on at most as many lanes needs no more), and are flagged
 * kQrRankReported. A matrix's result does not depend on the rest of the
 * list, so the rerun gives what a single call would have. */
void rerun_rank_deficient(Context &ctx, const QrKernels &k, const QrCall &call,
                          size_t list_count, int concurrency, size_t reserved,
                          void *scratch, uint32_t *flags) {
  size_t count = 0;
  for (size_t p = 0; p < call.count; ++p)
    if (call.jobs[p].factor_deficient && (flags[p] & kQrFailureMask) == kQrRankDeficient)
      ++count;
  if (count == 0) return;
  HostArray<QrJob> jobs(ctx, count);
  HostArray<size_t> position(ctx, list_count);
  size_t c = 0;
  for (size_t p = 0; p < call.count; ++p) {
    if (!(call.jobs[p].factor_deficient &&
          (flags[p] & kQrFailureMask) == kQrRankDeficient))
      continue;
    jobs[c] = call.jobs[p];
    jobs[c].rank_tol = -1.0;
    position[call.jobs[p].index] = p;
    ++c;
  }
  QrCall again = call;
  again.jobs = jobs.get();
  again.count = count;
  HostArray<size_t> lane_offset(
      ctx, std::min(static_cast<size_t>(std::max(concurrency, 1)), count));
  const size_t bytes = plan_call(ctx, k, again, concurrency, lane_offset, list_count);
  if (bytes > reserved)
    raise(OSFT_STATUS_INTERNAL_ERROR,
          "qr: the rank-deficient rerun needs %zu bytes > %zu", bytes, reserved);
  again.lane_offset = lane_offset.get();
  HostArray<uint32_t> again_flags(ctx, count);
  k.run(ctx, again, scratch, again_flags.get());
  for (size_t q = 0; q < count; ++q) {
    const size_t p = position[again.jobs[q].index];
    flags[p] = (again_flags[q] & kQrFailureMask) != 0
                   ? again_flags[q]
                   : (flags[p] & kQrFellBack) | again_flags[q] | kQrRankReported;
  }
}

}  // namespace

void run_qr(Context &ctx, const osft_qr_options_t &opts, const QrList &list,
            osft_status_t *per_matrix_status) {
  HostArray<QrJob> all(ctx, list.count);
  check_qr_list(ctx, list, all.get());
  if (list.count == 0) return;
  const QrKernels &k = qr_kernels(ctx);

  QrCall call;
  call.method = qr_method(opts.method);
  call.ortho_threshold =
      opts.orthogonality_threshold > 0.0 ? opts.orthogonality_threshold : 0.5;
  call.iterations = list.iterations;
  HostArray<QrJob> jobs(ctx, list.count);
  for (size_t i = 0; i < list.count; ++i) {
    QrJob j = all[i];
    if (j.m() == 0 || j.n() == 0) continue; /* nothing to compute */
    j.rank_tol = resolve_rank_tol(opts.rank_tolerance, j);
    j.factor_deficient = opts.rank_deficient != nullptr;
    jobs[call.count++] = j;
  }
  call.jobs = jobs.get();
  HostArray<uint32_t> flags(ctx, call.count);
  if (call.count > 0) {
    const int concurrency =
        opts.max_concurrency > 0 ? opts.max_concurrency : k.default_concurrency(ctx);
    HostArray<size_t> lane_offset(
        ctx, std::min(static_cast<size_t>(std::max(concurrency, 1)), call.count));
    const size_t bytes = plan_call(ctx, k, call, concurrency, lane_offset, list.count);
    call.lane_offset = lane_offset.get();
    void *scratch = bytes > 0 ? workspace(ctx, bytes) : nullptr;
    log_message(OSFT_LOG_DEBUG, "qr: %zu matrices on %d lane(s), %zu bytes of scratch",
                call.count, call.lanes, bytes);
    k.run(ctx, call, scratch, flags.get());
    if (!k.reports_rank_deficient && opts.rank_deficient != nullptr)
      rerun_rank_deficient(ctx, k, call, list.count, concurrency, bytes, scratch,
                           flags.get());
  }
  report(call, flags.get(), list, per_matrix_status, opts.rank_deficient);
}

}  // namespace osft
