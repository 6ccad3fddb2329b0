/*
 * The loss semantics of fused linear cross-entropy under vocab parallelism
 * (issue 17), over real MPI processes (run by run_mpi_test.sh with P = 2
 * and 3): W, bias and class weights sharded unevenly over V = 37 classes,
 * M = 24 tokens, H = 16, fp32. Against a float64 reference of the FULL
 * problem (every rank computes it from the same seed; tests/c/flce_ref.h),
 * from the formulas of osftrt/flce.h:
 *
 *   MEAN: sum_i ce_i / D + sum_i zl_i / N   (D: sum of w_y, N: count, both
 *         global totals over the tokens not ignored); z_loss sum_i zl_i / N
 *   SUM:  sum_i (ce_i + zl_i);  NONE: ce_i + zl_i per token
 *
 *   - every combination of {MEAN, SUM, NONE} x {class weights off, on} x
 *     {label smoothing off, on} x {z-loss off, on} x {softcap off, on} x
 *     {bias off, on} x {ignore_index -100, a real class outside the
 *     first shard}, 1..M/2 tokens ignored: loss, z_loss, token_loss, grad_x and
 *     each rank's slice of grad_W and grad_b at atol 1e-5, rtol 5e-4;
 *   - class weights and z-loss with every target in the first shard (the
 *     other ranks hold no part of D, while N counts every token), with the
 *     targets' class weights all 0 (D = 0, N > 0), and with the class
 *     weights scaled by 8 (MEAN must not move).
 * Prints "rank R: PASS <name>" per check; exits 1 on any failure.
 */
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../c/flce_ref.h"
#include "../c/flce_test_plan.h"
#include "mpi_check.h"
#include "osftrt/osftrt.h"

static osft_context_t g_ctx;
static osft_comm_t g_comm;

enum { M = 24, H = 16, V = 37, REAL_IGNORE = 25 };
static const double kSmoothing = 0.1, kZScale = 0.03, kSoftcap = 3.0;

/* ------------------------------------------------------------ a case */

typedef struct {
  osft_flce_reduction_t red;
  int cw, smooth, zloss, cap, bias;
  int real_ignore;    /* ignore_index REAL_IGNORE, else -100 */
  int n_ignored;      /* tokens ignored */
  int first_shard;    /* every target in the first rank's shard */
  int zero_weight;    /* the targets' classes weigh 0 (D = 0) */
  double cw_scale;    /* class weights times this */
  int upstream;       /* grad_loss 0.7, or per token with NONE */
  int64_t chunk_rows; /* this rank's (the call takes the fewest) */
} sem_case;

static void describe(const sem_case *c, char *buf, size_t size) {
  static const char *red[] = {"mean", "sum", "none"};
  snprintf(buf, size,
           "%s cw=%d smooth=%d z=%d cap=%d bias=%d ignore=%s n_ign=%d first_shard=%d "
           "zero_w=%d cw_scale=%g up=%d",
           red[c->red], c->cw, c->smooth, c->zloss, c->cap, c->bias,
           c->real_ignore ? "class" : "-100", c->n_ignored, c->first_shard,
           c->zero_weight, c->cw_scale, c->upstream);
}

static int64_t ignore_index(const sem_case *c) {
  return c->real_ignore ? REAL_IGNORE : -100;
}

/* Shard sizes of V over the ranks: uneven on purpose. */
static void shards(int64_t *offset, int64_t *rows) {
  static const int64_t two[2] = {17, 20}, three[3] = {12, 11, 14};
  int64_t at = 0;
  for (int q = 0; q < g_size; ++q) {
    const int64_t n = g_size == 2   ? two[q]
                      : g_size == 3 ? three[q]
                                    : V / g_size + (q < V % g_size);
    if (q == g_rank) {
      *offset = at;
      *rows = n;
    }
    at += n;
  }
}

/* The first shard's size (on every rank). */
static int64_t first_shard_rows(void) {
  return g_size == 2 ? 17 : g_size == 3 ? 12 : V / g_size + (0 < V % g_size);
}

/* ------------------------------------------------------------ problem */

/* The same pseudo-random stream on every rank (xorshift64*). */
static uint64_t g_state;
static double uniform(double lo, double hi) {
  g_state ^= g_state >> 12;
  g_state ^= g_state << 25;
  g_state ^= g_state >> 27;
  const uint64_t r = g_state * 2685821657736338717ull;
  return lo + (hi - lo) * (double)(r >> 11) / 9007199254740992.0;
}

typedef struct {
  double x[M * H], w[V * H], b[V], cw[V], gl[M];
  int64_t y[M];
} problem;

