/*
 * Vocab-parallel fused linear cross-entropy over MPI (real processes; run
 * by run_mpi_test.sh with P = 2 and 3): W, bias and class weights sharded
 * unevenly over V = 123 classes, M = 37 tokens, H = 19, fp32, with
 * ignore_index, label smoothing, z-loss, softcap and class weights on:
 *   - MEAN, SUM and NONE (per-token upstream gradients): the loss (and the
 *     per-token losses), z-loss, argmax and accuracy, grad_x and each
 *     rank's slice of grad_W and grad_b equal a float64 plain-loop
 *     reference of the FULL problem that every rank computes from the same
 *     seed;
 *   - chunk sizes that differ between ranks (every rank takes the fewest),
 *     a padded grad_x on rank 0 only, and ACCUMULATE_ALL (rank 0's old
 *     grad_x is the base; the other ranks' old values do not count);
 *   - one all-gather per chunk plus the opening exchange, one all-reduce;
 *   - shards that do not tile [0, V), ranks that disagree on
 *     vocab_size_global or on grad_x, a target >= V: every rank fails with
 *     the same status, naming the field, and writes nothing.
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

/* ------------------------------------------------------------ problem */

enum { M = 37, H = 19, V = 123, IGNORE = -100 };
static const double kSmoothing = 0.1, kZScale = 1e-2, kSoftcap = 15.0;

/* The same pseudo-random stream on every rank (xorshift64*). */
static uint64_t g_state;
static double uniform(double lo, double hi) {
  g_state ^= g_state >> 12;
  g_state ^= g_state << 25;
  g_state ^= g_state >> 27;
  const uint64_t r = g_state * 2685821657736338717ull;
  return lo + (hi - lo) * (double)(r >> 11) / 9007199254740992.0;
}

/* Values as fp32 stores them. */
static void fill(double *v, int64_t n, double lo, double hi) {
  for (int64_t i = 0; i < n; ++i) v[i] = (float)uniform(lo, hi);
}

/* The full problem, the same on every rank. */
typedef struct {
  double x[M * H], w[V * H], b[V], cw[V], gl[M];
  int64_t y[M];
} problem;

static void make_problem(problem *p, uint64_t seed) {
  g_state = seed * 0x9e3779b97f4a7c15ull + 1;
  fill(p->x, M * H, -1, 1);
  fill(p->w, V * H, -1, 1);
  fill(p->b, V, -1, 1);
  fill(p->cw, V, 0.2, 2.0);
  fill(p->gl, M, 0.5, 1.5);
  for (int i = 0; i < M; ++i) {
    int64_t t = (int64_t)uniform(0, V);
    p->y[i] = uniform(0, 1) < 0.2 ? IGNORE : t < V ? t : V - 1;
  }
  p->y[3] = IGNORE; /* at least one of each */
  p->y[4] = V - 1;  /* the last shard's last class */
  p->y[5] = 0;
}

/* The float64 reference of the full problem (flce_ref.h): every option on,
 * the scalar upstream gradient 0.7 as the call passes it. */
static flce_ref full_reference(const problem *p, osft_flce_reduction_t red,
                               int upstream) {
  static const double up = 0.7;
  const double *gl = !upstream ? NULL : red == OSFT_FLCE_NONE ? p->gl : &up;
  const flce_ref_problem q = {M,    H,  V,      p->x,       p->w,    p->b,     p->cw,
                              p->y, gl, IGNORE, kSmoothing, kZScale, kSoftcap, red};
  return flce_ref_compute(&q);
}

/* ------------------------------------------------------------ tensors */

typedef struct {
  DLTensor t;
  int64_t shape[2], strides[2];
} tensor;

