/*
 * bench_projection — OSFT gradient projection of all 224 targets of
 * Llama-3.1-8B (7 per layer: q, k, v, o, gate, up, down; 32 layers) across
 * P MPI ranks, side by side in one run with per-target-collective
 * baselines:
 *
 *   batched      libosftrt: one projector, all targets; one all-reduce per
 *                step for every U_ROWS / V_COLS coefficient (fixed slices
 *                of one flat buffer); V_ROWS projects against V_high
 *                gathered once and cached.
 *   per-target   libosftrt, one projector per target: the same GEMMs, one
 *                all-reduce per target (what batching saves).
 *   blas+mpi     the plain framework loop: cblas GEMMs and one
 *                MPI_Allreduce per target and part; for V_ROWS, V_high
 *                all-gathered per target every step (no cache).
 *
 * Layouts: fsdp (U_ROWS + V_ROWS: row-wise FSDP sharding of U and of the
 * r x K matrix V), tp (U_ROWS + V_COLS: both coefficients all-reduced),
 * replicated (no collective). Shapes (N x K = out x in): q, o 4096x4096;
 * k, v 1024x4096; gate, up 14336x4096; down 4096x14336, divided by
 * --scale (default 16 for the CPU), rank ratio 0.5 (r = l = min(N,K)/2).
 *
 * Reported per (layout, method): median time per projection step (max over
 * ranks), collective launches per step, payload bytes per step and rank
 * against the minimum for the layout (sum of the coefficients that must be
 * reduced: r*l*4 per U_ROWS/V_COLS part; 0 per step for V_ROWS), and the
 * ring-algorithm wire bytes. A collective-only section times one all-reduce
 * of all U coefficients against one per target.
 *
 *   mpirun -np P bench_projection [--scale S] [--layers L] [--reps R]
 *                                 [--csv FILE (appended)]
 */
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "osftrt/osftrt.h"

#define MAXP 64
#define SHAPES 7

static int g_rank, g_size;

