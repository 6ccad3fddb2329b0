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
 *   3. OSFT gradient projection: a one-rank communicator, a projector over
 *      two layers (one registered as a layer, one as sharded tensors),
 *      gradients and parameters projected out of the frozen subspace, with
 *      the residuals before/after and the collectives per call.
 *   4. tiled MLP: a SwiGLU block over 2 sequences, tiled by a memory
 *      budget, against the untiled run: same results, less scratch.
 *   5. batched QR: a SOAP-like list of mixed shapes, checked Q and R, and
 *      one power-iteration step.
 *   6. fused linear cross-entropy: loss and gradients of an LM head with
 *      ignored tokens, against a float64 loss, logits never materialized.
 * Every step checks its figures; a failed check stops the demo with a
 * message on stderr.
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
  print_memory(ctx, "at the end");
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

/* A float32 (or int64) tensor of up to 3 dims held on the host and, on a
 * GPU, mirrored on the device. */
typedef struct {
  DLTensor t;
  int64_t shape[3];
  int64_t numel;
  union {
    float *host;
    int64_t *host_i64; /* int64 tensors (class targets) */
  };
} demo_tensor;

static size_t demo_bytes(const demo_tensor *d) {
  return (size_t)d->numel * d->t.dtype.bits / 8;
}

/* code: kDLFloat (fp32) or kDLInt (int64). */
static demo_tensor *demo_new_nd(osft_device_type_t device, uint8_t code, int ndim,
                                const int64_t *shape) {
  demo_tensor *d = calloc(1, sizeof *d);
  d->numel = 1;
  for (int i = 0; i < ndim; ++i) d->numel *= d->shape[i] = shape[i];
  d->t.ndim = ndim;
  d->t.shape = d->shape;
  d->t.dtype.code = code;
  d->t.dtype.bits = code == kDLInt ? 64 : 32;
  d->t.dtype.lanes = 1;
  d->host = calloc(demo_bytes(d), 1);
  d->t.data = d->host;
  d->t.device.device_type = kDLCPU;
#ifdef OSFT_DEMO_CUDA
  if (device == OSFT_DEVICE_CUDA) {
    if (cudaMalloc(&d->t.data, demo_bytes(d)) != cudaSuccess) {
      fprintf(stderr, "FAILED: cudaMalloc of %zu B\n", demo_bytes(d));
      exit(1);
    }
    d->t.device.device_type = kDLCUDA;
  }
#else
  (void)device;
#endif
  return d;
}

static demo_tensor *demo_new(osft_device_type_t device, int64_t rows, int64_t cols) {
  const int64_t shape[2] = {rows, cols};
  return demo_new_nd(device, kDLFloat, 2, shape);
}

/* Host -> device after the host copy was filled, and back. */
static void demo_upload(demo_tensor *d) {
#ifdef OSFT_DEMO_CUDA
  if (d->t.data != d->host)
    cudaMemcpy(d->t.data, d->host, demo_bytes(d), cudaMemcpyHostToDevice);
#else
  (void)d;
#endif
}