static void *tensor_init(tensor *t, uint8_t code, uint8_t bits, int ndim, int64_t rows,
                         int64_t cols, int64_t ld) {
  memset(t, 0, sizeof *t);
  t->shape[0] = rows;
  t->shape[1] = cols;
  t->strides[0] = ld;
  t->strides[1] = 1;
  t->t.device.device_type = kDLCPU;
  t->t.ndim = ndim;
  t->t.dtype.code = code;
  t->t.dtype.bits = bits;
  t->t.dtype.lanes = 1;
  t->t.shape = t->shape;
  if (ndim == 2 && ld != cols) t->t.strides = t->strides;
  const int64_t n = ndim == 0 ? 1 : ndim == 1 ? rows : rows * ld;
  t->t.data = calloc((size_t)n + 1, bits / 8);
  return t->t.data;
}

/* fp32 from doubles (n of them, rows of `cols` at stride ld). */
static void set_f32(tensor *t, const double *v, int64_t rows, int64_t cols, int64_t ld) {
  float *d = t->t.data;
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) d[i * ld + j] = (float)v[i * cols + j];
}

/* Shard sizes of V over the ranks: uneven on purpose. */
static void shards(int64_t *offset, int64_t *rows) {
  static const int64_t two[2] = {50, 73}, three[3] = {41, 40, 42};
  int64_t at = 0;
  for (int q = 0; q < g_size; ++q) {
    int64_t n = g_size == 2   ? two[q]
                : g_size == 3 ? three[q]
                              : V / g_size + (q < V % g_size);
    if (q == g_rank) {
      *offset = at;
      *rows = n;
    }
    at += n;
  }
}

/* max |got - ref| / max(max |ref|, 1e-6) */
static double rel_err(const double *got, const double *ref, int64_t n) {
  double num = 0, den = 1e-6;
  for (int64_t i = 0; i < n; ++i) {
    num = fmax(num, fabs(got[i] - ref[i]));
    den = fmax(den, fabs(ref[i]));
  }
  return num / den;
}

static void expect_close(const char *what, const char *name, const double *got,
                         const double *ref, int64_t n, double tol) {
  const double e = rel_err(got, ref, n);
  CHECK(e <= tol, "%s (%s): relative error %.3g > %.3g", what, name, e, tol);
}

static double *get_f32(const tensor *t, int64_t rows, int64_t cols, int64_t ld) {
  double *v = calloc((size_t)(rows * cols) + 1, sizeof(double));
  const float *d = t->t.data;
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) v[i * cols + j] = d[i * ld + j];
  return v;
}

/* ------------------------------------------------------- one variant */

typedef struct {
  const char *name;
  osft_flce_reduction_t reduction;
  int upstream;      /* grad_loss: 0.7, or per token with NONE */
  int chunk_by_rank; /* chunk_rows 5 + 3 * rank (else one chunk) */
  int padded_dx;     /* rank 0's grad_x has row padding */
  uint32_t accumulate;
  int mixed_plans; /* rank 0 token chunks, the others vocabulary slices */
} variant;

/* Everything one call passes, on this rank. */
typedef struct {
  int64_t off, vp, ld;
  tensor x, w, b, cw, y, gl;
  tensor loss, z, acc, amax, tok, dx, dw, db;
  osft_flce_inputs_t in;
  osft_flce_outputs_t out;
} call;

