// A downstream C++ program built against an *installed* libosftrt (through
// pkg-config and through find_package(osftrt)), by tests/packaging/run.sh:
// the C++ API (osftrt/osftrt.hpp) over the C ABI, unchanged. Exits non-zero
// on the first failure; prints one "OK" line otherwise.
#include <osftrt/osftrt.hpp>

#include <cmath>
#include <cstdio>
#include <vector>

namespace {
int fail(const char *what) {
  std::fprintf(stderr, "consumer_cpp: %s\n", what);
  return 1;
}
}  // namespace

int main() {
  try {
    osftrt::check_version();
    osftrt::Context ctx;
    // y = x W^T through an OSFT layer, against a float64 sum.
    const int64_t n = 4, k = 3;
    std::vector<float> w(n * k), x(k), y(n, std::nanf(""));
    for (int64_t i = 0; i < n * k; ++i)
      w[i] = std::sin(0.7f * static_cast<float>(i) + 0.3f);
    for (int64_t i = 0; i < k; ++i) x[i] = std::cos(1.3f * static_cast<float>(i));
    osftrt::Flinear layer = osftrt::Flinear::from_weight(ctx, {w.data(), {n, k}});
    layer.forward({x.data(), {1, k}}, {y.data(), {1, n}});
    for (int64_t i = 0; i < n; ++i) {
      double ref = 0;
      for (int64_t j = 0; j < k; ++j) ref += double(w[i * k + j]) * x[j];
      if (!(std::fabs(y[i] - ref) <= 1e-5)) return fail("forward differs from float64");
    }
    try {
      layer.forward({x.data(), {1, k + 1}}, {y.data(), {1, n}});
      return fail("a wrong shape did not throw");
    } catch (const osftrt::Error &e) {
      if (e.status() != OSFT_STATUS_SHAPE_MISMATCH) return fail("wrong status");
    }
  } catch (const osftrt::Error &e) {
    std::fprintf(stderr, "consumer_cpp: %s: %s\n", e.status_name(), e.what());
    return 1;
  }
  std::printf("OK: C++ consumer of libosftrt %s\n", osftrt::version_string());
  return 0;
}
