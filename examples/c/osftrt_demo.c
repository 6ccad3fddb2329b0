/*
 * osftrt_demo — the libosftrt demo trainer.
 *
 * Runs every capability built so far, on a GPU when one is present and on
 * the CPU otherwise, the way a trainer would use them:
 *   1. runtime: version check, diagnostics, device choice, a context whose
 *      memory comes from the trainer's own allocator, workspace, errors.
 *   2. factorized linear (OSFT layer): decompose a weight, check the
 *      factors, run forward/backward for a few SGD steps on the trainable
 *      part, merge back to a dense weight.
 * Later capabilities (projection, cross-entropy, tiled MLP, batched QR) add
 * their steps here.
 *
 * Exit status 0 when every step succeeded.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "osftrt/osftrt.h"

#ifdef OSFT_DEMO_CUDA
#include <cuda_runtime.h>
#endif

#define CHECK(call)                                                             \
  do {                                                                          \
    osft_status_t st_ = (call);                                                 \
    if (st_ != OSFT_STATUS_SUCCESS) {                                           \
      fprintf(stderr, "FAILED: %s -> %s: %s\n", #call, osft_status_string(st_), \
              osft_last_error());                                               \
      exit(1);                                                                  \
    }                                                                           \
  } while (0)

/* The trainer's own allocator: here a counting malloc, standing in for a
 * framework's caching allocator. */
typedef struct {
  long allocs, frees;
  size_t live, peak;
} trainer_heap;

static void *heap_alloc(void *user, size_t bytes, size_t alignment) {
  trainer_heap *h = user;
  void *p = aligned_alloc(alignment, (bytes + alignment - 1) / alignment * alignment);
  if (p != NULL) {
    h->allocs++;
    h->live += bytes;
    if (h->live > h->peak) h->peak = h->live;
  }
  return p;
}

static void heap_free(void *user, void *ptr, size_t bytes) {
  trainer_heap *h = user;
  free(ptr);
  h->frees++;
  h->live -= bytes;
}

static void log_to_stdout(void *user, osft_log_level_t level, const char *message) {
  (void)user;
  static const char *names[] = {"off", "error", "warn", "info", "debug"};
  printf("  [log %s] %s\n", names[level], message);
}

/* Refuse a library older than the headers or of another major version. */
static void check_library_version(void) {
  const unsigned lib = osft_version();
  printf("libosftrt %s (headers %d.%d.%d)\n  %s\n", osft_version_string(),
         OSFT_VERSION_MAJOR, OSFT_VERSION_MINOR, OSFT_VERSION_PATCH, osft_build_info());
  if (lib / 10000 != OSFT_VERSION_MAJOR || lib < OSFT_VERSION_NUMBER) {
    fprintf(stderr, "FAILED: library version %u does not match headers %d\n", lib,
            OSFT_VERSION_NUMBER);
    exit(1);
  }
}

static osft_context_t create_context(trainer_heap *heap, osft_device_type_t *device) {
  int gpus = 0;
  CHECK(osft_device_count(OSFT_DEVICE_CUDA, &gpus));
  *device = gpus > 0 ? OSFT_DEVICE_CUDA : OSFT_DEVICE_CPU;
  printf("devices: %d CUDA GPU(s) visible (CUDA backend %s) -> running on the %s\n", gpus,
         osft_has_feature(OSFT_FEATURE_CUDA) ? "compiled in" : "not compiled in",
         *device == OSFT_DEVICE_CUDA ? "GPU" : "CPU");

  osft_allocator_t allocator;
  CHECK(OSFT_ALLOCATOR_INIT(&allocator));
  allocator.user = heap;
  allocator.host_alloc = heap_alloc;
  allocator.host_free = heap_free;

  osft_context_options_t opts;
  CHECK(OSFT_CONTEXT_OPTIONS_INIT(&opts));
  opts.device_type = *device;
  opts.allocator = &allocator;
  opts.workspace_limit = (size_t)256 << 20;
  osft_context_t ctx = NULL;
  CHECK(osft_context_create(&ctx, &opts));
  return ctx;
}