static void call_init(call *c, const problem *p, const variant *v) {
  memset(c, 0, sizeof *c);
  shards(&c->off, &c->vp);
  const int per_token = v->reduction == OSFT_FLCE_NONE;
  c->ld = v->padded_dx && g_rank == 0 ? H + 5 : H;
  tensor_init(&c->x, kDLFloat, 32, 2, M, H, H);
  set_f32(&c->x, p->x, M, H, H);
  tensor_init(&c->w, kDLFloat, 32, 2, c->vp, H, H);
  set_f32(&c->w, p->w + c->off * H, c->vp, H, H);
  tensor_init(&c->b, kDLFloat, 32, 1, c->vp, 1, 1);
  set_f32(&c->b, p->b + c->off, 1, c->vp, c->vp);
  tensor_init(&c->cw, kDLFloat, 32, 1, c->vp, 1, 1);
  set_f32(&c->cw, p->cw + c->off, 1, c->vp, c->vp);
  int64_t *y = tensor_init(&c->y, kDLInt, 64, 1, M, 1, 1);
  memcpy(y, p->y, sizeof p->y);
  if (v->upstream) {
    tensor_init(&c->gl, kDLFloat, 32, per_token ? 1 : 0, M, 1, 1);
    const double up = 0.7;
    set_f32(&c->gl, per_token ? p->gl : &up, 1, per_token ? M : 1, M);
  }
  tensor_init(&c->loss, kDLFloat, 32, per_token ? 1 : 0, M, 1, 1);
  tensor_init(&c->z, kDLFloat, 32, per_token ? 1 : 0, M, 1, 1);
  tensor_init(&c->acc, kDLFloat, 32, 1, 1, 1, 1);
  tensor_init(&c->amax, kDLInt, 64, 1, M, 1, 1);
  tensor_init(&c->tok, kDLFloat, 32, 1, M, 1, 1);
  tensor_init(&c->dx, kDLFloat, 32, 2, M, H, c->ld);
  tensor_init(&c->dw, kDLFloat, 32, 2, c->vp, H, H);
  tensor_init(&c->db, kDLFloat, 32, 1, c->vp, 1, 1);
  /* poison: NaN everywhere an output is written */
  tensor *outs[8] = {&c->loss, &c->z, &c->acc, &c->tok, &c->dx, &c->dw, &c->db, NULL};
  for (int i = 0; outs[i] != NULL; ++i) {
    const int64_t n = outs[i]->t.ndim == 0   ? 1
                      : outs[i]->t.ndim == 1 ? outs[i]->shape[0]
                                             : outs[i]->shape[0] * outs[i]->strides[0];
    for (int64_t k = 0; k < n; ++k) ((float *)outs[i]->t.data)[k] = NAN;
  }
  memset(c->amax.t.data, 0xff, sizeof(int64_t) * M);
  OK(osft_flce_inputs_init(&c->in, sizeof c->in));
  OK(osft_flce_outputs_init(&c->out, sizeof c->out));
  c->in.x = &c->x.t;
  c->in.weight = &c->w.t;
  c->in.bias = &c->b.t;
  c->in.class_weight = &c->cw.t;
  c->in.targets = &c->y.t;
  c->in.grad_loss = v->upstream ? &c->gl.t : NULL;
  c->out.loss = &c->loss.t;
  c->out.z_loss = &c->z.t;
  c->out.accuracy = &c->acc.t;
  c->out.argmax = &c->amax.t;
  c->out.token_loss = &c->tok.t;
  c->out.grad_x = &c->dx.t;
  c->out.grad_weight = &c->dw.t;
  c->out.grad_bias = &c->db.t;
  c->out.accumulate = v->accumulate;
}

static void call_free(call *c) {
  tensor *all[14] = {&c->x, &c->w,   &c->b,    &c->cw,  &c->y,  &c->gl, &c->loss,
                     &c->z, &c->acc, &c->amax, &c->tok, &c->dx, &c->dw, &c->db};
  for (int i = 0; i < 14; ++i) free(all[i]->t.data);
}

static osft_flce_t make_flce(const variant *v, int64_t off, int64_t global) {
  osft_flce_options_t o;
  OK(osft_flce_options_init(&o, sizeof o));
  o.ignore_index = IGNORE;
  o.label_smoothing = kSmoothing;
  o.z_loss_scale = kZScale;
  o.softcap = kSoftcap;
  o.reduction = v->reduction;
  o.chunk_rows = v->chunk_by_rank ? 5 + 3 * g_rank : 0;
  int64_t shard_off = 0, shard_rows = 0;
  shards(&shard_off, &shard_rows);
  flce_test_plan_options(&o, shard_rows); /* the vocabulary plan slices its shard */
  if (v->mixed_plans) {
    o.chunking = g_rank == 0 ? OSFT_FLCE_CHUNKING_TOKENS : OSFT_FLCE_CHUNKING_VOCAB;
    o.slice_cols = g_rank == 0 ? 0 : (shard_rows + 2) / 3;
  }
  o.comm = g_comm;
  o.vocab_offset = off;
  o.vocab_size_global = global;
  osft_flce_t f = NULL;
  OK(osft_flce_create(g_ctx, &o, &f));
  return f;
}

