/*
 * bench_small_calls — the time of one call of each capability at tiny, small
 * and medium shapes, and the library's fixed overhead per call: the same
 * call on 1 x 1 work (issue 55). CPU, fp32.
 *
 *   bench_small_calls [--reps R] [--min-ms T] [--only CAP] [--sizes LIST]
 *                     [--large] [--cpu-time] [--csv FILE]
 *
 * Capabilities (CAP): flce (osft_flce_compute with loss, grad_x and
 * grad_W: forward and backward in one call), flinear (an OSFT layer from a
 * dense W at rank ratio 0.5: osft_flinear_forward + osft_flinear_backward
 * with every gradient), projection (osft_projector_project of one target),
 * mlp (a SwiGLU tiled MLP: osft_mlp_forward + osft_mlp_backward), qr
 * (osft_qr_batch of a list of equal square matrices, Q and R).
 *
 * Each row: the median over R repetitions (default 7) of the time per call,
 * a repetition being as many calls as take at least T ms (default 20; at
 * least one call), after two calls that grow the scratch; and GFLOP/s of
 * the GEMM flops a dense framework would run for the same work (FLCE: the 3
 * GEMMs; OSFT layer: the 3 GEMMs of nn.Linear; MLP: the 9 GEMMs of the
 * untiled SwiGLU; projection: its 4 GEMMs; QR: 4 m n^2 per matrix). The
 * "1x1" rows are the fixed overhead: validation, planning, dispatch and
 * synchronization with nothing to compute. --large adds the shapes that
 * take seconds on 2 cores (FLCE 50257 x 768 at 4096 tokens, OSFT layer
 * 2048^2 at 2048 tokens). --sizes runs only the sizes named in a comma
 * list ("1x1,tiny"). --cpu-time times in the process's CPU time instead of
 * wall time: with one thread (osft_set_num_threads(1) is called), the work
 * of a call, which other jobs on a loaded machine do not stretch.
 *
 * Prints the library's thread count (osft_get_num_threads where the loaded
 * library has it) and the build; run it against another build of the
 * library with LD_LIBRARY_PATH to compare (it uses only 1.3 functions).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"

/* ------------------------------------------------------------- tensors */

typedef struct {
  DLTensor t;
  int64_t shape[2];
  float *data;
} mat;

static mat *mat_new(int ndim, int64_t rows, int64_t cols, unsigned seed, float scale) {
  mat *m = xmalloc(sizeof *m);
  m->shape[0] = rows;
  m->shape[1] = cols;
  const size_t n = (size_t)rows * (size_t)(ndim == 2 ? cols : 1);
  m->data = xmalloc(n * sizeof(float));
  fill_uniform(m->data, n, seed, scale);
  m->t = host_f32_tensor(m->data, ndim, m->shape);
  return m;
}

static void mat_free(mat *m) {
  if (!m) return;
  free(m->data);
  free(m);
}

/* A tensor of int64 targets in [0, v). */
typedef struct {
  DLTensor t;
  int64_t shape[1];
  int64_t *data;
} targets_t;

static targets_t *targets_new(int64_t m, int64_t v) {
  targets_t *y = xmalloc(sizeof *y);
  y->shape[0] = m;
  y->data = xmalloc((size_t)m * sizeof(int64_t));
  for (int64_t i = 0; i < m; ++i) y->data[i] = (i * 7919) % v;
  memset(&y->t, 0, sizeof y->t);
  y->t.data = y->data;
  y->t.device.device_type = kDLCPU;
  y->t.ndim = 1;
  y->t.dtype.code = kDLInt;
  y->t.dtype.bits = 64;
  y->t.dtype.lanes = 1;
  y->t.shape = y->shape;
  return y;
}

/* ------------------------------------------------------------- cases */

typedef struct bench_case bench_case;
struct bench_case {
  const char *cap, *size; /* "flce", "tiny" */
  char shape[64];
  double flops; /* per call */
  void (*call)(bench_case *);
  void (*done)(bench_case *);
  osft_context_t ctx;
  /* state of the capability */
  osft_flce_t flce;
  osft_flinear_t layer;
  osft_projector_t proj;
  osft_comm_t comm;
  osft_mlp_t mlp;
  int64_t count;
  mat *m[16];
  targets_t *y;
  const DLTensor *qa[64];
  DLTensor *qq[64], *qr[64];
  osft_status_t qst[64];
};