static void demo_download(demo_tensor *d) {
#ifdef OSFT_DEMO_CUDA
  if (d->t.data != d->host)
    cudaMemcpy(d->host, d->t.data, demo_bytes(d), cudaMemcpyDeviceToHost);
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
  for (int64_t i = 0; i < d->numel; ++i) {
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

/* Stops the demo when a figure it printed is not what the library promises. */
static void expect(int ok, const char *what) {
  if (!ok) {
    fprintf(stderr, "FAILED: %s\n", what);
    exit(1);
  }
}

/* ---------------------------------------------- 3. gradient projection */

/* An OSFT layer of a random N x K weight, with gradients of its trainable
 * factors from one backward pass. */
typedef struct {
  osft_flinear_t layer;
  int64_t n, k, r, l;
  demo_tensor *du, *dv;
} demo_osft_layer;

static demo_osft_layer demo_layer_new(osft_context_t ctx, osft_device_type_t device,
                                      int64_t n, int64_t k, double rank_ratio,
                                      unsigned *seed) {
  demo_osft_layer d;
  demo_tensor *w = demo_new(device, n, k);
  demo_random(w, seed);
  osft_flinear_options_t opts;
  CHECK(OSFT_FLINEAR_OPTIONS_INIT(&opts));
  opts.rank_ratio = rank_ratio;
  CHECK(osft_flinear_create_from_weight(ctx, &w->t, &opts, &d.layer));
  demo_free(w); /* the factors are the layer's own */
  CHECK(osft_flinear_get_dims(d.layer, &d.n, &d.k, &d.r, &d.l));
  d.du = demo_new(device, d.n, d.l);
  d.dv = demo_new(device, d.l, d.k);
  return d;
}

static void demo_layer_backward(demo_osft_layer *d, osft_device_type_t device,
                                unsigned *seed) {
  const int64_t m = 256;
  demo_tensor *x = demo_new(device, m, d->k), *gy = demo_new(device, m, d->n);
  demo_random(x, seed);
  demo_random(gy, seed);
  osft_flinear_grads_t grads;
  CHECK(OSFT_FLINEAR_GRADS_INIT(&grads));
  grads.grad_u_low = &d->du->t;
  grads.grad_v_low = &d->dv->t;
  CHECK(osft_flinear_backward(d->layer, &x->t, &gy->t, &grads));
  demo_free(x);
  demo_free(gy);
}

static void demo_layer_free(demo_osft_layer *d) {
  CHECK(osft_flinear_destroy(d->layer));
  demo_free(d->du);
  demo_free(d->dv);
}

/* ||A B||_F / ||B||_F for orthonormal vectors a_p (p < na) and vectors b_q
 * (q < nb) of length len, element i of a_p at a[p * av + i * ae] (likewise
 * b): the share of B inside the span of the a_p, 0 when B is orthogonal. */
static double span_share(const float *a, int64_t na, int64_t av, int64_t ae,
                         const float *b, int64_t nb, int64_t bv, int64_t be,
                         int64_t len) {
  double inside = 0, total = 0;
  for (int64_t q = 0; q < nb; ++q) {
    for (int64_t i = 0; i < len; ++i)
      total += (double)b[q * bv + i * be] * b[q * bv + i * be];
    for (int64_t p = 0; p < na; ++p) {
      double dot = 0;
      for (int64_t i = 0; i < len; ++i)
        dot += (double)a[p * av + i * ae] * b[q * bv + i * be];
      inside += dot * dot;
    }
  }
  return sqrt(inside / total);
}

/* The largest share of a gradient inside its frozen subspace, over the U and
 * V gradients of the layers: |U_high^T dU_low| / |dU_low| (columns of
 * U_high against columns of dU_low) and |dV_low V_high^T| / |dV_low| (rows). */
static double frozen_share(demo_osft_layer *layers, int count) {
  double worst = 0;
  for (int i = 0; i < count; ++i) {
    demo_osft_layer *d = &layers[i];
    int64_t rows, cols;
    float *uh = read_factor(d->layer, OSFT_FACTOR_U_HIGH, &rows, &cols);
    float *vh = read_factor(d->layer, OSFT_FACTOR_V_HIGH, &rows, &cols);
    demo_download(d->du);
    demo_download(d->dv);
    const double su = span_share(uh, d->r, 1, d->r, d->du->host, d->l, 1, d->l, d->n);
    const double sv = span_share(vh, d->r, d->k, 1, d->dv->host, d->l, d->k, 1, d->k);
    worst = fmax(worst, fmax(su, sv));
    free(uh);
    free(vh);
  }
  return worst;
}

/* An Adam-like step: the per-element scaling (here the sign) moves the
 * trainable factors partly into the frozen subspace. */
static void sign_step(demo_osft_layer *d, float lr) {
  const osft_flinear_factor_t which[2] = {OSFT_FACTOR_U_LOW, OSFT_FACTOR_V_LOW};
  demo_tensor *grad[2] = {d->du, d->dv};
  for (int p = 0; p < 2; ++p) {
    int64_t rows, cols;
    float *f = read_factor(d->layer, which[p], &rows, &cols);
    demo_download(grad[p]);
    for (int64_t i = 0; i < rows * cols; ++i)
      f[i] -= grad[p]->host[i] > 0 ? lr : grad[p]->host[i] < 0 ? -lr : 0;
    write_factor(d->layer, which[p], f);
    free(f);
  }
}

/* The second layer as a framework would hand it over: its own tensors (here
 * views of the layer's factors), with U sharded by rows and V by columns over
 * the one rank, so that the projection needs its all-reduce. */
static void add_sharded_target(osft_projector_t proj, demo_osft_layer *d,
                               DLTensor views[4]) {
  const osft_flinear_factor_t which[4] = {OSFT_FACTOR_U_HIGH, OSFT_FACTOR_U_LOW,
                                          OSFT_FACTOR_V_HIGH, OSFT_FACTOR_V_LOW};
  for (int i = 0; i < 4; ++i)
    CHECK(osft_flinear_get_factor(d->layer, which[i], &views[i]));
  osft_projection_target_t t;
  CHECK(OSFT_PROJECTION_TARGET_INIT(&t));
  t.u_high = &views[0];
  t.u_low = &views[1];
  t.grad_u_low = &d->du->t;
  t.u_layout = OSFT_SHARD_U_ROWS;
  t.u_shards = &d->n; /* rank 0 holds all N rows */
  t.n_u_shards = 1;
  t.v_high = &views[2];
  t.v_low = &views[3];
  t.grad_v_low = &d->dv->t;
  t.v_layout = OSFT_SHARD_V_COLS;
  t.v_shards = &d->k;
  t.n_v_shards = 1;
  CHECK(osft_projector_add_target(proj, &t, NULL));
}

static void demo_projection(osft_context_t ctx, osft_device_type_t device) {
  printf("== 3. OSFT gradient projection ==\n");
  unsigned seed = 11;
  demo_osft_layer layers[2] = {demo_layer_new(ctx, device, 384, 256, 0.5, &seed),
                               demo_layer_new(ctx, device, 256, 512, 0.75, &seed)};
  osft_comm_t comm = NULL;
  CHECK(osft_comm_create_self(ctx, NULL, &comm));
  osft_projector_t proj = NULL;
  CHECK(osft_projector_create(ctx, comm, NULL, &proj));
  CHECK(osft_projector_add_layer(proj, layers[0].layer, &layers[0].du->t,
                                 &layers[0].dv->t, NULL));
  DLTensor views[4];
  add_sharded_target(proj, &layers[1], views);
  CHECK(osft_projector_prepare(proj)); /* the one-time setup collectives */
  osft_projector_info_t info;
  info.struct_size = sizeof info;
  CHECK(osft_projector_get_info(proj, &info));
  printf(
      "projector on a 1-rank communicator, %lld targets: a %lldx%lld layer "
      "(replicated),\n  a %lldx%lld one (U rows, V columns sharded)\n",
      (long long)info.targets, (long long)layers[0].n, (long long)layers[0].k,
      (long long)layers[1].n, (long long)layers[1].k);

  for (int i = 0; i < 2; ++i) demo_layer_backward(&layers[i], device, &seed);
  const double before = frozen_share(layers, 2);
  CHECK(osft_comm_reset_stats(comm));
  CHECK(osft_projector_project(proj));
  osft_comm_stats_t cs;
  cs.struct_size = sizeof cs;
  CHECK(osft_comm_get_stats(comm, &cs));
  const double after = frozen_share(layers, 2);
  printf(
      "gradients in the frozen subspace (|U_high^T dU_low|/|dU_low|, and for V): %.3f "
      "-> %.1e after project()\n",
      before, after);
  printf(
      "one project() for both: %llu all-reduce of %lld coefficients, %llu all-gathers\n",
      (unsigned long long)cs.allreduce_calls, (long long)info.reduced_elements,
      (unsigned long long)cs.allgather_calls);
  expect(before > 0.1 && after < 1e-5, "the projection did not remove the frozen part");
  expect(cs.allreduce_calls == 1 &&
             (int64_t)cs.allreduce_calls == info.collectives_per_project,
         "project() should make exactly one all-reduce");

  double u0, v0, u1, v1, u2, v2;
  CHECK(osft_projector_orthogonality(proj, &u0, &v0));
  for (int i = 0; i < 2; ++i) sign_step(&layers[i], 1e-3f);
  CHECK(osft_projector_orthogonality(proj, &u1, &v1));
  CHECK(osft_projector_project_params(proj));
  CHECK(osft_projector_orthogonality(proj, &u2, &v2));
  printf(
      "parameters: max|U_high^T U_low| %.1e -> %.1e after a sign (Adam-like) step -> "
      "%.1e after project_params()\n"
      "            max|V_low V_high^T| %.1e -> %.1e -> %.1e\n",
      u0, u1, u2, v0, v1, v2);
  expect(u1 > 1e-3 && v1 > 1e-3 && u2 < 1e-5 && v2 < 1e-5,
         "project_params() did not restore orthogonality");

  CHECK(osft_projector_destroy(proj));
  CHECK(osft_comm_destroy(comm));
  for (int i = 0; i < 2; ++i) demo_layer_free(&layers[i]);
}

/* ---------------------------------------------------------- 4. tiled MLP */

/* max |a - b| / max |b| over two tensors of one shape, on the host. */
static double max_rel_diff(demo_tensor *a, demo_tensor *b) {
  demo_download(a);
  demo_download(b);
  double diff = 0, scale = 0;
  for (int64_t i = 0; i < a->numel; ++i) {
    diff = fmax(diff, fabs((double)a->host[i] - b->host[i]));
    scale = fmax(scale, fabs((double)b->host[i]));
  }
  return diff / scale;
}

static osft_memory_stats_t memory_stats(osft_context_t ctx) {
  osft_memory_stats_t s;
  s.struct_size = sizeof s;
  CHECK(osft_context_get_memory_stats(ctx, &s));
  return s;
}

/* Empties the workspace and resets the peaks, so that the scratch of the
 * calls that follow shows in them; returns the memory in use now. */
static uint64_t scratch_begin(osft_context_t ctx) {
  CHECK(osft_context_release_workspace(ctx));
  CHECK(osft_context_reset_peak_memory(ctx));
  const osft_memory_stats_t s = memory_stats(ctx);
  return s.host_in_use + s.device_in_use;
}

/* The most memory held at once since scratch_begin(), above `base`, in MiB. */
static double scratch_peak_mib(osft_context_t ctx, uint64_t base) {
  CHECK(osft_context_synchronize(ctx));
  const osft_memory_stats_t s = memory_stats(ctx);
  return (double)(s.host_peak + s.device_peak - base) / 1048576.0;
}

/* Forward + backward with `tiles` tiles (0: the MLP's rule), from an empty
 * workspace: writes the workspace the pair needed (the scratch of its
 * largest tile) and the most memory the calls held at once, in MiB. */
static void mlp_pass(osft_context_t ctx, osft_mlp_t mlp, const demo_tensor *x,
                     demo_tensor *y, const demo_tensor *gy, const osft_mlp_grads_t *g,
                     int64_t tiles, double mib[2]) {
  const uint64_t base = scratch_begin(ctx);
  CHECK(osft_mlp_forward(mlp, &x->t, &y->t, tiles));
  CHECK(osft_mlp_backward(mlp, &x->t, &gy->t, g, tiles));
  mib[1] = scratch_peak_mib(ctx, base);
  mib[0] = (double)memory_stats(ctx).workspace_bytes / 1048576.0;
}

/* The gradients of one backward: dx, dgate, dup, ddown. */
static void mlp_grads_new(osft_device_type_t device, const int64_t *x_shape, int64_t h,
                          int64_t inter, demo_tensor *out[4], osft_mlp_grads_t *g) {
  out[0] = demo_new_nd(device, kDLFloat, 3, x_shape);
  out[1] = demo_new(device, inter, h);
  out[2] = demo_new(device, inter, h);
  out[3] = demo_new(device, h, inter);
  CHECK(OSFT_MLP_GRADS_INIT(g));
  g->grad_x = &out[0]->t;
  g->grad_gate = &out[1]->t;
  g->grad_up = &out[2]->t;
  g->grad_down = &out[3]->t;
}

static void demo_mlp(osft_context_t ctx, osft_device_type_t device) {
  printf("== 4. tiled MLP ==\n");
  const int64_t h = 256, inter = 688, x_shape[3] = {2, 512, 256}, m = 1024;
  unsigned seed = 23;
  demo_tensor *gate = demo_new(device, inter, h), *up = demo_new(device, inter, h);
  demo_tensor *down = demo_new(device, h, inter);
  demo_tensor *x = demo_new_nd(device, kDLFloat, 3, x_shape);
  demo_tensor *gy = demo_new_nd(device, kDLFloat, 3, x_shape);
  demo_tensor *y[2] = {demo_new_nd(device, kDLFloat, 3, x_shape),
                       demo_new_nd(device, kDLFloat, 3, x_shape)};
  demo_tensor *all[7] = {gate, up, down, x, gy, y[0], y[1]};
  for (int i = 0; i < 5; ++i) demo_random(all[i], &seed);

  osft_mlp_weights_t w;
  CHECK(OSFT_MLP_WEIGHTS_INIT(&w));
  w.gate = &gate->t;
  w.up = &up->t;
  w.down = &down->t;
  osft_mlp_options_t opts;
  CHECK(OSFT_MLP_OPTIONS_INIT(&opts));
  opts.tiling = OSFT_MLP_TILING_BUDGET;
  opts.memory_budget = (size_t)1 << 20;
  osft_mlp_t mlp = NULL;
  CHECK(osft_mlp_create(ctx, OSFT_MLP_SWIGLU, h, inter, &w, &opts, &mlp));
  int64_t tiles, tile_tokens;
  CHECK(osft_mlp_get_tile_count(mlp, m, &tiles, &tile_tokens));
  printf(
      "SwiGLU H=%lld I=%lld, x 2 x 512 tokens: a 1 MiB budget gives %lld tiles of <= "
      "%lld\n",
      (long long)h, (long long)inter, (long long)tiles, (long long)tile_tokens);

  demo_tensor *grads[2][4];
  osft_mlp_grads_t g[2];
  for (int i = 0; i < 2; ++i) mlp_grads_new(device, x_shape, h, inter, grads[i], &g[i]);
  double tiled[2], untiled[2]; /* MiB: workspace, peak */
  mlp_pass(ctx, mlp, x, y[0], gy, &g[0], 0, tiled);
  mlp_pass(ctx, mlp, x, y[1], gy, &g[1], 1, untiled);
  const char *names[4] = {"dx", "dW_gate", "dW_up", "dW_down"};
  double worst = max_rel_diff(y[0], y[1]);
  printf("tiled vs untiled: y %.1e", worst);
  for (int i = 0; i < 4; ++i) {
    const double d = max_rel_diff(grads[0][i], grads[1][i]);
    printf(", %s %.1e", names[i], d);
    worst = fmax(worst, d);
  }
  printf(" (max rel. diff)\n");
  printf(
      "forward + backward workspace: %.2f MiB tiled, %.2f MiB untiled (%.1fx less);\n"
      "  peak held %.2f vs %.2f MiB (a growing workspace holds old and new block)\n",
      tiled[0], untiled[0], untiled[0] / tiled[0], tiled[1], untiled[1]);
  expect(worst < 1e-4, "tiled and untiled results differ");
  expect(tiles > 1 && tiled[0] <= 1.0 && tiled[1] < untiled[1],
         "tiling did not keep the scratch within the budget");

  CHECK(osft_mlp_destroy(mlp));
  for (int i = 0; i < 7; ++i) demo_free(all[i]);
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 4; ++j) demo_free(grads[i][j]);
}

/* ---------------------------------------------------------- 5. batched QR */

static double *to_double(demo_tensor *d) {
  demo_download(d);
  double *out = malloc(sizeof(double) * (size_t)d->numel);
  for (int64_t i = 0; i < d->numel; ++i) out[i] = d->host[i];
  return out;
}

/* op(A) B with op(A) m x k (A stored k x m when trans_a), B k x n. */
static double *host_gemm(int trans_a, const double *a, const double *b, int64_t m,
                         int64_t k, int64_t n) {
  double *c = calloc((size_t)(m * n), sizeof(double));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t t = 0; t < k; ++t) {
      const double ait = trans_a ? a[t * m + i] : a[i * k + t];
      for (int64_t j = 0; j < n; ++j) c[i * n + j] += ait * b[t * n + j];
    }
  return c;
}

