/* ThreadSanitizer test (.ci/stage_tsan.sh): several threads, each with its
 * own CPU context, run every capability at the same time — factorized
 * linear (decompose, forward, backward, merge), gradient projection over a
 * one-rank communicator, the tiled MLP, fused linear cross-entropy and the
 * batched QR with internal concurrency (its own worker threads) plus power
 * iteration — while a process-wide log callback receives every thread's
 * messages. Each thread also makes a deliberate error whose text names a
 * value of its own, waits until every thread has made its error, runs more
 * (successful) work, and checks that osft_last_error() still shows its own
 * message and no other thread's. After the threads join, every thread's
 * results (same inputs) must be bit-identical.
 *
 * A second phase runs the library's CPU thread pool from several threads at
 * once (issue 55): with osft_set_num_threads(3) (so even under
 * OPENBLAS_NUM_THREADS=1 the element-wise passes and the QR lanes use the
 * pool), threads with contexts of their own run FLCE, the tiled MLP and the
 * batched QR at shapes that split over the pool, while one more thread
 * changes the count (1 to 4) and reads it back; every thread's losses must
 * match a serial run's (within fp32 rounding: the BLAS's thread count
 * changes under them).
 *
 * Exit 0 when every check passed; TSan reports make the run fail on their
 * own (TSAN_OPTIONS=halt_on_error=1, exitcode). Run with
 * OPENBLAS_NUM_THREADS=1 for the bit-identity check; with OpenBLAS's own
 * threads, set OSFT_TSAN_COMPARE=0. */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "osftrt/osftrt.h"

#define THREADS 4
#define ROUNDS 3

#define CHECK(call)                                                                 \
  do {                                                                              \
    osft_status_t st_ = (call);                                                     \
    if (st_ != OSFT_STATUS_SUCCESS) {                                               \
      fprintf(stderr, "tsan test: %s:%d: %s returned %d: %s\n", __FILE__, __LINE__, \
              #call, (int)st_, osft_last_error());                                  \
      exit(1);                                                                      \
    }                                                                               \
  } while (0)

#define FAIL(...)                               \
  do {                                          \
    fprintf(stderr, "tsan test: " __VA_ARGS__); \
    fprintf(stderr, "\n");                      \
    exit(1);                                    \
  } while (0)

/* ---------------------------------------------------------------- data */

typedef struct {
  DLTensor t;
  int64_t shape[2];
} tensor;

static void make(tensor *x, void *data, uint8_t code, uint8_t bits, int ndim, int64_t d0,
                 int64_t d1) {
  memset(x, 0, sizeof *x);
  x->shape[0] = d0;
  x->shape[1] = d1;
  x->t.data = data;
  x->t.device.device_type = kDLCPU;
  x->t.ndim = ndim;
  x->t.dtype.code = code;
  x->t.dtype.bits = bits;
  x->t.dtype.lanes = 1;
  x->t.shape = x->shape;
}

static float *randf(size_t n, uint64_t seed) {
  float *p = (float *)malloc(n * sizeof *p);
  uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
  for (size_t i = 0; i < n; ++i) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    p[i] = (float)((double)(s >> 11) / 9007199254740992.0 * 2.0 - 1.0);
    if (p[i] > -1e-3f && p[i] < 1e-3f) p[i] = 0.5f;
  }
  return p;
}

static double *randd(size_t n, uint64_t seed) {
  float *f = randf(n, seed);
  double *d = (double *)malloc(n * sizeof *d);
  for (size_t i = 0; i < n; ++i) d[i] = f[i];
  free(f);
  return d;
}

/* ------------------------------------------------------------- results */

/* What each thread computes from the same inputs (compared after join). */
typedef struct {
  float y[16 * 32];      /* flinear forward */
  float gu[32 * 12];     /* flinear grad_u_low, projected */
  float merged[32 * 24]; /* flinear merge */
  double ortho[2];       /* projector orthogonality after project_params */
  float mlp_y[24 * 16];  /* mlp forward */
  float mlp_gdown[16 * 32];
  float loss; /* flce */
  float flce_gx[32 * 16];
  float qr_q32[24 * 16]; /* qr */
  double qr_q64[30 * 8];
  float pi_q[16 * 4]; /* power iteration */
} results;

typedef struct {
  int id;
  results res;
} thread_state;

static pthread_barrier_t g_barrier;
static atomic_long g_log_messages;

