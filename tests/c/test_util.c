#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void assert_error_mentions(const char *needle) {
  const char *msg = osft_last_error();
  if (strstr(msg, needle) == NULL)
    fail_msg("last error \"%s\" does not mention \"%s\"", msg, needle);
}

void test_tensor_make(test_tensor *tt, void *data, uint8_t code, uint8_t bits,
                      int device_type, int device_id, int ndim, ...) {
  memset(tt, 0, sizeof *tt);
  va_list ap;
  va_start(ap, ndim);
  for (int i = 0; i < ndim; ++i) tt->shape[i] = va_arg(ap, int64_t);
  va_end(ap);
  tt->t.data = data;
  tt->t.device.device_type = (DLDeviceType)device_type;
  tt->t.device.device_id = device_id;
  tt->t.ndim = ndim;
  tt->t.dtype.code = code;
  tt->t.dtype.bits = bits;
  tt->t.dtype.lanes = 1;
  tt->t.shape = tt->shape;
  tt->t.strides = NULL;
  tt->t.byte_offset = 0;
}

void test_tensor_set_strides(test_tensor *tt, ...) {
  va_list ap;
  va_start(ap, tt);
  for (int i = 0; i < tt->t.ndim; ++i) tt->strides[i] = va_arg(ap, int64_t);
  va_end(ap);
  tt->t.strides = tt->strides;
}

static uint64_t rng_state = 88172645463325252ull;

void test_seed(const char *name) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a of the name */
  for (const char *c = name; *c; ++c) h = (h ^ (uint8_t)*c) * 1099511628211ull;
  rng_state = h ? h : 1;
}

double test_uniform(double lo, double hi) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return lo + (hi - lo) * ((double)(rng_state >> 11) / 9007199254740992.0);
}

void test_poison_f32(float *p, size_t n) {
  for (size_t i = 0; i < n; ++i) p[i] = NAN;
}

/* Each block carries a header with its size so frees can be checked. */
typedef struct block_header_s {
  size_t bytes;
  size_t pad[7]; /* keeps the payload 64-byte aligned */
} block_header;

static void *counted_alloc(size_t bytes, long *count, long *fail_after, size_t *live) {
  if (*fail_after == 0) return NULL;
  if (*fail_after > 0) --*fail_after;
  block_header *h = aligned_alloc(64, sizeof(block_header) + (bytes + 63) / 64 * 64);
  if (h == NULL) return NULL;
  h->bytes = bytes;
  ++*count;
  *live += bytes;
  return h + 1;
}

static void counted_free(void *ptr, size_t bytes, long *count, size_t *live,
                         int *mismatch) {
  block_header *h = (block_header *)ptr - 1;
  if (h->bytes != bytes) *mismatch = 1;
  ++*count;
  *live -= h->bytes;
  free(h);
}

static void *host_alloc_cb(void *user, size_t bytes, size_t alignment) {
  test_alloc_state *s = user;
  if (alignment > 64) return NULL;
  if (s->fail_host_above > 0 && bytes > s->fail_host_above) return NULL;
  return counted_alloc(bytes, &s->host_allocs, &s->fail_host_after, &s->host_bytes_live);
}

static void host_free_cb(void *user, void *ptr, size_t bytes) {
  test_alloc_state *s = user;
  counted_free(ptr, bytes, &s->host_frees, &s->host_bytes_live, &s->size_mismatch);
}

static void *device_alloc_cb(void *user, size_t bytes, int device_id, void *stream) {
  (void)device_id;
  (void)stream;
  test_alloc_state *s = user;
  return counted_alloc(bytes, &s->device_allocs, &s->fail_device_after,
                       &s->device_bytes_live);
}

static void device_free_cb(void *user, void *ptr, size_t bytes, int device_id,
                           void *stream) {
  (void)device_id;
  (void)stream;
  test_alloc_state *s = user;
  counted_free(ptr, bytes, &s->device_frees, &s->device_bytes_live, &s->size_mismatch);
}

void test_alloc_reset(test_alloc_state *s) {
  memset(s, 0, sizeof *s);
  s->fail_host_after = -1;
  s->fail_device_after = -1;
}

void test_alloc_callbacks(osft_allocator_t *a, test_alloc_state *s, int with_device) {
  assert_ok(OSFT_ALLOCATOR_INIT(a));
  a->user = s;
  a->host_alloc = host_alloc_cb;
  a->host_free = host_free_cb;
  if (with_device) {
    a->device_alloc = device_alloc_cb;
    a->device_free = device_free_cb;
  }
}

void test_alloc_refuse(test_alloc_state *s, int device, long granted) {
  *(device ? &s->fail_device_after : &s->fail_host_after) = granted;
}

int test_alloc_unrefuse(test_alloc_state *s, int device) {
  long *after = device ? &s->fail_device_after : &s->fail_host_after;
  const int none = *after > 0;
  *after = -1;
  return none;
}
