/* OSFT projection: the batched projection of gradients or parameters and
 * the orthogonality query. Per call: every U_ROWS / V_COLS part's GEMM
 * writes its fixed slice of the coefficient buffer, ONE all-reduce sums
 * the buffer, then every part is updated (local parts compute their
 * coefficients in scratch). Nothing the caller owns is written before the
 * collective has succeeded.
 *
 * Parts with the same shapes, dtypes and arithmetic are worked on together:
 * each step of their update is one batched GEMM (one launch on CUDA) over
 * the group, in slices whose scratch stays under kBatchBytes. */
#include <algorithm>
#include <cmath>
#include <utility>

#include "core/error.h"
#include "core/logging.h"
#include "core/scratch.h"
#include "ops/projection_ops.h"

namespace osft {
namespace {

/* Scratch of one batch of parts (coefficients, splits, accumulators): a
 * batch of large parts holds a few (their GEMMs fill the GPU alone), one
 * of small parts holds many. */
constexpr size_t kBatchBytes = size_t{64} << 20;

Mat full_of(const Projector &p, const Part &part) {
  if (part.layout != OSFT_SHARD_V_ROWS || ranks(p) == 1) return part.high.m;
  return Mat{static_cast<char *>(p.cache) + part.cache, part.r, part.dim, part.dim,
             part.high.m.dtype};
}

/* Before a call: refreshes the layers' views and checks the operands.
 * need_all: every present part must have the operand (the orthogonality
 * query), else parts without it are skipped. */
void refresh(Projector &p, Operands which, bool need_all) {
  for (size_t i = 0; i < p.targets.size(); ++i) {
    Target &t = p.targets[i];
    if (t.layer != nullptr) refresh_layer_target(p, t, static_cast<int64_t>(i));
    if (!need_all) continue;
    for (const Part *part : {&t.u, &t.v}) {
      const Operand &x = which == Operands::grads ? part->grad : part->low;
      if (part->present && !x.set)
        raise(OSFT_STATUS_INVALID_ARGUMENT,
              "target %zu: no %s registered; the orthogonality query needs the "
              "trainable factor of every part",
              i, part == &t.u ? "u_low" : "v_low");
    }
  }
}

bool native_bf16(Context &ctx) {
  const Backend &b = backend(ctx);
  return b.native_bf16_gemm != nullptr && b.native_bf16_gemm(ctx);
}

/* osft_projection_arithmetic_t resolved for one part (projection.h). */
Arith arithmetic(Context &ctx, int option, const Mat &full, const Mat &x) {
  const bool bf16_full = full.dtype == OSFTI_BF16;
  const bool native = bf16_full && native_bf16(ctx);
  switch (option) {
    case OSFT_PROJECTION_ARITHMETIC_FP32: return Arith::fp32;
    case OSFT_PROJECTION_ARITHMETIC_BF16: return bf16_full ? Arith::bf16 : Arith::fp32;
    case OSFT_PROJECTION_ARITHMETIC_EXACT: return native ? Arith::split : Arith::fp32;
    default: /* AUTO: the storage of x decides */
      if (x.dtype == OSFTI_F32) return native ? Arith::split : Arith::fp32;
      return native ? Arith::bf16 : Arith::fp32;
  }
}

/* The fields that order parts by kind: reduced parts first, then by side,
 * arithmetic and shapes. */
constexpr int kKeyFields = 11;
void kind_key(const ProjectionJob &j, int64_t key[kKeyFields]) {
  const int64_t k[kKeyFields] = {j.coef == nullptr,
                                 !j.u,
                                 static_cast<int64_t>(j.arith),
                                 j.full.rows,
                                 j.full.cols,
                                 j.full.ld,
                                 j.full.dtype,
                                 j.x.rows,
                                 j.x.cols,
                                 j.x.ld,
                                 j.x.dtype};
  std::copy(k, k + kKeyFields, key);
}

/* A strict weak order that puts parts of one kind next to each other. */
bool kind_before(const ProjectionJob &a, const ProjectionJob &b) {
  int64_t ka[kKeyFields], kb[kKeyFields];
  kind_key(a, ka);
  kind_key(b, kb);
  return std::lexicographical_compare(ka, ka + kKeyFields, kb, kb + kKeyFields);
}

/* Parts that one batched GEMM can serve together. */
bool same_kind(const ProjectionJob &a, const ProjectionJob &b) {
  return !kind_before(a, b) && !kind_before(b, a);
}

/* p.jobs: the parts a call works on, grouped by kind (a stable insertion
 * sort: no allocation, and registration order within a kind). query: the
 * orthogonality query, whose coefficients stay fp32. */
void collect_jobs(Projector &p, Operands which, bool query) {
  p.jobs.clear();
  for (Target &t : p.targets)
    for (const Part *part : {&t.u, &t.v}) {
      const Operand &x = which == Operands::grads ? part->grad : part->low;
      if (!part->present || !x.set) continue;
      ProjectionJob j;
      j.u = part == &t.u;
      j.full = full_of(p, *part);
      j.x = x.m;
      j.arith = query ? Arith::fp32 : arithmetic(*p.ctx, p.arithmetic, j.full, j.x);
      if (part->reduced()) j.coef = p.coef + part->coef;
      p.jobs.push_back(j);
    }
  for (size_t i = 1; i < p.jobs.size(); ++i)
    for (size_t k = i; k > 0 && kind_before(p.jobs[k], p.jobs[k - 1]); --k)
      std::swap(p.jobs[k], p.jobs[k - 1]);
}

int64_t elems(const Mat &m) {
  return m.rows * m.cols;
}

/* The coefficient block of a part: C_U (r x l) or C_V (l x r). */
Mat coef_mat(const ProjectionJob &j, void *data, osfti_dtype_t dtype) {
  if (j.u) return Mat{data, j.full.cols, j.x.cols, j.x.cols, dtype};
  return Mat{data, j.x.rows, j.full.rows, j.full.rows, dtype};
}

/* A part's scratch: widened operands, its coefficients (local parts; a
 * reduced part's bf16 copy), C's bf16 halves and the split's fp32
 * accumulator, each only where its arithmetic needs it. */
struct Slots {
  Mat w32, x32, c, hi, lo, acc;
};

/* Carves compact matrices from `base` (nullptr: only counts the bytes). */
class Carver {
 public:
  explicit Carver(char *base) : base_(base) {}
  Mat take(int64_t rows, int64_t cols, osfti_dtype_t dtype) {
    const size_t bytes = static_cast<size_t>(rows * cols) * osfti_dtype_size(dtype);
    Mat m{base_ != nullptr ? base_ + used_ : nullptr, rows, cols, cols, dtype};
    used_ += (bytes + ScratchPlan::alignment - 1) / ScratchPlan::alignment *
             ScratchPlan::alignment;
    return m;
  }
  size_t used() const noexcept { return used_; }