static void log_sink(void *user, osft_log_level_t level, const char *message) {
  (void)user;
  (void)level;
  if (message == NULL || message[0] == '\0') abort();
  atomic_fetch_add(&g_log_messages, 1);
}

/* -------------------------------------------------------- capabilities */

static void run_flinear_projection(osft_context_t ctx, results *r) {
  enum { N = 32, K = 24, M = 16 };
  float *w = randf(N * K, 1), *x = randf(M * K, 2), *gy = randf(M * N, 3);
  tensor tw, tx, ty, tgy, tgx, tgu, tgs, tgv, tm;
  make(&tw, w, kDLFloat, 32, 2, N, K);
  osft_flinear_options_t o;
  CHECK(OSFT_FLINEAR_OPTIONS_INIT(&o));
  o.rank_ratio = 0.5;
  osft_flinear_t layer;
  CHECK(osft_flinear_create_from_weight(ctx, &tw.t, &o, &layer));
  int64_t rr, ll;
  CHECK(osft_flinear_get_dims(layer, NULL, NULL, &rr, &ll));
  if (rr != 12 || ll != 12) FAIL("flinear: r %lld l %lld", (long long)rr, (long long)ll);
  make(&tx, x, kDLFloat, 32, 2, M, K);
  make(&ty, r->y, kDLFloat, 32, 2, M, N);
  CHECK(osft_flinear_forward(layer, &tx.t, NULL, &ty.t));
  float *gx = (float *)malloc(M * K * sizeof(float)),
        *gs = (float *)malloc(12 * sizeof(float));
  float *gv = (float *)malloc(12 * K * sizeof(float));
  make(&tgy, gy, kDLFloat, 32, 2, M, N);
  make(&tgx, gx, kDLFloat, 32, 2, M, K);
  make(&tgu, r->gu, kDLFloat, 32, 2, N, 12);
  make(&tgs, gs, kDLFloat, 32, 1, 12, 0);
  make(&tgv, gv, kDLFloat, 32, 2, 12, K);
  osft_flinear_grads_t g;
  CHECK(OSFT_FLINEAR_GRADS_INIT(&g));
  g.grad_x = &tgx.t;
  g.grad_u_low = &tgu.t;
  g.grad_s_low = &tgs.t;
  g.grad_v_low = &tgv.t;
  CHECK(osft_flinear_backward(layer, &tx.t, &tgy.t, &g));

  /* Projection over a one-rank communicator. */
  osft_comm_t comm;
  CHECK(osft_comm_create_self(ctx, NULL, &comm));
  osft_projector_t proj;
  CHECK(osft_projector_create(ctx, comm, NULL, &proj));
  CHECK(osft_projector_add_layer(proj, layer, &tgu.t, &tgv.t, NULL));
  CHECK(osft_projector_project(proj));
  CHECK(osft_projector_project_params(proj));
  CHECK(osft_projector_orthogonality(proj, &r->ortho[0], &r->ortho[1]));
  if (!(r->ortho[0] < 1e-4 && r->ortho[1] < 1e-4))
    FAIL("projection: residual %g %g after project_params", r->ortho[0], r->ortho[1]);
  CHECK(osft_projector_destroy(proj));
  CHECK(osft_comm_destroy(comm));

  make(&tm, r->merged, kDLFloat, 32, 2, N, K);
  CHECK(osft_flinear_merge(layer, &tm.t));
  CHECK(osft_flinear_destroy(layer));
  free(w);
  free(x);
  free(gy);
  free(gx);
  free(gs);
  free(gv);
}