static void free_mats(bench_case *c) {
  for (int i = 0; i < 16; ++i) mat_free(c->m[i]), c->m[i] = NULL;
}

/* FLCE: x M x H, W V x H; loss, grad_x, grad_W. */
static void flce_call(bench_case *c) {
  osft_flce_inputs_t in;
  CHECK(OSFT_FLCE_INPUTS_INIT(&in));
  in.x = &c->m[0]->t, in.weight = &c->m[1]->t, in.targets = &c->y->t;
  osft_flce_outputs_t out;
  CHECK(OSFT_FLCE_OUTPUTS_INIT(&out));
  out.loss = &c->m[2]->t, out.grad_x = &c->m[3]->t, out.grad_weight = &c->m[4]->t;
  CHECK(osft_flce_compute(c->flce, &in, &out));
}
static void flce_done(bench_case *c) {
  CHECK(osft_flce_destroy(c->flce));
  free(c->y->data);
  free(c->y);
}
static void flce_setup(bench_case *c, int64_t m, int64_t h, int64_t v) {
  snprintf(c->shape, sizeof c->shape, "%lldx%lldx%lld", (long long)m, (long long)v,
           (long long)h);
  c->flops = 6.0 * (double)m * (double)h * (double)v;
  c->m[0] = mat_new(2, m, h, 1, 2.0f);
  c->m[1] = mat_new(2, v, h, 2, 0.2f);
  c->m[2] = mat_new(1, 1, 1, 3, 0.0f);
  c->m[3] = mat_new(2, m, h, 4, 0.0f);
  c->m[4] = mat_new(2, v, h, 5, 0.0f);
  c->y = targets_new(m, v);
  CHECK(osft_flce_create(c->ctx, NULL, &c->flce));
  c->call = flce_call, c->done = flce_done;
}

/* OSFT layer N x K (out x in) at rank ratio 0.5, M tokens: forward and
 * backward with grad_x and every factor's gradient. */
static void flinear_call(bench_case *c) {
  CHECK(osft_flinear_forward(c->layer, &c->m[1]->t, NULL, &c->m[2]->t));
  osft_flinear_grads_t g;
  CHECK(OSFT_FLINEAR_GRADS_INIT(&g));
  g.grad_x = &c->m[4]->t;
  g.grad_u_low = &c->m[5]->t, g.grad_s_low = &c->m[6]->t, g.grad_v_low = &c->m[7]->t;
  CHECK(osft_flinear_backward(c->layer, &c->m[1]->t, &c->m[3]->t, &g));
}
static void flinear_done(bench_case *c) {
  CHECK(osft_flinear_destroy(c->layer));
}
static void flinear_setup(bench_case *c, int64_t m, int64_t n, int64_t k) {
  snprintf(c->shape, sizeof c->shape, "%lldx%lld, %lld tok", (long long)n, (long long)k,
           (long long)m);
  c->flops = 6.0 * (double)m * (double)n * (double)k;
  c->m[0] = mat_new(2, n, k, 11, 0.5f);
  osft_flinear_options_t o;
  CHECK(OSFT_FLINEAR_OPTIONS_INIT(&o));
  o.rank_ratio = 0.5;
  CHECK(osft_flinear_create_from_weight(c->ctx, &c->m[0]->t, &o, &c->layer));
  int64_t l = 0;
  CHECK(osft_flinear_get_dims(c->layer, NULL, NULL, NULL, &l));
  c->m[1] = mat_new(2, m, k, 12, 2.0f);
  c->m[2] = mat_new(2, m, n, 13, 0.0f);
  c->m[3] = mat_new(2, m, n, 14, 2.0f);
  c->m[4] = mat_new(2, m, k, 15, 0.0f);
  c->m[5] = mat_new(2, n, l, 16, 0.0f);
  c->m[6] = mat_new(1, l, 1, 17, 0.0f);
  c->m[7] = mat_new(2, l, k, 18, 0.0f);
  c->call = flinear_call, c->done = flinear_done;
}

/* Projection of one target: U_high N x r, grad_U_low N x l, V_high r x K,
 * grad_V_low l x K. */