/* The argmax is a class with the largest reference logit (a near tie may
 * pick either), the accuracy agrees with it. */
static void check_argmax(const call *c, const problem *p, const flce_ref *r,
                         const char *name) {
  const int64_t *am = c->amax.t.data;
  int64_t correct = 0, valid = 0;
  for (int i = 0; i < M; ++i) {
    const double *z = r->logit + i * V;
    double mx = -INFINITY;
    for (int j = 0; j < V; ++j) mx = fmax(mx, z[j]);
    CHECK(am[i] >= 0 && am[i] < V && z[am[i]] >= mx - 1e-4 * (1 + fabs(mx)),
          "argmax (%s): token %d got %lld", name, i, (long long)am[i]);
    if (p->y[i] != IGNORE) {
      valid++;
      correct += am[i] == p->y[i];
    }
  }
  const double want = (double)correct / (double)valid;
  const double got = *(const float *)c->acc.t.data;
  CHECK(fabs(got - want) <= 1e-6, "accuracy (%s): %g, expected %g", name, got, want);
}

static void run_variant(const variant *v) {
  const int before = g_failures;
  problem *p = malloc(sizeof *p);
  make_problem(p, 7);
  flce_ref ref = full_reference(p, v->reduction, v->upstream);
  const flce_ref *r = &ref;
  call c;
  call_init(&c, p, v);
  /* accumulated gradients start from values; grad_x's from rank 0 only
   * count, so the other ranks start from different ones */
  double *dx0 = calloc(M * H, sizeof(double)), *dw0 = calloc(V * H, sizeof(double));
  double *db0 = calloc(V, sizeof(double));
  g_state = 99;
  fill(dx0, M * H, -1, 1);
  fill(dw0, V * H, -1, 1);
  fill(db0, V, -1, 1);
  if (v->accumulate) {
    double *mine = calloc(M * H, sizeof(double));
    for (int64_t i = 0; i < M * H; ++i) mine[i] = g_rank == 0 ? dx0[i] : 100.0 + g_rank;
    set_f32(&c.dx, mine, M, H, c.ld);
    set_f32(&c.dw, dw0 + c.off * H, c.vp, H, H);
    set_f32(&c.db, db0 + c.off, 1, c.vp, c.vp);
    free(mine);
  } else {
    memset(dx0, 0, sizeof(double) * M * H);
    memset(dw0, 0, sizeof(double) * V * H);
    memset(db0, 0, sizeof(double) * V);
  }
  osft_flce_t f = make_flce(v, c.off, V);
  osft_flce_plan_t plan;
  plan.struct_size = sizeof plan;
  OK(osft_flce_get_plan(f, &c.in, &c.out, &plan));
  const osft_flce_chunking_t want = !v->mixed_plans ? flce_test_chunking()
                                    : g_rank == 0   ? OSFT_FLCE_CHUNKING_TOKENS
                                                    : OSFT_FLCE_CHUNKING_VOCAB;
  CHECK(want == OSFT_FLCE_CHUNKING_AUTO || plan.chunking == want,
        "%s: planned chunking %d", v->name, (int)plan.chunking);
  osft_comm_stats_t s0, s1;
  s0.struct_size = s1.struct_size = sizeof s0;
  OK(osft_comm_get_stats(g_comm, &s0));
  OK(osft_flce_compute(f, &c.in, &c.out));
  OK(osft_comm_get_stats(g_comm, &s1));
  /* the fewest rows per chunk over the ranks */
  const int64_t rows = v->chunk_by_rank ? 5 : M, chunks = (M + rows - 1) / rows;
  CHECK(s1.allgather_calls - s0.allgather_calls == (uint64_t)(1 + chunks),
        "%s: %llu all-gathers, expected %lld", v->name,
        (unsigned long long)(s1.allgather_calls - s0.allgather_calls),
        (long long)(1 + chunks));
  const uint64_t reduces = v->padded_dx ? M : 1;
  CHECK(s1.allreduce_calls - s0.allreduce_calls == reduces,
        "%s: %llu all-reduces, expected %llu", v->name,
        (unsigned long long)(s1.allreduce_calls - s0.allreduce_calls),
        (unsigned long long)reduces);

  const double tol = 1e-5, gtol = 2e-5;
  const int per_token = v->reduction == OSFT_FLCE_NONE;
  double *got = get_f32(&c.loss, 1, per_token ? M : 1, 1);
  expect_close("loss", v->name, got, per_token ? r->tok : &r->loss, per_token ? M : 1,
               tol);
  free(got);
  got = get_f32(&c.z, 1, per_token ? M : 1, 1);
  expect_close("z_loss", v->name, got, per_token ? r->ztok : &r->z, per_token ? M : 1,
               tol);
  free(got);
  got = get_f32(&c.tok, 1, M, M);
  expect_close("token_loss", v->name, got, r->tok, M, tol);
  free(got);
  check_argmax(&c, p, r, v->name);
  for (int64_t i = 0; i < M * H; ++i) dx0[i] += r->dx[i];
  for (int64_t i = 0; i < V * H; ++i) dw0[i] += r->dw[i];
  for (int64_t i = 0; i < V; ++i) db0[i] += r->db[i];
  got = get_f32(&c.dx, M, H, c.ld);
  expect_close("grad_x", v->name, got, dx0, M * H, gtol);
  free(got);
  got = get_f32(&c.dw, c.vp, H, H);
  expect_close("grad_weight slice", v->name, got, dw0 + c.off * H, c.vp * H, gtol);
  free(got);
  got = get_f32(&c.db, 1, c.vp, c.vp);
  expect_close("grad_bias slice", v->name, got, db0 + c.off, c.vp, gtol);
  free(got);
  if (c.ld != H) {
    const float *d = c.dx.t.data;
    for (int64_t i = 0; i + 1 < M; ++i)
      CHECK(isnan(d[i * c.ld + H]), "%s: grad_x padding written", v->name);
  }
  OK(osft_flce_destroy(f));
  call_free(&c);
  free(dx0);
  free(dw0);
  free(db0);
  free(p);
  flce_ref_free(&ref);
  report(v->name, before);
}