/* Figures of one n x n triangular factor: the largest magnitude below the
 * diagonal relative to the largest overall, and the smallest diagonal. */
static void triangle_figures(const double *r, int64_t n, double *below,
                             double *min_diag) {
  double lower = 0, top = 0;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j) {
      top = fmax(top, fabs(r[i * n + j]));
      if (j < i) lower = fmax(lower, fabs(r[i * n + j]));
      if (j == i) *min_diag = fmin(*min_diag, r[i * n + j]);
    }
  *below = fmax(*below, lower / top);
}

/* Q, R of A: max |Q^T Q - I|, |QR - A|_F / |A|_F, and R's triangle. */
static void check_qr(demo_tensor *a, demo_tensor *q, demo_tensor *r, double *orth,
                     double *resid, double *below, double *min_diag) {
  const int64_t m = a->shape[0], n = a->shape[1];
  double *da = to_double(a), *dq = to_double(q), *dr = to_double(r);
  double *qtq = host_gemm(1, dq, dq, n, m, n), *qr = host_gemm(0, dq, dr, m, n, n);
  double err = 0, norm = 0;
  for (int64_t i = 0; i < n * n; ++i)
    *orth = fmax(*orth, fabs(qtq[i] - (i / n == i % n ? 1.0 : 0.0)));
  for (int64_t i = 0; i < m * n; ++i) {
    err += (qr[i] - da[i]) * (qr[i] - da[i]);
    norm += da[i] * da[i];
  }
  *resid = fmax(*resid, sqrt(err / norm));
  triangle_figures(dr, n, below, min_diag);
  free(da), free(dq), free(dr), free(qtq), free(qr);
}