static void print_memory(osft_context_t ctx, const char *when) {
  osft_memory_stats_t s;
  s.struct_size = sizeof s;
  CHECK(osft_context_get_memory_stats(ctx, &s));
  printf(
      "memory %s: host %llu B in use (peak %llu), device %llu B in use (peak %llu), "
      "workspace %llu B\n",
      when, (unsigned long long)s.host_in_use, (unsigned long long)s.host_peak,
      (unsigned long long)s.device_in_use, (unsigned long long)s.device_peak,
      (unsigned long long)s.workspace_bytes);
}

/* A bad call is reported with a status and a message naming the argument,
 * and changes nothing. */
static void show_error_reporting(osft_context_t ctx) {
  const osft_status_t st = osft_context_reserve_workspace(ctx, (size_t)1 << 40);
  printf("errors: reserving 1 TiB above the limit -> %s\n  \"%s\"\n",
         osft_status_string(st), osft_last_error());
  if (st != OSFT_STATUS_OUT_OF_MEMORY) exit(1);
}

/* Creates the context every later step uses. */
static osft_context_t demo_runtime(trainer_heap *heap, osft_device_type_t *device) {
  printf("== 1. runtime ==\n");
  check_library_version();
  CHECK(osft_set_log_callback(log_to_stdout, NULL, OSFT_LOG_INFO));
  osft_context_t ctx = create_context(heap, device);
  CHECK(osft_context_reserve_workspace(ctx, (size_t)16 << 20));
  print_memory(ctx, "after reserving 16 MiB of workspace");
  show_error_reporting(ctx);
  CHECK(osft_set_log_callback(NULL, NULL, OSFT_LOG_OFF));
  return ctx;
}

/* Tears the context down and checks every byte went back to the trainer. */
static void finish_runtime(osft_context_t ctx, const trainer_heap *heap) {
  printf("== done ==\n");
  print_memory(ctx, "at the end (peaks over all steps)");
  CHECK(osft_context_synchronize(ctx));
  CHECK(osft_context_destroy(ctx));
  printf("trainer allocator: %ld allocations, %ld frees, %zu B still live, peak %zu B\n",
         heap->allocs, heap->frees, heap->live, heap->peak);
  if (heap->allocs != heap->frees || heap->live != 0) {
    fprintf(stderr, "FAILED: the context did not return all its memory\n");
    exit(1);
  }
}

/* ------------------------------------------------ tensors on the device */

/* A float32 matrix held on the host and, on a GPU, mirrored on the device. */
typedef struct {
  DLTensor t;
  int64_t shape[2];
  float *host;
} demo_tensor;

static demo_tensor *demo_new(osft_device_type_t device, int64_t rows, int64_t cols) {
  demo_tensor *p = calloc(1, sizeof *p);
  demo_tensor d;
  memset(&d, 0, sizeof d);
  d.shape[0] = rows;
  d.shape[1] = cols;
  d.host = calloc((size_t)(rows * cols), sizeof(float));
  d.t.data = d.host;
  d.t.device.device_type = kDLCPU;
#ifdef OSFT_DEMO_CUDA
  if (device == OSFT_DEVICE_CUDA) {
    if (cudaMalloc(&d.t.data, sizeof(float) * (size_t)(rows * cols)) != cudaSuccess)
      exit(1);
    d.t.device.device_type = kDLCUDA;
  }
#else
  (void)device;
#endif
  d.t.ndim = 2;
  d.t.dtype.code = kDLFloat;
  d.t.dtype.bits = 32;
  d.t.dtype.lanes = 1;
  *p = d;
  p->t.shape = p->shape; /* the shape lives in the heap object */
  return p;
}

/* Host -> device after the host copy was filled, and back. */
static void demo_upload(demo_tensor *d) {
#ifdef OSFT_DEMO_CUDA
  if (d->t.data != d->host)
    cudaMemcpy(d->t.data, d->host, sizeof(float) * (size_t)(d->shape[0] * d->shape[1]),
               cudaMemcpyHostToDevice);
#else
  (void)d;
#endif
}

static void demo_download(demo_tensor *d) {
#ifdef OSFT_DEMO_CUDA
  if (d->t.data != d->host)
    cudaMemcpy(d->host, d->t.data, sizeof(float) * (size_t)(d->shape[0] * d->shape[1]),
               cudaMemcpyDeviceToHost);
#else
  (void)d;
#endif
}

