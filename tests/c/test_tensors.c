#include "test_tensors.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef OSFT_TEST_CUDA
#include <cuda_runtime.h>
#endif

#include "test_util.h"

static size_t elem_size(tt_dtype d) {
  switch (d) {
    case TT_F32:
    case TT_I32: return 4;
    case TT_F64:
    case TT_I64: return 8;
    case TT_BF16: return 2;
  }
  return 0;
}

static DLDataType dl_of(tt_dtype d) {
  DLDataType t;
  t.lanes = 1;
  switch (d) {
    case TT_F32:
      t.code = kDLFloat;
      t.bits = 32;
      break;
    case TT_F64:
      t.code = kDLFloat;
      t.bits = 64;
      break;
    case TT_BF16:
      t.code = kDLBfloat;
      t.bits = 16;
      break;
    case TT_I32:
      t.code = kDLInt;
      t.bits = 32;
      break;
    default:
      t.code = kDLInt;
      t.bits = 64;
      break;
  }
  return t;
}

osft_device_type_t tt_device(void) {
#ifdef OSFT_TEST_CUDA
  return OSFT_DEVICE_CUDA;
#else
  return OSFT_DEVICE_CPU;
#endif
}

int tt_device_present(void) {
#ifdef OSFT_TEST_CUDA
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    printf("SKIPPED: no CUDA device (%s)\n",
           e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    return 0;
  }
#endif
  return 1;
}

osft_context_t tt_context(const osft_context_options_t *given) {
  osft_context_options_t o;
  if (given != NULL) {
    o = *given;
  } else {
    assert_ok(OSFT_CONTEXT_OPTIONS_INIT(&o));
  }
  o.device_type = tt_device();
  osft_context_t ctx = NULL;
  assert_ok(osft_context_create(&ctx, &o));
  return ctx;
}

#ifdef OSFT_TEST_CUDA
/* The device pair of the counting allocator on a GPU: cudaMalloc/cudaFree
 * (which wait for the device, so freeing in stream order is trivially
 * safe), counting into the same state as the host pair. Sizes are kept in
 * a table of live blocks, since device memory cannot carry a header. */
enum { TT_MAX_DEVICE_BLOCKS = 4096 };
static struct {
  void *ptr;
  size_t bytes;
} tt_device_blocks[TT_MAX_DEVICE_BLOCKS];

static void *tt_cuda_alloc(void *user, size_t bytes, int device_id, void *stream) {
  (void)stream;
  test_alloc_state *s = user;
  if (s->fail_device_after == 0) return NULL;
  if (s->fail_device_after > 0) --s->fail_device_after;
  int previous = 0;
  if (cudaGetDevice(&previous) != cudaSuccess) previous = device_id;
  void *p = NULL;
  cudaSetDevice(device_id);
  const cudaError_t e = cudaMalloc(&p, bytes);
  cudaSetDevice(previous);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return NULL;
  }
  for (int i = 0; i < TT_MAX_DEVICE_BLOCKS; ++i)
    if (tt_device_blocks[i].ptr == NULL) {
      tt_device_blocks[i].ptr = p;
      tt_device_blocks[i].bytes = bytes;
      ++s->device_allocs;
      s->device_bytes_live += bytes;
      return p;
    }
  cudaFree(p);
  return NULL; /* table full: report a refused allocation */
}

static void tt_cuda_free(void *user, void *ptr, size_t bytes, int device_id,
                         void *stream) {
  (void)device_id, (void)stream;
  test_alloc_state *s = user;
  for (int i = 0; i < TT_MAX_DEVICE_BLOCKS; ++i)
    if (tt_device_blocks[i].ptr == ptr) {
      if (tt_device_blocks[i].bytes != bytes) s->size_mismatch = 1;
      s->device_bytes_live -= tt_device_blocks[i].bytes;
      tt_device_blocks[i].ptr = NULL;
      ++s->device_frees;
      cudaFree(ptr);
      return;
    }
  s->size_mismatch = 1; /* not a block of ours */
}
#endif

osft_context_t tt_counting_context(test_alloc_state *a) {
  test_alloc_reset(a);
  osft_allocator_t cb;
  test_alloc_callbacks(&cb, a, 0);
#ifdef OSFT_TEST_CUDA
  cb.device_alloc = tt_cuda_alloc;
  cb.device_free = tt_cuda_free;
#endif
  osft_context_options_t o;
  assert_ok(OSFT_CONTEXT_OPTIONS_INIT(&o));
  o.allocator = &cb; /* copied at create */
  return tt_context(&o);
}

void tt_expect_all_returned(const test_alloc_state *a) {
  assert_int_equal(a->host_allocs, a->host_frees);
  assert_int_equal(a->host_bytes_live, 0);
  assert_int_equal(a->device_allocs, a->device_frees);
  assert_int_equal(a->device_bytes_live, 0);
  assert_false(a->size_mismatch);
}