/* After Q1 = qr(A Q0): Q1^T (A Q0) is R, upper triangular with diag >= 0. */
static void check_power_step(demo_tensor *a, const double *q0, demo_tensor *q1,
                             double *orth, double *below, double *min_diag) {
  const int64_t m = q1->shape[0], n = q1->shape[1];
  double *da = to_double(a), *dq1 = to_double(q1);
  double *aq = host_gemm(0, da, q0, m, m, n), *r = host_gemm(1, dq1, aq, n, m, n);
  double *qtq = host_gemm(1, dq1, dq1, n, m, n);
  for (int64_t i = 0; i < n * n; ++i)
    *orth = fmax(*orth, fabs(qtq[i] - (i / n == i % n ? 1.0 : 0.0)));
  triangle_figures(r, n, below, min_diag);
  free(da), free(dq1), free(aq), free(r), free(qtq);
}

enum { QR_COUNT = 14 };

static void demo_qr(osft_context_t ctx, osft_device_type_t device) {
  printf("== 5. batched QR ==\n");
  unsigned seed = 31;
  /* A SOAP-like list: eigenbases of 6 128-wide and 6 256-wide factors, and
   * two tall matrices. */
  demo_tensor *a[QR_COUNT], *q[QR_COUNT], *r[QR_COUNT], *p[QR_COUNT];
  for (int i = 0; i < QR_COUNT; ++i) {
    const int64_t m = i < 6 ? 128 : i < 12 ? 256 : 300, n = i < 12 ? m : 200;
    a[i] = demo_new(device, m, n);
    q[i] = demo_new(device, m, n);
    r[i] = demo_new(device, n, n);
    p[i] = demo_new(device, m, m); /* the power iteration's square matrix */
    demo_random(a[i], &seed);
    demo_random(p[i], &seed);
  }
  const DLTensor *at[QR_COUNT], *pt[QR_COUNT];
  DLTensor *qt[QR_COUNT], *rt[QR_COUNT];
  for (int i = 0; i < QR_COUNT; ++i) {
    at[i] = &a[i]->t;
    pt[i] = &p[i]->t;
    qt[i] = &q[i]->t;
    rt[i] = &r[i]->t;
  }
  osft_status_t st[QR_COUNT];
  CHECK(osft_qr_batch(ctx, NULL, QR_COUNT, at, qt, rt, st));
  double orth = 0, resid = 0, below = 0, min_diag = INFINITY;
  for (int i = 0; i < QR_COUNT; ++i)
    check_qr(a[i], q[i], r[i], &orth, &resid, &below, &min_diag);
  printf(
      "qr_batch of 14 fp32 matrices (6 128x128, 6 256x256, 2 300x200): max|Q^T Q - I| "
      "%.1e,\n  max|QR - A|/|A| %.1e, R upper triangular (%g below), min diag(R) %.3f\n",
      orth, resid, below, min_diag);
  expect(orth < 1e-4 && resid < 1e-5 && below == 0 && min_diag >= 0, "bad QR factors");

  double *q0[QR_COUNT];
  for (int i = 0; i < QR_COUNT; ++i) q0[i] = to_double(q[i]);
  CHECK(osft_qr_power_iteration(ctx, NULL, QR_COUNT, pt, qt, 1, st));
  orth = below = 0;
  min_diag = INFINITY;
  for (int i = 0; i < QR_COUNT; ++i) {
    check_power_step(p[i], q0[i], q[i], &orth, &below, &min_diag);
    free(q0[i]);
  }
  printf(
      "power iteration Q <- qr(P Q) on 14 pairs: max|Q^T Q - I| %.1e,\n  Q^T P Q_old "
      "upper triangular to %.1e, min diag %.3f\n",
      orth, below, min_diag);
  expect(orth < 1e-4 && below < 1e-4 && min_diag >= 0, "bad power-iteration step");
  for (int i = 0; i < QR_COUNT; ++i) {
    demo_free(a[i]);
    demo_free(q[i]);
    demo_free(r[i]);
    demo_free(p[i]);
  }
}

