/* Errors of the C++ API (osftrt/osftrt.hpp): every failing C call becomes an
 * osftrt::Error with the C status and the library's message naming the
 * argument, outputs stay untouched; the header's own checks (views, read-only
 * outputs, a padded vocabulary) throw the status the C side would give. */
#include <cstring>
#include <limits>

#include "cpp_test.h"

using osftrt::TensorView;

namespace {

constexpr int64_t kN = 6, kK = 5, kM = 3;

osftrt::Flinear make_layer(const osftrt::Context &ctx, std::vector<float> &w) {
  std::mt19937_64 rng(7);
  w = cpp_test::to_float(cpp_test::uniform(kN * kK, rng));
  return osftrt::Flinear::from_weight(ctx, TensorView(w.data(), {kN, kK}));
}

bool bits_equal(const std::vector<float> &a, const std::vector<float> &b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

}  // namespace

OSFT_CPP_TEST(context_options_error_names_the_field) {
  osftrt::ContextOptions o;
  o.device_id = 3;  // a CPU context must have device 0
  OSFT_EXPECT_THROWS(osftrt::Context ctx(o), OSFT_STATUS_INVALID_ARGUMENT, "device_id");
  OSFT_EXPECT_THROWS(osftrt::Context ctx(o), OSFT_STATUS_INVALID_ARGUMENT,
                     "osft_context_create");
}

OSFT_CPP_TEST(error_carries_status_and_last_error) {
  osftrt::Context ctx;
  std::vector<float> w;
  osftrt::Flinear layer = make_layer(ctx, w);
  std::vector<float> x(kM * (kK + 1), 0.5f), y(kM * kN, std::nanf(""));
  const std::vector<float> y0 = y;
  try {
    layer.forward(TensorView(x.data(), {kM, kK + 1}), TensorView(y.data(), {kM, kN}));
    cpp_test::fail(__FILE__, __LINE__, "forward with a wrong x did not throw");
  } catch (const osftrt::Error &e) {
    OSFT_CHECK(e.status() == OSFT_STATUS_SHAPE_MISMATCH);
    OSFT_CHECK(std::string(e.what()) == osftrt::last_error());
    OSFT_CHECK(std::string(e.what()).find("x") != std::string::npos);
    OSFT_CHECK(std::string(e.status_name()) == osft_status_string(e.status()));
    const std::runtime_error &base = e;  // catchable as the standard type
    OSFT_CHECK(std::string(base.what()) == e.what());
  }
  OSFT_CHECK(bits_equal(y, y0));  // nothing written on failure
}

OSFT_CPP_TEST(dtype_layout_and_handle_errors) {
  osftrt::Context ctx;
  std::vector<float> w;
  osftrt::Flinear layer = make_layer(ctx, w);
  std::vector<double> xd(kM * kK, 0.25);
  std::vector<float> x(kM * kK, 0.25f), y(kM * kN, std::nanf(""));
  OSFT_EXPECT_THROWS(
      layer.forward(TensorView(xd.data(), {kM, kK}), TensorView(y.data(), {kM, kN})),
      OSFT_STATUS_DTYPE_MISMATCH, "x");
  // Column-major x: a layout the C side rejects.
  OSFT_EXPECT_THROWS(layer.forward(TensorView(x.data(), {kM, kK}, {1, kM}),
                                   TensorView(y.data(), {kM, kN})),
                     OSFT_STATUS_BAD_LAYOUT, "x");
  osftrt::Flinear moved = std::move(layer);
  OSFT_EXPECT_THROWS(layer.dims(), OSFT_STATUS_INVALID_HANDLE, "layer");
  OSFT_CHECK(moved.dims().out_features == kN);
}

OSFT_CPP_TEST(read_only_view_refused_as_output) {
  osftrt::Context ctx;
  std::vector<float> w;
  osftrt::Flinear layer = make_layer(ctx, w);
  std::vector<float> x(kM * kK, 0.25f), y(kM * kN, 1.0f);
  const float *yc = y.data();
  const TensorView ro(yc, {kM, kN});
  OSFT_CHECK(ro.read_only());
  OSFT_EXPECT_THROWS(layer.forward(TensorView(x.data(), {kM, kK}), ro),
                     OSFT_STATUS_INVALID_ARGUMENT, "y: a read-only view");
  const float *xc = x.data();  // a const input is fine
  layer.forward(TensorView(xc, {kM, kK}), TensorView(y.data(), {kM, kN}));
}

OSFT_CPP_TEST(view_checks) {
  float f[4] = {0, 0, 0, 0};
  OSFT_EXPECT_THROWS(TensorView(f, {2, -1}), OSFT_STATUS_SHAPE_MISMATCH, "shape[1]");
  OSFT_EXPECT_THROWS(TensorView(f, {2, 2}, {2}), OSFT_STATUS_INVALID_ARGUMENT, "strides");
  OSFT_EXPECT_THROWS(TensorView(static_cast<float *>(nullptr), {2}),
                     OSFT_STATUS_INVALID_ARGUMENT, "NULL data");
  OSFT_EXPECT_THROWS(TensorView(f, {1, 1, 1, 1, 1, 1, 1, 1, 1}),
                     OSFT_STATUS_NOT_SUPPORTED, "dimensions");
  TensorView empty_ok(static_cast<float *>(nullptr), {0, 3});  // no elements: no data
  OSFT_CHECK(empty_ok.numel() == 0);
  OSFT_EXPECT_THROWS(TensorView(f, {4}).rows(1, 5), OSFT_STATUS_SHAPE_MISMATCH, "rows");
  OSFT_EXPECT_THROWS(TensorView(f, {4}).data_as<double>(), OSFT_STATUS_DTYPE_MISMATCH,
                     "data_as");
  DLTensor t{};
  int64_t shape[1] = {4};
  t.data = f;
  t.ndim = 1;
  t.shape = shape;
  t.device = osftrt::cpu_device();
  t.dtype = DLDataType{kDLFloat, 32, 4};
  OSFT_EXPECT_THROWS(TensorView v(t), OSFT_STATUS_DTYPE_MISMATCH, "lanes");
}

OSFT_CPP_TEST(flce_target_out_of_range) {
  osftrt::Context ctx;
  osftrt::Flce ce(ctx);
  const int64_t m = 2, h = 3, v = 4;
  std::vector<float> x(m * h, 0.5f), w(v * h, 0.25f);
  std::vector<int64_t> tgt = {1, 7};
  float loss = std::nanf("");
  osftrt::FlceInputs in;
  in.x = TensorView(x.data(), {m, h});
  in.weight = TensorView(w.data(), {v, h});
  in.targets = TensorView(tgt.data(), {m});
  osftrt::FlceOutputs out;
  out.loss = TensorView::scalar(&loss);
  OSFT_EXPECT_THROWS(ce.compute(in, out), OSFT_STATUS_INDEX_OUT_OF_RANGE, "targets");
  OSFT_CHECK(std::isnan(loss));
  // A padded vocabulary larger than the weight: refused before the call.
  in.targets = TensorView(tgt.data(), {1});
  in.x = TensorView(x.data(), {1, h});
  in.num_classes = v + 1;
  OSFT_EXPECT_THROWS(ce.compute(in, out), OSFT_STATUS_SHAPE_MISMATCH, "num_classes");
  OSFT_EXPECT_THROWS(ce.plan(in, out), OSFT_STATUS_SHAPE_MISMATCH, "weight");
}

OSFT_CPP_TEST(option_errors) {
  osftrt::Context ctx;
  osftrt::FlceOptions fo;
  fo.label_smoothing = 2.0;
  OSFT_EXPECT_THROWS(osftrt::Flce ce(ctx, fo), OSFT_STATUS_INVALID_ARGUMENT,
                     "label_smoothing");
  osftrt::ProjectorOptions po;
  po.check_consistency = 5;
  OSFT_EXPECT_THROWS(osftrt::Projector p(ctx, po), OSFT_STATUS_INVALID_ARGUMENT,
                     "check_consistency");
  osftrt::CommOptions co;
  co.timeout_seconds = -1.0;
  OSFT_EXPECT_THROWS(osftrt::Comm::self(ctx, co), OSFT_STATUS_INVALID_ARGUMENT,
                     "timeout_seconds");
  OSFT_EXPECT_THROWS(
      osftrt::set_log_callback(nullptr, nullptr, static_cast<osft_log_level_t>(9)),
      OSFT_STATUS_INVALID_ARGUMENT, "max_level");
  if (!osftrt::has_feature(OSFT_FEATURE_MPI)) {
    OSFT_EXPECT_THROWS(osftrt::Comm::mpi(ctx, 0), OSFT_STATUS_NOT_SUPPORTED, "MPI");
  }
  if (!osftrt::has_feature(OSFT_FEATURE_NCCL)) {
    OSFT_EXPECT_THROWS(osftrt::nccl_unique_id(), OSFT_STATUS_NOT_SUPPORTED, "NCCL");
    OSFT_EXPECT_THROWS(osftrt::Comm::nccl(ctx, reinterpret_cast<void *>(16)),
                       OSFT_STATUS_NOT_SUPPORTED, "NCCL");
    osftrt::NcclUniqueId id{};
    OSFT_EXPECT_THROWS(osftrt::Comm::nccl(ctx, id, 1, 0), OSFT_STATUS_NOT_SUPPORTED,
                       "NCCL");
  }
  OSFT_CHECK(osftrt::device_count(OSFT_DEVICE_CPU) == 1);
  const int threads = osftrt::num_threads();  // the process-wide CPU count
  OSFT_CHECK(threads >= 1);
  OSFT_EXPECT_THROWS(osftrt::set_num_threads(-1), OSFT_STATUS_INVALID_ARGUMENT, "n: -1");
  osftrt::set_num_threads(threads + 1);
  OSFT_CHECK(osftrt::num_threads() == threads + 1);
  osftrt::set_num_threads(0);  // back to the automatic count
  OSFT_CHECK(osftrt::num_threads() == threads);
  osftrt::check_version();  // the headers and the library of this build agree
}

OSFT_CPP_TEST(qr_numerical_failure_is_a_result) {
  osftrt::Context ctx;
  osftrt::Qr qr(ctx);
  std::mt19937_64 rng(3);
  std::vector<double> a0 = cpp_test::uniform(6 * 3, rng), a1 = a0;
  a1[4] = std::numeric_limits<double>::quiet_NaN();
  std::vector<double> q0(6 * 3, 9.0), q1(6 * 3, 9.0);
  const std::vector<double> q1_before = q1;
  osftrt::QrResult res =
      qr.batch({TensorView(a0.data(), {6, 3}), TensorView(a1.data(), {6, 3})},
               {TensorView(q0.data(), {6, 3}), TensorView(q1.data(), {6, 3})});
  OSFT_CHECK(!res.ok());
  OSFT_CHECK(res.status.size() == 2);
  OSFT_CHECK(res.status[0] == OSFT_STATUS_SUCCESS);
  OSFT_CHECK(res.status[1] == OSFT_STATUS_NUMERICAL_ERROR);
  OSFT_CHECK(res.message.find("a[1]") != std::string::npos);
  OSFT_CHECK(q0[0] != 9.0);
  OSFT_CHECK(q1 == q1_before);
  OSFT_EXPECT_THROWS(
      qr.batch({TensorView(a0.data(), {6, 3})}, {}, {TensorView(), TensorView()}),
      OSFT_STATUS_SHAPE_MISMATCH, "r has 2 entries");
  OSFT_EXPECT_THROWS(qr.power_iteration({TensorView(a0.data(), {6, 3})},
                                        {TensorView(q0.data(), {6, 3})}, 1),
                     OSFT_STATUS_SHAPE_MISMATCH, "a[0]");
  qr.options().method = static_cast<osft_qr_method_t>(99);
  OSFT_EXPECT_THROWS(qr.batch({TensorView(a0.data(), {6, 3})}, {}),
                     OSFT_STATUS_INVALID_ARGUMENT, "method");
}

namespace {
struct FailingCollectives : osftrt::Collectives {
  osft_status_t status;
  explicit FailingCollectives(osft_status_t s) : status(s) {}
  void allreduce_sum(DLTensor &) override {
    if (status == OSFT_STATUS_SUCCESS) throw std::logic_error("not an osftrt::Error");
    throw osftrt::Error(status, "collective failed");
  }
  void allgather(const DLTensor &, DLTensor &, const int64_t *, int64_t) override {}
};
}  // namespace

OSFT_CPP_TEST(collective_exceptions_become_statuses) {
  osftrt::Context ctx;
  float buf[3] = {1, 2, 3};
  osftrt::Comm timeout = osftrt::Comm::callbacks(
      ctx, std::make_shared<FailingCollectives>(OSFT_STATUS_TIMEOUT), 0, 2);
  OSFT_EXPECT_THROWS(timeout.allreduce_sum(TensorView(buf, {3})), OSFT_STATUS_TIMEOUT,
                     "allreduce_sum");
  osftrt::Comm other = osftrt::Comm::callbacks(
      ctx, std::make_shared<FailingCollectives>(OSFT_STATUS_SUCCESS), 0, 2);
  OSFT_EXPECT_THROWS(other.allreduce_sum(TensorView(buf, {3})), OSFT_STATUS_COMM_ERROR,
                     "allreduce_sum");
  OSFT_CHECK(other.stats().failures == 1);
  OSFT_EXPECT_THROWS(osftrt::Comm::callbacks(ctx, nullptr, 0, 1),
                     OSFT_STATUS_INVALID_ARGUMENT, "collectives");
  OSFT_EXPECT_THROWS(
      osftrt::Comm::callbacks(
          ctx, std::make_shared<FailingCollectives>(OSFT_STATUS_TIMEOUT), 3, 2),
      OSFT_STATUS_INVALID_ARGUMENT, "rank");
}

OSFT_CPP_TEST(log_sink_sees_the_error) {
  std::vector<std::string> seen;
  osftrt::ContextOptions bad;
  bad.device_id = 1;
  std::string what;
  {
    osftrt::LogSink sink(
        [&](osft_log_level_t level, const char *msg) {
          if (level == OSFT_LOG_ERROR) seen.emplace_back(msg);
          throw std::runtime_error("a sink that throws is contained");
        },
        OSFT_LOG_ERROR);
    osftrt::LogSink moved = std::move(sink);  // the installation moves with it
    try {
      osftrt::Context ctx(bad);
    } catch (const osftrt::Error &e) {
      what = e.what();
    }
  }
  OSFT_CHECK(seen.size() == 1 && seen[0] == what);
  try {
    osftrt::Context ctx(bad);
  } catch (const osftrt::Error &) {
  }
  OSFT_CHECK(seen.size() == 1);  // removed with the object
}
