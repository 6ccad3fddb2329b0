/* Numbers through the C++ API (osftrt/osftrt.hpp), each against a float64
 * reference computed here with plain loops on fresh random inputs, outputs
 * poisoned with NaN first: the OSFT layer's forward and backward (both
 * strategies, fp32 and bf16 activations), fused cross-entropy (and a padded
 * vocabulary through num_classes), the projector, the tiled MLP, batched QR
 * and power iteration, the one-rank communicator and the context queries. */
#include <algorithm>

#include "cpp_test.h"

using cpp_test::uniform;
using osftrt::TensorView;

namespace {

const float kNaN = std::nanf("");

/* c (m x n) = a (m x k) b^T (n x k), all row-major doubles. */
std::vector<double> matmul_nt(const std::vector<double> &a, const std::vector<double> &b,
                              int64_t m, int64_t n, int64_t k) {
  std::vector<double> c(m * n, 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j)
      for (int64_t p = 0; p < k; ++p) c[i * n + j] += a[i * k + p] * b[j * k + p];
  return c;
}

std::vector<double> transpose(const std::vector<double> &a, int64_t m, int64_t n) {
  std::vector<double> t(m * n);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) t[j * m + i] = a[i * n + j];
  return t;
}

std::vector<double> widen(const TensorView &v) {  // a compact or row-padded fp32 matrix
  const float *p = v.data_as<float>();
  const int64_t rows = v.ndim() == 2 ? v.size(0) : 1;
  const int64_t cols = v.ndim() == 2 ? v.size(1) : v.size(0);
  const int64_t ld = v.ndim() == 2 ? v.stride(0) : cols;
  std::vector<double> d(rows * cols);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) d[i * cols + j] = p[i * ld + j];
  return d;
}

std::vector<double> as_double(const std::vector<float> &f) {
  return std::vector<double>(f.begin(), f.end());
}

void flinear_case(osft_flinear_strategy_t strategy) {
  const int64_t n = 12, k = 9, m = 7;
  std::mt19937_64 rng(11 + strategy);
  const std::vector<float> w = cpp_test::to_float(uniform(n * k, rng));
  const std::vector<float> x = cpp_test::to_float(uniform(m * k, rng));
  const std::vector<float> g = cpp_test::to_float(uniform(m * n, rng));
  const std::vector<float> b = cpp_test::to_float(uniform(n, rng));
  osftrt::Context ctx;
  osftrt::FlinearOptions o;
  o.rank_ratio = 0.5;
  osftrt::Flinear layer =
      osftrt::Flinear::from_weight(ctx, TensorView(w.data(), {n, k}), o);
  layer.set_strategy(strategy);
  OSFT_CHECK(layer.choose_strategy(m, OSFT_FLINEAR_FORWARD) == strategy);
  const osftrt::FlinearDims d = layer.dims();
  OSFT_CHECK(d.out_features == n && d.in_features == k &&
             d.frozen_rank + d.trainable_rank == k);
  const int64_t l = d.trainable_rank;

  std::vector<float> y(m * n, kNaN);
  layer.forward(TensorView(x.data(), {m, k}), TensorView(b.data(), {n}),
                TensorView(y.data(), {m, n}));
  std::vector<double> yr = matmul_nt(as_double(x), as_double(w), m, n, k);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) yr[i * n + j] += b[j];
  OSFT_CHECK_LE(cpp_test::max_rel_err(y.data(), yr.data(), y.size(), 1.0), 2e-5);

  std::vector<float> gx(m * k, kNaN), gu(n * l, kNaN), gs(l, kNaN), gv(l * k, kNaN),
      gb(n, kNaN);
  osftrt::FlinearGrads grads;
  grads.grad_x = TensorView(gx.data(), {m, k});
  grads.grad_u_low = TensorView(gu.data(), {n, l});
  grads.grad_s_low = TensorView(gs.data(), {l});
  grads.grad_v_low = TensorView(gv.data(), {l, k});
  grads.grad_bias = TensorView(gb.data(), {n});
  layer.backward(TensorView(x.data(), {m, k}), TensorView(g.data(), {m, n}), grads);

  // dx = g W; G = g^T x; dU = G V^T diag(S); dV = diag(S) U^T G; dS = diag(U^T G V^T).
  const std::vector<double> gd = as_double(g), xd = as_double(x);
  const std::vector<double> dx = matmul_nt(gd, transpose(as_double(w), n, k), m, k, n);
  const std::vector<double> G =
      matmul_nt(transpose(gd, m, n), transpose(xd, m, k), n, k, m);
  const std::vector<double> U = widen(layer.factor(OSFT_FACTOR_U_LOW));
  const std::vector<double> S = widen(layer.factor(OSFT_FACTOR_S_LOW));
  const std::vector<double> V = widen(layer.factor(OSFT_FACTOR_V_LOW));
  std::vector<double> GV = matmul_nt(G, V, n, l, k);  // n x l
  std::vector<double> du(n * l), dv(l * k, 0.0), ds(l, 0.0), db(n, 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < l; ++j) {
      du[i * l + j] = GV[i * l + j] * S[j];
      ds[j] += U[i * l + j] * GV[i * l + j];
      for (int64_t c = 0; c < k; ++c) dv[j * k + c] += S[j] * U[i * l + j] * G[i * k + c];
    }
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) db[j] += gd[i * n + j];
  OSFT_CHECK_LE(cpp_test::max_rel_err(gx.data(), dx.data(), dx.size(), 1.0), 2e-5);
  OSFT_CHECK_LE(cpp_test::max_rel_err(gu.data(), du.data(), du.size(), 1.0), 2e-5);
  OSFT_CHECK_LE(cpp_test::max_rel_err(gs.data(), ds.data(), ds.size(), 1.0), 2e-5);
  OSFT_CHECK_LE(cpp_test::max_rel_err(gv.data(), dv.data(), dv.size(), 1.0), 2e-5);
  OSFT_CHECK_LE(cpp_test::max_rel_err(gb.data(), db.data(), db.size(), 1.0), 2e-5);

  std::vector<float> merged(n * k, kNaN);
  layer.merge(TensorView(merged.data(), {n, k}));
  const std::vector<double> wd = as_double(w);
  OSFT_CHECK_LE(cpp_test::max_rel_err(merged.data(), wd.data(), wd.size(), 1.0), 2e-5);
}