static void projection_call(bench_case *c) {
  CHECK(osft_projector_project(c->proj));
}
static void projection_done(bench_case *c) {
  CHECK(osft_projector_destroy(c->proj));
  CHECK(osft_comm_destroy(c->comm));
}
static void projection_setup(bench_case *c, int64_t n, int64_t k, int64_t r, int64_t l) {
  snprintf(c->shape, sizeof c->shape, "%lldx%lld, r %lld l %lld", (long long)n,
           (long long)k, (long long)r, (long long)l);
  c->flops = 4.0 * (double)r * (double)l * (double)(n + k);
  c->m[0] = mat_new(2, n, r, 21, 0.5f);
  c->m[1] = mat_new(2, n, l, 22, 0.5f);
  c->m[2] = mat_new(2, r, k, 23, 0.5f);
  c->m[3] = mat_new(2, l, k, 24, 0.5f);
  CHECK(osft_comm_create_self(c->ctx, NULL, &c->comm));
  CHECK(osft_projector_create(c->ctx, c->comm, NULL, &c->proj));
  osft_projection_target_t t;
  CHECK(OSFT_PROJECTION_TARGET_INIT(&t));
  t.u_high = &c->m[0]->t, t.grad_u_low = &c->m[1]->t;
  t.v_high = &c->m[2]->t, t.grad_v_low = &c->m[3]->t;
  CHECK(osft_projector_add_target(c->proj, &t, NULL));
  CHECK(osft_projector_prepare(c->proj));
  c->call = projection_call, c->done = projection_done;
}

/* SwiGLU tiled MLP, hidden H, intermediate I, M tokens, automatic tiles:
 * forward and backward with grad_x and the three weight gradients. */
static void mlp_call(bench_case *c) {
  CHECK(osft_mlp_forward(c->mlp, &c->m[3]->t, &c->m[4]->t, 0));
  osft_mlp_grads_t g;
  CHECK(OSFT_MLP_GRADS_INIT(&g));
  g.grad_x = &c->m[6]->t;
  g.grad_gate = &c->m[7]->t, g.grad_up = &c->m[8]->t, g.grad_down = &c->m[9]->t;
  CHECK(osft_mlp_backward(c->mlp, &c->m[3]->t, &c->m[5]->t, &g, 0));
}
static void mlp_done(bench_case *c) {
  CHECK(osft_mlp_destroy(c->mlp));
}
static void mlp_setup(bench_case *c, int64_t m, int64_t h, int64_t inter) {
  snprintf(c->shape, sizeof c->shape, "%lldx%lld, %lld tok", (long long)h,
           (long long)inter, (long long)m);
  c->flops = 18.0 * (double)m * (double)h * (double)inter;
  c->m[0] = mat_new(2, inter, h, 31, 0.3f);
  c->m[1] = mat_new(2, inter, h, 32, 0.3f);
  c->m[2] = mat_new(2, h, inter, 33, 0.3f);
  c->m[3] = mat_new(2, m, h, 34, 2.0f);
  c->m[4] = mat_new(2, m, h, 35, 0.0f);
  c->m[5] = mat_new(2, m, h, 36, 2.0f);
  c->m[6] = mat_new(2, m, h, 37, 0.0f);
  c->m[7] = mat_new(2, inter, h, 38, 0.0f);
  c->m[8] = mat_new(2, inter, h, 39, 0.0f);
  c->m[9] = mat_new(2, h, inter, 40, 0.0f);
  osft_mlp_weights_t w;
  CHECK(OSFT_MLP_WEIGHTS_INIT(&w));
  w.gate = &c->m[0]->t, w.up = &c->m[1]->t, w.down = &c->m[2]->t;
  CHECK(osft_mlp_create(c->ctx, OSFT_MLP_SWIGLU, h, inter, &w, NULL, &c->mlp));
  c->call = mlp_call, c->done = mlp_done;
}

/* QR of `count` n x n matrices: Q and R. */
static void qr_call(bench_case *c) {
  CHECK(osft_qr_batch(c->ctx, NULL, (size_t)c->count, c->qa, c->qq, c->qr, c->qst));
}
static void qr_setup(bench_case *c, int64_t count, int64_t n) {
  snprintf(c->shape, sizeof c->shape, "%lld x %lld^2", (long long)count, (long long)n);
  c->flops = 4.0 * (double)count * (double)n * (double)n * (double)n;
  c->count = count;
  /* one big block per role keeps the case's matrices in m[0..2] */
  for (int role = 0; role < 3; ++role) {
    c->m[role] = mat_new(2, count * n, n, 41 + (unsigned)role, 1.0f);
  }
  for (int64_t i = 0; i < count; ++i) {
    static int64_t shapes[64][2];
    shapes[i][0] = n, shapes[i][1] = n;
    DLTensor *t[3];
    for (int role = 0; role < 3; ++role) {
      t[role] = xmalloc(sizeof(DLTensor));
      *t[role] = host_f32_tensor(c->m[role]->data + i * n * n, 2, shapes[i]);
    }
    c->qa[i] = t[0], c->qq[i] = t[1], c->qr[i] = t[2];
  }
  c->call = qr_call, c->done = NULL;
}

