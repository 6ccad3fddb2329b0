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
 *                                 [--counts] [--csv FILE (appended)]
 *
 * --counts prints what one batched step did (osft_projector_info_t
 * last_*): GEMMs, GEMM calls (a batched call counts one), element-wise
 * calls, collectives and host waits.
 *
 * --device cuda (one GPU, one rank, no MPI: see bench_cuda_projection
 * below) times the gradient + parameter projection of the same 224 targets
 * at full size (--scale 1), bf16 factors, in each update arithmetic
 * (osft_projection_arithmetic_t), against the same GEMMs issued straight
 * to cuBLAS (the floors), in the same run:
 *
 *   bench_projection --device cuda [--layout fsdp|tp|replicated]
 *                    [--layers L] [--scale S] [--reps R] [--tf32 0|1|both]
 *                    [--arith auto|exact|both] [--csv FILE (written)]
 *
 * A build without MPI (OSFT_BENCH_NO_MPI) runs the CPU mode as one rank.
 */
#ifndef OSFT_BENCH_NO_MPI
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#endif

#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef OSFT_BENCH_CUDA
#include "bench_cuda.h"
#endif
#include "bench_util.h"
#include "osftrt/osftrt.h"

#define MAXP 64
#define SHAPES 7

static int g_rank, g_size = 1;
#ifndef OSFT_BENCH_NO_MPI
static int g_mpi; /* 1 once MPI_Init ran: the CPU mode with MPI */
#endif

/* The MPI calls of the CPU mode; one rank without MPI (a build without it,
 * or --device cuda, which never initializes MPI). */
static void proj_abort(int code) {
#ifndef OSFT_BENCH_NO_MPI
  if (g_mpi) MPI_Abort(MPI_COMM_WORLD, code);
#endif
  exit(code);
}

static void proj_barrier(void) {
#ifndef OSFT_BENCH_NO_MPI
  if (g_mpi) MPI_Barrier(MPI_COMM_WORLD);
#endif
}

/* In place: the maximum (max != 0) or the sum of n values over the ranks. */
static void proj_allreduce(void *buf, int n, int is_double, int max) {
#ifndef OSFT_BENCH_NO_MPI
  if (g_mpi)
    MPI_Allreduce(MPI_IN_PLACE, buf, n, is_double ? MPI_DOUBLE : MPI_FLOAT,
                  max ? MPI_MAX : MPI_SUM, MPI_COMM_WORLD);
#else
  (void)buf, (void)n, (void)is_double, (void)max;
#endif
}

static void proj_allgatherv(const float *send, int count, float *recv, const int *counts,
                            const int *displ) {
#ifndef OSFT_BENCH_NO_MPI
  if (g_mpi) {
    MPI_Allgatherv(send, count, MPI_FLOAT, recv, counts, displ, MPI_FLOAT,
                   MPI_COMM_WORLD);
    return;
  }
#endif
  (void)counts;
  memcpy(recv + displ[0], send, sizeof(float) * (size_t)count);
}

