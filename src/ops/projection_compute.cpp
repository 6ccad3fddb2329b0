/* OSFT projection: the batched projection of gradients or parameters and
 * the orthogonality query. Per call: every U_ROWS / V_COLS part's GEMM
 * writes its fixed slice of the coefficient buffer, ONE all-reduce sums
 * the buffer, then every part is updated (local parts compute their
 * coefficients in scratch). Nothing the caller owns is written before the
 * collective has succeeded. */
#include <cmath>

#include "core/error.h"
#include "core/logging.h"
#include "core/scratch.h"
#include "ops/projection_ops.h"

namespace osft {
namespace {

/* One part as a call sees it: high (this rank's), full (the V_high to
 * project against: the gathered one for V_ROWS), x (what is projected). */
struct View {
  bool u = false;
  Mat full, x;
  float *coef = nullptr; /* reduced parts: the slice; else NULL (scratch) */
};

struct Scratch {
  ScratchPlan plan;
  int w32 = -1;             /* full widened to fp32 */
  int x32 = -1;             /* x widened to fp32 (fp32 full with bf16 x) */
  int loc = -1;             /* coefficients of a local part */
  int c_hi = -1, c_lo = -1; /* C split: bf16(C) and bf16(C_hi - C) */
  int acc = -1;             /* the split update of a bf16 x, in fp32 */
};

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

/* Calls fn(view) for each part a call works on, in registration order.
 * Views are made on the fly rather than collected, so that a call
 * allocates nothing. */
template <class Fn>
void each_view(Projector &p, Operands which, Fn &&fn) {
  for (Target &t : p.targets)
    for (const Part *part : {&t.u, &t.v}) {
      const Operand &x = which == Operands::grads ? part->grad : part->low;
      if (!part->present || !x.set) continue;
      View v;
      v.u = part == &t.u;
      v.full = full_of(p, *part);
      v.x = x.m;
      if (part->reduced()) v.coef = p.coef + part->coef;
      fn(static_cast<const View &>(v));
    }
}

/* The coefficient block of a view: C_U (r x l) or C_V (l x r). */
Mat coef_mat(const View &v, float *data) {
  if (v.u) return Mat{data, v.full.cols, v.x.cols, v.x.cols, OSFTI_F32};
  return Mat{data, v.x.rows, v.full.rows, v.full.rows, OSFTI_F32};
}

int64_t elems(const Mat &m) {
  return m.rows * m.cols;
}

/* Where bf16 GEMMs run on bf16 hardware, the update multiplies a bf16 full
 * by C split into bf16 halves rather than by a widened fp32 copy of full:
 * two bf16 GEMMs cost a fraction of one fp32 GEMM on tensor cores or AMX
 * (and TF32 would round C to 10 bits), and C_hi + C_lo carries 16 of C's
 * 24 bits, so x is still updated to about fp32 accuracy. */
bool splits(Context &ctx, const View &v) {
  const Backend &b = backend(ctx);
  return v.full.dtype == OSFTI_BF16 && b.native_bf16_gemm != nullptr &&
         b.native_bf16_gemm(ctx);
}

Scratch plan_scratch(Projector &p, Operands which) {
  Context &ctx = *p.ctx;
  int64_t w = 0, x = 0, loc = 0, coef = 0, acc = 0;
  each_view(p, which, [&](const View &v) {
    const bool split = splits(ctx, v), mixed = v.full.dtype != v.x.dtype;
    /* full is widened for the coefficients of a mixed pair, and for an
     * update that does not split. */
    if (v.full.dtype != OSFTI_F32 && (mixed || !split)) w = std::max(w, elems(v.full));
    if (v.full.dtype == OSFTI_F32 && v.x.dtype != OSFTI_F32) x = std::max(x, elems(v.x));
    if (v.coef == nullptr) loc = std::max(loc, elems(coef_mat(v, nullptr)));
    if (split) coef = std::max(coef, elems(coef_mat(v, nullptr)));
    if (split && v.x.dtype != OSFTI_F32) acc = std::max(acc, elems(v.x));
  });
  Scratch s;
  s.w32 = s.plan.add_mat(1, w, OSFTI_F32);
  s.x32 = s.plan.add_mat(1, x, OSFTI_F32);
  s.loc = s.plan.add_mat(1, loc, OSFTI_F32);
  s.c_hi = s.plan.add_mat(1, coef, OSFTI_BF16);
  s.c_lo = s.plan.add_mat(1, coef, OSFTI_BF16);
  s.acc = s.plan.add_mat(1, acc, OSFTI_F32);
  return s;
}

Mat widen(Context &ctx, const Mat &m, const Mat &slot) {
  const Mat dst{slot.data, m.rows, m.cols, m.cols, OSFTI_F32};
  backend(ctx).scale_into(ctx, Axis::cols, m, nullptr, 0.0f, dst);
  return dst;
}

/* C = full^T x (U) or x full^T (V); GEMM operands share a dtype, so the
 * bf16 one of a mixed pair is widened. Accumulated in fp32. */
void coefficients(Context &ctx, const View &v, const Mat &c, const Scratch &s) {
  Mat f = v.full, x = v.x;
  if (f.dtype != x.dtype) {
    if (f.dtype != OSFTI_F32)
      f = widen(ctx, f, s.plan.mat(s.w32));
    else
      x = widen(ctx, x, s.plan.mat(s.x32));
  }
  if (v.u)
    backend(ctx).gemm(ctx, Op::T, f, Op::N, x, 1.0f, 0.0f, c);
  else
    backend(ctx).gemm(ctx, Op::N, x, Op::T, f, 1.0f, 0.0f, c);
}

/* dst = alpha full C + beta dst (U) or alpha C full + beta dst (V). */
void full_times(Context &ctx, const View &v, const Mat &f, const Mat &c, float alpha,
                float beta, const Mat &dst) {
  if (v.u)
    backend(ctx).gemm(ctx, Op::N, f, Op::N, c, alpha, beta, dst);
  else
    backend(ctx).gemm(ctx, Op::N, c, Op::N, f, alpha, beta, dst);
}

/* A compact view of `slot`'s memory shaped like m. */
Mat shaped(const Mat &slot, const Mat &m) {
  return Mat{slot.data, m.rows, m.cols, m.cols, slot.dtype};
}

/* x -= full (C_hi - C_lo'), with C_hi = bf16(C) and C_lo' = bf16(C_hi - C):
 * both GEMMs accumulate in fp32 (into x itself if fp32, else into an fp32
 * buffer added to x once), so x is rounded once. Overwrites c. */
void update_split(Context &ctx, const View &v, const Mat &c, const Scratch &s) {
  const Backend &b = backend(ctx);
  const Mat hi = shaped(s.plan.mat(s.c_hi), c), lo = shaped(s.plan.mat(s.c_lo), c);
  split_bf16(ctx, c, hi, lo);
  const bool direct = v.x.dtype == OSFTI_F32;
  const Mat acc = direct ? v.x : shaped(s.plan.mat(s.acc), v.x);
  full_times(ctx, v, v.full, hi, -1.0f, direct ? 1.0f : 0.0f, acc);
  full_times(ctx, v, v.full, lo, 1.0f, 1.0f, acc);
  if (!direct) b.scale_into(ctx, Axis::cols, acc, nullptr, 1.0f, v.x);
}

/* x -= full C (U) or C full (V), accumulated in fp32 and rounded once into
 * x's dtype: a bf16 full against C's bf16 halves where that is fast, else
 * in fp32 (full widened if bf16). */
void update(Context &ctx, const View &v, const Mat &c, const Scratch &s) {
  if (splits(ctx, v)) return update_split(ctx, v, c, s);
  const Mat f =
      v.full.dtype == OSFTI_F32 ? v.full : widen(ctx, v.full, s.plan.mat(s.w32));
  full_times(ctx, v, f, c, -1.0f, 1.0f, v.x);
}

/* max |m| of a compact fp32 matrix in the context's memory; NaN wins. */
double max_abs(Context &ctx, const Mat &m) {
  const size_t n = static_cast<size_t>(elems(m));
  HostMemory host(ctx, on_cuda(ctx) ? n * sizeof(float) : 0, "orthogonality");
  const float *h = static_cast<const float *>(m.data);
  if (on_cuda(ctx)) {
    copy_to_host(ctx, host.get(), m.data, n * sizeof(float));
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

}  // namespace

void project(Projector &p, Operands which) {
  Context &ctx = *p.ctx;
  prepare(p);
  refresh(p, which, false);
  Scratch s = plan_scratch(p, which);
  s.plan.allocate(ctx);
  size_t parts = 0;
  each_view(p, which, [&](const View &v) {
    ++parts;
    if (v.coef != nullptr) coefficients(ctx, v, coef_mat(v, v.coef), s);
  });
  /* Decided by the registration alone, so every rank launches it. */
  if (p.comm != nullptr && p.reduced > 0)
    comm_allreduce_sum(*p.comm, p.coef, static_cast<size_t>(p.reduced), OSFTI_F32);
  const Mat loc = s.plan.mat(s.loc);
  each_view(p, which, [&](const View &v) {
    if (v.coef != nullptr) return;
    const Mat c = coef_mat(v, static_cast<float *>(loc.data));
    coefficients(ctx, v, c, s);
    update(ctx, v, c, s);
  });
  each_view(p, which, [&](const View &v) {
    if (v.coef != nullptr) update(ctx, v, coef_mat(v, v.coef), s);
  });
  log_message(OSFT_LOG_DEBUG,
              "projector %p: projected %zu %s parts, %lld coefficients "
              "all-reduced",
              static_cast<void *>(&p), parts,
              which == Operands::grads ? "gradient" : "parameter",
              static_cast<long long>(p.comm != nullptr ? p.reduced : 0));
}

void orthogonality(Projector &p, double *max_u, double *max_v) {
  Context &ctx = *p.ctx;
  prepare(p);
  refresh(p, Operands::params, true);
  Scratch s = plan_scratch(p, Operands::params);
  s.plan.allocate(ctx);
  const int P = ranks(p), me = my_rank(p);
  const size_t total = static_cast<size_t>(p.reduced) + 2 * static_cast<size_t>(P);
  /* Each rank's maximum over its local parts goes to its own slot (the
   * others stay 0), so the sum all-reduce delivers every rank's maximum. */
  HostMemory host(ctx, total * sizeof(float), "orthogonality");
  float *h = host.get<float>();
  for (size_t i = 0; i < total; ++i) h[i] = 0.0f;
  const Mat loc = s.plan.mat(s.loc);
  double local[2] = {0.0, 0.0};
  each_view(p, Operands::params, [&](const View &v) {
    if (v.coef != nullptr) {
      coefficients(ctx, v, coef_mat(v, v.coef), s);
      return;
    }
    const Mat c = coef_mat(v, static_cast<float *>(loc.data));
    coefficients(ctx, v, c, s);
    keep_max(&local[v.u ? 0 : 1], max_abs(ctx, c));
  });
  float *slots = h + p.reduced;
  slots[me] = static_cast<float>(local[0]);
  slots[P + me] = static_cast<float>(local[1]);
  copy_from_host(ctx, p.coef + p.reduced, slots, 2 * P * sizeof(float));
  if (p.comm != nullptr) comm_allreduce_sum(*p.comm, p.coef, total, OSFTI_F32);
  copy_to_host(ctx, h, p.coef, total * sizeof(float));
  double best[2] = {0.0, 0.0};
  for (int q = 0; q < P; ++q) {
    keep_max(&best[0], slots[q]);
    keep_max(&best[1], slots[P + q]);
  }
  each_view(p, Operands::params, [&](const View &v) {
    if (v.coef == nullptr) return;
    const Mat c = coef_mat(v, h + (v.coef - p.coef));
    for (int64_t i = 0; i < elems(c); ++i)
      keep_max(&best[v.u ? 0 : 1],
               std::fabs(static_cast<double>(h[v.coef - p.coef + i])));
  });
  if (max_u != nullptr) *max_u = best[0];
  if (max_v != nullptr) *max_v = best[1];
}

}  // namespace osft