static void run_mlp(osft_context_t ctx, results *r) {
  enum { H = 16, I = 32, M = 24 };
  float *gate = randf(I * H, 11), *up = randf(I * H, 12), *down = randf(H * I, 13);
  float *x = randf(M * H, 14), *gy = randf(M * H, 15);
  float *gx = (float *)malloc(M * H * sizeof(float));
  tensor tg, tu, td, tx, ty, tgy, tgx, tgd;
  make(&tg, gate, kDLFloat, 32, 2, I, H);
  make(&tu, up, kDLFloat, 32, 2, I, H);
  make(&td, down, kDLFloat, 32, 2, H, I);
  osft_mlp_weights_t w;
  CHECK(OSFT_MLP_WEIGHTS_INIT(&w));
  w.gate = &tg.t;
  w.up = &tu.t;
  w.down = &td.t;
  osft_mlp_options_t o;
  CHECK(OSFT_MLP_OPTIONS_INIT(&o));
  o.tiling = OSFT_MLP_TILING_TOKENS;
  o.tile_tokens = 8;
  osft_mlp_t mlp;
  CHECK(osft_mlp_create(ctx, OSFT_MLP_SWIGLU, H, I, &w, &o, &mlp));
  make(&tx, x, kDLFloat, 32, 2, M, H);
  make(&ty, r->mlp_y, kDLFloat, 32, 2, M, H);
  CHECK(osft_mlp_forward(mlp, &tx.t, &ty.t, 0));
  make(&tgy, gy, kDLFloat, 32, 2, M, H);
  make(&tgx, gx, kDLFloat, 32, 2, M, H);
  make(&tgd, r->mlp_gdown, kDLFloat, 32, 2, H, I);
  osft_mlp_grads_t g;
  CHECK(OSFT_MLP_GRADS_INIT(&g));
  g.grad_x = &tgx.t;
  g.grad_down = &tgd.t;
  CHECK(osft_mlp_backward(mlp, &tx.t, &tgy.t, &g, 0));
  CHECK(osft_mlp_destroy(mlp));
  free(gate);
  free(up);
  free(down);
  free(x);
  free(gy);
  free(gx);
}

/* Fused cross-entropy; with bad_target > 0, token 3's target is that value
 * (out of range) and the call must fail naming it. */
static void run_flce(osft_context_t ctx, results *r, int64_t bad_target) {
  enum { M = 32, H = 16, V = 50 };
  float *x = randf(M * H, 21), *w = randf(V * H, 22);
  float *gw = (float *)malloc(V * H * sizeof(float));
  int64_t targets[M];
  for (int i = 0; i < M; ++i) targets[i] = (i * 7) % V;
  targets[5] = -100; /* ignored */
  if (bad_target > 0) targets[3] = bad_target;
  tensor tx, tw, tt, tl, tgx, tgw;
  make(&tx, x, kDLFloat, 32, 2, M, H);
  make(&tw, w, kDLFloat, 32, 2, V, H);
  make(&tt, targets, kDLInt, 64, 1, M, 0);
  make(&tl, &r->loss, kDLFloat, 32, 0, 0, 0);
  make(&tgx, r->flce_gx, kDLFloat, 32, 2, M, H);
  make(&tgw, gw, kDLFloat, 32, 2, V, H);
  osft_flce_options_t o;
  CHECK(OSFT_FLCE_OPTIONS_INIT(&o));
  o.label_smoothing = 0.1;
  o.z_loss_scale = 1e-4;
  o.chunk_rows = 8;
  osft_flce_t ce;
  CHECK(osft_flce_create(ctx, &o, &ce));
  osft_flce_inputs_t in;
  CHECK(OSFT_FLCE_INPUTS_INIT(&in));
  in.x = &tx.t;
  in.weight = &tw.t;
  in.targets = &tt.t;
  osft_flce_outputs_t out;
  CHECK(OSFT_FLCE_OUTPUTS_INIT(&out));
  out.loss = &tl.t;
  out.grad_x = &tgx.t;
  out.grad_weight = &tgw.t;
  const osft_status_t st = osft_flce_compute(ce, &in, &out);
  if (bad_target > 0) {
    if (st != OSFT_STATUS_INDEX_OUT_OF_RANGE)
      FAIL("flce with target %lld returned %d, expected INDEX_OUT_OF_RANGE",
           (long long)bad_target, (int)st);
  } else if (st != OSFT_STATUS_SUCCESS) {
    FAIL("flce: %s", osft_last_error());
  }
  CHECK(osft_flce_destroy(ce));
  free(x);
  free(w);
  free(gw);
}

