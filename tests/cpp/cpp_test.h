/* The C++ tests' harness (tests/cpp): OSFT_CPP_TEST(name) registers a test,
 * OSFT_CHECK* record failures without stopping it, OSFT_EXPECT_THROWS checks
 * that a statement throws osftrt::Error with a given status and a message
 * naming the argument. main() runs every test and exits non-zero when one
 * failed; a test that throws fails with its message. */
#ifndef OSFTRT_TESTS_CPP_TEST_H
#define OSFTRT_TESTS_CPP_TEST_H

#include <cmath>
#include <cstdio>
#include <exception>
#include <random>
#include <string>
#include <vector>

#include <osftrt/osftrt.hpp>

namespace cpp_test {

struct Case {
  const char *name;
  void (*fn)();
};

inline std::vector<Case> &cases() {
  static std::vector<Case> all;
  return all;
}

inline int &failures() {
  static int n = 0;
  return n;
}

struct Register {
  Register(const char *name, void (*fn)()) { cases().push_back({name, fn}); }
};

inline void fail(const char *file, int line, const std::string &what) {
  std::printf("  FAIL %s:%d: %s\n", file, line, what.c_str());
  ++failures();
}

/* Fresh random values in [-1, 1): every numeric test's inputs. */
inline std::vector<double> uniform(size_t n, std::mt19937_64 &rng) {
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  std::vector<double> v(n);
  for (double &x : v) x = u(rng);
  return v;
}

inline std::vector<float> to_float(const std::vector<double> &v) {
  return std::vector<float>(v.begin(), v.end());
}

/* The largest |a - b| / (|b| + floor) over two arrays. */
inline double max_rel_err(const float *a, const double *b, size_t n, double floor) {
  double worst = 0.0;
  for (size_t i = 0; i < n; ++i) {
    const double e =
        std::fabs(static_cast<double>(a[i]) - b[i]) / (std::fabs(b[i]) + floor);
    if (!(e <= worst)) worst = e;  // NaN (an unwritten poisoned value) wins
  }
  return worst;
}

}  // namespace cpp_test

#define OSFT_CPP_TEST(name)                                       \
  static void name();                                             \
  static const cpp_test::Register name##_registered(#name, name); \
  static void name()

#define OSFT_CHECK(cond) \
  ((cond) ? (void)0 : cpp_test::fail(__FILE__, __LINE__, "OSFT_CHECK(" #cond ")"))

#define OSFT_CHECK_LE(a, b)                                                             \
  do {                                                                                  \
    const double osft_a_ = (a), osft_b_ = (b);                                          \
    if (!(osft_a_ <= osft_b_))                                                          \
      cpp_test::fail(__FILE__, __LINE__,                                                \
                     std::string(#a " <= " #b ": ") + std::to_string(osft_a_) + " > " + \
                         std::to_string(osft_b_));                                      \
  } while (0)

/* `stmt` throws osftrt::Error with `want_status` and a message containing
 * `want_text`. */
#define OSFT_EXPECT_THROWS(stmt, want_status, want_text)                                 \
  do {                                                                                   \
    bool osft_thrown_ = false;                                                           \
    try {                                                                                \
      stmt;                                                                              \
    } catch (const osftrt::Error &osft_e_) {                                             \
      osft_thrown_ = true;                                                               \
      if (osft_e_.status() != (want_status))                                             \
        cpp_test::fail(__FILE__, __LINE__,                                               \
                       std::string(#stmt ": status ") + osft_e_.status_name() +          \
                           ", expected " + osftrt::status_string(want_status) + " (" +   \
                           osft_e_.what() + ")");                                        \
      else if (std::string(osft_e_.what()).find(want_text) == std::string::npos)         \
        cpp_test::fail(__FILE__, __LINE__,                                               \
                       std::string(#stmt ": message '") + osft_e_.what() + "' lacks '" + \
                           (want_text) + "'");                                           \
    }                                                                                    \
    if (!osft_thrown_) cpp_test::fail(__FILE__, __LINE__, #stmt ": did not throw");      \
  } while (0)

#endif