 private:
  char *base_;
  size_t used_ = 0;
};

Slots carve(const ProjectionJob &j, Carver &cv) {
  Slots s;
  const bool bf16_full = j.full.dtype == OSFTI_BF16;
  const bool mixed = j.full.dtype != j.x.dtype;
  const Mat shape = coef_mat(j, nullptr, OSFTI_F32);
  /* full is widened for the coefficients of a mixed pair and for an fp32
   * update; x for the coefficients of a bf16 x against an fp32 full. */
  if (bf16_full && (mixed || j.arith == Arith::fp32))
    s.w32 = cv.take(j.full.rows, j.full.cols, OSFTI_F32);
  if (!bf16_full && mixed) s.x32 = cv.take(j.x.rows, j.x.cols, OSFTI_F32);
  if (j.arith == Arith::bf16)
    s.c = cv.take(shape.rows, shape.cols, OSFTI_BF16);
  else if (j.coef == nullptr)
    s.c = cv.take(shape.rows, shape.cols, OSFTI_F32);
  if (j.arith == Arith::split) {
    s.hi = cv.take(shape.rows, shape.cols, OSFTI_BF16);
    s.lo = cv.take(shape.rows, shape.cols, OSFTI_BF16);
    if (j.x.dtype != OSFTI_F32) s.acc = cv.take(j.x.rows, j.x.cols, OSFTI_F32);
  }
  return s;
}

size_t slot_bytes(const ProjectionJob &j) {
  Carver cv(nullptr);
  carve(j, cv);
  return cv.used();
}

/* One call's work over p.jobs, batch by batch, every backend call counted
 * in p.last. A batch: parts [first_, first_ + n_) of one kind, their slots
 * carved from one scratch block, each step one batched GEMM over them. */
class Pass {
 public:
  explicit Pass(Projector &p) : p_(p), ctx_(*p.ctx), be_(backend(ctx_)) {
    const size_t limit = ctx_.workspace_limit;
    cap_ = limit != 0 ? std::min(kBatchBytes, limit / 2) : kBatchBytes;
  }