struct FlceRef {
  double loss = 0;
  std::vector<double> dx, dw;
};

/* MEAN cross-entropy of x W^T (no options), and its gradients. */
FlceRef flce_reference(const std::vector<double> &x, const std::vector<double> &w,
                       const std::vector<int64_t> &y, int64_t m, int64_t h, int64_t v) {
  FlceRef r;
  r.dx.assign(m * h, 0.0);
  r.dw.assign(v * h, 0.0);
  const std::vector<double> z = matmul_nt(x, w, m, v, h);
  for (int64_t i = 0; i < m; ++i) {
    const double *zi = &z[i * v];
    const double mx = *std::max_element(zi, zi + v);
    double s = 0;
    for (int64_t j = 0; j < v; ++j) s += std::exp(zi[j] - mx);
    const double lse = mx + std::log(s);
    r.loss += (lse - zi[y[i]]) / m;
    for (int64_t j = 0; j < v; ++j) {
      const double dz = (std::exp(zi[j] - lse) - (j == y[i] ? 1.0 : 0.0)) / m;
      for (int64_t c = 0; c < h; ++c) {
        r.dx[i * h + c] += dz * w[j * h + c];
        r.dw[j * h + c] += dz * x[i * h + c];
      }
    }
  }
  return r;
}

}  // namespace

OSFT_CPP_TEST(flinear_factorized_matches_float64) {
  flinear_case(OSFT_FLINEAR_FACTORIZED);
}

OSFT_CPP_TEST(flinear_dense_matches_float64) {
  flinear_case(OSFT_FLINEAR_DENSE);
}

OSFT_CPP_TEST(flinear_bf16_activations) {
  const int64_t n = 8, k = 6, m = 5;
  std::mt19937_64 rng(21);
  const std::vector<float> w = cpp_test::to_float(uniform(n * k, rng));
  const std::vector<double> xd = uniform(m * k, rng);
  std::vector<osftrt::bfloat16> x(m * k), y(m * n, osftrt::bfloat16::from_float(kNaN));
  std::vector<double> xr(m * k);
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = osftrt::bfloat16::from_float(static_cast<float>(xd[i]));
    xr[i] = x[i].to_float();  // the reference sees the values bf16 stores
  }
  OSFT_CHECK(osftrt::bfloat16::from_float(1.0f).bits == 0x3f80);
  OSFT_CHECK(std::isnan(osftrt::bfloat16::from_float(kNaN).to_float()));
  osftrt::Context ctx;
  osftrt::Flinear layer = osftrt::Flinear::from_weight(ctx, TensorView(w.data(), {n, k}));
  layer.forward(TensorView(x.data(), {m, k}), TensorView(y.data(), {m, n}));
  const std::vector<double> yr = matmul_nt(xr, as_double(w), m, n, k);
  std::vector<float> yf(y.size());
  for (size_t i = 0; i < y.size(); ++i) yf[i] = y[i].to_float();
  // bf16 operands and output: 8 mantissa bits, a few roundings.
  OSFT_CHECK_LE(cpp_test::max_rel_err(yf.data(), yr.data(), yr.size(), 1.0), 3e-2);
}

