/* Per-call cost of two tiny libosftrt calls made from C: the baseline that
 * bench/rust/overhead.rs (the same calls through the Rust bindings) is
 * compared with. Prints one CSV line per case:
 *   case,impl,ns_per_call_min,ns_per_call_median
 * Build: cc -O2 overhead_c.c $(pkg-config --cflags --libs osftrt)
 * (bench/rust/run_overhead.sh does it). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "osftrt/osftrt.h"

#define CHECK(call)                                                 \
  do {                                                              \
    osft_status_t st_ = (call);                                     \
    if (st_ != OSFT_STATUS_SUCCESS) {                               \
      fprintf(stderr, "%s failed: %s\n", #call, osft_last_error()); \
      exit(1);                                                      \
    }                                                               \
  } while (0)

enum { REPEATS = 31 };

/* The shapes, shared with overhead.rs. */
enum { FM = 4, FH = 16, FV = 32, QN = 4, QR = 8, QC = 8 };

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e9 + ts.tv_nsec;
}

/* CPU time of the calling thread: what the call costs, without the time the
 * thread waited for a core on a loaded machine (every call here runs on the
 * calling thread: one QR worker, OPENBLAS_NUM_THREADS=1). */
static double cpu_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static void fill(float *p, int n, unsigned seed) {
  for (int i = 0; i < n; ++i) {
    seed = seed * 1664525u + 1013904223u;
    p[i] = (float)((seed >> 8) & 0xffff) / 65536.0f - 0.5f;
  }
}

static DLTensor tensor(void *data, DLDataType dt, int ndim, int64_t *shape) {
  DLTensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.device.device_type = kDLCPU;
  t.ndim = ndim;
  t.dtype = dt;
  t.shape = shape;
  return t;
}

typedef struct {
  osft_flce_t ce;
  osft_context_t ctx;
  DLTensor x, w, t, loss, gx;
  DLTensor a[QN], q[QN];
  const DLTensor *ap[QN];
  DLTensor *qp[QN];
  DLTensor e[QN], eq[QN];
  const DLTensor *ep[QN];
  DLTensor *eqp[QN];
  osft_qr_options_t qo;
} state_t;

static void flce_call(state_t *s) {
  osft_flce_inputs_t in;
  OSFT_FLCE_INPUTS_INIT(&in);
  in.x = &s->x;
  in.weight = &s->w;
  in.targets = &s->t;
  osft_flce_outputs_t out;
  OSFT_FLCE_OUTPUTS_INIT(&out);
  out.loss = &s->loss;
  out.grad_x = &s->gx;
  CHECK(osft_flce_compute(s->ce, &in, &out));
}

static void flce_plan_call(state_t *s) {
  osft_flce_inputs_t in;
  OSFT_FLCE_INPUTS_INIT(&in);
  in.x = &s->x;
  in.weight = &s->w;
  in.targets = &s->t;
  osft_flce_outputs_t out;
  OSFT_FLCE_OUTPUTS_INIT(&out);
  out.loss = &s->loss;
  out.grad_x = &s->gx;
  osft_flce_plan_t plan;
  memset(&plan, 0, sizeof plan);
  plan.struct_size = sizeof plan;
  CHECK(osft_flce_get_plan(s->ce, &in, &out, &plan));
}

static void qr_empty_call(state_t *s) {
  CHECK(osft_qr_batch(s->ctx, &s->qo, QN, s->ep, s->eqp, NULL, NULL));
}

static void qr_call(state_t *s) {
  CHECK(osft_qr_batch(s->ctx, &s->qo, QN, s->ap, s->qp, NULL, NULL));
}

static void bench(const char *name, void (*call)(state_t *), state_t *s) {
  /* Calibrate: about 10 ms per repeat; the minimum over the repeats is
   * the figure least disturbed by other work on the machine. */
  for (int i = 0; i < 1000; ++i) call(s);
  double t0 = now_ns();
  for (int i = 0; i < 1000; ++i) call(s);
  double per = (now_ns() - t0) / 1000;
  long n = (long)(1e7 / per);
  if (n < 100) n = 100;
  double r[REPEATS], c[REPEATS];
  for (int k = 0; k < REPEATS; ++k) {
    t0 = now_ns();
    double c0 = cpu_ns();
    for (long i = 0; i < n; ++i) call(s);
    c[k] = (cpu_ns() - c0) / (double)n;
    r[k] = (now_ns() - t0) / (double)n;
  }
  qsort(r, REPEATS, sizeof r[0], cmp_double);
  qsort(c, REPEATS, sizeof c[0], cmp_double);
  printf("%s,c,%.1f,%.1f,%.1f,%.1f\n", name, r[0], r[REPEATS / 2], c[0], c[REPEATS / 2]);
}

int main(void) {
  state_t s;
  DLDataType f32 = {kDLFloat, 32, 1}, i64 = {kDLInt, 64, 1};
  static float x[FM * FH], w[FV * FH], gx[FM * FH], loss, a[QN][QR * QC], q[QN][QR * QC];
  static int64_t targets[FM];
  int64_t sx[2] = {FM, FH}, sw[2] = {FV, FH}, st[1] = {FM}, sq[2] = {QR, QC},
          se[2] = {QR, 0};
  fill(x, FM * FH, 1);
  fill(w, FV * FH, 2);
  for (int i = 0; i < FM; ++i) targets[i] = (i * 7) % FV;
  for (int i = 0; i < QN; ++i) fill(a[i], QR * QC, 10 + i);

  CHECK(osft_context_create(&s.ctx, NULL));
  CHECK(osft_flce_create(s.ctx, NULL, &s.ce));
  s.x = tensor(x, f32, 2, sx);
  s.w = tensor(w, f32, 2, sw);
  s.t = tensor(targets, i64, 1, st);
  s.loss = tensor(&loss, f32, 0, NULL);
  s.gx = tensor(gx, f32, 2, sx);
  for (int i = 0; i < QN; ++i) {
    s.a[i] = tensor(a[i], f32, 2, sq);
    s.q[i] = tensor(q[i], f32, 2, sq);
    s.ap[i] = &s.a[i];
    s.qp[i] = &s.q[i];
    s.e[i] = tensor(a[i], f32, 2, se);
    s.eq[i] = tensor(q[i], f32, 2, se);
    s.ep[i] = &s.e[i];
    s.eqp[i] = &s.eq[i];
  }
  OSFT_QR_OPTIONS_INIT(&s.qo);
  s.qo.max_concurrency = 1;

  bench("flce_tiny", flce_call, &s);
  bench("qr_batch_small", qr_call, &s);
  bench("flce_plan", flce_plan_call, &s);
  bench("qr_batch_empty", qr_empty_call, &s);

  CHECK(osft_flce_destroy(s.ce));
  CHECK(osft_context_destroy(s.ctx));
  return 0;
}