static float bf16_to_f32(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static uint16_t f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

double tt_round(tt_dtype d, double v) {
  switch (d) {
    case TT_F32: return (float)v;
    case TT_BF16: return bf16_to_f32(f32_to_bf16((float)v));
    case TT_I32:
    case TT_I64: return (double)(int64_t)v;
    default: return v;
  }
}

static void put(tt *t, int64_t i, double v) {
  switch (t->dtype) {
    case TT_F32: ((float *)t->host)[i] = (float)v; break;
    case TT_F64: ((double *)t->host)[i] = v; break;
    case TT_BF16: ((uint16_t *)t->host)[i] = f32_to_bf16((float)v); break;
    case TT_I32: ((int32_t *)t->host)[i] = (int32_t)v; break;
    case TT_I64: ((int64_t *)t->host)[i] = (int64_t)v; break;
  }
}

static double get(const tt *t, int64_t i) {
  switch (t->dtype) {
    case TT_F32: return ((const float *)t->host)[i];
    case TT_F64: return ((const double *)t->host)[i];
    case TT_BF16: return bf16_to_f32(((const uint16_t *)t->host)[i]);
    case TT_I32: return ((const int32_t *)t->host)[i];
    case TT_I64: return (double)((const int64_t *)t->host)[i];
  }
  return NAN;
}

static void upload(tt *t) {
#ifdef OSFT_TEST_CUDA
  assert_int_equal(cudaMemcpy(t->dev, t->host, (size_t)t->numel * elem_size(t->dtype),
                              cudaMemcpyHostToDevice),
                   cudaSuccess);
#else
  (void)t;
#endif
}

static void download(const tt *t) {
#ifdef OSFT_TEST_CUDA
  assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
  assert_int_equal(cudaMemcpy(t->host, t->dev, (size_t)t->numel * elem_size(t->dtype),
                              cudaMemcpyDeviceToHost),
                   cudaSuccess);
#else
  (void)t;
#endif
}

static tt *make(tt_dtype dtype, int ndim, const int64_t *shape, int64_t ld) {
  tt *t = calloc(1, sizeof *t);
  t->dtype = dtype;
  int64_t numel = 1;
  for (int d = 0; d < ndim; ++d) {
    t->shape[d] = shape[d];
    numel *= shape[d];
  }
  if (ld > 0) {
    numel = shape[0] * ld;
    t->strides[0] = ld;
    t->strides[1] = 1;
    t->t.strides = t->strides;
  }
  t->numel = numel;
  const size_t bytes = (size_t)(numel > 0 ? numel : 1) * elem_size(dtype);
  t->host = malloc(bytes);
#ifdef OSFT_TEST_CUDA
  assert_int_equal(cudaMalloc(&t->dev, bytes), cudaSuccess);
  t->t.device.device_type = kDLCUDA;
#else
  t->dev = t->host;
  t->t.device.device_type = kDLCPU;
#endif
  t->t.device.device_id = 0;
  t->t.data = t->dev;
  t->t.ndim = ndim;
  t->t.dtype = dl_of(dtype);
  t->t.shape = t->shape;
  return t;
}

tt *tt_new(tt_dtype dtype, int ndim, const int64_t *shape) {
  return make(dtype, ndim, shape, 0);
}

tt *tt_new_padded(tt_dtype dtype, int64_t rows, int64_t cols, int64_t ld) {
  const int64_t shape[2] = {rows, cols};
  return make(dtype, 2, shape, ld);
}

void tt_free(tt *t) {
  if (t == NULL) return;
#ifdef OSFT_TEST_CUDA
  cudaFree(t->dev);
#endif
  free(t->host);
  free(t);
}

int64_t tt_logical_numel(const tt *t) {
  int64_t n = 1;
  for (int d = 0; d < t->t.ndim; ++d) n *= t->shape[d];
  return n;
}

/* Storage index of logical element i (padded 2-D tensors skip padding). */
static int64_t storage_index(const tt *t, int64_t i) {
  if (t->t.strides == NULL) return i;
  const int64_t cols = t->shape[1];
  return (i / cols) * t->strides[0] + i % cols;
}

void tt_random(tt *t, double lo, double hi) {
  for (int64_t i = 0; i < t->numel; ++i) /* padding stays poisoned */
    put(t, i, t->dtype >= TT_I32 ? -777 : NAN);
  const int64_t n = tt_logical_numel(t);
  for (int64_t i = 0; i < n; ++i) put(t, storage_index(t, i), test_uniform(lo, hi));
  upload(t);
}

void tt_set(tt *t, const double *values) {
  const int64_t n = tt_logical_numel(t);
  for (int64_t i = 0; i < n; ++i) put(t, storage_index(t, i), values[i]);
  upload(t);
}

double *tt_get(const tt *t) {
  download(t);
  const int64_t n = tt_logical_numel(t);
  double *out = malloc((size_t)(n > 0 ? n : 1) * sizeof(double));
  for (int64_t i = 0; i < n; ++i) out[i] = get(t, storage_index(t, i));
  return out;
}

void tt_poison(tt *t) {
  for (int64_t i = 0; i < t->numel; ++i) put(t, i, t->dtype >= TT_I32 ? -777 : NAN);
  upload(t);
}

void *tt_bytes(const tt *t, size_t *size) {
  download(t);
  *size = (size_t)t->numel * elem_size(t->dtype);
  void *copy = malloc(*size > 0 ? *size : 1);
  memcpy(copy, t->host, *size);
  return copy;
}

double rel_max_err(const double *a, const double *b, size_t n, double floor) {
  double err = 0.0, scale = floor;
  for (size_t i = 0; i < n; ++i) {
    const double d = fabs(a[i] - b[i]);
    if (isnan(d)) return INFINITY; /* an unwritten (poisoned) element */
    if (d > err) err = d;
    if (fabs(b[i]) > scale) scale = fabs(b[i]);
  }
  return err / scale;
}

/* A temporary tt describing an existing view's storage (no ownership). */
static void view_geometry(const DLTensor *v, int64_t *rows, int64_t *cols, int64_t *ld) {
  *cols = v->shape[v->ndim - 1];
  *rows = v->ndim == 2 ? v->shape[0] : 1;
  *ld = v->ndim == 2 && v->strides != NULL ? v->strides[0] : *cols;
}

static tt_dtype tt_dtype_of(DLDataType d) {
  if (d.code == kDLBfloat) return TT_BF16;
  if (d.code == kDLFloat) return d.bits == 64 ? TT_F64 : TT_F32;
  return d.bits == 64 ? TT_I64 : TT_I32;
}

double *tt_read_view(const DLTensor *v) {
  int64_t rows, cols, ld;
  view_geometry(v, &rows, &cols, &ld);
  tt *t = tt_new_padded(tt_dtype_of(v->dtype), rows, cols, ld);
  const size_t bytes = (size_t)((rows - 1) * ld + cols) * elem_size(t->dtype);
  const char *src = (const char *)v->data + v->byte_offset;
#ifdef OSFT_TEST_CUDA
  assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
  assert_int_equal(cudaMemcpy(t->host, src, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
#else
  memcpy(t->host, src, bytes);
#endif
  double *out = malloc((size_t)(rows * cols) * sizeof(double));
  for (int64_t i = 0; i < rows * cols; ++i) out[i] = get(t, storage_index(t, i));
  tt_free(t);
  return out;
}

void tt_write_view(const DLTensor *v, const double *values) {
  int64_t rows, cols, ld;
  view_geometry(v, &rows, &cols, &ld);
  tt *t = tt_new_padded(tt_dtype_of(v->dtype), rows, cols, ld);
  const size_t bytes = (size_t)((rows - 1) * ld + cols) * elem_size(t->dtype);
  char *dst = (char *)v->data + v->byte_offset;
#ifdef OSFT_TEST_CUDA
  assert_int_equal(cudaMemcpy(t->host, dst, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
#else
  memcpy(t->host, dst, bytes);
#endif
  for (int64_t i = 0; i < rows * cols; ++i) put(t, storage_index(t, i), values[i]);
#ifdef OSFT_TEST_CUDA
  assert_int_equal(cudaMemcpy(dst, t->host, bytes, cudaMemcpyHostToDevice), cudaSuccess);
#else
  memcpy(dst, t->host, bytes);
#endif
  tt_free(t);
}

void tt_refusal_sweep(tt_refused_call call, void *user) {
  const int with_device = tt_device() != OSFT_DEVICE_CPU;
  for (int device = 0; device <= with_device; ++device) {
    for (long granted = 0;; ++granted) {
      assert_true(granted < 400);
      test_alloc_state a;
      osft_context_t ctx = tt_counting_context(&a);
      call(user, ctx, &a, device, granted);
      const int done = test_alloc_unrefuse(&a, device);
      assert_ok(osft_context_destroy(ctx));
      tt_expect_all_returned(&a);
      if (done) {
        if (device == with_device) assert_true(granted > 0);
        break;
      }
    }
  }
}

void tt_snapshot_take(tt_snapshot *s, tt *const *ts, int n) {
  s->n = 0;
  for (int i = 0; i < n; ++i) {
    if (ts[i] == NULL) continue;
    assert_true(s->n < TT_SNAPSHOT_MAX);
    s->t[s->n] = ts[i];
    s->bytes[s->n] = tt_bytes(ts[i], &s->size[s->n]);
    s->n++;
  }
}

void tt_snapshot_expect_untouched(const tt_snapshot *s, const char *what) {
  for (int i = 0; i < s->n; ++i) {
    size_t size;
    void *now = tt_bytes(s->t[i], &size);
    assert_int_equal(size, s->size[i]);
    const int same = memcmp(now, s->bytes[i], size) == 0;
    free(now);
    if (!same) fail_msg("%s: output %d changed by the failed call", what, i);
  }
}

void tt_snapshot_release(tt_snapshot *s) {
  for (int i = 0; i < s->n; ++i) free(s->bytes[i]);
  s->n = 0;
}