/* Values as fp32 stores them; n_ignored tokens at random positions. */
static void make_problem(const sem_case *c, uint64_t seed, problem *p) {
  g_state = seed * 0x9e3779b97f4a7c15ull + 1;
  for (int i = 0; i < M * H; ++i) p->x[i] = (float)uniform(-1, 1);
  for (int i = 0; i < V * H; ++i) p->w[i] = (float)uniform(-1.5, 1.5);
  for (int j = 0; j < V; ++j) {
    p->b[j] = (float)uniform(-1, 1);
    p->cw[j] = (float)(c->cw_scale * uniform(0.1, 3.0));
  }
  for (int i = 0; i < M; ++i) p->gl[i] = (float)uniform(0.5, 1.5);
  int ignored[M] = {0};
  for (int k = 0; k < c->n_ignored;) {
    const int i = (int)uniform(0, M) % M;
    if (!ignored[i]) {
      ignored[i] = 1;
      ++k;
    }
  }
  const int64_t classes = c->first_shard ? first_shard_rows() : V;
  for (int i = 0; i < M; ++i) {
    if (ignored[i]) {
      p->y[i] = ignore_index(c);
      continue;
    }
    int64_t t;
    do t = (int64_t)uniform(0, (double)classes) % classes;
    while (t == REAL_IGNORE);
    p->y[i] = t;
  }
  if (c->zero_weight)
    for (int i = 0; i < M; ++i)
      if (p->y[i] != ignore_index(c)) p->cw[p->y[i]] = 0.0;
}

/* ------------------------------------------------------------ reference */

/* The float64 reference of the FULL problem (flce_ref.h) on this case's
 * switches; the scalar upstream gradient is 0.7, as the call passes it. */
static flce_ref full_reference(const sem_case *c, const problem *p) {
  static const double up = 0.7;
  const double *gl = !c->upstream ? NULL : c->red == OSFT_FLCE_NONE ? p->gl : &up;
  flce_ref_problem q = {M, H, V, p->x, p->w, NULL, NULL, p->y, gl, ignore_index(c)};
  q.bias = c->bias ? p->b : NULL;
  q.class_weight = c->cw ? p->cw : NULL;
  q.label_smoothing = c->smooth ? kSmoothing : 0.0;
  q.z_loss_scale = c->zloss ? kZScale : 0.0;
  q.softcap = c->cap ? kSoftcap : 0.0;
  q.reduction = c->red;
  return flce_ref_compute(&q);
}

/* ------------------------------------------------------------ tensors */

typedef struct {
  DLTensor t;
  int64_t shape[2];
} tensor;

/* A compact fp32 (or int64) tensor of ndim 0..2, poisoned with NaN. */
static void tensor_init(tensor *t, uint8_t code, uint8_t bits, int ndim, int64_t d0,
                        int64_t d1) {
  memset(t, 0, sizeof *t);
  t->shape[0] = d0;
  t->shape[1] = d1;
  t->t.device.device_type = kDLCPU;
  t->t.ndim = ndim;
  t->t.dtype.code = code;
  t->t.dtype.bits = bits;
  t->t.dtype.lanes = 1;
  t->t.shape = t->shape;
  const int64_t n = ndim == 0 ? 1 : ndim == 1 ? d0 : d0 * d1;
  t->t.data = malloc((size_t)n * bits / 8 + 8);
  if (code == kDLFloat)
    for (int64_t i = 0; i < n; ++i) ((float *)t->t.data)[i] = NAN;
}

static void set_f32(tensor *t, const double *v, int64_t n) {
  for (int64_t i = 0; i < n; ++i) ((float *)t->t.data)[i] = (float)v[i];
}

/* |got - ref| <= 1e-5 + 5e-4 |ref| for every element (NaN fails). */
static void expect_allclose(const char *what, const char *name, const tensor *t,
                            const double *ref, int64_t n) {
  const float *got = t->t.data;
  for (int64_t i = 0; i < n; ++i) {
    const double err = fabs(got[i] - ref[i]);
    if (!(err <= 1e-5 + 5e-4 * fabs(ref[i]))) {
      CHECK(0, "%s (%s): element %lld is %.9g, reference %.9g", what, name, (long long)i,
            (double)got[i], ref[i]);
      return;
    }
  }
}

/* ------------------------------------------------------------ one call */

/* Runs one case on this rank's shard and checks every output; the loss,
 * z_loss and grad_x go to keep (if given) for comparisons between calls. */