  /* Takes the workspace for the largest batch, before anything is
   * written. one_at_a_time: batches of one part (the query). */
  void allocate(bool one_at_a_time) {
    one_ = one_at_a_time;
    size_t most = 0;
    for (bool reduced : {true, false})
      each_batch(reduced, [&](size_t first, size_t last) {
        size_t bytes = 0;
        for (size_t i = first; i < last; ++i) bytes += slot_bytes(p_.jobs[i]);
        most = std::max(most, bytes);
      });
    ScratchPlan plan; /* bytes as floats: one slot, carved by Carver */
    const int slot = plan.add_mat(
        1, static_cast<int64_t>((most + sizeof(float) - 1) / sizeof(float)), OSFTI_F32);
    plan.allocate(ctx_);
    base_ = static_cast<char *>(plan.mat(slot).data);
  }

  /* The reduced parts' coefficients, into their slices. */
  void reduced_coefficients() {
    each_batch(true, [&](size_t first, size_t last) {
      begin(first, last);
      coefficients();
    });
  }

  /* The local parts: coefficients and update. A backend without batched
   * GEMMs takes them part by part (its caches still hold a part's operands
   * when the update reads them again). */
  void local_parts() {
    each_batch(false, [&](size_t first, size_t last) {
      begin(first, last);
      const size_t step = be_.gemm_batched != nullptr ? n_ : 1;
      for (size_t i = 0; i < n_; i += step) {
        span(i, i + step);
        coefficients();
        update();
      }
    });
  }

  /* The reduced parts' updates, after the all-reduce. */
  void reduced_updates() {
    each_batch(true, [&](size_t first, size_t last) {
      begin(first, last);
      update();
    });
  }

  /* Part i's fp32 coefficients, computed alone (the query; allocate(true)
   * first): its slice, or its slot until the next call. */
  Mat coefficients_of(size_t i) {
    begin(i, i + 1);
    coefficients();
    return coef_out(0);
  }

 private:
  static constexpr size_t kMaxBatch = 64; /* parts per batched GEMM */

  /* Calls fn(first, last) for each batch of reduced (or local) parts. */
  template <class Fn>
  void each_batch(bool reduced, Fn &&fn) const {
    const auto &jobs = p_.jobs;
    for (size_t i = 0; i < jobs.size();) {
      if ((jobs[i].coef != nullptr) != reduced) {
        ++i;
        continue;
      }
      size_t j = i + 1, bytes = slot_bytes(jobs[i]);
      for (; !one_ && j < jobs.size() && j - i < kMaxBatch && same_kind(jobs[i], jobs[j]);
           ++j) {
        const size_t more = slot_bytes(jobs[j]);
        if (bytes + more > cap_) break;
        bytes += more;
      }
      fn(i, j);
      i = j;
    }
  }

