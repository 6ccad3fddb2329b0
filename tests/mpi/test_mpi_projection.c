/*
 * Multi-rank OSFT projection over MPI (real processes; run by
 * run_mpi_test.sh with P = 2, 3, 4):
 *   - every layout (U_ROWS, V_ROWS, V_COLS, REPLICATED, mixed in one
 *     projector), even and uneven shards (a rank may hold nothing): each
 *     rank's gradients and parameters equal its slice of the float64
 *     single-rank projection of the full matrices; the orthogonality query
 *     equals the float64 maximum over the full matrices; fp32 and bf16;
 *   - the naive per-rank all-reduce of dV_p V_p^T (row-sharded V) is NOT
 *     orthogonal to V_high, the projector is;
 *   - a host-callback communicator (over MPI) counts one collective per
 *     project call for 1, 7 and 40 targets;
 *   - 200 steps of Adam with post-step projection keep the residual
 *     <= 1e-5 in fp32 (cross-checked on the gathered full matrices);
 *   - registrations that differ between ranks fail on every rank;
 *   - V_high re-gathered only after osft_projector_invalidate();
 *   - the MPI communicator's collectives (fp32, bf16, uneven all-gather).
 * Prints "rank R: PASS <name>" per check; exits 1 on any failure.
 */
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpi_check.h"
#include "osftrt/osftrt.h"
#include "projection_ref.h"

/* ------------------------------------------------------- host tensors */