static void run_case(const sem_case *c, double *keep) {
  char name[256];
  describe(c, name, sizeof name);
  problem *p = malloc(sizeof *p);
  make_problem(c, 1000 + (uint64_t)c->n_ignored * 7 + (uint64_t)c->red, p);
  flce_ref r = full_reference(c, p);
  int64_t off = 0, vp = 0;
  shards(&off, &vp);

  osft_flce_options_t o;
  OK(osft_flce_options_init(&o, sizeof o));
  o.ignore_index = ignore_index(c);
  o.label_smoothing = c->smooth ? kSmoothing : 0.0;
  o.z_loss_scale = c->zloss ? kZScale : 0.0;
  o.softcap = c->cap ? kSoftcap : 0.0;
  o.reduction = c->red;
  o.chunk_rows = c->chunk_rows;
  flce_test_plan_options(&o, vp); /* the vocabulary plan slices this shard */
  o.comm = g_comm;
  o.vocab_offset = off;
  o.vocab_size_global = V;
  osft_flce_t f = NULL;
  OK(osft_flce_create(g_ctx, &o, &f));

  const int per_token = c->red == OSFT_FLCE_NONE;
  tensor x, w, b, cw, y, gl, loss, z, tok, dx, dw, db;
  tensor_init(&x, kDLFloat, 32, 2, M, H);
  set_f32(&x, p->x, M * H);
  tensor_init(&w, kDLFloat, 32, 2, vp, H);
  set_f32(&w, p->w + off * H, vp * H);
  tensor_init(&b, kDLFloat, 32, 1, vp, 0);
  set_f32(&b, p->b + off, vp);
  tensor_init(&cw, kDLFloat, 32, 1, vp, 0);
  set_f32(&cw, p->cw + off, vp);
  tensor_init(&y, kDLInt, 64, 1, M, 0);
  memcpy(y.t.data, p->y, sizeof p->y);
  const double seven = 0.7;
  tensor_init(&gl, kDLFloat, 32, per_token ? 1 : 0, M, 0);
  set_f32(&gl, per_token ? p->gl : &seven, per_token ? M : 1);
  tensor_init(&loss, kDLFloat, 32, per_token ? 1 : 0, M, 0);
  tensor_init(&z, kDLFloat, 32, per_token ? 1 : 0, M, 0);
  tensor_init(&tok, kDLFloat, 32, 1, M, 0);
  tensor_init(&dx, kDLFloat, 32, 2, M, H);
  tensor_init(&dw, kDLFloat, 32, 2, vp, H);
  tensor_init(&db, kDLFloat, 32, 1, vp, 0);

  osft_flce_inputs_t in;
  OK(osft_flce_inputs_init(&in, sizeof in));
  in.x = &x.t;
  in.weight = &w.t;
  in.targets = &y.t;
  in.bias = c->bias ? &b.t : NULL;
  in.class_weight = c->cw ? &cw.t : NULL;
  in.grad_loss = c->upstream ? &gl.t : NULL;
  osft_flce_outputs_t out;
  OK(osft_flce_outputs_init(&out, sizeof out));
  out.loss = &loss.t;
  out.z_loss = &z.t;
  out.token_loss = &tok.t;
  out.grad_x = &dx.t;
  out.grad_weight = &dw.t;
  out.grad_bias = c->bias ? &db.t : NULL;
  osft_flce_plan_t plan;
  plan.struct_size = sizeof plan;
  OK(osft_flce_get_plan(f, &in, &out, &plan));
  CHECK(flce_test_chunking() == OSFT_FLCE_CHUNKING_AUTO ||
            (plan.chunking == flce_test_chunking() && plan.slices > 1),
        "%s: planned chunking %d, %lld slice(s)", name, (int)plan.chunking,
        (long long)plan.slices);
  const osft_status_t st = osft_flce_compute(f, &in, &out);
  CHECK(st == OSFT_STATUS_SUCCESS, "compute (%s): %s: %s", name, osft_status_string(st),
        osft_last_error());
  if (st == OSFT_STATUS_SUCCESS) {
    const int64_t nl = per_token ? M : 1;
    expect_allclose("loss", name, &loss, per_token ? r.tok : &r.loss, nl);
    expect_allclose("z_loss", name, &z, per_token ? r.ztok : &r.z, nl);
    expect_allclose("token_loss", name, &tok, r.tok, M);
    expect_allclose("grad_x", name, &dx, r.dx, M * H);
    expect_allclose("grad_weight slice", name, &dw, r.dw + off * H, vp * H);
    if (c->bias) expect_allclose("grad_bias slice", name, &db, r.db + off, vp);
    if (keep != NULL) {
      keep[0] = ((const float *)loss.t.data)[0];
      keep[1] = ((const float *)z.t.data)[0];
      for (int64_t i = 0; i < M * H; ++i) keep[2 + i] = ((const float *)dx.t.data)[i];
    }
  }
  OK(osft_flce_destroy(f));
  tensor *all[] = {&x, &w, &b, &cw, &y, &gl, &loss, &z, &tok, &dx, &dw, &db};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) free(all[i]->t.data);
  free(p);
  flce_ref_free(&r);
}