  /* A batch: its parts' slots, all of them in hand. */
  void begin(size_t first, size_t last) {
    Carver cv(base_);
    first_ = first;
    n_ = last - first;
    for (size_t i = 0; i < n_; ++i) slots_[i] = carve(job(i), cv);
    span(0, n_);
  }

  /* The parts [lo, hi) of the batch that the next steps work on. */
  void span(size_t lo, size_t hi) {
    lo_ = lo;
    hi_ = hi;
  }

  const ProjectionJob &job(size_t i) const { return p_.jobs[first_ + i]; }

  void convert(const Mat &src, const Mat &dst, float beta = 0.0f) {
    be_.scale_into(ctx_, Axis::cols, src, nullptr, beta, dst);
    ++p_.last.elementwise;
  }

  /* What part i's coefficient GEMM writes and an fp32 update reads: its
   * slice (reduced) or its slot (bf16 for the BF16 arithmetic: the GEMM
   * rounds C once). */
  Mat coef_out(size_t i) const {
    const ProjectionJob &j = job(i);
    if (j.coef != nullptr) return coef_mat(j, j.coef, OSFTI_F32);
    return slots_[i].c;
  }

  /* Operand lists of the batch's next GEMM. */
  void operands(size_t i, const Mat &a, const Mat &b, const Mat &c) {
    a_[i] = a;
    b_[i] = b;
    c_[i] = c;
  }

  void gemm(Op op_a, Op op_b, float alpha, float beta) {
    const auto n = static_cast<int64_t>(hi_ - lo_);
    gemm_batch(ctx_, op_a, op_b, n, a_ + lo_, b_ + lo_, alpha, beta, c_ + lo_);
    p_.last.gemms += n;
    p_.last.gemm_calls += be_.gemm_batched != nullptr ? 1 : n;
  }

  /* C = full^T x (U) or x full^T (V), accumulated in fp32: GEMM operands
   * share a dtype, so the bf16 one of a mixed pair is widened first. */
  void coefficients() {
    for (size_t i = lo_; i < hi_; ++i) {
      const ProjectionJob &j = job(i);
      Mat f = j.full, x = j.x;
      if (f.dtype != x.dtype && f.dtype != OSFTI_F32) {
        convert(f, slots_[i].w32);
        f = slots_[i].w32;
      } else if (f.dtype != x.dtype) {
        convert(x, slots_[i].x32);
        x = slots_[i].x32;
      }
      if (j.u)
        operands(i, f, x, coef_out(i));
      else
        operands(i, x, f, coef_out(i));
    }
    const bool u = job(lo_).u;
    gemm(u ? Op::T : Op::N, u ? Op::N : Op::T, 1.0f, 0.0f);
  }

  /* The update GEMM's operands: full C (U) or C full (V) into dst. */
  void update_operands(size_t i, const Mat &full, const Mat &c, const Mat &dst) {
    if (job(i).u)
      operands(i, full, c, dst);
    else
      operands(i, c, full, dst);
  }

  /* x -= full C (U) or C full (V) in the batch's arithmetic. */
  void update() {
    switch (job(lo_).arith) {
      case Arith::fp32: return update_fp32();
      case Arith::bf16: return update_bf16();
      case Arith::split: return update_split();
    }
  }

  /* One fp32 GEMM, a bf16 full widened (TF32 where the context allows). */
  void update_fp32() {
    for (size_t i = lo_; i < hi_; ++i) {
      const ProjectionJob &j = job(i);
      Mat f = j.full;
      if (f.dtype != OSFTI_F32) {
        /* A local mixed pair's coefficients widened it in this batch. */
        if (j.coef != nullptr || j.x.dtype == f.dtype) convert(f, slots_[i].w32);
        f = slots_[i].w32;
      }
      update_operands(i, f, coef_out(i), j.x);
    }
    gemm(Op::N, Op::N, -1.0f, 1.0f);
  }