static void demo_free(demo_tensor *d) {
#ifdef OSFT_DEMO_CUDA
  if (d->t.data != d->host) cudaFree(d->t.data);
#endif
  free(d->host);
  free(d);
}

static void demo_random(demo_tensor *d, unsigned *seed) {
  for (int64_t i = 0; i < d->shape[0] * d->shape[1]; ++i) {
    *seed = *seed * 1664525u + 1013904223u;
    d->host[i] = (float)((*seed >> 8) * (1.0 / 16777216.0) - 0.5);
  }
  demo_upload(d);
}

/* Copies rows x cols floats between a factor view (row-major, row stride
 * ld, on the host or the GPU) and a compact host array. */
static void copy_rows(float *dst, int64_t dst_ld, const float *src, int64_t src_ld,
                      int64_t rows, int64_t cols, int on_gpu, int to_view) {
#ifdef OSFT_DEMO_CUDA
  if (on_gpu) {
    cudaMemcpy2D(dst, sizeof(float) * (size_t)dst_ld, src, sizeof(float) * (size_t)src_ld,
                 sizeof(float) * (size_t)cols, (size_t)rows,
                 to_view ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost);
    return;
  }
#else
  (void)on_gpu;
  (void)to_view;
#endif
  for (int64_t i = 0; i < rows; ++i)
    memcpy(dst + i * dst_ld, src + i * src_ld, sizeof(float) * (size_t)cols);
}

/* Reads a factor into a compact host copy, or writes one back. */
static float *read_factor(osft_flinear_t layer, osft_flinear_factor_t which,
                          int64_t *rows, int64_t *cols) {
  DLTensor v;
  CHECK(osft_flinear_get_factor(layer, which, &v));
  *rows = v.ndim == 2 ? v.shape[0] : 1;
  *cols = v.shape[v.ndim - 1];
  const int64_t ld = v.ndim == 2 ? v.strides[0] : *cols;
  float *out = malloc(sizeof(float) * (size_t)(*rows * *cols));
  copy_rows(out, *cols, v.data, ld, *rows, *cols, v.device.device_type == kDLCUDA, 0);
  return out;
}

static void write_factor(osft_flinear_t layer, osft_flinear_factor_t which,
                         const float *values) {
  DLTensor v;
  CHECK(osft_flinear_get_factor(layer, which, &v));
  const int64_t rows = v.ndim == 2 ? v.shape[0] : 1, cols = v.shape[v.ndim - 1];
  const int64_t ld = v.ndim == 2 ? v.strides[0] : cols;
  copy_rows(v.data, ld, values, cols, rows, cols, v.device.device_type == kDLCUDA, 1);
}

/* max |A^T A - I| over the columns of a rows x cols matrix. */
static double orthogonality_error(const float *a, int64_t rows, int64_t cols) {
  double worst = 0;
  for (int64_t p = 0; p < cols; ++p)
    for (int64_t q = p; q < cols; ++q) {
      double dot = 0;
      for (int64_t i = 0; i < rows; ++i) dot += (double)a[i * cols + p] * a[i * cols + q];
      const double err = fabs(dot - (p == q ? 1.0 : 0.0));
      if (err > worst) worst = err;
    }
  return worst;
}