/* ------------------------------------------------------------- timing */

/* the clock of the run (clock_ms): wall time, or the process's CPU time */
static int g_cpu_time;

static double time_case(bench_case *c, int reps, double min_ms) {
  c->call(c);
  c->call(c);
  /* calls per repetition: enough for min_ms */
  double t0 = now_ms();
  c->call(c);
  const double one = now_ms() - t0;
  long calls = one >= min_ms ? 1 : (long)(min_ms / (one > 1e-4 ? one : 1e-4)) + 1;
  if (calls > 200000) calls = 200000;
  double *t = xmalloc((size_t)reps * sizeof(double));
  for (int r = 0; r < reps; ++r) {
    t0 = clock_ms(g_cpu_time);
    for (long i = 0; i < calls; ++i) c->call(c);
    t[r] = (clock_ms(g_cpu_time) - t0) / (double)calls;
  }
  qsort(t, (size_t)reps, sizeof(double), cmp_double);
  const double med = t[reps / 2];
  free(t);
  return med;
}

/* Whether `name` is an item of the comma-separated `list`. */
static int in_list(const char *list, const char *name) {
  const size_t n = strlen(name);
  for (const char *p = list; *p;) {
    const char *end = strchr(p, ',');
    const size_t len = end ? (size_t)(end - p) : strlen(p);
    if (len == n && !strncmp(p, name, n)) return 1;
    if (!end) break;
    p = end + 1;
  }
  return 0;
}