static uint16_t to_bf16(double v) {
  float f = (float)v;
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

static double from_bf16(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* A compact fp32 or bf16 host matrix with its DLTensor. */
typedef struct {
  DLTensor t;
  int64_t shape[2];
  int bf16;
} hmat;

static hmat *hm_new(int bf16, int64_t rows, int64_t cols, const double *values) {
  hmat *m = calloc(1, sizeof *m);
  m->bf16 = bf16;
  m->shape[0] = rows;
  m->shape[1] = cols;
  m->t.data = calloc((size_t)(rows * cols + 1), bf16 ? 2 : 4);
  m->t.device.device_type = kDLCPU;
  m->t.ndim = 2;
  m->t.dtype.code = bf16 ? kDLBfloat : kDLFloat;
  m->t.dtype.bits = bf16 ? 16 : 32;
  m->t.dtype.lanes = 1;
  m->t.shape = m->shape;
  if (values != NULL)
    for (int64_t i = 0; i < rows * cols; ++i) {
      if (bf16)
        ((uint16_t *)m->t.data)[i] = to_bf16(values[i]);
      else
        ((float *)m->t.data)[i] = (float)values[i];
    }
  return m;
}

static double *hm_get(const hmat *m) {
  const int64_t n = m->shape[0] * m->shape[1];
  double *out = ref_alloc(n);
  for (int64_t i = 0; i < n; ++i)
    out[i] = m->bf16 ? from_bf16(((uint16_t *)m->t.data)[i]) : ((float *)m->t.data)[i];
  return out;
}

static void hm_set(hmat *m, const double *values) {
  for (int64_t i = 0; i < m->shape[0] * m->shape[1]; ++i) {
    if (m->bf16)
      ((uint16_t *)m->t.data)[i] = to_bf16(values[i]);
    else
      ((float *)m->t.data)[i] = (float)values[i];
  }
}

static void hm_free(hmat *m) {
  if (m == NULL) return;
  free(m->t.data);
  free(m);
}

/* ----------------------------------------------------------- sharding */

/* Shard sizes of n over P ranks: balanced (n / P, the first n % P ranks
 * one more) or chunked like torch.chunk (ceil(n / P) each, the last ranks
 * smaller or empty). */
static void split(int64_t n, int scheme, int64_t *sizes) {
  const int P = g_size;
  int64_t left = n;
  for (int q = 0; q < P; ++q) {
    int64_t s = scheme == 0 ? n / P + (q < n % P) : (n + P - 1) / P;
    if (s > left) s = left;
    sizes[q] = s;
    left -= s;
  }
}

static int64_t offset_of(const int64_t *sizes, int q) {
  int64_t off = 0;
  for (int j = 0; j < q; ++j) off += sizes[j];
  return off;
}

/* One target as this rank holds it: the local pieces (tensors), the
 * expected local results, and the shard arrays. */
typedef struct {
  int u_layout, v_layout;
  int64_t n_sh[8], r_sh[8], l_sh[8], k_sh[8];
  hmat *uh, *gu, *ul, *vh, *gv, *vl;
  double *want_gu, *want_gv, *want_ul, *want_vl;
  double max_u, max_v; /* orthogonality of the full (perturbed) factors */
} local_target;

/* Rows/columns of a full matrix (rows x cols) this rank holds for a part
 * sharded by rows (over `rs`) or columns (over `cs`); NULL: all. */
static double *local_piece(const double *full, int64_t rows, int64_t cols,
                           const int64_t *rs, const int64_t *cs) {
  const int64_t r0 = rs ? offset_of(rs, g_rank) : 0, nr = rs ? rs[g_rank] : rows;
  const int64_t c0 = cs ? offset_of(cs, g_rank) : 0, nc = cs ? cs[g_rank] : cols;
  return ref_block(full, cols, r0, nr, c0, nc);
}

static hmat *local_tensor(int bf16, const double *full, int64_t rows, int64_t cols,
                          const int64_t *rs, const int64_t *cs) {
  double *piece = local_piece(full, rows, cols, rs, cs);
  const int64_t nr = rs ? rs[g_rank] : rows, nc = cs ? cs[g_rank] : cols;
  hmat *m = hm_new(bf16, nr, nc, piece);
  free(piece);
  return m;
}

/* Builds this rank's target from the full problem P. The reference runs
 * on the full matrices as every rank stores them (rounded to the dtype). */
static local_target make_local(const ref_problem *P0, int u_layout, int v_layout,
                               int scheme, int bf16) {
  local_target L;
  memset(&L, 0, sizeof L);
  L.u_layout = u_layout;
  L.v_layout = v_layout;
  split(P0->n, scheme, L.n_sh);
  split(P0->r, scheme, L.r_sh);
  split(P0->l, scheme, L.l_sh);
  split(P0->k, scheme, L.k_sh);
  /* The values as stored: round trip through the dtype. */
  ref_problem P = *P0;
  double *arrays[6] = {P.uh, P.ul, P.vh, P.vl, P.gu, P.gv};
  const int64_t sizes[6] = {P.n * P.r, P.n * P.l, P.r * P.k,
                            P.l * P.k, P.n * P.l, P.l * P.k};
  double *stored[6];
  for (int i = 0; i < 6; ++i) {
    hmat *tmp = hm_new(bf16, 1, sizes[i], arrays[i]);
    stored[i] = hm_get(tmp);
    hm_free(tmp);
  }
  const double *uh = stored[0], *ul = stored[1], *vh = stored[2], *vl = stored[3];
  const double *gu = stored[4], *gv = stored[5];
  const int64_t *nrows = u_layout == OSFT_SHARD_U_ROWS ? L.n_sh : NULL;
  L.uh = local_tensor(bf16, uh, P.n, P.r, nrows, NULL);
  L.gu = local_tensor(bf16, gu, P.n, P.l, nrows, NULL);
  L.ul = local_tensor(bf16, ul, P.n, P.l, nrows, NULL);
  const int64_t *vr = v_layout == OSFT_SHARD_V_ROWS ? L.r_sh : NULL;
  const int64_t *lr = v_layout == OSFT_SHARD_V_ROWS ? L.l_sh : NULL;
  const int64_t *kc = v_layout == OSFT_SHARD_V_COLS ? L.k_sh : NULL;
  L.vh = local_tensor(bf16, vh, P.r, P.k, vr, kc);
  L.gv = local_tensor(bf16, gv, P.l, P.k, lr, kc);
  L.vl = local_tensor(bf16, vl, P.l, P.k, lr, kc);
  L.max_u = ref_max_u(uh, P.n, P.r, ul, P.l);
  L.max_v = ref_max_v(vh, P.r, P.k, vl, P.l);
  double *full[4];
  for (int i = 0; i < 4; ++i) full[i] = ref_alloc(sizes[i < 2 ? 4 + i : 2 + i]);
  memcpy(full[0], gu, sizeof(double) * (size_t)(P.n * P.l));
  memcpy(full[1], gv, sizeof(double) * (size_t)(P.l * P.k));
  memcpy(full[2], ul, sizeof(double) * (size_t)(P.n * P.l));
  memcpy(full[3], vl, sizeof(double) * (size_t)(P.l * P.k));
  ref_project_u(uh, P.n, P.r, full[0], P.l);
  ref_project_v(vh, P.r, P.k, full[1], P.l);
  ref_project_u(uh, P.n, P.r, full[2], P.l);
  ref_project_v(vh, P.r, P.k, full[3], P.l);
  L.want_gu = local_piece(full[0], P.n, P.l, nrows, NULL);
  L.want_gv = local_piece(full[1], P.l, P.k, lr, kc);
  L.want_ul = local_piece(full[2], P.n, P.l, nrows, NULL);
  L.want_vl = local_piece(full[3], P.l, P.k, lr, kc);
  for (int i = 0; i < 4; ++i) free(full[i]);
  for (int i = 0; i < 6; ++i) free(stored[i]);
  return L;
}

static osft_projection_target_t target_of(local_target *L) {
  osft_projection_target_t t;
  osft_projection_target_init(&t, sizeof t);
  t.u_high = &L->uh->t;
  t.grad_u_low = &L->gu->t;
  t.u_low = &L->ul->t;
  t.u_layout = (osft_shard_layout_t)L->u_layout;
  if (L->u_layout == OSFT_SHARD_U_ROWS) {
    t.u_shards = L->n_sh;
    t.n_u_shards = g_size;
  }
  t.v_high = &L->vh->t;
  t.grad_v_low = &L->gv->t;
  t.v_low = &L->vl->t;
  t.v_layout = (osft_shard_layout_t)L->v_layout;
  if (L->v_layout != OSFT_SHARD_REPLICATED) {
    t.v_shards = L->v_layout == OSFT_SHARD_V_ROWS ? L->r_sh : L->k_sh;
    t.n_v_shards = g_size;
  }
  return t;
}

static void free_local(local_target *L) {
  hm_free(L->uh), hm_free(L->gu), hm_free(L->ul);
  hm_free(L->vh), hm_free(L->gv), hm_free(L->vl);
  free(L->want_gu), free(L->want_gv), free(L->want_ul), free(L->want_vl);
}

static void expect_close(const char *what, const hmat *m, const double *want,
                         double tol) {
  double *got = hm_get(m);
  const double err = ref_rel_err(got, want, m->shape[0] * m->shape[1], 1e-6);
  CHECK(err <= tol, "%s: relative max error %.3g > %.3g", what, err, tol);
  free(got);
}

static osft_context_t g_ctx;
/* The library's MPI communicators: with a timeout (nonblocking collectives
 * polled against a deadline) and without (MPI's blocking collectives). */
static osft_comm_t g_comm, g_comm_blocking;

/* ------------------------------------------------------------- layouts */

/* Several targets of every layout in ONE projector (so the batched
 * coefficient buffer holds slices of several layouts), both shard schemes,
 * fp32 and bf16. */
static void test_layouts(osft_comm_t comm, const char *suffix) {
  static const int64_t shapes[3][4] = {{37, 29, 7, 5}, {12, 40, 3, 4}, {26, 18, 9, 6}};
  static const int layouts[5][2] = {{OSFT_SHARD_U_ROWS, OSFT_SHARD_V_ROWS},
                                    {OSFT_SHARD_U_ROWS, OSFT_SHARD_V_COLS},
                                    {OSFT_SHARD_REPLICATED, OSFT_SHARD_REPLICATED},
                                    {OSFT_SHARD_REPLICATED, OSFT_SHARD_V_ROWS},
                                    {OSFT_SHARD_U_ROWS, OSFT_SHARD_REPLICATED}};
  for (int bf16 = 0; bf16 < 2; ++bf16)
    for (int scheme = 0; scheme < 2; ++scheme) {
      const int before = g_failures;
      osft_projector_t proj = NULL;
      OK(osft_projector_create(g_ctx, comm, NULL, &proj));
      local_target L[15];
      int count = 0;
      for (int s = 0; s < 3; ++s)
        for (int a = 0; a < 5; ++a) {
          char seed[48];
          snprintf(seed, sizeof seed, "layouts %d %d", s, a);
          ref_problem P = ref_problem_make(seed, shapes[s][0], shapes[s][1], shapes[s][2],
                                           shapes[s][3]);
          ref_problem_perturb(&P, 0.1);
          L[count] = make_local(&P, layouts[a][0], layouts[a][1], scheme, bf16);
          osft_projection_target_t t = target_of(&L[count]);
          int64_t index = -1;
          OK(osft_projector_add_target(proj, &t, &index));
          CHECK(index == count, "index %lld", (long long)index);
          ++count;
          ref_problem_free(&P);
        }
      double mu = -1, mv = -1;
      OK(osft_projector_orthogonality(proj, &mu, &mv));
      double want_u = 0, want_v = 0;
      for (int i = 0; i < count; ++i) {
        want_u = fmax(want_u, L[i].max_u);
        want_v = fmax(want_v, L[i].max_v);
      }
      CHECK(fabs(mu - want_u) <= 1e-2 * want_u && fabs(mv - want_v) <= 1e-2 * want_v,
            "orthogonality %g %g, want %g %g", mu, mv, want_u, want_v);
      OK(osft_projector_project(proj));
      OK(osft_projector_project_params(proj));
      const double tol = bf16 ? 1.5e-2 : 2e-5;
      for (int i = 0; i < count; ++i) {
        char what[64];
        snprintf(what, sizeof what, "target %d (U %d, V %d) grad_u_low", i, L[i].u_layout,
                 L[i].v_layout);
        expect_close(what, L[i].gu, L[i].want_gu, tol);
        expect_close("grad_v_low", L[i].gv, L[i].want_gv, tol);
        expect_close("u_low", L[i].ul, L[i].want_ul, tol);
        expect_close("v_low", L[i].vl, L[i].want_vl, tol);
      }
      OK(osft_projector_orthogonality(proj, &mu, &mv));
      CHECK(mu <= (bf16 ? 5e-2 : 1e-5) && mv <= (bf16 ? 5e-2 : 1e-5),
            "residual after project_params %g %g", mu, mv);
      OK(osft_projector_destroy(proj));
      for (int i = 0; i < count; ++i) free_local(&L[i]);
      char name[64];
      snprintf(name, sizeof name, "layouts-%s-%s-shards%s", bf16 ? "bf16" : "fp32",
               scheme ? "chunked" : "balanced", suffix);
      report(name, before);
    }
}

/* ------------------------------------------------- naive V_ROWS is wrong */

/* dV p-th rows times V_p^T is one block of C_V, not a partial sum:
 * all-reducing it (as for U) leaves dV far from orthogonal to V_high; the
 * projector's gathered V_high gives fp32 round-off. */
static void test_naive_vrows_is_wrong(void) {
  const int before = g_failures;
  const int64_t r = 2 * g_size, l = 3 * g_size, k = 24;
  ref_problem P = ref_problem_make("naive", 8 * g_size, k, r, l);
  local_target L = make_local(&P, OSFT_SHARD_REPLICATED, OSFT_SHARD_V_ROWS, 0, 0);
  const int64_t rq = L.r_sh[g_rank], lq = L.l_sh[g_rank];
  /* naive: C = sum_p dV_p V_p^T (lq x rq, same on every rank), dV_p -= C V_p */
  double *vh = hm_get(L.vh), *gv = hm_get(L.gv), *c = ref_alloc(lq * rq);
  for (int64_t b = 0; b < lq; ++b)
    for (int64_t a = 0; a < rq; ++a)
      for (int64_t j = 0; j < k; ++j) c[b * rq + a] += gv[b * k + j] * vh[a * k + j];
  MPI_Allreduce(MPI_IN_PLACE, c, (int)(lq * rq), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  for (int64_t b = 0; b < lq; ++b)
    for (int64_t j = 0; j < k; ++j)
      for (int64_t a = 0; a < rq; ++a) gv[b * k + j] -= c[b * rq + a] * vh[a * k + j];
  double *naive_full = ref_alloc(l * k);
  MPI_Allgather(gv, (int)(lq * k), MPI_DOUBLE, naive_full, (int)(lq * k), MPI_DOUBLE,
                MPI_COMM_WORLD);
  const double naive = ref_max_v(P.vh, r, k, naive_full, l);
  /* ours */
  osft_projector_t proj = NULL;
  OK(osft_projector_create(g_ctx, g_comm, NULL, &proj));
  osft_projection_target_t t = target_of(&L);
  OK(osft_projector_add_target(proj, &t, NULL));
  OK(osft_projector_project(proj));
  double *ours_local = hm_get(L.gv), *ours_full = ref_alloc(l * k);
  MPI_Allgather(ours_local, (int)(lq * k), MPI_DOUBLE, ours_full, (int)(lq * k),
                MPI_DOUBLE, MPI_COMM_WORLD);
  const double ours = ref_max_v(P.vh, r, k, ours_full, l);
  CHECK(naive > 1e-2, "naive all-reduce residual %g: expected it to be wrong", naive);
  CHECK(ours <= 1e-5, "projector residual %g", ours);
  if (g_rank == 0)
    printf("naive all-reduce of dV_p V_p^T: max |dV V_high^T| = %.3g; projector: %.3g\n",
           naive, ours);
  OK(osft_projector_destroy(proj));
  free(vh), free(gv), free(c), free(naive_full), free(ours_local), free(ours_full);
  free_local(&L);
  ref_problem_free(&P);
  report("naive-vrows-allreduce-is-not-orthogonal", before);
}

/* --------------------------------------------- counted host callbacks */

typedef struct {
  int allreduce, allgather, barrier;
} counts_t;

static MPI_Datatype mpi_type(const DLTensor *t) {
  return t->dtype.bits == 16 ? MPI_UINT16_T : MPI_FLOAT;
}

static osft_status_t cb_allreduce(void *user, DLTensor *buf) {
  ((counts_t *)user)->allreduce++;
  if (buf->dtype.code != kDLFloat) return OSFT_STATUS_NOT_SUPPORTED;
  const int rc = MPI_Allreduce(MPI_IN_PLACE, buf->data, (int)buf->shape[0], MPI_FLOAT,
                               MPI_SUM, MPI_COMM_WORLD);
  return rc == MPI_SUCCESS ? OSFT_STATUS_SUCCESS : OSFT_STATUS_COMM_ERROR;
}

static osft_status_t cb_allgather(void *user, const DLTensor *send, DLTensor *recv,
                                  const int64_t *counts, int64_t n) {
  ((counts_t *)user)->allgather++;
  int c[16], d[16], off = 0;
  for (int q = 0; q < n; ++q) {
    c[q] = (int)counts[q];
    d[q] = off;
    off += c[q];
  }
  const int rc = MPI_Allgatherv(send->data, (int)send->shape[0], mpi_type(send),
                                recv->data, c, d, mpi_type(recv), MPI_COMM_WORLD);
  return rc == MPI_SUCCESS ? OSFT_STATUS_SUCCESS : OSFT_STATUS_COMM_ERROR;
}

static osft_status_t cb_barrier(void *user) {
  ((counts_t *)user)->barrier++;
  return MPI_Barrier(MPI_COMM_WORLD) == MPI_SUCCESS ? OSFT_STATUS_SUCCESS
                                                    : OSFT_STATUS_COMM_ERROR;
}

static void test_one_collective_per_call(void) {
  static const int layouts[4][2] = {{OSFT_SHARD_U_ROWS, OSFT_SHARD_V_ROWS},
                                    {OSFT_SHARD_U_ROWS, OSFT_SHARD_V_COLS},
                                    {OSFT_SHARD_REPLICATED, OSFT_SHARD_V_COLS},
                                    {OSFT_SHARD_REPLICATED, OSFT_SHARD_REPLICATED}};
  const int sizes[3] = {1, 7, 40};
  counts_t n = {0, 0, 0};
  osft_comm_callbacks_t cb;
  osft_comm_callbacks_init(&cb, sizeof cb);
  cb.user = &n;
  cb.rank = g_rank;
  cb.size = g_size;
  cb.allreduce_sum = cb_allreduce;
  cb.allgather = cb_allgather;
  cb.barrier = cb_barrier;
  osft_comm_t comm = NULL;
  OK(osft_comm_create_callbacks(g_ctx, &cb, NULL, &comm));
  for (int c = 0; c < 3; ++c) {
    const int before = g_failures;
    osft_projector_t proj = NULL;
    OK(osft_projector_create(g_ctx, comm, NULL, &proj));
    local_target *L = calloc((size_t)sizes[c], sizeof *L);
    for (int i = 0; i < sizes[c]; ++i) {
      char seed[48];
      snprintf(seed, sizeof seed, "count %d %d", c, i);
      ref_problem P = ref_problem_make(seed, 11 + i % 5, 13 + i % 3, 3 + i % 2, 4);
      L[i] = make_local(&P, layouts[(i + c) % 4][0], layouts[(i + c) % 4][1], i % 2, 0);
      osft_projection_target_t t = target_of(&L[i]);
      OK(osft_projector_add_target(proj, &t, NULL));
      ref_problem_free(&P);
    }
    const counts_t start = n;
    OK(osft_projector_prepare(proj)); /* setup: consistency check, V_high gather */
    const counts_t setup = n;
    for (int step = 0; step < 5; ++step) OK(osft_projector_project(proj));
    osft_projector_info_t info;
    info.struct_size = sizeof info;
    OK(osft_projector_get_info(proj, &info));
    const int expect = info.collectives_per_project == 1 ? 5 : 0;
    CHECK(sizes[c] == 1 || info.collectives_per_project == 1, "collectives per project");
    CHECK(n.allreduce - setup.allreduce == expect && n.allgather == setup.allgather,
          "%d targets: %d all-reduces and %d all-gathers in 5 project calls", sizes[c],
          n.allreduce - setup.allreduce, n.allgather - setup.allgather);
    for (int i = 0; i < sizes[c]; ++i) {
      /* 5 projections of a gradient are one (idempotent). */
      expect_close("callbacks grad_u_low", L[i].gu, L[i].want_gu, 2e-5);
      expect_close("callbacks grad_v_low", L[i].gv, L[i].want_gv, 2e-5);
      free_local(&L[i]);
    }
    free(L);
    OK(osft_projector_destroy(proj));
    if (g_rank == 0)
      printf(
          "callbacks: %d targets: %d all-reduce per project call (setup: %d "
          "all-gathers)\n",
          sizes[c], expect / 5, setup.allgather - start.allgather);
    char name[64];
    snprintf(name, sizeof name, "one-collective-per-project-%d-targets", sizes[c]);
    report(name, before);
  }
  OK(osft_comm_barrier(comm));
  CHECK(n.barrier == 1, "barrier callback");
  OK(osft_comm_destroy(comm));
}

/* ------------------------------------------------------------- Adam */

typedef struct {
  double *m, *v;
  int64_t n;
} adam_state;

static void adam_step(hmat *param, const hmat *grad, adam_state *s, int step) {
  const double lr = 1e-2, b1 = 0.9, b2 = 0.999, eps = 1e-8;
  double *x = hm_get(param), *g = hm_get(grad);
  for (int64_t e = 0; e < s->n; ++e) {
    s->m[e] = b1 * s->m[e] + (1 - b1) * g[e];
    s->v[e] = b2 * s->v[e] + (1 - b2) * g[e] * g[e];
    const double mh = s->m[e] / (1 - pow(b1, step)), vh = s->v[e] / (1 - pow(b2, step));
    x[e] -= lr * mh / (sqrt(vh) + eps);
  }
  hm_set(param, x);
  free(x), free(g);
}

/* The full matrix from every rank's rows (compact, rows x cols). */
static double *gather_rows(const hmat *m, const int64_t *rows, int64_t cols) {
  int c[16], d[16];
  int64_t total = 0;
  for (int q = 0; q < g_size; ++q) {
    c[q] = (int)(rows[q] * cols);
    d[q] = (int)(total * cols);
    total += rows[q];
  }
  double *mine = hm_get(m), *all = ref_alloc(total * cols);
  MPI_Allgatherv(mine, c[g_rank], MPI_DOUBLE, all, c, d, MPI_DOUBLE, MPI_COMM_WORLD);
  free(mine);
  return all;
}

static void test_adam_200_steps(void) {
  const int before = g_failures;
  ref_problem P[2] = {ref_problem_make("adam fsdp", 40, 36, 10, 9),
                      ref_problem_make("adam cols", 30, 44, 8, 7)};
  local_target L[2] = {make_local(&P[0], OSFT_SHARD_U_ROWS, OSFT_SHARD_V_ROWS, 1, 0),
                       make_local(&P[1], OSFT_SHARD_U_ROWS, OSFT_SHARD_V_COLS, 0, 0)};
  osft_projector_t proj = NULL;
  OK(osft_projector_create(g_ctx, g_comm, NULL, &proj));
  adam_state st[2][2];
  for (int i = 0; i < 2; ++i) {
    osft_projection_target_t t = target_of(&L[i]);
    OK(osft_projector_add_target(proj, &t, NULL));
    hmat *params[2] = {L[i].ul, L[i].vl};
    for (int j = 0; j < 2; ++j) {
      st[i][j].n = params[j]->shape[0] * params[j]->shape[1];
      st[i][j].m = ref_alloc(st[i][j].n);
      st[i][j].v = ref_alloc(st[i][j].n);
    }
  }
  char seed[32];
  snprintf(seed, sizeof seed, "adam grads %d", g_rank);
  ref_rng g = ref_seed(seed);
  double worst = 0, unprojected = 0;
  for (int step = 1; step <= 200; ++step) {
    for (int i = 0; i < 2; ++i) {
      hmat *grads[2] = {L[i].gu, L[i].gv};
      for (int j = 0; j < 2; ++j) {
        double *gr = ref_random(&g, st[i][j].n, -1, 1);
        hm_set(grads[j], gr);
        free(gr);
      }
    }
    OK(osft_projector_project(proj));
    for (int i = 0; i < 2; ++i) {
      adam_step(L[i].ul, L[i].gu, &st[i][0], step);
      adam_step(L[i].vl, L[i].gv, &st[i][1], step);
    }
    double mu, mv;
    if (step == 1) {
      OK(osft_projector_orthogonality(proj, &mu, &mv));
      unprojected = fmax(mu, mv);
    }
    OK(osft_projector_project_params(proj));
    if (step % 20 == 0) {
      OK(osft_projector_orthogonality(proj, &mu, &mv));
      worst = fmax(worst, fmax(mu, mv));
    }
  }
  CHECK(worst <= 1e-5, "orthogonality residual reached %g", worst);
  CHECK(unprojected > 1e-4, "Adam without the parameter projection leaks only %g",
        unprojected);
  /* Cross-check on the gathered full U_low (float64). */
  double *ul = gather_rows(L[0].ul, L[0].n_sh, P[0].l);
  double *uh = gather_rows(L[0].uh, L[0].n_sh, P[0].r);
  const double full = ref_max_u(uh, P[0].n, P[0].r, ul, P[0].l);
  CHECK(full <= 1e-5, "gathered |U_high^T U_low| = %g", full);
  if (g_rank == 0)
    printf(
        "adam: residual after one unprojected step %.3g; worst over 200 projected "
        "steps %.3g\n",
        unprojected, worst);
  free(ul), free(uh);
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 2; ++j) free(st[i][j].m), free(st[i][j].v);
    free_local(&L[i]);
    ref_problem_free(&P[i]);
  }
  OK(osft_projector_destroy(proj));
  report("adam-200-steps-residual-below-1e-5", before);
}

/* -------------------------------------------------- consistency check */

static void test_inconsistent_registration(void) {
  const int before = g_failures;
  ref_problem P = ref_problem_make("inconsistent", 10 * g_size, 12, 3, 4);
  local_target A = make_local(&P, OSFT_SHARD_U_ROWS, OSFT_SHARD_V_COLS, 0, 0);
  /* Target 1: rank 1 states other shard sizes for the other ranks (its
   * own entry still matches): locally valid, globally inconsistent. */
  local_target B = make_local(&P, OSFT_SHARD_U_ROWS, OSFT_SHARD_REPLICATED, 0, 0);
  if (g_rank == 1) B.n_sh[0] += 1;
  osft_projector_t proj = NULL;
  OK(osft_projector_create(g_ctx, g_comm, NULL, &proj));
  osft_projection_target_t ta = target_of(&A), tb = target_of(&B);
  OK(osft_projector_add_target(proj, &ta, NULL));
  OK(osft_projector_add_target(proj, &tb, NULL));
  double *before_gu = hm_get(A.gu);
  EXPECT(osft_projector_project(proj), OSFT_STATUS_INVALID_ARGUMENT);
  CHECK(strstr(osft_last_error(), "target 1") != NULL, "message: %s", osft_last_error());
  expect_close("untouched grad_u_low", A.gu, before_gu, 0);
  OK(osft_projector_destroy(proj));
  /* Different target counts. */
  OK(osft_projector_create(g_ctx, g_comm, NULL, &proj));
  OK(osft_projector_add_target(proj, &ta, NULL));
  if (g_rank == 0) {
    osft_projection_target_t tc = target_of(&B);
    tc.u_shards = A.n_sh;
    OK(osft_projector_add_target(proj, &tc, NULL));
  }
  EXPECT(osft_projector_prepare(proj), OSFT_STATUS_INVALID_ARGUMENT);
  CHECK(strstr(osft_last_error(), "registered 2 targets") != NULL ||
            strstr(osft_last_error(), "registered 1 targets") != NULL,
        "message: %s", osft_last_error());
  OK(osft_projector_destroy(proj));
  free(before_gu);
  free_local(&A), free_local(&B);
  ref_problem_free(&P);
  report("inconsistent-registration-fails-on-every-rank", before);
}

/* ----------------------------------------------------- invalidate */

static void test_invalidate_regathers(void) {
  const int before = g_failures;
  ref_problem P = ref_problem_make("invalidate old", 16, 30, 6, 5);
  ref_problem Q = ref_problem_make("invalidate new", 16, 30, 6, 5);
  local_target L = make_local(&P, OSFT_SHARD_REPLICATED, OSFT_SHARD_V_ROWS, 1, 0);
  local_target M = make_local(&Q, OSFT_SHARD_REPLICATED, OSFT_SHARD_V_ROWS, 1, 0);
  osft_projector_t proj = NULL;
  OK(osft_projector_create(g_ctx, g_comm, NULL, &proj));
  osft_projection_target_t t = target_of(&L);
  OK(osft_projector_add_target(proj, &t, NULL));
  OK(osft_projector_project(proj)); /* gathers P's V_high */
  expect_close("first", L.gv, L.want_gv, 2e-5);
  /* New frozen factors in place (a re-decomposition), a fresh gradient
   * (Q's), both parts: without invalidate the cached V_high still rules. */
  double *vh_new = hm_get(M.vh), *gv_new = hm_get(M.gv);
  hm_set(L.vh, vh_new);
  hm_set(L.gv, gv_new);
  /* Q's local rows projected against P's full V_high. */
  double *stale = hm_get(M.gv);
  ref_project_v(P.vh, P.r, P.k, stale, M.gv->shape[0]);
  OK(osft_projector_project(proj));
  expect_close("cached V_high until invalidate", L.gv, stale, 2e-5);
  hm_set(L.gv, gv_new);
  OK(osft_projector_invalidate(proj));
  OK(osft_projector_project(proj));
  expect_close("re-gathered after invalidate", L.gv, M.want_gv, 2e-5);
  OK(osft_projector_destroy(proj));
  free(vh_new), free(gv_new), free(stale);
  free_local(&L), free_local(&M);
  ref_problem_free(&P), ref_problem_free(&Q);
  report("vrows-cache-regathered-only-after-invalidate", before);
}

/* ------------------------------------------------ MPI communicator */

static void test_mpi_collectives(osft_comm_t comm, const char *name) {
  const int before = g_failures;
  int rank = -1, size = -1;
  osft_comm_engine_t engine;
  OK(osft_comm_get_info(comm, &rank, &size, &engine));
  CHECK(rank == g_rank && size == g_size && engine == OSFT_COMM_ENGINE_MPI, "info");
  OK(osft_comm_reset_stats(comm));
  for (int bf16 = 0; bf16 < 2; ++bf16) {
    double vals[5];
    for (int i = 0; i < 5; ++i) vals[i] = (g_rank + 1) * (i + 0.5);
    hmat *buf = hm_new(bf16, 1, 5, vals);
    OK(osft_comm_allreduce_sum(comm, &buf->t));
    double *got = hm_get(buf);
    for (int i = 0; i < 5; ++i) {
      const double want = g_size * (g_size + 1) / 2.0 * (i + 0.5);
      CHECK(fabs(got[i] - want) <= (bf16 ? 8e-3 : 1e-6) * want, "allreduce[%d] %g", i,
            got[i]);
    }
    free(got);
    hm_free(buf);
    /* uneven all-gather: rank q sends q + 1 values q * 10 + i */
    int64_t counts[16], total = 0;
    for (int q = 0; q < g_size; ++q) total += counts[q] = q + 1;
    double mine[16];
    for (int i = 0; i <= g_rank; ++i) mine[i] = g_rank * 10 + i;
    hmat *send = hm_new(bf16, 1, g_rank + 1, mine), *recv = hm_new(bf16, 1, total, NULL);
    OK(osft_comm_allgather(comm, &send->t, &recv->t, counts, g_size));
    double *all = hm_get(recv);
    int64_t at = 0;
    for (int q = 0; q < g_size; ++q)
      for (int i = 0; i <= q; ++i, ++at)
        CHECK(all[at] == q * 10 + i, "allgather[%lld] = %g", (long long)at, all[at]);
    free(all);
    EXPECT(osft_comm_allgather(comm, &send->t, &recv->t, counts, g_size + 1),
           OSFT_STATUS_INVALID_ARGUMENT);
    hm_free(send), hm_free(recv);
  }
  OK(osft_comm_barrier(comm));
  osft_comm_stats_t st;
  st.struct_size = sizeof st;
  OK(osft_comm_get_stats(comm, &st));
  CHECK(st.allreduce_calls == 2 && st.allgather_calls == 2 && st.barrier_calls == 1 &&
            st.allreduce_bytes == 5 * 4 + 5 * 2 && st.failures == 0,
        "stats %llu %llu %llu %llu", (unsigned long long)st.allreduce_calls,
        (unsigned long long)st.allgather_calls, (unsigned long long)st.barrier_calls,
        (unsigned long long)st.allreduce_bytes);
  osft_comm_t bad = NULL;
  EXPECT(osft_comm_create_mpi(g_ctx, 1 << 30, NULL, &bad), OSFT_STATUS_INVALID_ARGUMENT);
  CHECK(bad == NULL, "no handle on failure");
  report(name, before);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  if (g_size > 16) {
    if (g_rank == 0) fprintf(stderr, "at most 16 ranks\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  OK(osft_context_create(&g_ctx, NULL));
  osft_comm_options_t o;
  OK(osft_comm_options_init(&o, sizeof o));
  o.timeout_seconds = 60;
  OK(osft_comm_create_mpi(g_ctx, (int64_t)MPI_Comm_c2f(MPI_COMM_WORLD), &o, &g_comm));
  o.timeout_seconds = INFINITY;
  OK(osft_comm_create_mpi(g_ctx, (int64_t)MPI_Comm_c2f(MPI_COMM_WORLD), &o,
                          &g_comm_blocking));
  test_mpi_collectives(g_comm, "mpi-communicator-collectives");
  test_mpi_collectives(g_comm_blocking, "mpi-communicator-collectives-no-timeout");
  test_layouts(g_comm, "");
  test_layouts(g_comm_blocking, "-no-timeout");
  test_naive_vrows_is_wrong();
  test_one_collective_per_call();
  test_adam_200_steps();
  test_inconsistent_registration();
  test_invalidate_regathers();
  OK(osft_comm_destroy(g_comm));
  OK(osft_comm_destroy(g_comm_blocking));
  OK(osft_context_destroy(g_ctx));
  int all = 0;
  MPI_Allreduce(&g_failures, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (g_rank == 0)
    printf("%s: %d failure(s) over %d ranks\n", all ? "FAILED" : "PASSED", all, g_size);
  MPI_Finalize();
  return all != 0;
}