OSFT_CPP_TEST(flce_matches_float64_and_pads_the_vocabulary) {
  const int64_t m = 6, h = 5, v = 7, vp = 16;  // 7 classes in a weight padded to 16 rows
  std::mt19937_64 rng(31);
  const std::vector<double> xd = uniform(m * h, rng), wd = uniform(vp * h, rng);
  const std::vector<float> x = cpp_test::to_float(xd), w = cpp_test::to_float(wd);
  std::vector<int64_t> y(m);
  for (int64_t i = 0; i < m; ++i) y[i] = static_cast<int64_t>(rng() % v);
  // The reference sees only the V real classes (the fp32 values of the weight).
  const std::vector<float> w_real(w.begin(), w.begin() + v * h);
  const FlceRef ref = flce_reference(as_double(x), as_double(w_real), y, m, h, v);
  osftrt::Context ctx;
  osftrt::Flce ce(ctx);
  float loss = kNaN;
  std::vector<float> gx(m * h, kNaN), gw(vp * h, kNaN);
  osftrt::FlceInputs in;
  in.x = TensorView(x.data(), {m, h});
  in.weight = TensorView(w.data(), {vp, h});
  in.targets = TensorView(y.data(), {m});
  in.num_classes = v;
  osftrt::FlceOutputs out;
  out.loss = TensorView::scalar(&loss);
  out.grad_x = TensorView(gx.data(), {m, h});
  out.grad_weight = TensorView(gw.data(), {vp, h});
  const osftrt::FlcePlan plan = ce.plan(in, out);
  OSFT_CHECK(plan.tokens == m && plan.chunks >= 1);
  ce.compute(in, out);
  OSFT_CHECK_LE(std::fabs(loss - ref.loss) / ref.loss, 1e-5);
  OSFT_CHECK_LE(cpp_test::max_rel_err(gx.data(), ref.dx.data(), ref.dx.size(), 1e-2),
                1e-4);
  OSFT_CHECK_LE(cpp_test::max_rel_err(gw.data(), ref.dw.data(), ref.dw.size(), 1e-2),
                1e-4);
  bool pad_untouched = true;
  for (int64_t i = v * h; i < vp * h; ++i)
    pad_untouched = pad_untouched && std::isnan(gw[i]);
  OSFT_CHECK(pad_untouched);
  OSFT_CHECK(ce.options().ignore_index == -100);
  ce.check_targets();
  // The split phases give the same numbers (the backward recomputes).
  float loss2 = kNaN;
  std::vector<float> gx2(m * h, kNaN);
  ce.forward(in, TensorView::scalar(&loss2));
  OSFT_CHECK(loss2 == loss);
  osftrt::FlceOutputs grads;
  grads.grad_x = TensorView(gx2.data(), {m, h});
  ce.backward(in, grads);
  OSFT_CHECK(gx2 == gx);
  OSFT_EXPECT_THROWS(ce.backward(in, osftrt::FlceOutputs()), OSFT_STATUS_INVALID_ARGUMENT,
                     "grad_x");
}

