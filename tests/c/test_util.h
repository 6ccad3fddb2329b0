/* Shared helpers for the CMocka tests: tensors over host buffers, random
 * data, poisoning, and a counting allocator with failure injection. */
#ifndef OSFTRT_TEST_UTIL_H
#define OSFTRT_TEST_UTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "osftrt/osftrt.h"

/* Exit code ctest reads as "skipped" (tests/CMakeLists.txt). */
#define OSFT_TEST_SKIP 77

/* Asserts that `call` returned `expected`, printing the status names and
 * the last error message on failure. */
#define assert_status(call, expected)                                                    \
  do {                                                                                   \
    osft_status_t st_ = (call);                                                          \
    if (st_ != (expected))                                                               \
      fail_msg("%s returned %d (%s), expected %d (%s); last error: %s", #call, (int)st_, \
               osft_status_string(st_), (int)(expected), osft_status_string(expected),   \
               osft_last_error());                                                       \
  } while (0)

#define assert_ok(call) assert_status((call), OSFT_STATUS_SUCCESS)

/* Asserts that the calling thread's last error contains `needle`. */
void assert_error_mentions(const char *needle);

/* A DLTensor over caller storage with its own shape/strides arrays. */
typedef struct test_tensor_s {
  DLTensor t;
  int64_t shape[8];
  int64_t strides[8];
} test_tensor;

/* Fills `tt` as a compact tensor of `ndim` dims (shape from varargs as
 * int64_t) of dtype (code, bits) on `device_type`/`device_id` over `data`. */
void test_tensor_make(test_tensor *tt, void *data, uint8_t code, uint8_t bits,
                      int device_type, int device_id, int ndim, ...);

/* Sets explicit strides (int64_t varargs, one per dim). */
void test_tensor_set_strides(test_tensor *tt, ...);

/* Deterministic per-test random numbers: xorshift seeded from the test
 * name, so each run of a test sees the same fresh (non-zero) values. */
void test_seed(const char *name);
double test_uniform(double lo, double hi);

/* Poison: a NaN pattern that any real result overwrites. */
void test_poison_f32(float *p, size_t n);

/* A counting allocator with failure injection, for osft_allocator_t. */
typedef struct test_alloc_state_s {
  long host_allocs, host_frees, device_allocs, device_frees;
  size_t host_bytes_live, device_bytes_live;
  long fail_host_after;   /* <0: never fail; n: the (n+1)-th host alloc fails */
  long fail_device_after; /* same for device allocs */
  size_t fail_host_above; /* >0: host allocs of more bytes than this fail */
  int size_mismatch;      /* set if a free reported a size unlike its alloc */
} test_alloc_state;

void test_alloc_reset(test_alloc_state *s);
/* An osft_allocator_t whose host callbacks (and device ones if
 * `with_device`) count into `s`. Device blocks are host memory: only for
 * tests that never touch them on a GPU. */
void test_alloc_callbacks(osft_allocator_t *a, test_alloc_state *s, int with_device);

/* Refusal sweeps ("nothing is written on failure"). test_alloc_refuse lets
 * `granted` more host (device: 0) or device (1) allocations through and
 * refuses every later one; test_alloc_unrefuse ends that and returns 1 when
 * fewer than `granted` were made (no refusal happened). */
void test_alloc_refuse(test_alloc_state *s, int device, long granted);
int test_alloc_unrefuse(test_alloc_state *s, int device);

#endif