/* ------------------------------------- 6. fused linear cross-entropy */

/* The mean cross-entropy of the logits x W^T over the tokens whose target is
 * not `ignore`, in float64 with plain loops. */
static double reference_loss(const float *x, const float *w, const int64_t *targets,
                             int64_t m, int64_t h, int64_t v, int64_t ignore) {
  double *z = malloc(sizeof(double) * (size_t)v), total = 0;
  int64_t counted = 0;
  for (int64_t i = 0; i < m; ++i) {
    if (targets[i] == ignore) continue;
    double top = -INFINITY, sum = 0;
    for (int64_t c = 0; c < v; ++c) {
      z[c] = 0;
      for (int64_t j = 0; j < h; ++j) z[c] += (double)x[i * h + j] * w[c * h + j];
      top = fmax(top, z[c]);
    }
    for (int64_t c = 0; c < v; ++c) sum += exp(z[c] - top);
    total += top + log(sum) - z[targets[i]];
    counted++;
  }
  free(z);
  return total / (double)counted;
}

/* Random classes, with every 8th token ignored (as padding would be). */
static void random_targets(demo_tensor *t, int64_t classes, int64_t ignore,
                           unsigned *seed) {
  for (int64_t i = 0; i < t->numel; ++i) {
    *seed = *seed * 1664525u + 1013904223u;
    t->host_i64[i] = i % 8 == 7 ? ignore : (int64_t)(*seed >> 8) % classes;
  }
  demo_upload(t);
}

