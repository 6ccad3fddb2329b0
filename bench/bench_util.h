/* Helpers the benchmarks share: status checks, the clocks, host
 * allocation that exits on failure, deterministic uniform data, bf16. */
#ifndef OSFTRT_BENCH_UTIL_H
#define OSFTRT_BENCH_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "osftrt/osftrt.h"

/* Exits with the library's message if a call fails. */
#define CHECK(call)                                                 \
  do {                                                              \
    osft_status_t st_ = (call);                                     \
    if (st_ != OSFT_STATUS_SUCCESS) {                               \
      fprintf(stderr, "%s failed: %s\n", #call, osft_last_error()); \
      exit(1);                                                      \
    }                                                               \
  } while (0)

static inline double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* ms on a benchmark's clock: the monotonic wall clock, or with cpu_time
 * the process's CPU time (all its threads: work, not waiting). */
static inline double clock_ms(int cpu_time) {
  if (!cpu_time) return now_ms();
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static inline void *xmalloc(size_t bytes) {
  void *p = malloc(bytes > 0 ? bytes : 1);
  if (!p) {
    fprintf(stderr, "out of host memory (%zu bytes)\n", bytes);
    exit(1);
  }
  return p;
}

/* qsort's comparison of doubles, ascending (medians of timings). */
static inline int cmp_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* n values uniform in [-scale/2, scale/2) from an LCG seeded with `seed`. */
static inline void fill_uniform(float *p, size_t n, unsigned seed, float scale) {
  for (size_t i = 0; i < n; ++i) {
    seed = seed * 1664525u + 1013904223u;
    p[i] = scale * (float)((seed >> 8) * (1.0 / 16777216.0) - 0.5);
  }
}

/* A compact fp32 host tensor over `data`; `shape` must outlive it. */
static inline DLTensor host_f32_tensor(float *data, int ndim, int64_t *shape) {
  DLTensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.device.device_type = kDLCPU;
  t.ndim = ndim;
  t.dtype.code = kDLFloat;
  t.dtype.bits = 32;
  t.dtype.lanes = 1;
  t.shape = shape;
  return t;
}

/* Round to nearest even. */
static inline uint16_t to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

#endif
