/* Runs every OSFT_CPP_TEST of the program (tests/cpp/cpp_test.h). */
#include "cpp_test.h"

int main() {
  int failed_cases = 0;
  for (const cpp_test::Case &c : cpp_test::cases()) {
    const int before = cpp_test::failures();
    try {
      c.fn();
    } catch (const std::exception &e) {
      cpp_test::fail(__FILE__, __LINE__, std::string("uncaught exception: ") + e.what());
    }
    const bool ok = cpp_test::failures() == before;
    failed_cases += !ok;
    std::printf("[%s] %s\n", ok ? "  OK  " : " FAIL ", c.name);
  }
  std::printf("%zu tests, %d failed (C++%ld)\n", cpp_test::cases().size(), failed_cases,
              static_cast<long>(__cplusplus / 100 % 100));
  return failed_cases == 0 ? 0 : 1;
}