/* ------------------------------------------------------------- errors */

/* The outputs' bytes, to see that a failed call wrote nothing. */
static size_t out_bytes(const call *c, unsigned char *buf) {
  const tensor *outs[8] = {&c->loss, &c->z,  &c->acc, &c->amax,
                           &c->tok,  &c->dx, &c->dw,  &c->db};
  size_t at = 0;
  for (int i = 0; i < 8; ++i) {
    const DLTensor *t = &outs[i]->t;
    const int64_t n = t->ndim == 0   ? 1
                      : t->ndim == 1 ? t->shape[0]
                                     : t->shape[0] * outs[i]->strides[0];
    const size_t bytes = (size_t)n * t->dtype.bits / 8;
    if (buf != NULL) memcpy(buf + at, t->data, bytes);
    at += bytes;
  }
  return at;
}

/* One bad call: every rank gets `status` naming `needle`, nothing written. */
static void expect_fail(osft_flce_t f, call *c, osft_status_t status, const char *needle,
                        const char *what) {
  const size_t n = out_bytes(c, NULL);
  unsigned char *before = malloc(n), *after = malloc(n);
  out_bytes(c, before);
  EXPECT(osft_flce_compute(f, &c->in, &c->out), status);
  CHECK(strstr(osft_last_error(), needle) != NULL, "%s: message '%s' lacks '%s'", what,
        osft_last_error(), needle);
  out_bytes(c, after);
  CHECK(memcmp(before, after, n) == 0, "%s: the failed call wrote an output", what);
  free(before);
  free(after);
}

