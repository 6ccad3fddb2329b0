/* Test tensors on the device under test: host staging in the tensor's own
 * dtype, a device copy when the test is built for CUDA (OSFT_TEST_CUDA), and
 * conversions to double for float64 references. */
#ifndef OSFTRT_TEST_TENSORS_H
#define OSFTRT_TEST_TENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "osftrt/osftrt.h"
#include "test_util.h"

/* dtypes by name, for brevity */
typedef enum { TT_F32, TT_F64, TT_BF16, TT_I32, TT_I64 } tt_dtype;

typedef struct tt_s {
  DLTensor t;
  int64_t shape[4];
  int64_t strides[4];
  tt_dtype dtype;
  int64_t numel; /* elements of storage (rows * ld for padded rows) */
  void *host;    /* staging, same layout as the device copy */
  void *dev;     /* == host on the CPU */
} tt;

/* The device tensors live on: OSFT_DEVICE_CPU, or OSFT_DEVICE_CUDA when the
 * file is built with OSFT_TEST_CUDA. */
osft_device_type_t tt_device(void);
/* 1 if the device exists (always on the CPU), else prints why and returns 0. */
int tt_device_present(void);
osft_context_t tt_context(const osft_context_options_t *opts_or_null);
/* A context on the device under test whose memory goes through the
 * counting allocator of test_util.h (reset first): its host pair, and on a
 * GPU a counting cudaMalloc/cudaFree device pair; `a` must outlive the
 * context. */
osft_context_t tt_counting_context(test_alloc_state *a);
/* After such a context is destroyed: every host and device block it
 * allocated was freed, with the size it was allocated with. */
void tt_expect_all_returned(const test_alloc_state *a);

/* Byte snapshots of a call's outputs, to prove a failed call wrote nothing:
 * take copies the bytes of every non-NULL tensor of ts (at most
 * TT_SNAPSHOT_MAX); expect_untouched asserts they are unchanged (`what`
 * names the call in the message); release frees the copies. */
enum { TT_SNAPSHOT_MAX = 24 };
typedef struct {
  tt *t[TT_SNAPSHOT_MAX];
  void *bytes[TT_SNAPSHOT_MAX];
  size_t size[TT_SNAPSHOT_MAX];
  int n;
} tt_snapshot;
void tt_snapshot_take(tt_snapshot *s, tt *const *ts, int n);
void tt_snapshot_expect_untouched(const tt_snapshot *s, const char *what);
void tt_snapshot_release(tt_snapshot *s);

/* A refusal sweep ("nothing is written on failure"): `call` makes one first
 * call on `ctx`, a fresh counting context over `a`, with
 * test_alloc_refuse(a, device, granted) just before the call, and checks
 * that the call failed with OSFT_STATUS_OUT_OF_MEMORY having written
 * nothing, or succeeded with every output right. tt_refusal_sweep runs it
 * for granted = 0, 1, ... until a call makes fewer allocations than granted
 * (test_alloc_unrefuse), refusing host allocations, and on a GPU device ones
 * in a second sweep; each context is destroyed with every block returned.
 * The first call must allocate memory of the device's own kind. */
typedef void (*tt_refused_call)(void *user, osft_context_t ctx, test_alloc_state *a,
                                int device, long granted);
void tt_refusal_sweep(tt_refused_call call, void *user);

/* A compact tensor of the given rank and shape. */
tt *tt_new(tt_dtype dtype, int ndim, const int64_t *shape);
/* A 2-D tensor with padded rows (row stride ld >= cols). */
tt *tt_new_padded(tt_dtype dtype, int64_t rows, int64_t cols, int64_t ld);
void tt_free(tt *t);

/* Fills with uniform values in [lo, hi) (rounded to the dtype), and uploads. */
void tt_random(tt *t, double lo, double hi);
/* Fills from doubles (compact logical order) and uploads. */
void tt_set(tt *t, const double *values);
/* Downloads and converts to doubles in compact logical order (padding
 * skipped); returns a malloc'ed array of numel_logical elements. */
double *tt_get(const tt *t);
/* Fills every storage element, padding included, with NaN (ints: -777). */
void tt_poison(tt *t);
/* Raw storage bytes (downloaded), for bit-identity checks; malloc'ed. */
void *tt_bytes(const tt *t, size_t *size);

int64_t tt_logical_numel(const tt *t);
double tt_round(tt_dtype dtype, double v); /* what storing v in dtype keeps */

/* max |a - b| / max(max |b|, floor) over n elements. */
double rel_max_err(const double *a, const double *b, size_t n, double floor);

/* Reads any 1-D or row-major 2-D view (e.g. a layer's factor) into doubles
 * (compact); malloc'ed. */
double *tt_read_view(const DLTensor *view);
/* Writes doubles (compact) into such a view, rounding to its dtype. */
void tt_write_view(const DLTensor *view, const double *values);

#endif