int main(int argc, char **argv) {
  int reps = 7, large = 0;
  double min_ms = 20.0;
  const char *only = NULL, *csv_path = NULL, *sizes = NULL;
  for (int i = 1; i < argc; ++i) {
    if (!strcmp(argv[i], "--reps") && i + 1 < argc)
      reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--min-ms") && i + 1 < argc)
      min_ms = atof(argv[++i]);
    else if (!strcmp(argv[i], "--only") && i + 1 < argc)
      only = argv[++i];
    else if (!strcmp(argv[i], "--sizes") && i + 1 < argc)
      sizes = argv[++i];
    else if (!strcmp(argv[i], "--cpu-time"))
      g_cpu_time = 1;
    else if (!strcmp(argv[i], "--large"))
      large = 1;
    else if (!strcmp(argv[i], "--csv") && i + 1 < argc)
      csv_path = argv[++i];
    else {
      fprintf(
          stderr,
          "usage: bench_small_calls [--reps R] [--min-ms T] [--only CAP] [--sizes LIST] "
          "[--large] [--cpu-time] [--csv FILE]\n");
      return 2;
    }
  }
  if (reps < 1) reps = 1;

  osft_context_t ctx;
  CHECK(osft_context_create(&ctx, NULL));
  typedef osft_status_t (*get_threads_fn)(int *);
  typedef osft_status_t (*set_threads_fn)(int);
  get_threads_fn get_threads =
      (get_threads_fn)dlsym(RTLD_DEFAULT, "osft_get_num_threads");
  set_threads_fn set_threads =
      (set_threads_fn)dlsym(RTLD_DEFAULT, "osft_set_num_threads");
  if (g_cpu_time && set_threads) CHECK(set_threads(1));
  int threads = -1;
  if (get_threads) CHECK(get_threads(&threads));
  printf("# bench_small_calls: libosftrt %s; %s\n", osft_version_string(),
         osft_build_info());
  if (threads > 0)
    printf("# library threads: %d (osft_get_num_threads)\n", threads);
  else
    printf("# library threads: (no osft_get_num_threads in this library)\n");
  FILE *la = fopen("/proc/loadavg", "r");
  char load[128] = "?";
  if (la) {
    if (!fgets(load, sizeof load, la)) strcpy(load, "?\n");
    fclose(la);
  }
  printf("# load average at start: %s", load);
  printf("# median of %d repetitions of >= %.0f ms; %s per call\n", reps, min_ms,
         g_cpu_time ? "process CPU time" : "wall time");
  printf("%-10s %-6s %-24s %12s %10s\n", "cap", "size", "shape", "us/call", "GFLOP/s");
  FILE *csv = csv_path ? fopen(csv_path, "w") : NULL;
  if (csv) fprintf(csv, "cap,size,shape,us_per_call,gflops\n");

  /* (capability, size, setup arguments) */
  struct {
    const char *cap, *size;
    int64_t a, b, c, d;
    int large;
  } rows[] = {
      {"flce", "1x1", 1, 1, 1, 0, 0},
      {"flce", "tiny", 16, 300, 6, 0, 0},
      {"flce", "tiny", 64, 300, 6, 0, 0},
      {"flce", "small", 256, 256, 1000, 0, 0},
      {"flce", "small", 16, 768, 50257, 0, 0},
      {"flce", "medium", 256, 768, 50257, 0, 0},
      {"flce", "large", 4096, 768, 50257, 0, 1},
      {"flinear", "1x1", 1, 2, 2, 0, 0},
      {"flinear", "tiny", 16, 64, 64, 0, 0},
      {"flinear", "small", 64, 256, 256, 0, 0},
      {"flinear", "medium", 512, 576, 576, 0, 0},
      {"flinear", "medium", 512, 1536, 576, 0, 0},
      {"flinear", "medium", 512, 576, 1536, 0, 0},
      {"flinear", "medium", 2048, 576, 576, 0, 0},
      {"flinear", "medium", 512, 2048, 2048, 0, 0},
      {"flinear", "large", 2048, 2048, 2048, 0, 1},
      {"projection", "1x1", 2, 2, 1, 1, 0},
      {"projection", "tiny", 64, 64, 32, 32, 0},
      {"projection", "small", 576, 576, 288, 288, 0},
      {"projection", "medium", 2048, 2048, 1024, 1024, 0},
      {"mlp", "1x1", 1, 1, 1, 0, 0},
      {"mlp", "tiny", 16, 64, 172, 0, 0},
      {"mlp", "small", 128, 256, 688, 0, 0},
      {"mlp", "medium", 512, 576, 1536, 0, 0},
      {"qr", "1x1", 1, 1, 0, 0, 0},
      {"qr", "tiny", 16, 8, 0, 0, 0},
      {"qr", "small", 8, 64, 0, 0, 0},
      {"qr", "medium", 4, 256, 0, 0, 0},
      {"qr", "medium", 2, 512, 0, 0, 0},
  };
  for (size_t i = 0; i < sizeof rows / sizeof *rows; ++i) {
    if (only && strcmp(only, rows[i].cap) != 0) continue;
    if (rows[i].large && !large) continue;
    if (sizes && !in_list(sizes, rows[i].size)) continue;
    bench_case c;
    memset(&c, 0, sizeof c);
    c.ctx = ctx;
    c.cap = rows[i].cap, c.size = rows[i].size;
    if (!strcmp(c.cap, "flce")) flce_setup(&c, rows[i].a, rows[i].b, rows[i].c);
    if (!strcmp(c.cap, "flinear")) flinear_setup(&c, rows[i].a, rows[i].b, rows[i].c);
    if (!strcmp(c.cap, "projection"))
      projection_setup(&c, rows[i].a, rows[i].b, rows[i].c, rows[i].d);
    if (!strcmp(c.cap, "mlp")) mlp_setup(&c, rows[i].a, rows[i].b, rows[i].c);
    if (!strcmp(c.cap, "qr")) qr_setup(&c, rows[i].a, rows[i].b);
    const double ms = time_case(&c, reps, min_ms);
    const double gflops = c.flops / (ms * 1e6);
    printf("%-10s %-6s %-24s %12.2f %10.2f\n", c.cap, c.size, c.shape, ms * 1e3, gflops);
    fflush(stdout);
    if (csv)
      fprintf(csv, "%s,%s,\"%s\",%.3f,%.3f\n", c.cap, c.size, c.shape, ms * 1e3, gflops);
    if (c.done) c.done(&c);
    if (!strcmp(c.cap, "qr"))
      for (int64_t j = 0; j < c.count; ++j) {
        free((void *)c.qa[j]);
        free(c.qq[j]);
        free(c.qr[j]);
      }
    free_mats(&c);
  }
  la = fopen("/proc/loadavg", "r");
  if (la) {
    if (!fgets(load, sizeof load, la)) strcpy(load, "?\n");
    fclose(la);
  }
  printf("# load average at end: %s", load);
  if (csv) fclose(csv);
  CHECK(osft_context_destroy(ctx));
  return 0;
}