  /* One bf16 GEMM against C rounded once to bf16: a local part's GEMM
   * wrote it so; a reduced part's slice is converted. */
  void update_bf16() {
    for (size_t i = lo_; i < hi_; ++i) {
      const ProjectionJob &j = job(i);
      if (j.coef != nullptr) convert(coef_mat(j, j.coef, OSFTI_F32), slots_[i].c);
      update_operands(i, j.full, slots_[i].c, j.x);
    }
    gemm(Op::N, Op::N, -1.0f, 1.0f);
  }

  /* x -= full (C_hi - C_lo'), C_hi = bf16(C), C_lo' = bf16(C_hi - C): both
   * GEMMs accumulate in fp32 (into x itself if fp32, else into an fp32
   * buffer added to x once), so x is rounded once. Overwrites C. */
  void update_split() {
    const bool direct = job(lo_).x.dtype == OSFTI_F32;
    for (size_t i = lo_; i < hi_; ++i) {
      split_bf16(ctx_, coef_out(i), slots_[i].hi, slots_[i].lo);
      p_.last.elementwise += 3;
      update_operands(i, job(i).full, slots_[i].hi, direct ? job(i).x : slots_[i].acc);
    }
    gemm(Op::N, Op::N, -1.0f, direct ? 1.0f : 0.0f);
    for (size_t i = lo_; i < hi_; ++i)
      update_operands(i, job(i).full, slots_[i].lo, direct ? job(i).x : slots_[i].acc);
    gemm(Op::N, Op::N, 1.0f, 1.0f);
    if (direct) return;
    for (size_t i = lo_; i < hi_; ++i) convert(slots_[i].acc, job(i).x, 1.0f);
  }