static sem_case base_case(osft_flce_reduction_t red) {
  sem_case c;
  memset(&c, 0, sizeof c);
  c.red = red;
  c.cw = c.smooth = c.zloss = c.cap = c.bias = 1;
  c.n_ignored = 4;
  c.cw_scale = 1.0;
  c.chunk_rows = 5 + 2 * g_rank;
  return c;
}

/* ------------------------------------------------------------ the checks */

static int parity(unsigned v) {
  int p = 0;
  for (; v != 0; v >>= 1) p ^= (int)(v & 1u);
  return p;
}

/* All 64 combinations of the six switches under one reduction. */
static void test_grid(osft_flce_reduction_t red, const char *label) {
  const int before = g_failures;
  for (unsigned mask = 0; mask < 64; ++mask) {
    sem_case c = base_case(red);
    c.cw = (mask >> 0) & 1;
    c.smooth = (mask >> 1) & 1;
    c.zloss = (mask >> 2) & 1;
    c.cap = (mask >> 3) & 1;
    c.bias = (mask >> 4) & 1;
    c.real_ignore = (mask >> 5) & 1;
    const unsigned idx = mask + 64u * (unsigned)red;
    c.n_ignored = 1 + (int)(idx % (M / 2));
    c.upstream = parity(mask);
    c.chunk_rows = idx % 3 == 0 ? 0 : 5 + 2 * g_rank;
    run_case(&c, NULL);
  }
  report(label, before);
}

/* With class weights and a z-loss: every target in the first shard (the
 * other ranks add nothing to D, N still counts every token), and the
 * targets' weights all 0 (D = 0: MEAN keeps only the z-loss part). */
static void test_totals_are_global(void) {
  const int before = g_failures;
  for (int red = 0; red < 3; ++red)
    for (int zero = 0; zero < 2; ++zero) {
      sem_case c = base_case((osft_flce_reduction_t)red);
      c.first_shard = 1;
      c.zero_weight = zero;
      c.upstream = zero;
      run_case(&c, NULL);
    }
  report("mean-sum-none-targets-in-one-shard-and-zero-weights", before);
}

/* MEAN does not move when every class weight is scaled (the old rule, the
 * z-loss over D, does). */
static void test_weight_scale_invariance(void) {
  const int before = g_failures;
  double *one = calloc(2 + M * H, sizeof(double)),
         *eight = calloc(2 + M * H, sizeof(double));
  sem_case c = base_case(OSFT_FLCE_MEAN);
  run_case(&c, one);
  c.cw_scale = 8.0;
  run_case(&c, eight);
  double worst = 0.0;
  for (int i = 0; i < 2 + M * H; ++i)
    worst = fmax(worst, fabs(eight[i] - one[i]) / (1e-3 + fabs(one[i])));
  CHECK(worst <= 1e-4, "weights x 8: MEAN moved by %.3g (relative)", worst);
  free(one);
  free(eight);
  report("mean-invariant-under-weight-scale", before);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  if (g_size < 2 || g_size > 3) {
    if (g_rank == 0) fprintf(stderr, "2 or 3 ranks\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  OK(osft_context_create(&g_ctx, NULL));
  osft_comm_options_t o;
  OK(osft_comm_options_init(&o, sizeof o));
  o.timeout_seconds = 60;
  OK(osft_comm_create_mpi(g_ctx, (int64_t)MPI_Comm_c2f(MPI_COMM_WORLD), &o, &g_comm));
  test_grid(OSFT_FLCE_MEAN, "grid-mean");
  test_grid(OSFT_FLCE_SUM, "grid-sum");
  test_grid(OSFT_FLCE_NONE, "grid-none");
  test_totals_are_global();
  test_weight_scale_invariance();
  OK(osft_comm_destroy(g_comm));
  OK(osft_context_destroy(g_ctx));
  int all = 0;
  MPI_Allreduce(&g_failures, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (g_rank == 0)
    printf("%s: %d failure(s) over %d ranks\n", all ? "FAILED" : "PASSED", all, g_size);
  MPI_Finalize();
  return all != 0;
}