#undef CHECK /* rank-aware, and aborts the whole job */
#define CHECK(call)                                                                  \
  do {                                                                               \
    osft_status_t st_ = (call);                                                      \
    if (st_ != OSFT_STATUS_SUCCESS) {                                                \
      fprintf(stderr, "rank %d: %s failed: %s\n", g_rank, #call, osft_last_error()); \
      proj_abort(1);                                                                 \
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
  proj_allreduce(buf, count, 0, 0);
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
    proj_allgatherv(t->vh, counts[g_rank], t->vfull, counts, displ);
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
  proj_barrier();
  const double t0 = now_ms();
  f(s);
  double dt = now_ms() - t0;
  proj_allreduce(&dt, 1, 1, 1);
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
static int g_counts; /* --counts */

/* What the projector's last call did (osft_projector_info_t last_*). */
static void print_counts(const char *layout, const char *what, osft_projector_t p) {
  osft_projector_info_t info;
  memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  CHECK(osft_projector_get_info(p, &info));
  printf(
      "# counts %s%s: %lld targets; per call %lld GEMMs in %lld GEMM calls, %lld "
      "element-wise calls, %lld collectives, %lld host waits\n",
      layout, what, (long long)info.targets, (long long)info.last_gemms,
      (long long)info.last_gemm_calls, (long long)info.last_elementwise_calls,
      (long long)info.last_collectives, (long long)info.last_host_waits);
}

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
  if (g_counts && g_rank == 0) print_counts(layout_names[layout], "", s.batched);
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
      proj_barrier();
      const double t0 = now_ms();
      if (m == 0) {
        CHECK(osft_comm_allreduce_sum(comm, &t));
      } else if (m == 1) {
        proj_allreduce(buf, (int)total, 0, 0);
      } else {
        long off = 0;
        for (int i = 0; i < n_targets; off += sizes[i++])
          proj_allreduce(buf + off, sizes[i], 0, 0);
      }
      double dt = now_ms() - t0;
      proj_allreduce(&dt, 1, 1, 1);
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

/* ------------------------------------------------------------ CUDA */

#ifdef OSFT_BENCH_CUDA
/* --device cuda: one GPU, one rank, full Llama-3.1-8B shapes (--scale 1),
 * rank ratio 0.5, every factor and gradient bf16 (U_high, dU_low, U_low,
 * V_high, dV_low, V_low of each of the 224 targets: 29.2 GB; a step
 * projects the gradients, osft_projector_project, then the parameters,
 * osft_projector_project_params). One context per TF32 setting (it
 * matters only to fp32 GEMMs, which bf16 factors never run) and update
 * arithmetic, its communicator one-rank NCCL (infinite timeout: the
 * collective stays on the stream) when the library has NCCL, else the self
 * communicator (the output says which). Layout fsdp (default): U_ROWS +
 * V_ROWS, FSDP2's; the U coefficients of all targets go through the one
 * all-reduce per call; tp: U_ROWS + V_COLS, both; replicated: none.
 *
 * Methods (side by side, round-robin):
 *   osft auto    the library, default arithmetic (bf16 factors: C rounded
 *                to bf16, one bf16 GEMM per update): project +
 *                project_params, synchronized
 *   osft exact   the library, OSFT_PROJECTION_ARITHMETIC_EXACT (C split
 *                into two bf16 halves: two update GEMMs)
 *   bf16 floor   the GEMMs of the default arithmetic straight to cuBLAS, one
 *                call per target and part: C = high^T x (bf16 x bf16 ->
 *                bf16), x -= high C (beta 1). These are mini_trainer's
 *                GEMMs too (bench/gpu/peers_projection_torch.py): the least
 *                a bf16 projection costs per target. osft auto / this is its
 *                "own GEMM floor" ratio (issue 34's goal: <= 1.05).
 *   split floor  the exact arithmetic's GEMMs: C (bf16 x bf16 -> fp32),
 *                then acc = -high C_hi + high C_lo (fp32, the second with
 *                beta 1); without the split itself, the add of acc into bf16
 *                x, the collective and launch overhead.
 * Data: uniform random, high factors scaled so that |1 - sigma^2| <= 1 for
 * every singular value of U_high (V_high), so repeated projections never
 * grow (the factors are not orthonormal: timing only). */

#define CU_BLOCK (1u << 25) /* elements of one random block */

static double proj_sqrt(double x) { /* x > 0; the benchmarks link no libm */
  double y = x > 1 ? x : 1;
  for (int i = 0; i < 200 && y * y - x > 1e-15 * x; ++i) y = 0.5 * (y + x / y);
  return y;
}

/* Random bf16 data without a kernel: per magnitude one block of 2^25
 * uniform values, made on the host and uploaded once; a tensor is a
 * device copy of a slice of its block from a pseudo-random offset (every
 * tensor here is smaller than a block, so none repeats within itself). */
typedef struct {
  float scale;
  void *dev;
} cu_block;
static cu_block g_blocks[16];
static int g_nblocks;

static const char *cu_block_for(float scale) {
  for (int i = 0; i < g_nblocks; ++i)
    if (g_blocks[i].scale == scale) return (const char *)g_blocks[i].dev;
  if (g_nblocks == 16) {
    fprintf(stderr, "bench_projection: too many distinct magnitudes\n");
    exit(1);
  }
  float *h = xmalloc(sizeof(float) * CU_BLOCK);
  fill_uniform(h, CU_BLOCK, 4242u + 97u * (unsigned)g_nblocks, scale);
  g_blocks[g_nblocks].scale = scale;
  g_blocks[g_nblocks].dev = upload(h, CU_BLOCK, 1);
  free(h);
  return (const char *)g_blocks[g_nblocks++].dev;
}

static void cu_fill(void *dst, size_t n, float scale, unsigned *seed) {
  const char *block = cu_block_for(scale);
  *seed = *seed * 1664525u + 1013904223u;
  size_t off = (*seed >> 4) % CU_BLOCK;
  char *d = dst;
  while (n > 0) {
    const size_t chunk = n < CU_BLOCK - off ? n : CU_BLOCK - off;
    cuda_check(cudaMemcpy(d, block + 2 * off, 2 * chunk, cudaMemcpyDeviceToDevice),
               "cudaMemcpy (fill)");
    d += 2 * chunk;
    n -= chunk;
    off = 0;
  }
}

typedef struct {
  int n, k, r, l;
  void *uh, *gu, *ul, *vh, *gv, *vl; /* bf16, device */
  int64_t s_uh[2], s_ul[2], s_vh[2], s_vl[2];
  int64_t u_sh[1], v_sh[1];
  DLTensor t_uh, t_gu, t_ul, t_vh, t_gv, t_vl;
} cu_target;

static DLTensor cu_bf16_tensor(void *data, int64_t *shape) {
  DLTensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.device.device_type = kDLCUDA;
  t.ndim = 2;
  t.dtype.code = kDLBfloat;
  t.dtype.bits = 16;
  t.dtype.lanes = 1;
  t.shape = shape;
  return t;
}

static size_t cu_align(size_t bytes) {
  return (bytes + 255) & ~(size_t)255;
}

/* Bytes of one target's six bf16 tensors (each 256-byte aligned). */
static size_t cu_target_bytes(int n, int k) {
  const size_t kk = (size_t)(n < k ? n : k), r = kk / 2, l = kk - r;
  return cu_align(2 * n * r) + 2 * cu_align(2 * n * l) + cu_align(2 * r * k) +
         2 * cu_align(2 * l * k);
}

static void cu_target_make(cu_target *t, int n, int k, char **arena, unsigned *seed) {
  memset(t, 0, sizeof *t);
  t->n = n;
  t->k = k;
  t->r = (n < k ? n : k) / 2;
  t->l = (n < k ? n : k) - t->r;
  const size_t r = (size_t)t->r, l = (size_t)t->l;
  void **slots[6] = {&t->uh, &t->gu, &t->ul, &t->vh, &t->gv, &t->vl};
  const size_t elems[6] = {n * r, n * l, n * l, r * k, l * k, l * k};
  /* |1 - sigma^2| <= 1: sigma_max^2 of an N x r uniform matrix with entry
   * variance c^2 / N is about c^2 (1 + sqrt(r/N))^2 <= 2.9 c^2; c = 0.8. */
  const float su = (float)(0.8 * proj_sqrt(12.0 / n)),
              sv = (float)(0.8 * proj_sqrt(12.0 / k));
  const float scales[6] = {su, 0.05f, 0.05f, sv, 0.05f, 0.05f};
  for (int i = 0; i < 6; ++i) {
    *slots[i] = *arena;
    *arena += cu_align(2 * elems[i]);
    cu_fill(*slots[i], elems[i], scales[i], seed);
  }
  t->s_uh[0] = n, t->s_uh[1] = t->r;
  t->s_ul[0] = n, t->s_ul[1] = t->l;
  t->s_vh[0] = t->r, t->s_vh[1] = k;
  t->s_vl[0] = t->l, t->s_vl[1] = k;
  t->t_uh = cu_bf16_tensor(t->uh, t->s_uh);
  t->t_gu = cu_bf16_tensor(t->gu, t->s_ul);
  t->t_ul = cu_bf16_tensor(t->ul, t->s_ul);
  t->t_vh = cu_bf16_tensor(t->vh, t->s_vh);
  t->t_gv = cu_bf16_tensor(t->gv, t->s_vl);
  t->t_vl = cu_bf16_tensor(t->vl, t->s_vl);
}

static osft_projection_target_t cu_describe(cu_target *t, int layout) {
  osft_projection_target_t d;
  CHECK(OSFT_PROJECTION_TARGET_INIT(&d));
  d.u_high = &t->t_uh;
  d.grad_u_low = &t->t_gu;
  d.u_low = &t->t_ul;
  d.v_high = &t->t_vh;
  d.grad_v_low = &t->t_gv;
  d.v_low = &t->t_vl;
  if (layout != REPL) {
    t->u_sh[0] = t->n;
    d.u_layout = OSFT_SHARD_U_ROWS;
    d.u_shards = t->u_sh;
    d.n_u_shards = 1;
    t->v_sh[0] = layout == FSDP ? t->r : t->k;
    d.v_layout = layout == FSDP ? OSFT_SHARD_V_ROWS : OSFT_SHARD_V_COLS;
    d.v_shards = t->v_sh;
    d.n_v_shards = 1;
  }
  return d;
}

/* Row-major C (m x n) = alpha op(A) op(B) + beta C through cublasGemmEx. */
static void cu_gemm(cublasHandle_t h, int ta, int tb, int m, int n, int k, float alpha,
                    const void *a, cudaDataType at, int lda, const void *b,
                    cudaDataType bt, int ldb, float beta, void *c, cudaDataType ct,
                    int ldc, cublasComputeType_t compute) {
  cublas_check(cublasGemmEx(h, tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                            ta ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha, b, bt, ldb,
                            a, at, lda, &beta, c, ct, ldc, compute, CUBLAS_GEMM_DEFAULT),
               "cublasGemmEx");
}

typedef struct {
  int n_targets, tf32, bf16; /* bf16: mini_trainer's all-bf16 GEMMs */
  cu_target *t;
  cublasHandle_t blas;
  void *coef; /* fp32 (or bf16) r x l */
  void *x32;  /* fp32 stand-in for the update's accumulator */
} cu_floor;

/* One pass (gradients or parameters) of the floor's GEMMs. */
static void cu_floor_pass(cu_floor *f, int params) {
  const cudaDataType B = CUDA_R_16BF, F = CUDA_R_32F;
  const cudaDataType ct = f->bf16 ? B : F;
  const cublasComputeType_t c32 = CUBLAS_COMPUTE_32F;
  for (int i = 0; i < f->n_targets; ++i) {
    const cu_target *t = &f->t[i];
    const int n = t->n, k = t->k, r = t->r, l = t->l;
    void *xu = params ? t->ul : t->gu, *xv = params ? t->vl : t->gv;
    /* U: C = U_high^T x (r x l); x -= U_high C */
    cu_gemm(f->blas, 1, 0, r, l, n, 1.0f, t->uh, B, r, xu, B, l, 0.0f, f->coef, ct, l,
            CUBLAS_COMPUTE_32F);
    if (f->bf16)
      cu_gemm(f->blas, 0, 0, n, l, r, -1.0f, t->uh, B, r, f->coef, B, l, 1.0f, xu, B, l,
              CUBLAS_COMPUTE_32F);
    else /* the library's split update: C's two bf16 halves into fp32 */
      for (int half = 0; half < 2; ++half)
        cu_gemm(f->blas, 0, 0, n, l, r, half ? 1.0f : -1.0f, t->uh, B, r, f->coef, B, l,
                half ? 1.0f : 0.0f, f->x32, F, l, c32);
    /* V: C = x V_high^T (l x r); x -= C V_high */
    cu_gemm(f->blas, 0, 1, l, r, k, 1.0f, xv, B, k, t->vh, B, k, 0.0f, f->coef, ct, r,
            CUBLAS_COMPUTE_32F);
    if (f->bf16)
      cu_gemm(f->blas, 0, 0, l, k, r, -1.0f, f->coef, B, r, t->vh, B, k, 1.0f, xv, B, k,
              CUBLAS_COMPUTE_32F);
    else
      for (int half = 0; half < 2; ++half)
        cu_gemm(f->blas, 0, 0, l, k, r, half ? 1.0f : -1.0f, f->coef, B, r, t->vh, B, k,
                half ? 1.0f : 0.0f, f->x32, F, k, c32);
  }
}

typedef struct {
  const char *name;
  int kind; /* 0 the library, 1 a floor */
  osft_context_t ctx;
  osft_projector_t proj;
  osft_comm_t comm;
  cu_floor *floor;
  int tf32;
  int arith;    /* the library's osft_projection_arithmetic_t */
  int floor_of; /* the library: index of its GEMM floor among the methods */
  double t[64];
} cu_method;

static void cu_step(cu_method *m) {
  if (m->kind == 0) {
    CHECK(osft_projector_project(m->proj));
    CHECK(osft_projector_project_params(m->proj));
    CHECK(osft_context_synchronize(m->ctx));
  } else {
    cu_floor_pass(m->floor, 0);
    cu_floor_pass(m->floor, 1);
    cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }
}

/* A CUDA context (allow_tf32 as given), its communicator and a projector
 * with every target. Returns the communicator's name. */
static const char *cu_library(cu_method *m, cu_target *t, int n_targets, int layout,
                              int tf32, int arith) {
  osft_context_options_t co;
  CHECK(OSFT_CONTEXT_OPTIONS_INIT(&co));
  co.device_type = OSFT_DEVICE_CUDA;
  co.allow_tf32 = tf32;
  CHECK(osft_context_create(&m->ctx, &co));
  osft_comm_options_t copts;
  CHECK(OSFT_COMM_OPTIONS_INIT(&copts));
  copts.timeout_seconds = INFINITY; /* NCCL stays asynchronous on the stream */
  const char *comm_name = "self (one rank; the library has no NCCL)";
  osft_nccl_unique_id_t id;
  osft_status_t st = osft_comm_nccl_unique_id(&id);
  if (st == OSFT_STATUS_SUCCESS)
    st = osft_comm_create_nccl_from_id(m->ctx, &id, 1, 0, &copts, &m->comm);
  if (st == OSFT_STATUS_SUCCESS) {
    comm_name = "nccl (one rank)";
  } else {
    if (st != OSFT_STATUS_NOT_SUPPORTED) {
      fprintf(stderr, "# one-rank NCCL communicator failed (%s: %s); using self\n",
              osft_status_string(st), osft_last_error());
      comm_name = "self (one rank; NCCL failed, see stderr)";
    }
    CHECK(osft_comm_create_self(m->ctx, &copts, &m->comm));
  }
  osft_projector_options_t po;
  CHECK(OSFT_PROJECTOR_OPTIONS_INIT(&po));
  po.arithmetic = arith;
  CHECK(osft_projector_create(m->ctx, m->comm, &po, &m->proj));
  for (int i = 0; i < n_targets; ++i) {
    osft_projection_target_t d = cu_describe(&t[i], layout);
    CHECK(osft_projector_add_target(m->proj, &d, NULL));
  }
  CHECK(osft_projector_prepare(m->proj));
  osft_projector_info_t info;
  memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  CHECK(osft_projector_get_info(m->proj, &info));
  printf(
      "# projector (%s, tf32 %s): %lld targets, %lld coefficients all-reduced per call, "
      "%lld collective(s) per call, %.2f GB coefficients, %.2f GB gathered V_high\n",
      m->name, tf32 ? "on" : "off", (long long)info.targets,
      (long long)info.reduced_elements, (long long)info.collectives_per_project,
      info.coefficient_bytes / 1e9, info.gathered_bytes / 1e9);
  return comm_name;
}

static int cmp_ms(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* 1 if every bf16 value of the device tensor is finite. */
static int cu_finite(const void *dev, size_t n) {
  uint16_t *h = xmalloc(2 * n);
  cuda_check(cudaMemcpy(h, dev, 2 * n, cudaMemcpyDeviceToHost), "cudaMemcpy (check)");
  int ok = 1;
  for (size_t i = 0; i < n && ok; ++i) ok = (h[i] & 0x7f80u) != 0x7f80u;
  free(h);
  return ok;
}

static int bench_cuda_projection(int argc, char **argv) {
  int scale = 1, layers = 32, reps = 5, layout = FSDP, tf32_from = 0, tf32_to = 0;
  int arith_auto = 1, arith_exact = 1;
  const char *csv_path = NULL;
  for (int i = 1; i < argc; ++i) {
    if (!strcmp(argv[i], "--device") && i + 1 < argc)
      ++i;
    else if (!strcmp(argv[i], "--scale") && i + 1 < argc)
      scale = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--layers") && i + 1 < argc)
      layers = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
      reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--csv") && i + 1 < argc)
      csv_path = argv[++i];
    else if (!strcmp(argv[i], "--layout") && i + 1 < argc) {
      ++i;
      layout = !strcmp(argv[i], "tp") ? TP : !strcmp(argv[i], "replicated") ? REPL : FSDP;
    } else if (!strcmp(argv[i], "--tf32") && i + 1 < argc) {
      ++i;
      tf32_from = !strcmp(argv[i], "1");
      tf32_to = strcmp(argv[i], "0") ? 1 : 0;
    } else if (!strcmp(argv[i], "--arith") && i + 1 < argc) {
      ++i;
      arith_auto = strcmp(argv[i], "exact") != 0;
      arith_exact = strcmp(argv[i], "auto") != 0;
    } else if (!strcmp(argv[i], "--counts")) {
      g_counts = 1;
    } else {
      fprintf(stderr,
              "usage: %s --device cuda [--layout fsdp|tp|replicated] [--layers L] "
              "[--scale S] [--reps R] [--tf32 0|1|both] [--arith auto|exact|both] "
              "[--counts] [--csv FILE]\n",
              argv[0]);
      return 2;
    }
  }
  if (reps < 1 || reps > 63) reps = 5;
  if (scale < 1 || layers < 1) return 2;
  const int n_targets = layers * SHAPES;
  size_t bytes = 0, max_rl = 0, max_x = 0;
  double flop = 0;
  for (int i = 0; i < n_targets; ++i) {
    const int n = shapes[i % SHAPES].n / scale, k = shapes[i % SHAPES].k / scale;
    const size_t kk = (size_t)(n < k ? n : k), r = kk / 2, l = kk - r;
    bytes += cu_target_bytes(n, k);
    if (r * l > max_rl) max_rl = r * l;
    if (n * l > max_x) max_x = n * l;
    if (l * k > max_x) max_x = l * k;
    flop += 2.0 * 4.0 * (double)r * (double)l * (double)(n + k); /* 2 passes */
  }
  cuda_check(cudaSetDevice(0), "cudaSetDevice");
  struct cudaDeviceProp prop;
  cuda_check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  printf(
      "# %s\n# %s; %d targets (%d layers x 7: q, k, v, o, gate, up, down), shapes / %d, "
      "bf16 factors and gradients, rank ratio 0.5, layout %s: %.2f GB of tensors\n",
      osft_build_info(), prop.name, n_targets, layers, scale, layout_names[layout],
      bytes / 1e9);
  const double t_setup = now_ms();
  char *arena = NULL, *at;
  cuda_check(cudaMalloc((void **)&arena, bytes), "cudaMalloc (the targets)");
  at = arena;
  cu_target *t = calloc((size_t)n_targets, sizeof *t);
  unsigned seed = 99u;
  for (int i = 0; i < n_targets; ++i)
    cu_target_make(&t[i], shapes[i % SHAPES].n / scale, shapes[i % SHAPES].k / scale, &at,
                   &seed);
  cublasHandle_t blas;
  cublas_check(cublasCreate(&blas), "cublasCreate");
  float *h32 = xmalloc(sizeof(float) * max_x);
  fill_uniform(h32, max_x, 31u, 0.05f);
  /* The floors: [0] the split arithmetic's GEMMs, [1] the bf16 ones. */
  cu_floor floors[2];
  void *coef = NULL, *x32 = upload(h32, max_x, 0);
  free(h32);
  cuda_check(cudaMalloc(&coef, sizeof(float) * max_rl), "cudaMalloc (coefficients)");
  cu_method m[8];
  int nm = 0;
  for (int f = 0; f < 2; ++f) {
    memset(&floors[f], 0, sizeof floors[f]);
    floors[f].n_targets = n_targets, floors[f].t = t, floors[f].blas = blas;
    floors[f].coef = coef, floors[f].x32 = x32, floors[f].bf16 = f;
    memset(&m[nm], 0, sizeof m[nm]);
    m[nm].name = f ? "bf16 floor (mini_trainer's GEMMs)" : "split floor (exact's GEMMs)";
    m[nm].kind = 1;
    m[nm].floor = &floors[f];
    m[nm].tf32 = -1;
    ++nm;
  }
  const char *comm_name = "";
  for (int tf = tf32_from; tf <= tf32_to; ++tf)
    for (int a = 0; a < 2; ++a) {
      if (!(a ? arith_exact : arith_auto)) continue;
      memset(&m[nm], 0, sizeof m[nm]);
      m[nm].name = a ? "osft exact (split C)" : "osft auto (bf16 C)";
      m[nm].tf32 = tf;
      m[nm].arith =
          a ? OSFT_PROJECTION_ARITHMETIC_EXACT : OSFT_PROJECTION_ARITHMETIC_AUTO;
      m[nm].floor_of = a ? 0 : 1;
      comm_name = cu_library(&m[nm], t, n_targets, layout, tf, m[nm].arith);
      ++nm;
    }
  cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  printf(
      "# communicator: %s; setup %.1f s; median of %d steps (gradients + parameters), "
      "methods round-robin after one warm-up step each\n",
      comm_name, (now_ms() - t_setup) / 1e3, reps);
  /* Collectives of one step (the warm-up) from the communicator's counters. */
  double calls[8] = {0}, payload[8] = {0};
  for (int i = 0; i < nm; ++i) {
    osft_comm_stats_t a, b;
    a.struct_size = b.struct_size = sizeof a;
    if (m[i].kind == 0) CHECK(osft_comm_get_stats(m[i].comm, &a));
    cu_step(&m[i]);
    if (m[i].kind == 0) {
      if (g_counts) print_counts(m[i].name, " (parameter pass)", m[i].proj);
      CHECK(osft_comm_get_stats(m[i].comm, &b));
      calls[i] = (double)(b.allreduce_calls + b.allgather_calls - a.allreduce_calls -
                          a.allgather_calls);
      payload[i] = (double)(b.allreduce_bytes + b.allgather_bytes - a.allreduce_bytes -
                            a.allgather_bytes);
    }
  }
  for (int rep = 0; rep < reps; ++rep)
    for (int j = 0; j < nm; ++j) {
      cu_method *x = &m[(rep + j) % nm];
      const double t0 = now_ms();
      cu_step(x);
      x->t[rep] = now_ms() - t0;
    }
  const int finite = cu_finite(t[0].gu, (size_t)t[0].n * t[0].l) &&
                     cu_finite(t[0].vl, (size_t)t[0].l * t[0].k);
  FILE *csv = NULL;
  if (csv_path) {
    csv = fopen(csv_path, "a");
    if (csv && ftell(csv) == 0)
      fprintf(csv,
              "device,gpu,layout,comm,targets,scale,tf32,method,median_ms,min_ms,max_ms,"
              "over_gemm_floor,gemm_tflop_per_step,tflops,collectives_per_step,"
              "allreduce_bytes_per_step\n");
  }
  printf("%-36s %5s %10s %9s %9s %11s %8s %6s %11s\n", "method", "tf32", "median ms",
         "min ms", "max ms", "/gemm floor", "TFLOP/s", "coll", "payload MB");
  for (int i = 0; i < nm; ++i) qsort(m[i].t, (size_t)reps, sizeof(double), cmp_ms);
  for (int i = 0; i < nm; ++i) {
    const double med = m[i].t[reps / 2];
    const double fl = m[i].kind == 0 ? m[m[i].floor_of].t[reps / 2] : 0;
    char tf[8];
    snprintf(tf, sizeof tf, "%s", m[i].tf32 < 0 ? "-" : m[i].tf32 ? "on" : "off");
    printf("%-36s %5s %10.2f %9.2f %9.2f %10.3fx %8.1f %6.0f %11.2f\n", m[i].name, tf,
           med, m[i].t[0], m[i].t[reps - 1], fl > 0 ? med / fl : 0.0, flop / med / 1e9,
           calls[i], payload[i] / 1e6);
    if (csv)
      fprintf(csv, "cuda,%s,%s,%s,%d,%d,%s,%s,%.4f,%.4f,%.4f,%.4f,%.4f,%.2f,%.0f,%.0f\n",
              prop.name, layout_names[layout], comm_name, n_targets, scale, tf, m[i].name,
              med, m[i].t[0], m[i].t[reps - 1], fl > 0 ? med / fl : 0.0, flop / 1e12,
              flop / med / 1e9, calls[i], payload[i]);
  }
  printf(
      "# GEMM work per step: %.2f TFLOP; the first target's projected dU_low and "
      "V_low are %s\n",
      flop / 1e12, finite ? "finite" : "NOT FINITE");
  if (csv) fclose(csv);
  for (int i = 0; i < nm; ++i) {
    if (m[i].kind != 0) continue;
    CHECK(osft_projector_destroy(m[i].proj));
    CHECK(osft_comm_destroy(m[i].comm));
    CHECK(osft_context_destroy(m[i].ctx));
  }
  cublasDestroy(blas);
  cudaFree(coef), cudaFree(x32), cudaFree(arena);
  for (int i = 0; i < g_nblocks; ++i) cudaFree(g_blocks[i].dev);
  free(t);
  return finite ? 0 : 1;
}
#endif

int main(int argc, char **argv) {
  for (int i = 1; i + 1 < argc; ++i)
    if (!strcmp(argv[i], "--device") && strcmp(argv[i + 1], "cpu") != 0) {
#ifdef OSFT_BENCH_CUDA
      if (!strcmp(argv[i + 1], "cuda")) return bench_cuda_projection(argc, argv);
#endif
      fprintf(stderr, "bench_projection: --device %s is not built in (cpu%s)\n",
              argv[i + 1],
#ifdef OSFT_BENCH_CUDA
              ", cuda"
#else
              ""
#endif
      );
      return 2;
    }
#ifndef OSFT_BENCH_NO_MPI
  MPI_Init(&argc, &argv);
  g_mpi = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
#endif
  int scale = 16, layers = 32, reps = 9;
  double timeout = 300.0;
  const char *csv_path = NULL;
  for (int i = 1; i < argc; ++i) {
    if (!strcmp(argv[i], "--device") && i + 1 < argc)
      ++i; /* cpu */
    else if (!strcmp(argv[i], "--scale") && i + 1 < argc)
      scale = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--layers") && i + 1 < argc)
      layers = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
      reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--csv") && i + 1 < argc)
      csv_path = argv[++i];
    else if (!strcmp(argv[i], "--timeout") && i + 1 < argc)
      timeout = strtod(argv[++i], NULL); /* "inf": MPI's blocking collectives */
    else if (!strcmp(argv[i], "--counts"))
      g_counts = 1;
    else {
      if (g_rank == 0)
        fprintf(stderr,
                "usage: %s [--device cpu|cuda] [--scale S] [--layers L] [--reps R] "
                "[--timeout SECONDS|inf] [--counts] [--csv FILE]\n",
                argv[0]);
#ifndef OSFT_BENCH_NO_MPI
      MPI_Finalize();
#endif
      return 2;
    }
  }
  if (reps < 1 || reps > 63) reps = 9;
  if (scale < 1 || layers < 1 || g_size > MAXP) proj_abort(2);
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
#ifndef OSFT_BENCH_NO_MPI
  CHECK(osft_comm_create_mpi(ctx, (int64_t)MPI_Comm_c2f(MPI_COMM_WORLD), &copts, &comm));
#else
  CHECK(osft_comm_create_self(ctx, &copts, &comm));
#endif
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
#ifndef OSFT_BENCH_NO_MPI
  MPI_Finalize();
#endif
  return 0;
}