#undef CHECK /* rank-aware, and aborts the whole job */
#define CHECK(call)                                                                  \
  do {                                                                               \
    osft_status_t st_ = (call);                                                      \
    if (st_ != OSFT_STATUS_SUCCESS) {                                                \
      fprintf(stderr, "rank %d: %s failed: %s\n", g_rank, #call, osft_last_error()); \
      MPI_Abort(MPI_COMM_WORLD, 1);                                                  \
    }                                                                                \
  } while (0)

enum { FSDP, TP, REPL, LAYOUTS };
static const char *const layout_names[LAYOUTS] = {"fsdp", "tp", "replicated"};

static const struct {
  const char *name;
  int n, k;
} shapes[SHAPES] = {{"q", 4096, 4096},    {"k", 1024, 4096},     {"v", 1024, 4096},
                    {"o", 4096, 4096},    {"gate", 14336, 4096}, {"up", 14336, 4096},
                    {"down", 4096, 14336}};

static float *fill(size_t n, unsigned seed) {
  float *p = xmalloc(n * sizeof(float));
  fill_uniform(p, n, seed, 1.0f);
  return p;
}

/* Balanced shard sizes of n over the ranks. */
static void split(int n, int64_t *sizes) {
  for (int q = 0; q < g_size; ++q) sizes[q] = n / g_size + (q < n % g_size);
}

/* One target as this rank holds it under a layout. */
typedef struct {
  int n, k, r, l;     /* global */
  int nl, rl, ll, kl; /* local: rows of U, rows of V_high, of V_low, cols */
  int64_t n_sh[MAXP], r_sh[MAXP], k_sh[MAXP];
  float *uh, *gu, *vh, *gv, *vfull, *cu, *cv;
  int64_t s_uh[2], s_gu[2], s_vh[2], s_gv[2];
  DLTensor t_uh, t_gu, t_vh, t_gv;
} target;

static void make_target(target *t, int n, int k, int layout, unsigned seed) {
  memset(t, 0, sizeof *t);
  t->n = n;
  t->k = k;
  t->r = (n < k ? n : k) / 2;
  t->l = (n < k ? n : k) - t->r;
  int64_t l_sh[MAXP];
  split(n, t->n_sh);
  split(t->r, t->r_sh);
  split(t->l, l_sh);
  split(k, t->k_sh);
  t->nl = layout == REPL ? n : (int)t->n_sh[g_rank];
  t->rl = layout == FSDP ? (int)t->r_sh[g_rank] : t->r;
  t->ll = layout == FSDP ? (int)l_sh[g_rank] : t->l;
  t->kl = layout == TP ? (int)t->k_sh[g_rank] : k;
  t->uh = fill((size_t)t->nl * t->r, seed);
  t->gu = fill((size_t)t->nl * t->l, seed + 1);
  t->vh = fill((size_t)t->rl * t->kl, seed + 2);
  t->gv = fill((size_t)t->ll * t->kl, seed + 3);
  t->vfull = layout == FSDP ? fill((size_t)t->r * k, 0) : NULL;
  t->cu = fill((size_t)t->r * t->l, 0);
  t->cv = fill((size_t)t->l * t->r, 0);
  t->s_uh[0] = t->nl, t->s_uh[1] = t->r;
  t->s_gu[0] = t->nl, t->s_gu[1] = t->l;
  t->s_vh[0] = t->rl, t->s_vh[1] = t->kl;
  t->s_gv[0] = t->ll, t->s_gv[1] = t->kl;
  t->t_uh = host_f32_tensor(t->uh, 2, t->s_uh);
  t->t_gu = host_f32_tensor(t->gu, 2, t->s_gu);
  t->t_vh = host_f32_tensor(t->vh, 2, t->s_vh);
  t->t_gv = host_f32_tensor(t->gv, 2, t->s_gv);
}

static void free_target(target *t) {
  free(t->uh), free(t->gu), free(t->vh), free(t->gv), free(t->vfull), free(t->cu),
      free(t->cv);
}

static osft_projection_target_t describe(target *t, int layout) {
  osft_projection_target_t d;
  CHECK(osft_projection_target_init(&d, sizeof d));
  d.u_high = &t->t_uh;
  d.grad_u_low = &t->t_gu;
  d.v_high = &t->t_vh;
  d.grad_v_low = &t->t_gv;
  if (layout != REPL) {
    d.u_layout = OSFT_SHARD_U_ROWS;
    d.u_shards = t->n_sh;
    d.n_u_shards = g_size;
    d.v_layout = layout == FSDP ? OSFT_SHARD_V_ROWS : OSFT_SHARD_V_COLS;
    d.v_shards = layout == FSDP ? t->r_sh : t->k_sh;
    d.n_v_shards = g_size;
  }
  return d;
}

/* ------------------------------------------------- the plain baseline */

typedef struct {
  long calls;
  double bytes;
} traffic;

static void sgemm(int ta, int tb, int m, int n, int k, const float *a, int lda,
                  const float *b, int ldb, float alpha, float beta, float *c, int ldc) {
  if (m == 0 || n == 0) return;
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans,
              tb ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda, b, ldb, beta, c,
              ldc);
}

static void allreduce(float *buf, int count, traffic *tr) {
  MPI_Allreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  tr->calls++;
  tr->bytes += 4.0 * count;
}

/* One target the way a framework loop does it. */
static void baseline_target(target *t, int layout, traffic *tr) {
  const int r = t->r, l = t->l;
  /* U: C = U_p^T dU_p (r x l), all-reduced when sharded; dU_p -= U_p C. */
  if (t->nl == 0)
    memset(t->cu, 0, sizeof(float) * (size_t)r * l);
  else
    sgemm(1, 0, r, l, t->nl, t->uh, r, t->gu, l, 1, 0, t->cu, l);
  if (layout != REPL) allreduce(t->cu, r * l, tr);
  sgemm(0, 0, t->nl, l, r, t->uh, r, t->cu, l, -1, 1, t->gu, l);
  if (layout == FSDP) {
    /* V_ROWS: gather V_high (every step, no cache), project the own rows. */
    int counts[MAXP], displ[MAXP], off = 0;
    for (int q = 0; q < g_size; ++q) {
      counts[q] = (int)t->r_sh[q] * t->k;
      displ[q] = off;
      off += counts[q];
    }
    MPI_Allgatherv(t->vh, counts[g_rank], MPI_FLOAT, t->vfull, counts, displ, MPI_FLOAT,
                   MPI_COMM_WORLD);
    tr->calls++;
    tr->bytes += 4.0 * counts[g_rank];
    sgemm(0, 1, t->ll, r, t->k, t->gv, t->k, t->vfull, t->k, 1, 0, t->cv, r);
    sgemm(0, 0, t->ll, t->k, r, t->cv, r, t->vfull, t->k, -1, 1, t->gv, t->k);
    return;
  }
  /* V: C = dV_p V_p^T (l x r), all-reduced when column-sharded. */
  sgemm(0, 1, l, r, t->kl, t->gv, t->kl, t->vh, t->kl, 1, 0, t->cv, r);
  if (layout == TP) allreduce(t->cv, l * r, tr);
  sgemm(0, 0, l, t->kl, r, t->cv, r, t->vh, t->kl, -1, 1, t->gv, t->kl);
}