static void run_qr(osft_context_t ctx, results *r) {
  /* Mixed shapes and dtypes; max_concurrency 2: the call's own threads. */
  enum { COUNT = 6 };
  const int64_t rows[COUNT] = {24, 16, 30, 20, 12, 24};
  const int64_t cols[COUNT] = {16, 16, 8, 10, 12, 16};
  const int f64[COUNT] = {0, 0, 1, 0, 1, 0};
  void *a[COUNT], *q[COUNT];
  tensor ta[COUNT], tq[COUNT];
  const DLTensor *pa[COUNT];
  DLTensor *pq[COUNT];
  for (int i = 0; i < COUNT; ++i) {
    const size_t n = (size_t)(rows[i] * cols[i]);
    a[i] = f64[i] ? (void *)randd(n, 31 + i) : (void *)randf(n, 31 + i);
    q[i] = i == 0 ? (void *)r->qr_q32 : i == 2 ? (void *)r->qr_q64 : malloc(n * 8);
    make(&ta[i], a[i], kDLFloat, f64[i] ? 64 : 32, 2, rows[i], cols[i]);
    make(&tq[i], q[i], kDLFloat, f64[i] ? 64 : 32, 2, rows[i], cols[i]);
    pa[i] = &ta[i].t;
    pq[i] = &tq[i].t;
  }
  osft_qr_options_t o;
  CHECK(OSFT_QR_OPTIONS_INIT(&o));
  o.max_concurrency = 2;
  osft_status_t per[COUNT];
  CHECK(osft_qr_batch(ctx, &o, COUNT, pa, pq, NULL, per));
  o.method = OSFT_QR_CHOLESKY_QR2;
  CHECK(osft_qr_batch(ctx, &o, COUNT, pa, pq, NULL, per));
  for (int i = 0; i < COUNT; ++i) {
    free(a[i]);
    if (i != 0 && i != 2) free(q[i]);
  }
  /* Power iteration on two pairs. */
  float *pa0 = randf(16 * 16, 41), *pa1 = randf(12 * 12, 42), *q1 = randf(12 * 3, 44);
  float *q0 = randf(16 * 4, 43);
  memcpy(r->pi_q, q0, sizeof r->pi_q);
  tensor tpa[2], tpq[2];
  make(&tpa[0], pa0, kDLFloat, 32, 2, 16, 16);
  make(&tpa[1], pa1, kDLFloat, 32, 2, 12, 12);
  make(&tpq[0], r->pi_q, kDLFloat, 32, 2, 16, 4);
  make(&tpq[1], q1, kDLFloat, 32, 2, 12, 3);
  const DLTensor *ppa[2] = {&tpa[0].t, &tpa[1].t};
  DLTensor *ppq[2] = {&tpq[0].t, &tpq[1].t};
  o.method = OSFT_QR_HOUSEHOLDER;
  CHECK(osft_qr_power_iteration(ctx, &o, 2, ppa, ppq, 2, per));
  free(pa0);
  free(pa1);
  free(q0);
  free(q1);
}

/* ------------------------------------------------ the thread pool phase */

/* OpenBLAS hands the parts of a large GEMM to its own threads through words
 * it spins on (an uninstrumented library): ThreadSanitizer does not see that
 * hand-off, so what those threads write through intercepted calls (memset
 * in sgemm_beta) is reported against the caller's writes before the call.
 * Reports with an OpenBLAS frame are suppressed; the library's own accesses
 * on its own threads are still checked. */
const char *__tsan_default_suppressions(void);
const char *__tsan_default_suppressions(void) {
  return "race:libopenblas\n";
}

enum { POOL_THREADS = 3, POOL_ROUNDS = 4 };

/* FLCE over 64 x 4096 logits and a SwiGLU MLP over 256 x 1024 activations:
 * passes of more than two parts' worth, split over the pool; a QR list of
 * four: four lanes. Returns the FLCE loss plus the sums of the MLP's output
 * and of the QR's R diagonals (determined up to rounding). */