static void demo_flinear(osft_context_t ctx, osft_device_type_t device) {
  printf("== 2. factorized linear (OSFT layer) ==\n");
  const int64_t n = 384, k = 256, m = 512;
  unsigned seed = 7;
  demo_tensor *w = demo_new(device, n, k);
  demo_random(w, &seed);
  osft_flinear_options_t opts;
  CHECK(OSFT_FLINEAR_OPTIONS_INIT(&opts));
  opts.rank_ratio = 0.5;
  osft_flinear_t layer = NULL;
  CHECK(osft_flinear_create_from_weight(ctx, &w->t, &opts, &layer));
  int64_t r, l;
  CHECK(osft_flinear_get_dims(layer, NULL, NULL, &r, &l));
  int64_t ur, uc, vr, vc;
  float *u_high = read_factor(layer, OSFT_FACTOR_U_HIGH, &ur, &uc);
  float *u_low = read_factor(layer, OSFT_FACTOR_U_LOW, &vr, &vc);
  printf(
      "decomposed W %lldx%lld: r = %lld frozen, l = %lld trainable; "
      "max|U_high^T U_high - I| = %.2e, max|U_low^T U_low - I| = %.2e\n",
      (long long)n, (long long)k, (long long)r, (long long)l,
      orthogonality_error(u_high, ur, uc), orthogonality_error(u_low, vr, vc));
  free(u_high);
  free(u_low);
  osft_flinear_strategy_t few, many;
  CHECK(osft_flinear_choose_strategy(layer, 8, OSFT_FLINEAR_FORWARD, &few));
  CHECK(osft_flinear_choose_strategy(layer, 65536, OSFT_FLINEAR_FORWARD, &many));
  printf("cost model: %s for 8 tokens, %s for 65536 tokens\n",
         few == OSFT_FLINEAR_DENSE ? "dense rebuild" : "factorized",
         many == OSFT_FLINEAR_DENSE ? "dense rebuild" : "factorized");

  /* A few SGD steps on the trainable factors against a fixed target y*,
   * loss = 0.5 |y - y*|^2 / m: the loss must go down. */
  demo_tensor *x = demo_new(device, m, k), *target = demo_new(device, m, n);
  demo_tensor *y = demo_new(device, m, n), *dx = demo_new(device, m, k);
  demo_random(x, &seed);
  demo_random(target, &seed);
  osft_flinear_grads_t grads;
  CHECK(OSFT_FLINEAR_GRADS_INIT(&grads));
  demo_tensor *du = demo_new(device, n, l), *dv = demo_new(device, l, k);
  demo_tensor *ds = demo_new(device, l, 1);
  ds->t.ndim = 1;
  grads.grad_x = &dx->t;
  grads.grad_u_low = &du->t;
  grads.grad_v_low = &dv->t;
  grads.grad_s_low = &ds->t;
  const osft_flinear_factor_t trained[3] = {OSFT_FACTOR_U_LOW, OSFT_FACTOR_V_LOW,
                                            OSFT_FACTOR_S_LOW};
  demo_tensor *grad_of[3] = {du, dv, ds};
  double first = 0, last = 0;
  for (int step = 0; step < 5; ++step) {
    CHECK(osft_flinear_forward(layer, &x->t, NULL, &y->t));
    demo_download(y);
    double loss = 0;
    for (int64_t i = 0; i < m * n; ++i) {
      const float diff = y->host[i] - target->host[i];
      loss += 0.5 * diff * diff / (double)m;
      y->host[i] = diff / (float)m; /* dL/dy, reused as grad_y */
    }
    demo_upload(y);
    if (step == 0) first = loss;
    last = loss;
    CHECK(osft_flinear_backward(layer, &x->t, &y->t, &grads));
    for (int p = 0; p < 3; ++p) { /* factor -= lr * grad, in place */
      int64_t rows, cols;
      float *f = read_factor(layer, trained[p], &rows, &cols);
      demo_download(grad_of[p]);
      for (int64_t i = 0; i < rows * cols; ++i) f[i] -= 2e-4f * grad_of[p]->host[i];
      write_factor(layer, trained[p], f);
      free(f);
    }
  }
  printf("5 SGD steps on U_low, S_low, V_low: loss %.5f -> %.5f\n", first, last);
  if (!(last < first)) {
    fprintf(stderr, "FAILED: the loss did not decrease\n");
    exit(1);
  }
  demo_tensor *merged = demo_new(device, n, k);
  CHECK(osft_flinear_merge(layer, &merged->t));
  demo_download(merged);
  double moved = 0;
  for (int64_t i = 0; i < n * k; ++i) moved += fabs(merged->host[i] - w->host[i]);
  printf("merged W differs from the original by %.4f (mean abs), as training moved it\n",
         moved / (double)(n * k));
  CHECK(osft_flinear_destroy(layer));
  demo_tensor *all[9] = {w, x, target, y, dx, du, dv, ds, merged};
  for (int i = 0; i < 9; ++i) demo_free(all[i]);
}

int main(void) {
  trainer_heap heap = {0};
  osft_device_type_t device;
  osft_context_t ctx = demo_runtime(&heap, &device);
  demo_flinear(ctx, device);
  finish_runtime(ctx, &heap);
  printf("osftrt_demo: all steps succeeded\n");
  return 0;
}