/* ------------------------------------------------------------ timing */

typedef struct {
  int layout, n_targets;
  target *t;
  osft_projector_t batched;
  osft_projector_t *single; /* one per target */
  traffic tr;
} run_state;

typedef void (*step_fn)(run_state *);

static void step_batched(run_state *s) {
  CHECK(osft_projector_project(s->batched));
}

static void step_per_target(run_state *s) {
  for (int i = 0; i < s->n_targets; ++i) CHECK(osft_projector_project(s->single[i]));
}

static void step_baseline(run_state *s) {
  for (int i = 0; i < s->n_targets; ++i) baseline_target(&s->t[i], s->layout, &s->tr);
}

/* One timed step: the slowest rank's time. */
static double timed_ms(step_fn f, run_state *s) {
  MPI_Barrier(MPI_COMM_WORLD);
  const double t0 = now_ms();
  f(s);
  double dt = now_ms() - t0;
  MPI_Allreduce(MPI_IN_PLACE, &dt, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return dt;
}

static double median(double *t, int n) {
  for (int i = 1; i < n; ++i)
    for (int j = i; j > 0 && t[j] < t[j - 1]; --j) {
      const double x = t[j];
      t[j] = t[j - 1];
      t[j - 1] = x;
    }
  return t[n / 2];
}

typedef struct {
  double ms, calls, bytes;
} result;

/* Collective launches and payload bytes of one step, from the
 * communicator's statistics (or the baseline's own count). */
static result traffic_of(step_fn f, run_state *s, osft_comm_t comm) {
  result r;
  osft_comm_stats_t a, b;
  a.struct_size = b.struct_size = sizeof a;
  const traffic before = s->tr;
  CHECK(osft_comm_get_stats(comm, &a));
  f(s);
  CHECK(osft_comm_get_stats(comm, &b));
  r.ms = 0;
  r.calls = (double)(b.allreduce_calls + b.allgather_calls - a.allreduce_calls -
                     a.allgather_calls + (s->tr.calls - before.calls));
  r.bytes = (double)(b.allreduce_bytes + b.allgather_bytes - a.allreduce_bytes -
                     a.allgather_bytes) +
            (s->tr.bytes - before.bytes);
  return r;
}

static FILE *g_csv;
static double g_timeout;

static void emit(const char *layout, const char *method, result r, double base_ms,
                 double min_bytes, double setup_bytes) {
  const double ring = g_size > 1 ? 2.0 * (g_size - 1) / g_size : 0.0;
  if (g_rank != 0) return;
  char ratio[16] = "-";
  if (min_bytes > 0) snprintf(ratio, sizeof ratio, "%.3f", r.bytes / min_bytes);
  printf("%2d  %-10s %-11s %10.2f %8.2fx %9.0f %11.3f %11.3f %8s %11.3f %10.3f\n", g_size,
         layout, method, r.ms, base_ms / r.ms, r.calls, r.bytes / 1e6, min_bytes / 1e6,
         ratio, r.bytes * ring / 1e6, setup_bytes / 1e6);
  if (g_csv)
    fprintf(g_csv, "%d,%s,%s,%.4f,%.4f,%.1f,%.0f,%.0f,%.4f,%.0f,%g\n", g_size, layout,
            method, r.ms, base_ms / r.ms, r.calls, r.bytes, min_bytes,
            min_bytes > 0 ? r.bytes / min_bytes : 0.0, setup_bytes, g_timeout);
}

static void bench_layout(osft_context_t ctx, osft_comm_t comm, int layout, int scale,
                         int layers, int reps) {
  run_state s;
  memset(&s, 0, sizeof s);
  s.layout = layout;
  s.n_targets = layers * SHAPES;
  s.t = calloc((size_t)s.n_targets, sizeof(target));
  s.single = calloc((size_t)s.n_targets, sizeof(osft_projector_t));
  double min_bytes = 0;
  for (int i = 0; i < s.n_targets; ++i) {
    const int sh = i % SHAPES;
    make_target(&s.t[i], shapes[sh].n / scale, shapes[sh].k / scale, layout,
                1234u + 17u * (unsigned)i + 1000u * (unsigned)g_rank);
    const double coef = 4.0 * s.t[i].r * s.t[i].l;
    min_bytes += layout == FSDP ? coef : layout == TP ? 2 * coef : 0;
  }
  CHECK(osft_projector_create(ctx, comm, NULL, &s.batched));
  for (int i = 0; i < s.n_targets; ++i) {
    osft_projection_target_t d = describe(&s.t[i], layout);
    CHECK(osft_projector_add_target(s.batched, &d, NULL));
  }
  osft_comm_stats_t a, b;
  a.struct_size = b.struct_size = sizeof a;
  CHECK(osft_comm_get_stats(comm, &a));
  CHECK(osft_projector_prepare(s.batched));
  CHECK(osft_comm_get_stats(comm, &b));
  const double setup_bytes = (double)(b.allgather_bytes - a.allgather_bytes);
  for (int i = 0; i < s.n_targets; ++i) {
    CHECK(osft_projector_create(ctx, comm, NULL, &s.single[i]));
    osft_projection_target_t d = describe(&s.t[i], layout);
    CHECK(osft_projector_add_target(s.single[i], &d, NULL));
    CHECK(osft_projector_prepare(s.single[i]));
  }
  /* The methods take turns in every round (the order rotates), so that a
   * change in the machine's load hits all of them alike; each one's first
   * step warms up and counts its traffic. */
  const step_fn fns[3] = {step_baseline, step_per_target, step_batched};
  result res[3];
  double ms[3][64];
  for (int m = 0; m < 3; ++m) res[m] = traffic_of(fns[m], &s, comm);
  for (int rep = 0; rep < reps; ++rep)
    for (int k = 0; k < 3; ++k) {
      const int m = (rep + k) % 3;
      ms[m][rep] = timed_ms(fns[m], &s);
    }
  for (int m = 0; m < 3; ++m) res[m].ms = median(ms[m], reps);
  const result base = res[0], single = res[1], batched = res[2];
  CHECK(osft_projector_destroy(s.batched));
  const char *name = layout_names[layout];
  emit(name, "blas+mpi", base, base.ms, min_bytes, 0);
  emit(name, "per-target", single, base.ms, min_bytes, setup_bytes);
  emit(name, "batched", batched, base.ms, min_bytes, setup_bytes);
  for (int i = 0; i < s.n_targets; ++i) {
    CHECK(osft_projector_destroy(s.single[i]));
    free_target(&s.t[i]);
  }
  free(s.t);
  free(s.single);
}

/* The collective alone: every U coefficient block (r x l per target) in
 * one all-reduce through the library's MPI communicator, against one
 * MPI_Allreduce per target. */
static void bench_collectives(osft_comm_t comm, int scale, int layers, int reps) {
  const int n_targets = layers * SHAPES;
  int *sizes = malloc(sizeof(int) * (size_t)n_targets);
  long total = 0;
  for (int i = 0; i < n_targets; ++i) {
    const int n = shapes[i % SHAPES].n / scale, k = shapes[i % SHAPES].k / scale;
    const int kk = n < k ? n : k;
    sizes[i] = (kk / 2) * (kk - kk / 2);
    total += sizes[i];
  }
  float *buf = fill((size_t)total, 7);
  int64_t shape[1] = {total};
  DLTensor t = host_f32_tensor(buf, 1, shape);
  double ms[3][64];
  for (int rep = 0; rep <= reps; ++rep)
    for (int m = 0; m < 3; ++m) {
      MPI_Barrier(MPI_COMM_WORLD);
      const double t0 = now_ms();
      if (m == 0) {
        CHECK(osft_comm_allreduce_sum(comm, &t));
      } else if (m == 1) {
        MPI_Allreduce(MPI_IN_PLACE, buf, (int)total, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      } else {
        long off = 0;
        for (int i = 0; i < n_targets; off += sizes[i++])
          MPI_Allreduce(MPI_IN_PLACE, buf + off, sizes[i], MPI_FLOAT, MPI_SUM,
                        MPI_COMM_WORLD);
      }
      double dt = now_ms() - t0;
      MPI_Allreduce(MPI_IN_PLACE, &dt, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      if (rep > 0) ms[m][rep - 1] = dt; /* rep 0 warms up */
    }
  const char *names[3] = {"1 x osft_comm_allreduce_sum", "1 x MPI_Allreduce",
                          "per-target MPI_Allreduce"};
  const int calls[3] = {1, 1, n_targets};
  for (int m = 0; m < 3; ++m) {
    const double med = median(ms[m], reps);
    if (g_rank == 0)
      printf("%2d  %-30s %5d calls %10.3f ms  %7.2f MB\n", g_size, names[m], calls[m],
             med, 4.0 * total / 1e6);
    if (g_csv && g_rank == 0)
      fprintf(g_csv, "%d,collective,%s,%.4f,,%d,%.0f,%.0f,1,0,%g\n", g_size, names[m],
              med, calls[m], 4.0 * total, 4.0 * total, g_timeout);
  }
  free(buf);
  free(sizes);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  int scale = 16, layers = 32, reps = 9;
  double timeout = 300.0;
  const char *csv_path = NULL;
  for (int i = 1; i < argc; ++i) {
    if (!strcmp(argv[i], "--scale") && i + 1 < argc)
      scale = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--layers") && i + 1 < argc)
      layers = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
      reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--csv") && i + 1 < argc)
      csv_path = argv[++i];
    else if (!strcmp(argv[i], "--timeout") && i + 1 < argc)
      timeout = strtod(argv[++i], NULL); /* "inf": MPI's blocking collectives */
    else {
      if (g_rank == 0)
        fprintf(stderr,
                "usage: %s [--scale S] [--layers L] [--reps R] [--timeout SECONDS|inf] "
                "[--csv FILE]\n",
                argv[0]);
      MPI_Finalize();
      return 2;
    }
  }
  if (reps < 1 || reps > 63) reps = 9;
  if (scale < 1 || layers < 1 || g_size > MAXP) MPI_Abort(MPI_COMM_WORLD, 2);
  if (g_rank == 0 && csv_path) {
    g_csv = fopen(csv_path, "a");
    if (g_csv && ftell(g_csv) == 0)
      fprintf(g_csv,
              "P,layout,method,ms_per_step,speedup_vs_blas_mpi,collectives_per_step,"
              "payload_bytes_per_step,min_bytes_per_step,payload_over_min,"
              "setup_gather_bytes,timeout_s\n");
  }
  osft_context_t ctx;
  osft_comm_t comm;
  CHECK(osft_context_create(&ctx, NULL));
  osft_comm_options_t copts;
  CHECK(osft_comm_options_init(&copts, sizeof copts));
  copts.timeout_seconds = timeout;
  g_timeout = timeout;
  CHECK(osft_comm_create_mpi(ctx, (int64_t)MPI_Comm_c2f(MPI_COMM_WORLD), &copts, &comm));
  if (g_rank == 0) {
    printf(
        "# %s\n# P = %d ranks, %d targets (%d layers x 7), shapes / %d, fp32, rank "
        "ratio 0.5, median of %d steps (max over ranks), MPI timeout %g s\n",
        osft_build_info(), g_size, layers * SHAPES, layers, scale, reps, timeout);
    printf("%2s  %-10s %-11s %10s %9s %9s %11s %11s %8s %11s %10s\n", "P", "layout",
           "method", "ms/step", "vs-blas", "coll/step", "payload MB", "min MB", "pay/min",
           "wire MB(r)", "setup MB");
  }
  for (int layout = 0; layout < LAYOUTS; ++layout)
    bench_layout(ctx, comm, layout, scale, layers, reps);
  if (g_rank == 0)
    printf("# collectives only: all %d U coefficient blocks\n", layers * SHAPES);
  bench_collectives(comm, scale, layers, reps);
  CHECK(osft_comm_destroy(comm));
  CHECK(osft_context_destroy(ctx));
  if (g_csv) fclose(g_csv);
  MPI_Finalize();
  return 0;
}
