/* Factorized linear: forward and backward, both strategies, written once on
 * the backend primitives. Every buffer is planned before anything is
 * written, so a failure (validation or out of memory) leaves outputs intact. */
#include <algorithm>

#include "core/error.h"
#include "core/scratch.h"
#include "core/tensor_args.h"
#include "ops/flinear_ops.h"

namespace osft {
namespace {

constexpr unsigned kComputeDtypes = OSFTI_F32 | OSFTI_BF16;

struct Named {
  const char *name;
  const DLTensor *t;
};

/* Outputs must not overlap any input, factor, or each other. */
void check_disjoint(const Layer &layer, const Named *outs, int n_out, const Named *ins,
                    int n_in) {
  static const char *const factor_names[6] = {"u_high", "s_high", "v_high",
                                              "u_low",  "s_low",  "v_low"};
  for (int o = 0; o < n_out; ++o) {
    if (outs[o].t == nullptr) continue;
    for (int i = 0; i < n_in; ++i)
      check_no_overlap(ins[i].name, ins[i].t, outs[o].name, outs[o].t);
    for (int f = 0; f < 6; ++f)
      check_no_overlap(factor_names[f], &layer.factor[f].t, outs[o].name, outs[o].t);
    for (int p = 0; p < o; ++p)
      check_no_overlap(outs[p].name, outs[p].t, outs[o].name, outs[o].t);
  }
}

/* ------------------------------------------------------------ factor GEMMs */

/* Where the factors' dtype differs from the compute dtype, U and V^T are
 * converted into scratch (laid out fused); S never needs converting. */
struct ConvertSlots {
  int u = -1, v = -1;
  bool low_only = false; /* only U_low and V_low are read */
};

ConvertSlots plan_convert(const Layer &l, osfti_dtype_t compute, ScratchPlan &plan,
                          bool low_only = false) {
  ConvertSlots c;
  if (l.factor_dtype == compute) return c;
  c.low_only = low_only;
  const int64_t width = low_only ? l.l : l.r + l.l;
  c.u = plan.add_mat(l.n, width, compute);
  c.v = plan.add_mat(width, l.kin, compute);
  return c;
}

FactorViews compute_views(Layer &l, const ScratchPlan &plan, const ConvertSlots &c) {
  FactorViews f = factor_views(l);
  if (c.u < 0) return f;
  const Backend &be = backend(*l.ctx);
  const Mat u = plan.mat(c.u), v = plan.mat(c.v);
  auto copy = [&](const Mat &src, const Mat &dst) {
    be.scale_into(*l.ctx, Axis::cols, src, nullptr, 0.0f, dst);
  };
  if (c.low_only) {
    copy(f.u_low, u);
    copy(f.v_low, v);
    f.u_low = u;
    f.v_low = v;
    return f;
  }
  copy(f.u_high, cols_of(u, 0, l.r));
  copy(f.u_low, cols_of(u, l.r, l.l));
  copy(f.v_high, rows_of(v, 0, l.r));
  copy(f.v_low, rows_of(v, l.r, l.l));
  f.u_all = u;
  f.v_all = v;
  f.u_high = cols_of(u, 0, l.r);
  f.u_low = cols_of(u, l.r, l.l);
  f.v_high = rows_of(v, 0, l.r);
  f.v_low = rows_of(v, l.r, l.l);
  f.u_fused = f.v_fused = true;
  return f;
}

/* out (M x k) = a V^T, one GEMM when the parts of V are adjacent. */
void gemm_a_vt(Context &ctx, const Layer &l, const FactorViews &f, const Mat &a,
               const Mat &out) {
  const Backend &be = backend(ctx);
  if (f.v_fused) return be.gemm(ctx, Op::N, a, Op::T, f.v_all, 1.0f, 0.0f, out);
  be.gemm(ctx, Op::N, a, Op::T, f.v_high, 1.0f, 0.0f, cols_of(out, 0, l.r));
  be.gemm(ctx, Op::N, a, Op::T, f.v_low, 1.0f, 0.0f, cols_of(out, l.r, l.l));
}

/* out (M x k) = a U. */
void gemm_a_u(Context &ctx, const Layer &l, const FactorViews &f, const Mat &a,
              const Mat &out) {
  const Backend &be = backend(ctx);
  if (f.u_fused) return be.gemm(ctx, Op::N, a, Op::N, f.u_all, 1.0f, 0.0f, out);
  be.gemm(ctx, Op::N, a, Op::N, f.u_high, 1.0f, 0.0f, cols_of(out, 0, l.r));
  be.gemm(ctx, Op::N, a, Op::N, f.u_low, 1.0f, 0.0f, cols_of(out, l.r, l.l));
}

/* out = beta out + t F^T (F = U, n x k) or t F (F = V^T, k x kin): the low
 * part is accumulated by the second GEMM itself (beta = 1). */
void gemm_t_factor(Context &ctx, const Layer &l, bool fused, const Mat &all,
                   const Mat &high, const Mat &low, Op op, const Mat &t, float beta,
                   const Mat &out) {
  const Backend &be = backend(ctx);
  if (fused) return be.gemm(ctx, Op::N, t, op, all, 1.0f, beta, out);
  be.gemm(ctx, Op::N, cols_of(t, 0, l.r), op, high, 1.0f, beta, out);
  be.gemm(ctx, Op::N, cols_of(t, l.r, l.l), op, low, 1.0f, 1.0f, out);
}

/* t (M x k) = t diag(S). */
void scale_by_s(Context &ctx, const Layer &l, const FactorViews &f, const Mat &t) {
  const Backend &be = backend(ctx);
  if (f.s_fused) return be.scale_into(ctx, Axis::cols, t, &f.s_all, 0.0f, t);
  const Mat th = cols_of(t, 0, l.r), tl = cols_of(t, l.r, l.l);
  be.scale_into(ctx, Axis::cols, th, &f.s_high, 0.0f, th);
  be.scale_into(ctx, Axis::cols, tl, &f.s_low, 0.0f, tl);
}

/* --------------------------------------------------------------- dense */

/* acc = beta acc + (U diag(S)) V in fp32, through the dense scratch. */
void add_product(Layer &l, const Mat &u, const Vec &s, const Mat &v, float beta,
                 const Mat &acc, const ScratchPlan &plan, const DenseSlots &slots) {
  Context &ctx = *l.ctx;
  const Backend &be = backend(ctx);
  Mat us = plan.mat(slots.us);
  us.cols = u.cols;
  be.scale_into(ctx, Axis::cols, u, &s, 0.0f, us);
  Mat v32 = v;
  if (slots.v32 >= 0) {
    v32 = plan.mat(slots.v32);
    v32.rows = v.rows;
    be.scale_into(ctx, Axis::cols, v, nullptr, 0.0f, v32);
  }
  be.gemm(ctx, Op::N, us, Op::N, v32, 1.0f, beta, acc);
}

Mat high_cache(Layer &l, const ScratchPlan &plan, const DenseSlots &slots) {
  const Mat cache{l.w_high, l.n, l.kin, l.kin, OSFTI_F32};
  if (l.w_high != nullptr) return cache;
  const size_t bytes = static_cast<size_t>(l.n * l.kin) * sizeof(float);
  Mat fresh = cache;
  fresh.data = memory_alloc(*l.ctx, bytes, "flinear frozen-weight cache");
  const FactorViews f = factor_views(l);
  try {
    add_product(l, f.u_high, f.s_high, f.v_high, 0.0f, fresh, plan, slots);
  } catch (...) {
    memory_free(*l.ctx, fresh.data, bytes);
    throw;
  }
  l.w_high = fresh.data;
  ++l.frozen_builds;
  return fresh;
}

/* What identifies the trainable factors' current values: a fingerprint of
 * them where the backend takes one cheaply (not CUDA: it would need a host
 * sync), mixed with the reported version where the caller reports changes
 * (a report always rebuilds; an unreported write is still caught by the
 * fingerprint). Only meaningful where weight_kept(l). */
uint64_t weight_key(Layer &l) {
  const Backend &be = backend(*l.ctx);
  uint64_t h = l.updates_reported ? l.trainable_version * 0xbf58476d1ce4e5b9ull : 0;
  if (be.fingerprint == nullptr || l.fingerprints_off) return h;
  const FactorViews f = factor_views(l);
  h = h * 0x9e3779b97f4a7c15ull + be.fingerprint(*l.ctx, f.u_low);
  h = h * 0x9e3779b97f4a7c15ull + be.fingerprint(*l.ctx, as_row(f.s_low));
  h = h * 0x9e3779b97f4a7c15ull + be.fingerprint(*l.ctx, f.v_low);
  return h;
}

/* w = the frozen product: the cached one, or, for a layer that keeps no
 * cache (updates_in_place), the product itself. */
void put_frozen(Layer &l, const Mat &w, const ScratchPlan &plan,
                const DenseSlots &slots) {
  if (!updates_in_place(l)) {
    const Mat cache = high_cache(l, plan, slots);
    return backend(*l.ctx).scale_into(*l.ctx, Axis::cols, cache, nullptr, 0.0f, w);
  }
  const FactorViews f = factor_views(l);
  add_product(l, f.u_high, f.s_high, f.v_high, 0.0f, w, plan, slots);
  ++l.frozen_builds;
}

/* build_dense, with the low part's product on bf16 operands where us16 (an
 * n x l bf16 slot for U_low diag(S_low)) is planned: the per-step rebuild
 * then runs on the engine's bf16 GEMM (fp32 accumulation into W). */
void build_step_dense(Layer &l, const Mat &w, const ScratchPlan &plan,
                      const DenseSlots &slots, int us16) {
  ++l.rebuilds;
  if (us16 < 0) return build_dense(l, w, plan, slots);
  Context &ctx = *l.ctx;
  const Backend &be = backend(ctx);
  put_frozen(l, w, plan, slots);
  const FactorViews f = factor_views(l);
  const Mat us = plan.mat(us16);
  be.scale_into(ctx, Axis::cols, f.u_low, &f.s_low, 0.0f, us);
  be.gemm(ctx, Op::N, us, Op::N, f.v_low, 1.0f, 1.0f, w);
}

/* The snapshot of the low product's operands (updates_in_place): U_low
 * diag(S_low), n x l, and V_low, l x kin, in `dtype`. */
struct LowOperands {
  Mat us, v;
};

LowOperands low_operands(const Layer &l, osfti_dtype_t dtype) {
  char *base = static_cast<char *>(l.w_low);
  const size_t us_bytes = static_cast<size_t>(l.n * l.l) * osfti_dtype_size(dtype);
  return {Mat{base, l.n, l.l, l.l, dtype},
          Mat{base + us_bytes, l.l, l.kin, l.kin, dtype}};
}

/* A kept W (which holds the low product of the snapshot where `holds`)
 * brought to the current factors: W -= the snapshot's product, then W +=
 * the current one, whose operands become the snapshot. 4*n*kin*l flops
 * instead of a rebuild's 2*n*kin*l, and no n x kin frozen cache. Built in
 * full instead where W holds no known product, and every
 * kUpdatesBetweenBuilds updates (each adds a rounding of W's elements). */
void update_in_place(Layer &l, const Mat &w, bool holds, const ScratchPlan &plan,
                     const DenseSlots &slots, int us16) {
  Context &ctx = *l.ctx;
  const Backend &be = backend(ctx);
  ++l.rebuilds;
  if (l.w_low == nullptr)
    l.w_low = memory_alloc(ctx, low_snapshot_bytes(l), "flinear low-product snapshot");
  if (holds && l.w_low_valid && l.w_updates < kUpdatesBetweenBuilds) {
    const LowOperands old = low_operands(l, l.w_low_dtype);
    be.gemm(ctx, Op::N, old.us, Op::N, old.v, -1.0f, 1.0f, w);
    ++l.w_updates;
  } else {
    put_frozen(l, w, plan, slots);
    l.w_updates = 0;
  }
  l.w_low_valid = false; /* invalid until taken */
  l.w_low_dtype = us16 >= 0 ? OSFTI_BF16 : OSFTI_F32;
  const LowOperands now = low_operands(l, l.w_low_dtype);
  const FactorViews f = factor_views(l);
  be.scale_into(ctx, Axis::cols, f.u_low, &f.s_low, 0.0f, now.us);
  be.scale_into(ctx, Axis::cols, f.v_low, nullptr, 0.0f, now.v);
  be.gemm(ctx, Op::N, now.us, Op::N, now.v, 1.0f, 1.0f, w);
  l.w_low_valid = true;
}

/* The current dense weight W kept by the layer between calls, rebuilt only
 * when the trainable factors changed (their key says so): the forward and
 * backward of a step, and every micro-batch of an accumulation, share one
 * rebuild. */
Mat current_weight(Layer &l, uint64_t key, const ScratchPlan &plan,
                   const DenseSlots &slots, int us16) {
  const Mat w{l.w_cur, l.n, l.kin, l.kin, OSFTI_F32};
  if (l.w_cur != nullptr && l.w_cur_valid && l.w_cur_key == key) return w;
  Mat fresh = w;
  if (fresh.data == nullptr)
    fresh.data = memory_alloc(*l.ctx, static_cast<size_t>(l.n * l.kin) * sizeof(float),
                              "flinear current-weight cache");
  l.w_cur = fresh.data;
  const bool holds = l.w_cur_valid; /* W still holds the last build's product */
  l.w_cur_valid = false;            /* invalid until rebuilt */
  if (updates_in_place(l))
    update_in_place(l, fresh, holds, plan, slots, us16);
  else
    build_step_dense(l, fresh, plan, slots, us16);
  l.w_cur_key = key;
  l.w_cur_valid = true;
  return fresh;
}

/* The dense weight in the compute dtype: the layer's current-weight cache
 * where the layer keeps it (weight_kept), else rebuilt into scratch. */
struct DenseWeight {
  DenseSlots slots;
  bool kept = false;
  uint64_t key = 0;
  int w32 = -1, wc = -1;
  int us16 = -1; /* n x l bf16: U_low diag(S_low), dense_bf16_products only */
};

DenseWeight plan_weight(Layer &l, osfti_dtype_t compute, ScratchPlan &plan) {
  DenseWeight d;
  d.slots = plan_dense(l, plan);
  if (dense_bf16_products(plan_shape(l), compute))
    d.us16 = plan.add_mat(l.n, l.l, OSFTI_BF16);
  d.kept = weight_kept(l);
  if (d.kept)
    d.key = weight_key(l);
  else
    d.w32 = plan.add_mat(l.n, l.kin, OSFTI_F32);
  if (compute != OSFTI_F32) d.wc = plan.add_mat(l.n, l.kin, compute);
  return d;
}

Mat build_weight(Layer &l, const ScratchPlan &plan, const DenseWeight &d) {
  Mat w32;
  if (d.kept) {
    w32 = current_weight(l, d.key, plan, d.slots, d.us16);
  } else {
    w32 = plan.mat(d.w32);
    build_step_dense(l, w32, plan, d.slots, d.us16);
  }
  if (d.wc < 0) return w32;
  backend(*l.ctx).scale_into(*l.ctx, Axis::cols, w32, nullptr, 0.0f, plan.mat(d.wc));
  return plan.mat(d.wc);
}

/* -------------------------------------------------------------- forward */

/* y = bias (broadcast), so that the GEMM adds onto it; returns its beta. */
float start_output(Context &ctx, const Vec *bias, const Mat &y) {
  if (bias == nullptr) return 0.0f;
  backend(ctx).broadcast_rows(ctx, *bias, y);
  return 1.0f;
}

void forward_factorized(Layer &l, const Mat &x, const Vec *bias, const Mat &y) {
  Context &ctx = *l.ctx;
  ScratchPlan plan;
  const ConvertSlots conv = plan_convert(l, x.dtype, plan);
  const int t = plan.add_mat(x.rows, l.r + l.l, x.dtype);
  plan.allocate(ctx);
  const FactorViews f = compute_views(l, plan, conv);
  const float beta = start_output(ctx, bias, y);
  const Mat tm = plan.mat(t);
  gemm_a_vt(ctx, l, f, x, tm);
  scale_by_s(ctx, l, f, tm);
  gemm_t_factor(ctx, l, f.u_fused, f.u_all, f.u_high, f.u_low, Op::T, tm, beta, y);
}

void forward_dense(Layer &l, const Mat &x, const Vec *bias, const Mat &y) {
  ScratchPlan plan;
  const DenseWeight d = plan_weight(l, x.dtype, plan);
  plan.allocate(*l.ctx);
  const Mat w = build_weight(l, plan, d);
  const float beta = start_output(*l.ctx, bias, y);
  backend(*l.ctx).gemm(*l.ctx, Op::N, x, Op::T, w, 1.0f, beta, y);
}

/* ------------------------------------------------------------- backward */

struct GradViews {
  const DLTensor *x = nullptr, *u = nullptr, *s = nullptr, *v = nullptr, *bias = nullptr;
  float beta_x = 0, beta_u = 0, beta_s = 0, beta_v = 0, beta_bias = 0;
};

/* The factorized backward's scratch: the factors in the compute dtype,
 * A = g U (or A_low = g U_low) and T_low = x V_low^T. */
struct FactorizedSlots {
  ConvertSlots conv;
  int a = -1, t = -1;
};

FactorizedSlots plan_factorized(const Layer &l, int64_t m, osfti_dtype_t compute,
                                const GradViews &gr, ScratchPlan &plan) {
  const bool want_a_low = gr.v != nullptr || gr.s != nullptr;
  const bool want_t_low = gr.u != nullptr || gr.s != nullptr;
  FactorizedSlots s;
  s.conv = plan_convert(l, compute, plan, gr.x == nullptr);
  if (gr.x != nullptr || want_a_low)
    s.a = plan.add_mat(m, gr.x != nullptr ? l.r + l.l : l.l, compute);
  if (want_t_low) s.t = plan.add_mat(m, l.l, compute);
  return s;
}

/* Every requested gradient but db from the factors, on planned scratch:
 * the low factors' gradients cost about 4*M*l*(N+K) flops, grad_x
 * 2*M*k*(N+K). */
void run_factorized(Layer &l, const Mat &x, const Mat &g, const GradViews &gr,
                    const ScratchPlan &plan, const FactorizedSlots &slots) {
  Context &ctx = *l.ctx;
  const Backend &be = backend(ctx);
  const bool want_a_low = gr.v != nullptr || gr.s != nullptr;
  const bool want_t_low = gr.u != nullptr || gr.s != nullptr;
  const FactorViews f = compute_views(l, plan, slots.conv);

  Mat a_all, a_low, t_low;
  if (gr.x != nullptr) {
    a_all = plan.mat(slots.a);
    gemm_a_u(ctx, l, f, g, a_all); /* A = g U */
    a_low = cols_of(a_all, l.r, l.l);
  } else if (want_a_low) {
    a_low = plan.mat(slots.a);
    be.gemm(ctx, Op::N, g, Op::N, f.u_low, 1.0f, 0.0f, a_low);
  }
  if (want_t_low) {
    t_low = plan.mat(slots.t);
    be.gemm(ctx, Op::N, x, Op::T, f.v_low, 1.0f, 0.0f, t_low); /* T = x V_low^T */
  }
  /* dS_low = diag(U_low^T G V_low^T) = column sums of (g U_low) o (x V_low^T). */
  if (gr.s != nullptr) be.reduce(ctx, Axis::cols, a_low, &t_low, gr.beta_s, as_vec(gr.s));
  if (gr.x != nullptr)
    scale_by_s(ctx, l, f, a_all);
  else if (gr.v != nullptr)
    be.scale_into(ctx, Axis::cols, a_low, &f.s_low, 0.0f, a_low);
  /* dV_low = diag(S_low) U_low^T g^T x = (g U_low diag(S_low))^T x. */
  if (gr.v != nullptr)
    be.gemm(ctx, Op::T, a_low, Op::N, x, 1.0f, gr.beta_v, as_mat(gr.v));
  /* dx = g U diag(S) V^T-rows = A_s V. */
  if (gr.x != nullptr)
    gemm_t_factor(ctx, l, f.v_fused, f.v_all, f.v_high, f.v_low, Op::N, a_all, gr.beta_x,
                  as_mat(gr.x));
  /* dU_low = g^T x V_low^T diag(S_low). */
  if (gr.u != nullptr) {
    be.scale_into(ctx, Axis::cols, t_low, &f.s_low, 0.0f, t_low);
    be.gemm(ctx, Op::T, g, Op::N, t_low, 1.0f, gr.beta_u, as_mat(gr.u));
  }
}

void backward_factorized(Layer &l, const Mat &x, const Mat &g, const GradViews &gr) {
  ScratchPlan plan;
  const FactorizedSlots slots = plan_factorized(l, x.rows, x.dtype, gr, plan);
  plan.allocate(*l.ctx);
  run_factorized(l, x, g, gr, plan, slots);
}

void backward_dense(Layer &l, const Mat &x, const Mat &g, const GradViews &gr) {
  Context &ctx = *l.ctx;
  const Backend &be = backend(ctx);
  const bool want_low = gr.u != nullptr || gr.v != nullptr || gr.s != nullptr;
  const bool want_p = gr.v != nullptr || gr.s != nullptr;
  /* On bf16 hardware with bf16 factors, P and Q multiply the factors as
   * they are with G split into bf16 halves, G_hi = bf16(G) and
   * G_lo = bf16(G_hi - G) (bf16 GEMMs, fp32 results): Q = G_hi V_low^T
   * alone, P = U_low^T G_hi - U_low^T G_lo, so that dS_low, a sum over G
   * that may cancel, keeps G's fp32 precision. Otherwise P and Q are fp32
   * GEMMs (bf16 factors widened). */
  const bool b16 = dense_bf16_products(plan_shape(l), x.dtype);
  const bool widen = l.factor_dtype != OSFTI_F32 && !b16;
  ScratchPlan plan;
  /* G = g^T x (for the factor gradients) reuses W's scratch when W is
   * rebuilt into scratch, G_hi the compute-dtype copy of W: dx is done with
   * W before G is written. */
  DenseWeight d;
  if (gr.x != nullptr) d = plan_weight(l, x.dtype, plan);
  const int g32 =
      want_low ? (d.w32 >= 0 ? d.w32 : plan.add_mat(l.n, l.kin, OSFTI_F32)) : -1;
  const int g_hi =
      want_low && b16 ? (d.wc >= 0 ? d.wc : plan.add_mat(l.n, l.kin, OSFTI_BF16)) : -1;
  const int g_lo = want_p && b16 ? plan.add_mat(l.n, l.kin, OSFTI_BF16) : -1;
  const int u32 = want_low && widen ? plan.add_mat(l.n, l.l, OSFTI_F32) : -1;
  const int v32 = want_low && widen ? plan.add_mat(l.l, l.kin, OSFTI_F32) : -1;
  const int p = want_p ? plan.add_mat(l.l, l.kin, OSFTI_F32) : -1;
  const int q = gr.u != nullptr ? plan.add_mat(l.n, l.l, OSFTI_F32) : -1;
  plan.allocate(ctx);

  if (gr.x != nullptr) {
    const Mat w = build_weight(l, plan, d);
    be.gemm(ctx, Op::N, g, Op::N, w, 1.0f, gr.beta_x, as_mat(gr.x)); /* dx = g W */
  }
  if (!want_low) return;
  Mat gm = plan.mat(g32);
  be.gemm(ctx, Op::T, g, Op::N, x, 1.0f, 0.0f, gm); /* G = g^T x, fp32 */
  const FactorViews f = factor_views(l);
  Mat u_low = f.u_low, v_low = f.v_low;
  if (widen) {
    u_low = plan.mat(u32);
    v_low = plan.mat(v32);
    be.scale_into(ctx, Axis::cols, f.u_low, nullptr, 0.0f, u_low);
    be.scale_into(ctx, Axis::cols, f.v_low, nullptr, 0.0f, v_low);
  }
  Mat lo;
  if (b16) {
    const Mat hi = plan.mat(g_hi);
    if (want_p) {
      lo = plan.mat(g_lo);
      split_bf16(ctx, gm, hi, lo);
    } else {
      be.scale_into(ctx, Axis::cols, gm, nullptr, 0.0f, hi);
    }
    gm = hi;
  }
  if (want_p) {
    const Mat pm = plan.mat(p);
    be.gemm(ctx, Op::T, u_low, Op::N, gm, 1.0f, 0.0f, pm); /* P = U_low^T G */
    if (b16) be.gemm(ctx, Op::T, u_low, Op::N, lo, -1.0f, 1.0f, pm);
    if (gr.s != nullptr) be.reduce(ctx, Axis::rows, pm, &v_low, gr.beta_s, as_vec(gr.s));
    if (gr.v != nullptr)
      be.scale_into(ctx, Axis::rows, pm, &f.s_low, gr.beta_v, as_mat(gr.v));
  }
  if (gr.u != nullptr) {
    const Mat qm = plan.mat(q);
    be.gemm(ctx, Op::N, gm, Op::T, v_low, 1.0f, 0.0f, qm); /* Q = G V_low^T */
    be.scale_into(ctx, Axis::cols, qm, &f.s_low, gr.beta_u, as_mat(gr.u));
  }
}

/* The hybrid form: grad_x = g W on the dense W (kept or rebuilt, as the
 * dense form's), the low factors' gradients from the factors (A_low =
 * g U_low, T_low = x V_low^T and the small products: ~4*M*l*(N+K) flops
 * instead of G = g^T x's 2*M*N*K and P, Q's 4*N*K*l). Everything is planned
 * before anything is written. */
void backward_hybrid(Layer &l, const Mat &x, const Mat &g, const GradViews &gr) {
  Context &ctx = *l.ctx;
  GradViews low = gr;
  low.x = nullptr;
  const bool want_low = gr.u != nullptr || gr.v != nullptr || gr.s != nullptr;
  ScratchPlan plan;
  DenseWeight d;
  if (gr.x != nullptr) d = plan_weight(l, x.dtype, plan);
  FactorizedSlots slots;
  if (want_low) slots = plan_factorized(l, x.rows, x.dtype, low, plan);
  plan.allocate(ctx);
  if (gr.x != nullptr) {
    const Mat w = build_weight(l, plan, d);
    backend(ctx).gemm(ctx, Op::N, g, Op::N, w, 1.0f, gr.beta_x, as_mat(gr.x));
  }
  if (want_low) run_factorized(l, x, g, low, plan, slots);
}

float beta_for(uint32_t accumulate, uint32_t bit) {
  return (accumulate & bit) ? 1.0f : 0.0f;
}

}  // namespace

DenseSlots plan_dense(const Layer &l, ScratchPlan &plan) {
  const int64_t width = std::max(l.r, l.l);
  DenseSlots d;
  d.us = plan.add_mat(l.n, width, OSFTI_F32);
  if (l.factor_dtype != OSFTI_F32) d.v32 = plan.add_mat(width, l.kin, OSFTI_F32);
  return d;
}

void build_dense(Layer &l, const Mat &w, const ScratchPlan &plan,
                 const DenseSlots &slots) {
  put_frozen(l, w, plan, slots);
  const FactorViews f = factor_views(l);
  add_product(l, f.u_low, f.s_low, f.v_low, 1.0f, w, plan, slots);
}

void forward(Layer &l, const DLTensor *x, const DLTensor *bias, DLTensor *y) {
  Context &ctx = *l.ctx;
  const Mat xm = checked_rows(ctx, x, "x", kComputeDtypes, l.kin);
  const Mat ym = checked_rows(ctx, y, "y", kComputeDtypes, l.n, x, "x");
  if (bias != nullptr) checked_vector(ctx, bias, "bias", OSFTI_F32 | xm.dtype, l.n);
  const Named outs[1] = {{"y", y}};
  const Named ins[2] = {{"x", x}, {"bias", bias}};
  check_disjoint(l, outs, 1, ins, 2);
  if (xm.rows == 0) return;
  const Vec bias_vec = bias != nullptr ? as_vec(bias) : Vec{};
  const Vec *b = bias != nullptr ? &bias_vec : nullptr;
  const osft_flinear_strategy_t s =
      choose_strategy(l, xm.rows, OSFT_FLINEAR_FORWARD, GradRequest{}, xm.dtype);
  /* the hybrid form's forward is the dense one */
  if (s == OSFT_FLINEAR_DENSE || s == OSFT_FLINEAR_HYBRID)
    forward_dense(l, xm, b, ym);
  else
    forward_factorized(l, xm, b, ym);
}

void backward(Layer &l, const DLTensor *x, const DLTensor *grad_y,
              const osft_flinear_grads_t &grads) {
  Context &ctx = *l.ctx;
  const Mat xm = checked_rows(ctx, x, "x", kComputeDtypes, l.kin);
  const Mat gm = checked_rows(ctx, grad_y, "grad_y", kComputeDtypes, l.n, x, "x");
  /* fp32 factor gradients are accepted for bf16 factors (fp32 master
   * gradients); they are then rounded nowhere. */
  const unsigned fdt = l.factor_dtype | OSFTI_F32;
  GradViews gr;
  gr.x = grads.grad_x;
  gr.u = grads.grad_u_low;
  gr.s = grads.grad_s_low;
  gr.v = grads.grad_v_low;
  gr.bias = grads.grad_bias;
  if (gr.x != nullptr)
    checked_rows(ctx, gr.x, "grads->grad_x", kComputeDtypes, l.kin, x, "x");
  if (gr.u != nullptr) checked_matrix(ctx, gr.u, "grads->grad_u_low", fdt, l.n, l.l);
  if (gr.s != nullptr) checked_vector(ctx, gr.s, "grads->grad_s_low", fdt, l.l);
  if (gr.v != nullptr) checked_matrix(ctx, gr.v, "grads->grad_v_low", fdt, l.l, l.kin);
  if (gr.bias != nullptr)
    checked_vector(ctx, gr.bias, "grads->grad_bias", OSFTI_F32 | xm.dtype, l.n);
  const Named outs[5] = {{"grads->grad_x", gr.x},
                         {"grads->grad_u_low", gr.u},
                         {"grads->grad_s_low", gr.s},
                         {"grads->grad_v_low", gr.v},
                         {"grads->grad_bias", gr.bias}};
  const Named ins[2] = {{"x", x}, {"grad_y", grad_y}};
  check_disjoint(l, outs, 5, ins, 2);

  const uint32_t acc = grads.accumulate;
  gr.beta_x = beta_for(acc, OSFT_FLINEAR_ACCUMULATE_GRAD_X);
  gr.beta_u = beta_for(acc, OSFT_FLINEAR_ACCUMULATE_GRAD_U_LOW);
  gr.beta_s = beta_for(acc, OSFT_FLINEAR_ACCUMULATE_GRAD_S_LOW);
  gr.beta_v = beta_for(acc, OSFT_FLINEAR_ACCUMULATE_GRAD_V_LOW);
  gr.beta_bias = beta_for(acc, OSFT_FLINEAR_ACCUMULATE_GRAD_BIAS);
  GradRequest want;
  want.x = gr.x != nullptr;
  want.u = gr.u != nullptr;
  want.s = gr.s != nullptr;
  want.v = gr.v != nullptr;
  want.bias = gr.bias != nullptr;
  const osft_flinear_strategy_t s =
      choose_strategy(l, xm.rows, OSFT_FLINEAR_BACKWARD, want, xm.dtype);
  if (s == OSFT_FLINEAR_DENSE)
    backward_dense(l, xm, gm, gr);
  else if (s == OSFT_FLINEAR_HYBRID)
    backward_hybrid(l, xm, gm, gr);
  else
    backward_factorized(l, xm, gm, gr);
  if (gr.bias != nullptr)
    backend(ctx).reduce(ctx, Axis::cols, gm, nullptr, gr.beta_bias, as_vec(gr.bias));
}

}  // namespace osft