static double run_pool_round(osft_context_t ctx) {
  enum { M = 64, H = 32, V = 4096, T = 256, D = 64, I = 1024, Q = 4, QM = 48, QN = 32 };
  float *x = randf(M * H, 51), *w = randf((size_t)V * H, 52);
  float *gx = (float *)malloc(M * H * sizeof(float));
  float *gw = (float *)malloc((size_t)V * H * sizeof(float));
  float loss = 0.0f;
  int64_t targets[M];
  for (int i = 0; i < M; ++i) targets[i] = (i * 7919) % V;
  tensor tx, tw, tt, tl, tgx, tgw;
  make(&tx, x, kDLFloat, 32, 2, M, H);
  make(&tw, w, kDLFloat, 32, 2, V, H);
  make(&tt, targets, kDLInt, 64, 1, M, 0);
  make(&tl, &loss, kDLFloat, 32, 0, 0, 0);
  make(&tgx, gx, kDLFloat, 32, 2, M, H);
  make(&tgw, gw, kDLFloat, 32, 2, V, H);
  osft_flce_t ce;
  CHECK(osft_flce_create(ctx, NULL, &ce));
  osft_flce_inputs_t in;
  CHECK(OSFT_FLCE_INPUTS_INIT(&in));
  in.x = &tx.t, in.weight = &tw.t, in.targets = &tt.t;
  osft_flce_outputs_t out;
  CHECK(OSFT_FLCE_OUTPUTS_INIT(&out));
  out.loss = &tl.t, out.grad_x = &tgx.t, out.grad_weight = &tgw.t;
  CHECK(osft_flce_compute(ce, &in, &out));
  CHECK(osft_flce_destroy(ce));
  double total = loss;

  float *gate = randf(I * D, 53), *up = randf(I * D, 54), *down = randf(D * I, 55);
  float *mx = randf(T * D, 56), *my = (float *)malloc(T * D * sizeof(float));
  tensor tg, tu, td, tmx, tmy;
  make(&tg, gate, kDLFloat, 32, 2, I, D);
  make(&tu, up, kDLFloat, 32, 2, I, D);
  make(&td, down, kDLFloat, 32, 2, D, I);
  make(&tmx, mx, kDLFloat, 32, 2, T, D);
  make(&tmy, my, kDLFloat, 32, 2, T, D);
  osft_mlp_weights_t mw;
  CHECK(OSFT_MLP_WEIGHTS_INIT(&mw));
  mw.gate = &tg.t, mw.up = &tu.t, mw.down = &td.t;
  osft_mlp_t mlp;
  CHECK(osft_mlp_create(ctx, OSFT_MLP_SWIGLU, D, I, &mw, NULL, &mlp));
  CHECK(osft_mlp_forward(mlp, &tmx.t, &tmy.t, 1));
  CHECK(osft_mlp_destroy(mlp));
  for (int i = 0; i < T * D; ++i) total += 1e-3 * my[i];

  float *qa[Q], *qr[Q], *qq[Q];
  tensor tqa[Q], tqq[Q], tqr[Q];
  const DLTensor *pa[Q];
  DLTensor *pq[Q], *pr[Q];
  for (int i = 0; i < Q; ++i) {
    qa[i] = randf(QM * QN, 61 + i);
    qq[i] = (float *)malloc(QM * QN * sizeof(float));
    qr[i] = (float *)malloc(QN * QN * sizeof(float));
    make(&tqa[i], qa[i], kDLFloat, 32, 2, QM, QN);
    make(&tqq[i], qq[i], kDLFloat, 32, 2, QM, QN);
    make(&tqr[i], qr[i], kDLFloat, 32, 2, QN, QN);
    pa[i] = &tqa[i].t, pq[i] = &tqq[i].t, pr[i] = &tqr[i].t;
  }
  osft_status_t per[Q];
  CHECK(osft_qr_batch(ctx, NULL, Q, pa, pq, pr, per));
  for (int i = 0; i < Q; ++i) {
    for (int j = 0; j < QN; ++j) total += 1e-3 * qr[i][j * QN + j];
    free(qa[i]);
    free(qq[i]);
    free(qr[i]);
  }
  free(x), free(w), free(gx), free(gw);
  free(gate), free(up), free(down), free(mx), free(my);
  return total;
}

static atomic_int g_pool_stop;

static void *pool_user(void *arg) {
  double *results_out = (double *)arg;
  osft_context_t ctx;
  CHECK(osft_context_create(&ctx, NULL));
  for (int r = 0; r < POOL_ROUNDS; ++r) results_out[r] = run_pool_round(ctx);
  CHECK(osft_context_destroy(ctx));
  return NULL;
}

static void *pool_toggler(void *arg) {
  (void)arg;
  for (int k = 0; !atomic_load(&g_pool_stop); ++k) {
    CHECK(osft_set_num_threads(1 + k % 4));
    int n = 0;
    CHECK(osft_get_num_threads(&n));
    if (n < 1 || n > 4) FAIL("osft_get_num_threads: %d while the toggler sets 1 to 4", n);
    usleep(200);
  }
  return NULL;
}