  Projector &p_;
  Context &ctx_;
  const Backend &be_;
  size_t cap_ = kBatchBytes;
  bool one_ = false;
  char *base_ = nullptr;
  size_t first_ = 0, n_ = 0, lo_ = 0, hi_ = 0;
  Slots slots_[kMaxBatch];
  Mat a_[kMaxBatch], b_[kMaxBatch], c_[kMaxBatch];
};

/* max |m| of a compact fp32 matrix in the context's memory; NaN wins. */
double max_abs(Context &ctx, const Mat &m, ProjectionCounts &counts) {
  const size_t n = static_cast<size_t>(elems(m));
  HostMemory host(ctx, on_cuda(ctx) ? n * sizeof(float) : 0, "orthogonality");
  const float *h = static_cast<const float *>(m.data);
  if (on_cuda(ctx)) {
    copy_to_host(ctx, host.get(), m.data, n * sizeof(float));
    ++counts.host_waits;
    h = host.get<float>();
  }
  double best = 0.0;
  for (size_t i = 0; i < n; ++i) {
    const double a = std::fabs(static_cast<double>(h[i]));
    if (a != a) return a; /* NaN wins: a later finite value must not replace it */
    if (a > best) best = a;
  }
  return best;
}

void keep_max(double *best, double v) {
  if (*best != *best) return; /* NaN wins and stays */
  if (!(v <= *best)) *best = v;
}

uint64_t collectives_of(const Projector &p) {
  if (p.comm == nullptr) return 0;
  const osft_comm_stats_t &s = p.comm->stats;
  return s.allreduce_calls + s.allgather_calls + s.barrier_calls;
}

/* Starts a call's counts, and its pending setup (whose collectives count
 * too; its consistency check reads the registrations back to the host). */
void begin_call(Projector &p) {
  p.last = ProjectionCounts{};
  const uint64_t before = collectives_of(p);
  const bool check = p.setup_pending && ranks(p) > 1 && p.check_consistency;
  prepare(p);
  p.last.collectives = static_cast<int64_t>(collectives_of(p) - before);
  if (check && on_cuda(*p.ctx)) ++p.last.host_waits;
}

/* Ends a call's counts: its own collectives, and the waits they made. */
void end_call(Projector &p, uint64_t before) {
  const int64_t own = static_cast<int64_t>(collectives_of(p) - before);
  p.last.collectives += own;
  if (p.comm != nullptr && comm_waits_on_host(*p.comm)) p.last.host_waits += own;
}

}  // namespace

void project(Projector &p, Operands which) {
  begin_call(p);
  refresh(p, which, false);
  collect_jobs(p, which, false);
  Pass pass(p);
  pass.allocate(false);
  const uint64_t before = collectives_of(p);
  pass.reduced_coefficients();
  /* Decided by the registration alone, so every rank launches it. */
  if (p.comm != nullptr && p.reduced > 0)
    comm_allreduce_sum(*p.comm, p.coef, static_cast<size_t>(p.reduced), OSFTI_F32);
  pass.local_parts();
  pass.reduced_updates();
  end_call(p, before);
  log_message(OSFT_LOG_DEBUG,
              "projector: counts: %zu %s parts, %lld GEMMs in %lld GEMM calls, %lld "
              "element-wise calls, %lld collectives (%lld coefficients), %lld host waits",
              p.jobs.size(), which == Operands::grads ? "gradient" : "parameter",
              static_cast<long long>(p.last.gemms),
              static_cast<long long>(p.last.gemm_calls),
              static_cast<long long>(p.last.elementwise),
              static_cast<long long>(p.last.collectives),
              static_cast<long long>(p.comm != nullptr ? p.reduced : 0),
              static_cast<long long>(p.last.host_waits));
}

void orthogonality(Projector &p, double *max_u, double *max_v) {
  Context &ctx = *p.ctx;
  begin_call(p);
  refresh(p, Operands::params, true);
  collect_jobs(p, Operands::params, true);
  Pass pass(p);
  pass.allocate(true);
  const uint64_t before = collectives_of(p);
  const int P = ranks(p), me = my_rank(p);
  const size_t total = static_cast<size_t>(p.reduced) + 2 * static_cast<size_t>(P);
  /* Each rank's maximum over its local parts goes to its own slot (the
   * others stay 0), so the sum all-reduce delivers every rank's maximum. */
  HostMemory host(ctx, total * sizeof(float), "orthogonality");
  float *h = host.get<float>();
  for (size_t i = 0; i < total; ++i) h[i] = 0.0f;
  double local[2] = {0.0, 0.0};
  for (size_t i = 0; i < p.jobs.size(); ++i) {
    const Mat c = pass.coefficients_of(i);
    if (p.jobs[i].coef == nullptr)
      keep_max(&local[p.jobs[i].u ? 0 : 1], max_abs(ctx, c, p.last));
  }
  float *slots = h + p.reduced;
  slots[me] = static_cast<float>(local[0]);
  slots[P + me] = static_cast<float>(local[1]);
  copy_from_host(ctx, p.coef + p.reduced, slots, 2 * P * sizeof(float));
  if (p.comm != nullptr) comm_allreduce_sum(*p.comm, p.coef, total, OSFTI_F32);
  copy_to_host(ctx, h, p.coef, total * sizeof(float));
  if (on_cuda(ctx)) ++p.last.host_waits;
  double best[2] = {0.0, 0.0};
  for (int q = 0; q < P; ++q) {
    keep_max(&best[0], slots[q]);
    keep_max(&best[1], slots[P + q]);
  }
  for (const ProjectionJob &j : p.jobs) {
    if (j.coef == nullptr) continue;
    const int64_t off = j.coef - p.coef, n = elems(coef_mat(j, nullptr, OSFTI_F32));
    for (int64_t i = 0; i < n; ++i)
      keep_max(&best[j.u ? 0 : 1], std::fabs(static_cast<double>(h[off + i])));
  }
  end_call(p, before);
  if (max_u != nullptr) *max_u = best[0];
  if (max_v != nullptr) *max_v = best[1];
}

}  // namespace osft