static void demo_flce(osft_context_t ctx, osft_device_type_t device) {
  printf("== 6. fused linear cross-entropy ==\n");
  const int64_t m = 256, h = 128, v = 1000, one = 1;
  unsigned seed = 41;
  demo_tensor *x = demo_new(device, m, h), *w = demo_new(device, v, h);
  demo_tensor *dx = demo_new(device, m, h), *dw = demo_new(device, v, h);
  demo_tensor *loss = demo_new_nd(device, kDLFloat, 1, &one);
  demo_tensor *targets = demo_new_nd(device, kDLInt, 1, &m);
  demo_random(x, &seed);
  demo_random(w, &seed);
  osft_flce_options_t opts;
  CHECK(OSFT_FLCE_OPTIONS_INIT(&opts)); /* mean over tokens, ignore_index -100 */
  random_targets(targets, v, opts.ignore_index, &seed);
  opts.memory_budget = (size_t)256 << 10;
  osft_flce_t ce = NULL;
  CHECK(osft_flce_create(ctx, &opts, &ce));
  osft_flce_inputs_t in;
  CHECK(OSFT_FLCE_INPUTS_INIT(&in));
  in.x = &x->t;
  in.weight = &w->t;
  in.targets = &targets->t;
  osft_flce_outputs_t out;
  CHECK(OSFT_FLCE_OUTPUTS_INIT(&out));
  out.loss = &loss->t;
  out.grad_x = &dx->t;
  out.grad_weight = &dw->t;
  osft_flce_plan_t plan;
  plan.struct_size = sizeof plan;
  CHECK(osft_flce_get_plan(ce, &in, &out, &plan));
  const uint64_t base = scratch_begin(ctx);
  CHECK(osft_flce_compute(ce, &in, &out));
  const double peak = scratch_peak_mib(ctx, base), logits = m * v * 4 / 1048576.0;

  demo_download(loss);
  demo_download(dx);
  demo_download(dw);
  const double ref =
      reference_loss(x->host, w->host, targets->host_i64, m, h, v, opts.ignore_index);
  double ignored_dx = 0, dw_max = 0, class_sum = 0;
  for (int64_t i = 7; i < m; i += 8)
    for (int64_t j = 0; j < h; ++j)
      ignored_dx = fmax(ignored_dx, fabs(dx->host[i * h + j]));
  for (int64_t j = 0; j < h; ++j) { /* softmax - one-hot sums to 0 over classes */
    double sum = 0;
    for (int64_t c = 0; c < v; ++c) {
      sum += dw->host[c * h + j];
      dw_max = fmax(dw_max, fabs(dw->host[c * h + j]));
    }
    class_sum = fmax(class_sum, fabs(sum));
  }
  printf(
      "M=%lld tokens (%lld ignored), H=%lld, V=%lld: mean loss %.6f (float64 ref. "
      "%.6f)\n",
      (long long)m, (long long)(m / 8), (long long)h, (long long)v, loss->host[0], ref);
  printf(
      "grads: grad_x of ignored tokens %g, max|sum over classes of grad_W| %.1e (of "
      "%.1e)\n",
      ignored_dx, class_sum, dw_max);
  printf(
      "a 256 KiB budget: %lld chunks of %lld tokens, peak scratch %.3f MiB vs %.3f MiB "
      "of M x V fp32 logits\n",
      (long long)plan.chunks, (long long)plan.chunk_rows, peak, logits);
  expect(fabs(loss->host[0] - ref) < 1e-5 * ref, "the loss differs from the reference");
  expect(ignored_dx == 0 && class_sum < 1e-4 * dw_max, "bad gradients");
  expect(plan.chunks > 1 && peak < logits, "the logits were materialized");

  CHECK(osft_flce_destroy(ce));
  demo_tensor *all[6] = {x, w, dx, dw, loss, targets};
  for (int i = 0; i < 6; ++i) demo_free(all[i]);
}

int main(void) {
  trainer_heap heap = {0};
  osft_device_type_t device;
  osft_context_t ctx = demo_runtime(&heap, &device);
  demo_flinear(ctx, device);
  demo_projection(ctx, device);
  demo_mlp(ctx, device);
  demo_qr(ctx, device);
  demo_flce(ctx, device);
  finish_runtime(ctx, &heap);
  printf("osftrt_demo: all steps succeeded\n");
  return 0;
}