OSFT_CPP_TEST(projector_keeps_updates_orthogonal) {
  const int64_t n = 10, k = 8;
  std::mt19937_64 rng(41);
  const std::vector<float> w = cpp_test::to_float(uniform(n * k, rng));
  osftrt::Context ctx;
  osftrt::Comm comm = osftrt::Comm::self(ctx);
  osftrt::Projector proj(ctx, comm);
  osftrt::Flinear layer = osftrt::Flinear::from_weight(ctx, TensorView(w.data(), {n, k}));
  const int64_t l = layer.dims().trainable_rank, r = layer.dims().frozen_rank;
  std::vector<float> gu = cpp_test::to_float(uniform(n * l, rng));
  std::vector<float> gv = cpp_test::to_float(uniform(l * k, rng));
  OSFT_CHECK(proj.add_layer(layer, TensorView(gu.data(), {n, l}),
                            TensorView(gv.data(), {l, k})) == 0);
  proj.prepare();
  proj.project();
  const std::vector<double> uh = widen(layer.factor(OSFT_FACTOR_U_HIGH));
  const std::vector<double> vh = widen(layer.factor(OSFT_FACTOR_V_HIGH));
  // U_high^T dU_low and dV_low V_high^T after the projection: ~0 in float64.
  const std::vector<double> cu =
      matmul_nt(transpose(uh, n, r), transpose(as_double(gu), n, l), r, l, n);
  const std::vector<double> cv = matmul_nt(as_double(gv), vh, l, r, k);
  double worst = 0;
  for (double c : cu) worst = std::max(worst, std::fabs(c));
  for (double c : cv) worst = std::max(worst, std::fabs(c));
  OSFT_CHECK_LE(worst, 1e-5);
  // An optimizer step through the factor views, then the parameter projection.
  const TensorView ul = layer.factor(OSFT_FACTOR_U_LOW);
  float *u = ul.data_as<float>();
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < l; ++j)
      u[i * ul.stride(0) + j] += 0.1f * gu[i * l + j] + 0.05f;
  OSFT_CHECK(proj.orthogonality().max_u > 1e-3);  // the step left the complement
  proj.project_params();
  const osftrt::Orthogonality o = proj.orthogonality();
  OSFT_CHECK_LE(o.max(), 1e-5);
  const osftrt::ProjectorInfo info = proj.info();
  OSFT_CHECK(info.targets == 1 && info.setup_pending == 0);
  proj.invalidate();
  OSFT_CHECK(proj.info().setup_pending == 1);
  proj.set_grads(0, TensorView(gu.data(), {n, l}), TensorView());
  proj.project();
}

OSFT_CPP_TEST(projector_target_from_views) {
  const int64_t n = 6, r = 2, l = 2;
  std::mt19937_64 rng(43);
  // U_high: orthonormal columns from a QR of random data.
  osftrt::Context ctx;
  std::vector<double> a = uniform(n * r, rng), qh(n * r);
  osftrt::Qr(ctx).batch({TensorView(a.data(), {n, r})}, {TensorView(qh.data(), {n, r})});
  const std::vector<float> uh = cpp_test::to_float(qh);
  std::vector<float> gu = cpp_test::to_float(uniform(n * l, rng));
  osftrt::Projector proj(ctx);
  osftrt::ProjectionTarget t;
  t.u_high = TensorView(uh.data(), {n, r});
  t.grad_u_low = TensorView(gu.data(), {n, l});
  OSFT_CHECK(proj.add_target(t) == 0);
  proj.project();
  const std::vector<double> c =
      matmul_nt(transpose(as_double(uh), n, r), transpose(as_double(gu), n, l), r, l, n);
  double worst = 0;
  for (double v : c) worst = std::max(worst, std::fabs(v));
  OSFT_CHECK_LE(worst, 1e-6);
}