static void pool_phase(void) {
  CHECK(osft_set_num_threads(3));
  osft_context_t ctx;
  CHECK(osft_context_create(&ctx, NULL));
  const double serial = run_pool_round(ctx);
  CHECK(osft_context_destroy(ctx));
  static double got[POOL_THREADS][POOL_ROUNDS];
  pthread_t users[POOL_THREADS], toggler;
  atomic_store(&g_pool_stop, 0);
  if (pthread_create(&toggler, NULL, pool_toggler, NULL) != 0) FAIL("pthread_create");
  for (int i = 0; i < POOL_THREADS; ++i)
    if (pthread_create(&users[i], NULL, pool_user, got[i]) != 0) FAIL("pthread_create");
  for (int i = 0; i < POOL_THREADS; ++i) pthread_join(users[i], NULL);
  atomic_store(&g_pool_stop, 1);
  pthread_join(toggler, NULL);
  for (int i = 0; i < POOL_THREADS; ++i)
    for (int r = 0; r < POOL_ROUNDS; ++r)
      if (!(fabs(got[i][r] - serial) <= 1e-4 * fabs(serial)))
        FAIL("pool phase: thread %d round %d gave %.9g, the serial run %.9g", i, r,
             got[i][r], serial);
  CHECK(osft_set_num_threads(0));
}

/* ---------------------------------------------------------------- main */

static void *worker(void *arg) {
  thread_state *ts = (thread_state *)arg;
  osft_context_t ctx;
  CHECK(osft_context_create(&ctx, NULL));
  for (int round = 0; round < ROUNDS; ++round) {
    run_flinear_projection(ctx, &ts->res);
    run_mlp(ctx, &ts->res);
    run_flce(ctx, &ts->res, 0);
    run_qr(ctx, &ts->res);
  }
  /* The deliberate error: a target value of this thread's own. */
  const int64_t mine = 100000 + ts->id;
  results scratch;
  run_flce(ctx, &scratch, mine);
  pthread_barrier_wait(&g_barrier); /* every thread has made its error */
  run_qr(ctx, &scratch);            /* successful calls do not clear it */
  run_flce(ctx, &scratch, 0);
  char own[32];
  snprintf(own, sizeof own, "%lld", (long long)mine);
  const char *msg = osft_last_error();
  if (strstr(msg, own) == NULL)
    FAIL("thread %d: osft_last_error() is not this thread's: \"%s\"", ts->id, msg);
  for (int other = 0; other < THREADS; ++other) {
    char theirs[32];
    snprintf(theirs, sizeof theirs, "%lld", (long long)(100000 + other));
    if (other != ts->id && strstr(msg, theirs) != NULL)
      FAIL("thread %d sees thread %d's error: \"%s\"", ts->id, other, msg);
  }
  CHECK(osft_context_destroy(ctx));
  return NULL;
}

int main(void) {
  CHECK(osft_set_log_callback(log_sink, NULL, OSFT_LOG_DEBUG));
  pthread_barrier_init(&g_barrier, NULL, THREADS);
  static thread_state ts[THREADS];
  pthread_t th[THREADS];
  for (int i = 0; i < THREADS; ++i) {
    ts[i].id = i;
    if (pthread_create(&th[i], NULL, worker, &ts[i]) != 0) FAIL("pthread_create");
  }
  for (int i = 0; i < THREADS; ++i) pthread_join(th[i], NULL);
  pthread_barrier_destroy(&g_barrier);
  /* Bit-identical only when OpenBLAS is single-threaded (its threading may
   * change the last bits): OSFT_TSAN_COMPARE=0 skips the comparison. */
  const char *cmp = getenv("OSFT_TSAN_COMPARE");
  if (cmp == NULL || strcmp(cmp, "0") != 0)
    for (int i = 1; i < THREADS; ++i)
      if (memcmp(&ts[i].res, &ts[0].res, sizeof ts[0].res) != 0)
        FAIL("thread %d's results differ from thread 0's (same inputs)", i);
  if (atomic_load(&g_log_messages) < THREADS)
    FAIL("the log callback saw %ld messages, expected at least one error per thread",
         atomic_load(&g_log_messages));
  CHECK(osft_set_log_callback(NULL, NULL, OSFT_LOG_ERROR));
  pool_phase();
  printf(
      "tsan test: %d threads x %d rounds of flinear, projection, mlp, flce, qr "
      "(max_concurrency 2), power iteration; %d threads x %d rounds on the thread pool "
      "with the count changing: OK (%ld log messages)\n",
      THREADS, ROUNDS, POOL_THREADS, POOL_ROUNDS, atomic_load(&g_log_messages));
  return 0;
}