static void test_errors(void) {
  const int before = g_failures;
  problem *p = malloc(sizeof *p);
  make_problem(p, 11);
  const variant v = {"errors", OSFT_FLCE_MEAN, 0, 0, 0, 0};
  call c;
  call_init(&c, p, &v);

  /* shards that overlap: the last rank starts one class early */
  osft_flce_t f = make_flce(&v, c.off - (g_rank == g_size - 1), V);
  expect_fail(f, &c, OSFT_STATUS_SHAPE_MISMATCH, "in->weight", "overlapping shards");
  OK(osft_flce_destroy(f));
  /* a gap, rows that add up: the last rank's shard shifted past V */
  f = make_flce(&v, c.off + (g_rank == g_size - 1), V);
  expect_fail(f, &c, OSFT_STATUS_SHAPE_MISMATCH, "in->weight", "shard past V");
  OK(osft_flce_destroy(f));
  /* ranks that disagree on V */
  f = make_flce(&v, c.off, V + (g_rank == 1));
  expect_fail(f, &c, OSFT_STATUS_SHAPE_MISMATCH, "vocab_size_global", "disagreeing V");
  OK(osft_flce_destroy(f));
  /* grad_x on rank 0 only */
  f = make_flce(&v, c.off, V);
  DLTensor *dx = c.out.grad_x;
  if (g_rank != 0) c.out.grad_x = NULL;
  expect_fail(f, &c, OSFT_STATUS_INVALID_ARGUMENT, "out->grad_x", "grad_x on one rank");
  c.out.grad_x = dx;
  /* a target >= V (a class of no shard) */
  ((int64_t *)c.y.t.data)[9] = V;
  expect_fail(f, &c, OSFT_STATUS_INDEX_OUT_OF_RANGE, "token 9", "target >= V");
  ((int64_t *)c.y.t.data)[9] = 2;
  /* the communicator still works: the same handle succeeds */
  OK(osft_flce_compute(f, &c.in, &c.out));
  OK(osft_flce_destroy(f));
  call_free(&c);
  free(p);
  report("errors-fail-on-every-rank", before);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  if (g_size < 2 || g_size > V) {
    if (g_rank == 0) fprintf(stderr, "2 to %d ranks\n", V);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  OK(osft_context_create(&g_ctx, NULL));
  osft_comm_options_t o;
  OK(osft_comm_options_init(&o, sizeof o));
  o.timeout_seconds = 60;
  OK(osft_comm_create_mpi(g_ctx, (int64_t)MPI_Comm_c2f(MPI_COMM_WORLD), &o, &g_comm));
  const variant variants[] = {
      {"mean-chunks-differ-by-rank", OSFT_FLCE_MEAN, 0, 1, 0, 0},
      {"sum-upstream-padded-grad-x-on-rank-0", OSFT_FLCE_SUM, 1, 0, 1, 0},
      {"none-per-token-upstream-accumulate", OSFT_FLCE_NONE, 1, 1, 0,
       OSFT_FLCE_ACCUMULATE_ALL},
      {"mean-accumulate-padded", OSFT_FLCE_MEAN, 1, 0, 1, OSFT_FLCE_ACCUMULATE_ALL},
      /* each rank plans its own shard: token chunks and vocabulary slices
       * side by side give the same numbers */
      {"mean-plans-and-chunks-differ-by-rank", OSFT_FLCE_MEAN, 1, 1, 0, 0, 1},
      {"none-plans-differ-accumulate-padded", OSFT_FLCE_NONE, 1, 0, 1,
       OSFT_FLCE_ACCUMULATE_ALL, 1},
  };
  for (size_t i = 0; i < sizeof variants / sizeof variants[0]; ++i)
    run_variant(&variants[i]);
  test_errors();
  /* the handle held the communicator; it can go now */
  OK(osft_comm_destroy(g_comm));
  OK(osft_context_destroy(g_ctx));
  int all = 0;
  MPI_Allreduce(&g_failures, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (g_rank == 0)
    printf("%s: %d failure(s) over %d ranks\n", all ? "FAILED" : "PASSED", all, g_size);
  MPI_Finalize();
  return all != 0;
}