OSFT_CPP_TEST(mlp_swiglu_matches_float64) {
  const int64_t h = 6, i = 10, m = 9;
  std::mt19937_64 rng(51);
  const std::vector<float> gate = cpp_test::to_float(uniform(i * h, rng)),
                           up = cpp_test::to_float(uniform(i * h, rng)),
                           down = cpp_test::to_float(uniform(h * i, rng)),
                           x = cpp_test::to_float(uniform(m * h, rng));
  osftrt::Context ctx;
  osftrt::MlpWeights mw;
  mw.gate = TensorView(gate.data(), {i, h});
  mw.up = TensorView(up.data(), {i, h});
  mw.down = TensorView(down.data(), {h, i});
  osftrt::MlpOptions mo;
  mo.tiling = OSFT_MLP_TILING_TOKENS;
  mo.tile_tokens = 4;
  osftrt::Mlp mlp(ctx, OSFT_MLP_SWIGLU, h, i, mw, mo);
  OSFT_CHECK(mlp.tile_count(m).num_tiles == 3 && mlp.tile_count(m).tile_tokens == 3);
  std::vector<float> y(m * h, kNaN);
  mlp.forward(TensorView(x.data(), {m, h}), TensorView(y.data(), {m, h}));
  const std::vector<double> zg = matmul_nt(as_double(x), as_double(gate), m, i, h);
  std::vector<double> a = matmul_nt(as_double(x), as_double(up), m, i, h);
  for (size_t p = 0; p < a.size(); ++p) a[p] *= zg[p] / (1.0 + std::exp(-zg[p]));
  const std::vector<double> yr = matmul_nt(a, as_double(down), m, h, i);
  OSFT_CHECK_LE(cpp_test::max_rel_err(y.data(), yr.data(), yr.size(), 1.0), 2e-5);
  std::vector<float> gx(m * h, kNaN), gd(h * i, kNaN);
  osftrt::MlpGrads g;
  g.grad_x = TensorView(gx.data(), {m, h});
  g.grad_down = TensorView(gd.data(), {h, i});
  const std::vector<float> gy(m * h, 1.0f);
  mlp.backward(TensorView(x.data(), {m, h}), TensorView(gy.data(), {m, h}), g);
  // dL/d down = gy^T a.
  const std::vector<double> gdr =
      matmul_nt(transpose(as_double(gy), m, h), transpose(a, m, i), h, i, m);
  OSFT_CHECK_LE(cpp_test::max_rel_err(gd.data(), gdr.data(), gdr.size(), 1.0), 2e-5);
  OSFT_CHECK(!std::isnan(gx[0]) && !std::isnan(gx[m * h - 1]));
}

OSFT_CPP_TEST(qr_batch_and_power_iteration) {
  osftrt::Context ctx;
  osftrt::QrOptions qo;
  qo.max_concurrency = 1;
  osftrt::Qr qr(ctx, qo);
  std::mt19937_64 rng(61);
  const int64_t shapes[3][2] = {{8, 5}, {6, 6}, {10, 3}};
  std::vector<std::vector<double>> a(3), q(3), r(3);
  std::vector<TensorView> av, qv, rv;
  for (int t = 0; t < 3; ++t) {
    const int64_t m = shapes[t][0], n = shapes[t][1];
    a[t] = uniform(m * n, rng);
    q[t].assign(m * n, std::nan(""));
    r[t].assign(n * n, std::nan(""));
    av.emplace_back(a[t].data(), std::vector<int64_t>{m, n});
    qv.emplace_back(q[t].data(), std::vector<int64_t>{m, n});
    rv.emplace_back(r[t].data(), std::vector<int64_t>{n, n});
  }
  rv[1] = TensorView();  // no R for the second matrix
  const osftrt::QrResult res = qr.batch(av, qv, rv);
  OSFT_CHECK(res.ok() && res.status.size() == 3);
  for (int t = 0; t < 3; ++t) {
    const int64_t m = shapes[t][0], n = shapes[t][1];
    double orth = 0, recon = 0;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t p = 0; p < m; ++p) s += q[t][p * n + i] * q[t][p * n + j];
        orth = std::max(orth, std::fabs(s - (i == j)));
      }
    if (t != 1)
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
          double s = 0;
          for (int64_t p = 0; p <= j; ++p) s += q[t][i * n + p] * r[t][p * n + j];
          recon = std::max(recon, std::fabs(s - a[t][i * n + j]));
        }
    OSFT_CHECK_LE(orth, 1e-12);
    OSFT_CHECK_LE(recon, 1e-12);
    if (t != 1)
      for (int64_t j = 0; j < n; ++j) OSFT_CHECK(r[t][j * n + j] >= 0.0);
  }
  // Power iteration on a symmetric matrix: the basis stays orthonormal.
  const int64_t m = 6, n = 2;
  std::vector<double> s = uniform(m * m, rng), sym(m * m), basis = uniform(m * n, rng);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < m; ++j) sym[i * m + j] = s[i * m + j] + s[j * m + i];
  const osftrt::QrResult pr = qr.power_iteration({TensorView(sym.data(), {m, m})},
                                                 {TensorView(basis.data(), {m, n})}, 3);
  OSFT_CHECK(pr.ok());
  double dot = 0, norm0 = 0;
  for (int64_t p = 0; p < m; ++p) {
    dot += basis[p * n] * basis[p * n + 1];
    norm0 += basis[p * n] * basis[p * n];
  }
  OSFT_CHECK_LE(std::fabs(dot), 1e-12);
  OSFT_CHECK_LE(std::fabs(norm0 - 1.0), 1e-12);
}

