/* blas::parallel_for_threads of src/core/cpu_blas.h: the CPU kernels'
 * element-wise passes over the cores on threads of their own (the
 * OpenBLAS engine's parallel_for; oneMKL's runs on its OpenMP team). */
#include <algorithm>
#include <thread>
#include <vector>

#include "core/cpu_blas.h"

namespace osft::blas {

void parallel_for_threads(int64_t n, int64_t grain,
                          const std::function<void(int64_t, int64_t)> &body) {
  const int64_t hw = std::max<int64_t>(1, std::thread::hardware_concurrency());
  const int64_t parts =
      std::max<int64_t>(1, std::min(hw, n / std::max<int64_t>(grain, 1)));
  const int64_t share = (n + parts - 1) / parts;
  std::vector<std::thread> workers;
  for (int64_t p = 1; p < parts; ++p) {
    const int64_t begin = p * share, end = std::min(n, begin + share);
    if (begin >= end) break;
    try {
      workers.emplace_back([&body, begin, end] { body(begin, end); });
    } catch (...) {
      body(begin, end); /* no thread to be had: do it here */
    }
  }
  body(0, std::min(n, share));
  for (std::thread &t : workers) t.join();
}

}  // namespace osft::blas