OSFT_CPP_TEST(self_comm_collectives) {
  osftrt::Context ctx;
  osftrt::Comm comm = osftrt::Comm::self(ctx);
  const osftrt::CommInfo info = comm.info();
  OSFT_CHECK(info.rank == 0 && info.size == 1 && info.engine == OSFT_COMM_ENGINE_SELF);
  std::mt19937_64 rng(71);
  std::vector<float> buf = cpp_test::to_float(uniform(5, rng)), before = buf;
  comm.allreduce_sum(TensorView(buf.data(), {5}));
  OSFT_CHECK(buf == before);  // the sum over one rank
  std::vector<float> recv(5, kNaN);
  comm.allgather(TensorView(buf.data(), {5}), TensorView(recv.data(), {5}), {5});
  OSFT_CHECK(recv == buf);
  comm.barrier();
  const osftrt::CommStats st = comm.stats();
  OSFT_CHECK(st.allreduce_calls == 1 && st.allgather_calls == 1 && st.barrier_calls == 1);
  comm.reset_stats();
  OSFT_CHECK(comm.stats().allreduce_calls == 0);
}

namespace {
/* One rank over C++ callbacks: all-reduce doubles the buffer (as two equal
 * ranks would), all-gather copies. */
struct TwiceCollectives : osftrt::Collectives {
  int barriers = 0;
  void allreduce_sum(DLTensor &buf) override {
    float *p = static_cast<float *>(buf.data);
    for (int64_t i = 0; i < buf.shape[0]; ++i) p[i] *= 2.0f;
  }
  void allgather(const DLTensor &send, DLTensor &recv, const int64_t *counts,
                 int64_t) override {
    std::memcpy(recv.data, send.data, static_cast<size_t>(counts[0]) * 4);
  }
  bool has_barrier() const override { return true; }
  void barrier() override { ++barriers; }
};
}  // namespace

OSFT_CPP_TEST(callback_comm_runs_cpp_collectives) {
  osftrt::Context ctx;
  auto impl = std::make_shared<TwiceCollectives>();
  osftrt::Comm comm = osftrt::Comm::callbacks(ctx, impl, 0, 1);
  OSFT_CHECK(comm.info().engine == OSFT_COMM_ENGINE_CALLBACKS);
  std::vector<float> buf = {1.5f, -2.0f};
  comm.allreduce_sum(TensorView(buf.data(), {2}));
  OSFT_CHECK(buf[0] == 3.0f && buf[1] == -4.0f);
  comm.barrier();
  OSFT_CHECK(impl->barriers == 1);
  // The C struct form works as well.
  osftrt::CommCallbacks cb;
  OSFT_CHECK(cb.size == 1 && cb.allreduce_sum == nullptr);
}

OSFT_CPP_TEST(context_queries) {
  osftrt::ContextOptions o;
  o.workspace_limit = 1u << 20;
  osftrt::Context ctx(o);
  const osftrt::Device d = ctx.device();
  OSFT_CHECK(d.type == OSFT_DEVICE_CPU && d.id == 0);
  OSFT_CHECK(ctx.stream() == nullptr);
  ctx.set_stream(nullptr);
  ctx.synchronize();
  ctx.reserve_workspace(4096);
  OSFT_CHECK(ctx.workspace_size() >= 4096);
  const osftrt::MemoryStats s = ctx.memory_stats();
  OSFT_CHECK(s.workspace_bytes >= 4096 && s.host_peak >= s.host_in_use &&
             s.host_allocs > 0);
  ctx.release_workspace();
  OSFT_CHECK(ctx.workspace_size() == 0);
  ctx.reset_peak_memory();
  OSFT_CHECK(ctx.memory_stats().host_peak == ctx.memory_stats().host_in_use);
  OSFT_EXPECT_THROWS(ctx.reserve_workspace(2u << 20), OSFT_STATUS_OUT_OF_MEMORY, "limit");
  OSFT_CHECK(std::string(osftrt::version_string()).find('.') != std::string::npos);
  OSFT_CHECK(osftrt::version() / 10000 == OSFT_VERSION_MAJOR);
  OSFT_CHECK(std::string(osftrt::build_info()).size() > 10);
  OSFT_CHECK(osftrt::device_count(OSFT_DEVICE_CUDA) >= 0);
  osftrt::clear_last_error();
  OSFT_CHECK(osftrt::last_error().empty());
}
