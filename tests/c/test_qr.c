/* Batched QR: accuracy (orthogonality, residual, sign convention,
 * uniqueness against a float64 Gram-Schmidt reference written here), mixed
 * shapes and dtypes in one call, in place and out of place, both methods,
 * condition numbers up to 1e12 with CholeskyQR2's fall-back, power
 * iteration against a loop of separate QRs, per-matrix failures that spare
 * the rest bit for bit, and every error writing nothing. Built twice: for
 * the CPU, and with OSFT_TEST_CUDA for a GPU (skipped where none is). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_tensors.h"
#include "test_util.h"

#define NMAX 16 /* most matrices in one test list */

static const osft_qr_method_t kMethods[2] = {OSFT_QR_HOUSEHOLDER, OSFT_QR_CHOLESKY_QR2};

/* ------------------------------------------------------- float64 helpers */

static double eps_of(tt_dtype d) {
  return d == TT_F64 ? 2.220446049250313e-16 : 1.1920928955078125e-07;
}

static double *zeros(int64_t n) {
  return calloc((size_t)(n > 0 ? n : 1), sizeof(double));
}

/* Modified Gram-Schmidt applied twice, in float64: the reference Q (m x n)
 * and R (n x n, may be NULL) of a full-rank a (m x n, row-major), with
 * diag(R) > 0 by construction. */
static void ref_qr(const double *a, int64_t m, int64_t n, double *q, double *r) {
  memcpy(q, a, sizeof(double) * (size_t)(m * n));
  if (r) memset(r, 0, sizeof(double) * (size_t)(n * n));
  for (int64_t j = 0; j < n; ++j) {
    for (int pass = 0; pass < 2; ++pass)
      for (int64_t k = 0; k < j; ++k) {
        double c = 0;
        for (int64_t i = 0; i < m; ++i) c += q[i * n + k] * q[i * n + j];
        for (int64_t i = 0; i < m; ++i) q[i * n + j] -= c * q[i * n + k];
        if (r) r[k * n + j] += c;
      }
    double nrm = 0;
    for (int64_t i = 0; i < m; ++i) nrm += q[i * n + j] * q[i * n + j];
    nrm = sqrt(nrm);
    for (int64_t i = 0; i < m; ++i) q[i * n + j] /= nrm;
    if (r) r[j * n + j] = nrm;
  }
}

/* A random m x n matrix with orthonormal columns. */
static double *random_orthonormal(int64_t m, int64_t n) {
  double *g = zeros(m * n), *q = zeros(m * n);
  for (int64_t i = 0; i < m * n; ++i) g[i] = test_uniform(-1, 1);
  ref_qr(g, m, n, q, NULL);
  free(g);
  return q;
}

/* A = U diag(sigma) V^T with random orthonormal U (m x n), V (n x n) and
 * singular values log-spaced from 1 down to 1 / kappa. */
static double *conditioned(int64_t m, int64_t n, double kappa) {
  double *u = random_orthonormal(m, n), *v = random_orthonormal(n, n), *a = zeros(m * n);
  for (int64_t k = 0; k < n; ++k) {
    const double s = n > 1 ? pow(kappa, -(double)k / (double)(n - 1)) : 1.0;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) a[i * n + j] += u[i * n + k] * s * v[j * n + k];
  }
  free(u);
  free(v);
  return a;
}

static double frob(const double *x, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += x[i] * x[i];
  return sqrt(s);
}

/* Checks Q (and R if given) of A: ||Q^T Q - I||_F and ||Q R - A||_F / ||A||_F
 * within 30 max(m, n) eps; R upper triangular with diag(R) >= 0 (without
 * R: diag(Q^T A) > 0); Q within 20 kappa max(m, n) eps of the Gram-Schmidt
 * reference (skipped when that bound is meaningless). */
static void expect_qr(const char *what, const double *a, const double *q, const double *r,
                      int64_t m, int64_t n, tt_dtype d, double kappa) {
  const double tol = 30.0 * (double)(m > n ? m : n) * eps_of(d);
  double orth = 0;
  for (int64_t p = 0; p < n; ++p)
    for (int64_t c = 0; c < n; ++c) {
      double dot = 0;
      for (int64_t i = 0; i < m; ++i) dot += q[i * n + p] * q[i * n + c];
      orth += (dot - (p == c)) * (dot - (p == c));
    }
  orth = sqrt(orth);
  if (!(orth <= tol)) fail_msg("%s: ||Q^T Q - I||_F = %.3g > %.3g", what, orth, tol);
  double *rr = zeros(n * n);
  if (r) {
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < n; ++j) {
        if (j < i && r[i * n + j] != 0.0)
          fail_msg("%s: R(%lld,%lld) = %g below the diagonal", what, (long long)i,
                   (long long)j, r[i * n + j]);
        rr[i * n + j] = r[i * n + j];
      }
  } else { /* R = Q^T A */
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < n; ++j)
        for (int64_t t = 0; t < m; ++t) rr[i * n + j] += q[t * n + i] * a[t * n + j];
  }
  for (int64_t j = 0; j < n; ++j)
    if (!(rr[j * n + j] >= 0.0) || (!r && !(rr[j * n + j] > 0.0)))
      fail_msg("%s: diag(R)[%lld] = %g breaks diag(R) >= 0", what, (long long)j,
               rr[j * n + j]);
  double *res = zeros(m * n);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t t = 0; t < n; ++t) s += q[i * n + t] * rr[t * n + j];
      res[i * n + j] = s - a[i * n + j];
    }
  const double resid = frob(res, m * n) / frob(a, m * n);
  if (!(resid <= tol)) fail_msg("%s: ||QR - A|| / ||A|| = %.3g > %.3g", what, resid, tol);
  const double ref_tol = 20.0 * kappa * (double)(m > n ? m : n) * eps_of(d);
  if (ref_tol < 1e-2) {
    double *qref = zeros(m * n);
    ref_qr(a, m, n, qref, NULL);
    const double err = rel_max_err(q, qref, (size_t)(m * n), 1.0);
    if (!(err <= ref_tol))
      fail_msg("%s: Q differs from the reference by %.3g > %.3g", what, err, ref_tol);
    free(qref);
  }
  free(rr);
  free(res);
}

/* ---------------------------------------------------------- tensor lists */

typedef struct {
  tt_dtype dtype;
  int64_t m, n, ld; /* ld 0: compact */
} spec;

static tt *new_mat(tt_dtype d, int64_t m, int64_t n, int64_t ld) {
  if (ld > 0) return tt_new_padded(d, m, n, ld);
  const int64_t shape[2] = {m, n};
  return tt_new(d, 2, shape);
}

/* A list of n matrices (with their outputs) for one call. */
typedef struct {
  int n;
  spec s[NMAX];
  tt *a[NMAX], *q[NMAX], *r[NMAX];
  const DLTensor *ap[NMAX];
  DLTensor *qp[NMAX], *rp[NMAX];
  double kappa[NMAX];
} list;

/* Inputs with condition number kappa[i] (default 10), outputs poisoned; R
 * for the entries with want_r[i]. */
static void list_make(list *L, int n, const spec *s, const double *kappa,
                      const int *want_r) {
  memset(L, 0, sizeof *L);
  L->n = n;
  for (int i = 0; i < n; ++i) {
    L->s[i] = s[i];
    L->kappa[i] = kappa ? kappa[i] : 10.0;
    L->a[i] = new_mat(s[i].dtype, s[i].m, s[i].n, s[i].ld);
    tt_poison(L->a[i]); /* padding: the same bits in every list */
    double *v = conditioned(s[i].m, s[i].n, L->kappa[i]);
    tt_set(L->a[i], v);
    free(v);
    L->q[i] = new_mat(s[i].dtype, s[i].m, s[i].n, s[i].ld ? s[i].ld + 1 : 0);
    tt_poison(L->q[i]);
    if (!want_r || want_r[i]) {
      L->r[i] = new_mat(s[i].dtype, s[i].n, s[i].n, 0);
      tt_poison(L->r[i]);
    }
    L->ap[i] = &L->a[i]->t;
    L->qp[i] = &L->q[i]->t;
    L->rp[i] = L->r[i] ? &L->r[i]->t : NULL;
  }
}

static void list_free(list *L) {
  for (int i = 0; i < L->n; ++i) {
    tt_free(L->a[i]);
    tt_free(L->q[i]);
    tt_free(L->r[i]);
  }
}

/* Checks entry i's results (Q from `qt`, which is q[i] or, in place, a[i])
 * against the input values `a`. */
static void expect_entry(const list *L, int i, const tt *qt, const double *a) {
  char what[64];
  snprintf(what, sizeof what, "entry %d (%lldx%lld %s)", i, (long long)L->s[i].m,
           (long long)L->s[i].n, L->s[i].dtype == TT_F64 ? "f64" : "f32");
  double *q = tt_get(qt);
  double *r = L->r[i] ? tt_get(L->r[i]) : NULL;
  expect_qr(what, a, q, r, L->s[i].m, L->s[i].n, L->s[i].dtype, L->kappa[i]);
  free(q);
  free(r);
}

static osft_qr_options_t options(osft_qr_method_t method) {
  osft_qr_options_t o;
  assert_ok(OSFT_QR_OPTIONS_INIT(&o));
  o.method = method;
  return o;
}

/* Byte snapshots, for "unchanged" and "bit-identical" checks. */
typedef struct {
  void *bytes;
  size_t size;
} snap;

static snap take(const tt *t) {
  snap s = {NULL, 0};
  if (t) s.bytes = tt_bytes(t, &s.size);
  return s;
}

static int same(const snap *s, const tt *t) {
  if (!t) return s->bytes == NULL;
  size_t size;
  void *now = tt_bytes(t, &size);
  const int eq = size == s->size && memcmp(now, s->bytes, size) == 0;
  free(now);
  return eq;
}

/* All bytes of a list: inputs, outputs. */
typedef struct {
  snap a[NMAX], q[NMAX], r[NMAX];
} list_snap;

static void list_take(const list *L, list_snap *S) {
  for (int i = 0; i < L->n; ++i) {
    S->a[i] = take(L->a[i]);
    S->q[i] = take(L->q[i]);
    S->r[i] = take(L->r[i]);
  }
}

static void list_expect_same(const list *L, const list_snap *S, const char *what) {
  for (int i = 0; i < L->n; ++i)
    if (!same(&S->a[i], L->a[i]) || !same(&S->q[i], L->q[i]) || !same(&S->r[i], L->r[i]))
      fail_msg("%s: entry %d changed", what, i);
}

static void list_snap_free(const list *L, list_snap *S) {
  for (int i = 0; i < L->n; ++i) {
    free(S->a[i].bytes);
    free(S->q[i].bytes);
    free(S->r[i].bytes);
  }
}

/* ---------------------------------------------------------- log capture */

typedef struct {
  int fallbacks;
  char last_plan[256];
} log_capture;

static void capture_log(void *user, osft_log_level_t level, const char *message) {
  (void)level;
  log_capture *c = user;
  if (strstr(message, "redone with Householder")) ++c->fallbacks;
  if (strstr(message, "lane(s)"))
    snprintf(c->last_plan, sizeof c->last_plan, "%s", message);
}

static void log_start(log_capture *c) {
  memset(c, 0, sizeof *c);
  assert_ok(osft_set_log_callback(capture_log, c, OSFT_LOG_DEBUG));
}

static void log_stop(void) {
  assert_ok(osft_set_log_callback(NULL, NULL, OSFT_LOG_OFF));
}

/* ------------------------------------------------------------- fixtures */

static int setup(void **state) {
  *state = tt_context(NULL);
  return 0;
}

static int teardown(void **state) {
  assert_ok(osft_context_destroy((osft_context_t)*state));
  return 0;
}

#define CTX ((osft_context_t)*state)

/* Mixed shapes and dtypes, padded rows, R for some entries. On CUDA the
 * last two are too big for the batched kernel's shared memory and run on
 * cuSOLVER streams. */
static const spec kMixed[] = {
    {TT_F32, 5, 3, 0},    {TT_F64, 16, 16, 0},   {TT_F32, 40, 12, 15},
    {TT_F32, 64, 64, 0},  {TT_F64, 1, 1, 0},     {TT_F32, 7, 1, 0},
    {TT_F64, 130, 70, 0}, {TT_F32, 33, 33, 40},  {TT_F64, 96, 24, 30},
    {TT_F32, 130, 70, 0}, {TT_F32, 180, 150, 0}, {TT_F64, 140, 100, 110},
};
#define N_MIXED ((int)(sizeof kMixed / sizeof kMixed[0]))
static const int kWantR[N_MIXED] = {1, 0, 1, 1, 1, 0, 1, 0, 1, 1, 1, 0};

/* -------------------------------------------------------------- tests */

static void test_options_init(void **state) {
  (void)state;
  osft_qr_options_t o;
  memset(&o, 0x5a, sizeof o);
  assert_ok(OSFT_QR_OPTIONS_INIT(&o));
  assert_int_equal(o.struct_size, sizeof o);
  assert_int_equal(o.method, OSFT_QR_HOUSEHOLDER);
  assert_true(o.orthogonality_threshold == 0.0 && o.rank_tolerance == 0.0);
  assert_int_equal(o.max_concurrency, 0);
  assert_status(osft_qr_options_init(NULL, sizeof o), OSFT_STATUS_INVALID_ARGUMENT);
  assert_status(osft_qr_options_init(&o, 4), OSFT_STATUS_INVALID_STRUCT_SIZE);
  unsigned char big[sizeof o + 16];
  memset(big, 0x5a, sizeof big);
  assert_ok(osft_qr_options_init((osft_qr_options_t *)big, sizeof big));
  for (size_t i = sizeof o; i < sizeof big; ++i) assert_int_equal(big[i], 0);
}

static void test_mixed_shapes_out_of_place(void **state) {
  for (int mi = 0; mi < 2; ++mi) {
    test_seed("mixed");
    list L;
    list_make(&L, N_MIXED, kMixed, NULL, kWantR);
    list_snap before;
    list_take(&L, &before);
    osft_status_t st[N_MIXED];
    const osft_qr_options_t o = options(kMethods[mi]);
    assert_ok(osft_qr_batch(CTX, &o, (size_t)L.n, L.ap, L.qp, L.rp, st));
    for (int i = 0; i < L.n; ++i) {
      assert_int_equal(st[i], OSFT_STATUS_SUCCESS);
      assert_true(same(&before.a[i], L.a[i])); /* inputs are read only */
      double *a = tt_get(L.a[i]);
      expect_entry(&L, i, L.q[i], a);
      free(a);
    }
    list_snap_free(&L, &before);
    list_free(&L);
  }
}

/* Matrices without columns (4 x 0, 0 x 0) need nothing and succeed. */
static void test_empty_matrices(void **state) {
  test_seed("empty");
  const int64_t s40[2] = {4, 0}, s00[2] = {0, 0};
  tt *e1 = tt_new(TT_F32, 2, s40), *e2 = tt_new(TT_F64, 2, s00);
  const spec one = {TT_F32, 6, 4, 0};
  list L;
  list_make(&L, 1, &one, NULL, NULL);
  const DLTensor *a[3] = {&e1->t, L.ap[0], &e2->t};
  DLTensor *q[3] = {&e1->t, L.qp[0], &e2->t};
  osft_status_t st[3] = {(osft_status_t)-1, (osft_status_t)-1, (osft_status_t)-1};
  DLTensor *r[3] = {NULL, L.rp[0], NULL};
  assert_ok(osft_qr_batch(CTX, NULL, 3, a, q, r, st));
  for (int i = 0; i < 3; ++i) assert_int_equal(st[i], OSFT_STATUS_SUCCESS);
  double *v = tt_get(L.a[0]);
  expect_entry(&L, 0, L.q[0], v);
  free(v);
  tt_free(e1);
  tt_free(e2);
  list_free(&L);
}

/* In place (q == NULL, and q[i] == a[i]) gives the out-of-place bits. */
static void test_in_place(void **state) {
  for (int mi = 0; mi < 2; ++mi) {
    for (int variant = 0; variant < 2; ++variant) {
      test_seed("in_place");
      list L;
      list_make(&L, N_MIXED, kMixed, NULL, kWantR);
      const osft_qr_options_t o = options(kMethods[mi]);
      assert_ok(osft_qr_batch(CTX, &o, (size_t)L.n, L.ap, L.qp, L.rp, NULL));
      double *inputs[N_MIXED];
      snap q_out[N_MIXED], r_out[N_MIXED];
      for (int i = 0; i < L.n; ++i) {
        inputs[i] = tt_get(L.a[i]);
        q_out[i] = take(L.q[i]);
        r_out[i] = take(L.r[i]);
        if (L.r[i]) tt_poison(L.r[i]);
      }
      DLTensor *self[N_MIXED];
      for (int i = 0; i < L.n; ++i) self[i] = &L.a[i]->t;
      assert_ok(osft_qr_batch(CTX, &o, (size_t)L.n, L.ap, variant == 0 ? NULL : self,
                              L.rp, NULL));
      for (int i = 0; i < L.n; ++i) {
        expect_entry(&L, i, L.a[i], inputs[i]);
        double *via_a = tt_get(L.a[i]), *via_q = tt_get(L.q[i]);
        for (int64_t e = 0; e < L.s[i].m * L.s[i].n; ++e)
          if (memcmp(&via_a[e], &via_q[e], sizeof(double)) != 0)
            fail_msg("in place differs from out of place: entry %d element %lld", i,
                     (long long)e);
        assert_true(same(&r_out[i], L.r[i]));
        free(via_a);
        free(via_q);
        free(inputs[i]);
        free(q_out[i].bytes);
        free(r_out[i].bytes);
      }
      list_free(&L);
    }
  }
}

/* kappa 1e2..1e12 (fp64), 1e1..1e5 (fp32): both methods meet the same
 * accuracy; CholeskyQR2 falls back where theory says it must and not for
 * well-conditioned matrices. 200 x 130: on CUDA too big for the batched
 * kernel (which is always Householder). The rank check is off: fp32 at
 * 1e5 is near its default tolerance, and this test is about accuracy. */
static void test_condition_numbers(void **state) {
  const double k64[] = {1e2, 1e4, 1e6, 1e8, 1e10, 1e12};
  const double k32[] = {1e1, 1e2, 1e3, 1e4, 1e5};
  for (int dt = 0; dt < 2; ++dt) {
    const tt_dtype d = dt == 0 ? TT_F64 : TT_F32;
    const int n = dt == 0 ? 6 : 5;
    spec s[6];
    for (int i = 0; i < n; ++i) s[i] = (spec){d, 200, 130, 0};
    for (int mi = 0; mi < 2; ++mi) {
      test_seed("conditioning");
      list L;
      list_make(&L, n, s, dt == 0 ? k64 : k32, NULL);
      osft_qr_options_t o = options(kMethods[mi]);
      o.rank_tolerance = -1.0;
      log_capture cap;
      log_start(&cap);
      const osft_status_t call =
          osft_qr_batch(CTX, &o, (size_t)n, L.ap, L.qp, L.rp, NULL);
      log_stop();
      assert_int_equal(call, OSFT_STATUS_SUCCESS);
      for (int i = 0; i < n; ++i) {
        double *a = tt_get(L.a[i]);
        expect_entry(&L, i, L.q[i], a);
        free(a);
      }
      if (kMethods[mi] == OSFT_QR_CHOLESKY_QR2) {
        /* fp64: from 1e10 (maybe 1e8); fp32: from 1e4 (maybe 1e3). */
        const int at_least = 2, at_most = 3;
        if (cap.fallbacks < at_least || cap.fallbacks > at_most)
          fail_msg("%s: %d CholeskyQR2 fall-backs, expected %d to %d",
                   dt == 0 ? "fp64" : "fp32", cap.fallbacks, at_least, at_most);
      } else {
        assert_int_equal(cap.fallbacks, 0);
      }
      list_free(&L);
    }
  }
}

/* fp32 with kappa 1e8 is singular to working precision: reported as
 * rank-deficient by default; with the check off it still gets an
 * orthonormal Q with Q R = A. */
static void test_near_singular_fp32(void **state) {
  test_seed("near_singular");
  const spec s[2] = {{TT_F32, 40, 24, 0}, {TT_F32, 40, 24, 0}};
  const double kappa[2] = {10.0, 1e8};
  list L;
  list_make(&L, 2, s, kappa, NULL);
  osft_status_t st[2];
  osft_qr_options_t o = options(OSFT_QR_HOUSEHOLDER);
  snap q1 = take(L.q[1]);
  assert_status(osft_qr_batch(CTX, &o, 2, L.ap, L.qp, L.rp, st),
                OSFT_STATUS_NUMERICAL_ERROR);
  assert_error_mentions("a[1]");
  assert_error_mentions("rank-deficient");
  assert_int_equal(st[0], OSFT_STATUS_SUCCESS);
  assert_int_equal(st[1], OSFT_STATUS_NUMERICAL_ERROR);
  assert_true(same(&q1, L.q[1]));
  for (int mi = 0; mi < 2; ++mi) {
    o = options(kMethods[mi]);
    o.rank_tolerance = -1.0;
    assert_ok(osft_qr_batch(CTX, &o, 2, L.ap, L.qp, L.rp, st));
    double *a = tt_get(L.a[1]), *q = tt_get(L.q[1]), *r = tt_get(L.r[1]);
    expect_qr("kappa 1e8 fp32, check off", a, q, r, 40, 24, TT_F32, 1e30);
    free(a);
    free(q);
    free(r);
  }
  free(q1.bytes);
  list_free(&L);
}

/* A NaN in one matrix and an Inf in another: those two fail with their
 * outputs untouched; the rest are bit-identical to a run without them. */
static void test_nonfinite_spares_the_rest(void **state) {
  const spec s[5] = {{TT_F32, 24, 16, 0},
                     {TT_F64, 30, 30, 0},
                     {TT_F32, 17, 9, 20},
                     {TT_F32, 200, 130, 0},
                     {TT_F64, 150, 90, 0}};
  for (int mi = 0; mi < 2; ++mi)
    for (int in_place = 0; in_place < 2; ++in_place) {
      test_seed("nonfinite");
      list clean, dirty;
      list_make(&clean, 5, s, NULL, NULL);
      test_seed("nonfinite");
      list_make(&dirty, 5, s, NULL, NULL);
      const int bad[2] = {1, 3};
      for (int b = 0; b < 2; ++b) {
        const int i = bad[b];
        double *v = tt_get(dirty.a[i]);
        v[7] = b == 0 ? NAN : -INFINITY;
        tt_set(dirty.a[i], v);
        free(v);
      }
      list_snap before;
      list_take(&dirty, &before);
      const osft_qr_options_t o = options(kMethods[mi]);
      assert_ok(osft_qr_batch(CTX, &o, 5, clean.ap, in_place ? NULL : clean.qp, clean.rp,
                              NULL));
      osft_status_t st[5];
      assert_status(
          osft_qr_batch(CTX, &o, 5, dirty.ap, in_place ? NULL : dirty.qp, dirty.rp, st),
          OSFT_STATUS_NUMERICAL_ERROR);
      assert_error_mentions("a[1]");
      assert_error_mentions("contains NaN or Inf");
      assert_error_mentions("2 of 5");
      for (int i = 0; i < 5; ++i) {
        const int failed = i == 1 || i == 3;
        assert_int_equal(st[i],
                         failed ? OSFT_STATUS_NUMERICAL_ERROR : OSFT_STATUS_SUCCESS);
        if (failed) {
          assert_true(same(&before.a[i], dirty.a[i]));
          assert_true(same(&before.q[i], dirty.q[i]));
          assert_true(same(&before.r[i], dirty.r[i]));
          continue;
        }
        const tt *out = in_place ? dirty.a[i] : dirty.q[i];
        snap want = take(in_place ? clean.a[i] : clean.q[i]), want_r = take(clean.r[i]);
        if (!same(&want, out) || !same(&want_r, dirty.r[i]))
          fail_msg("entry %d is not bit-identical to the clean run", i);
        free(want.bytes);
        free(want_r.bytes);
      }
      list_snap_free(&dirty, &before);
      list_free(&clean);
      list_free(&dirty);
    }
}

/* Finite input whose column norms overflow fp32: that matrix fails as
 * "overflowed", with nothing written. */
static void test_overflow_is_reported(void **state) {
  test_seed("overflow");
  const spec s[2] = {{TT_F32, 8, 4, 0}, {TT_F32, 8, 4, 0}};
  list L;
  list_make(&L, 2, s, NULL, NULL);
  double v[32];
  for (int i = 0; i < 32; ++i) v[i] = (test_uniform(0, 1) < 0.5 ? -3e38 : 3e38);
  tt_set(L.a[1], v);
  for (int mi = 0; mi < 2; ++mi) {
    list_snap before;
    list_take(&L, &before);
    const osft_qr_options_t o = options(kMethods[mi]);
    osft_status_t st[2];
    assert_status(osft_qr_batch(CTX, &o, 2, L.ap, L.qp, L.rp, st),
                  OSFT_STATUS_NUMERICAL_ERROR);
    assert_error_mentions("a[1]: the factorization overflowed");
    assert_int_equal(st[0], OSFT_STATUS_SUCCESS);
    assert_int_equal(st[1], OSFT_STATUS_NUMERICAL_ERROR);
    assert_true(same(&before.q[1], L.q[1]) && same(&before.r[1], L.r[1]));
    list_snap_free(&L, &before);
  }
  list_free(&L);
}

/* Exactly rank-deficient matrices (a zero column, two equal columns, all
 * zero): their own error; with the check off, an orthonormal Q, Q R = A. */
static void test_rank_deficient(void **state) {
  test_seed("rank");
  const spec s[4] = {
      {TT_F64, 20, 8, 0}, {TT_F64, 20, 8, 0}, {TT_F32, 200, 130, 0}, {TT_F32, 6, 6, 0}};
  list L;
  list_make(&L, 4, s, NULL, NULL);
  double *v = tt_get(L.a[1]);
  for (int64_t i = 0; i < 20; ++i) v[i * 8 + 3] = 0.0; /* a zero column */
  tt_set(L.a[1], v);
  free(v);
  v = tt_get(L.a[2]);
  for (int64_t i = 0; i < 200; ++i) v[i * 130 + 5] = v[i * 130 + 2]; /* equal columns */
  tt_set(L.a[2], v);
  free(v);
  v = zeros(36);
  tt_set(L.a[3], v);
  free(v);
  for (int mi = 0; mi < 2; ++mi) {
    list_snap before;
    list_take(&L, &before);
    osft_qr_options_t o = options(kMethods[mi]);
    osft_status_t st[4];
    assert_status(osft_qr_batch(CTX, &o, 4, L.ap, L.qp, L.rp, st),
                  OSFT_STATUS_NUMERICAL_ERROR);
    assert_error_mentions("a[1]");
    assert_error_mentions("rank-deficient");
    assert_error_mentions("3 of 4");
    assert_int_equal(st[0], OSFT_STATUS_SUCCESS);
    for (int i = 1; i < 4; ++i) {
      assert_int_equal(st[i], OSFT_STATUS_NUMERICAL_ERROR);
      assert_true(same(&before.q[i], L.q[i]) && same(&before.r[i], L.r[i]));
    }
    double *a = tt_get(L.a[0]);
    expect_entry(&L, 0, L.q[0], a);
    free(a);
    o.rank_tolerance = -1.0;
    assert_ok(osft_qr_batch(CTX, &o, 3, L.ap, L.qp, L.rp, st));
    for (int i = 1; i < 3; ++i) {
      double *ai = tt_get(L.a[i]), *q = tt_get(L.q[i]), *r = tt_get(L.r[i]);
      expect_qr("rank-deficient, check off", ai, q, r, L.s[i].m, L.s[i].n, L.s[i].dtype,
                1e30);
      free(ai);
      free(q);
      free(r);
    }
    list_snap_free(&L, &before);
  }
  list_free(&L);
}

/* Results do not depend on the number of workers (bitwise from 2 workers
 * on, where every QR runs single-threaded), and a workspace limit makes
 * the call use fewer workers instead of failing. */
static void test_concurrency_and_workspace_limit(void **state) {
  (void)state;
  /* On CUDA too big for the batched kernel: all on streams. */
  const int64_t big = tt_device() == OSFT_DEVICE_CUDA ? 180 : 0;
  spec s[12];
  for (int i = 0; i < 12; ++i)
    s[i] = (spec){i % 3 == 0 ? TT_F64 : TT_F32, big + 20 + 7 * i, big + 10 + 3 * i, 0};
  snap ref[12];
  size_t workspace_two = 0;
  const int workers[3] = {2, 5, 1};
  for (int w = 0; w < 3; ++w) {
    test_seed("concurrency");
    list L;
    list_make(&L, 12, s, NULL, NULL);
    osft_context_t ctx = tt_context(NULL);
    osft_qr_options_t o = options(OSFT_QR_HOUSEHOLDER);
    o.max_concurrency = workers[w];
    assert_ok(osft_qr_batch(ctx, &o, 12, L.ap, L.qp, L.rp, NULL));
    if (w == 0) assert_ok(osft_context_get_workspace_size(ctx, &workspace_two));
    for (int i = 0; i < 12; ++i) {
      if (w == 0) {
        ref[i] = take(L.q[i]);
      } else if (w == 1 || tt_device() == OSFT_DEVICE_CUDA) {
        assert_true(same(&ref[i], L.q[i]));
      } else {
        double *a = tt_get(L.a[i]);
        expect_entry(&L, i, L.q[i], a);
        free(a);
      }
    }
    assert_ok(osft_context_destroy(ctx));
    list_free(&L);
  }
  /* Two workers' scratch does not fit: one worker runs everything. */
  test_seed("concurrency");
  list L;
  list_make(&L, 12, s, NULL, NULL);
  osft_context_options_t co;
  assert_ok(OSFT_CONTEXT_OPTIONS_INIT(&co));
  co.workspace_limit = workspace_two - 1;
  osft_context_t ctx = tt_context(&co);
  osft_qr_options_t o = options(OSFT_QR_HOUSEHOLDER);
  o.max_concurrency = 2;
  log_capture cap;
  log_start(&cap);
  const osft_status_t status = osft_qr_batch(ctx, &o, 12, L.ap, L.qp, L.rp, NULL);
  log_stop();
  assert_int_equal(status, OSFT_STATUS_SUCCESS);
  if (!strstr(cap.last_plan, "on 1 lane(s)")) fail_msg("plan: %s", cap.last_plan);
  for (int i = 0; i < 12; ++i) {
    double *a = tt_get(L.a[i]);
    expect_entry(&L, i, L.q[i], a);
    free(a);
    free(ref[i].bytes);
  }
  assert_ok(osft_context_destroy(ctx));
  /* Not even one worker fits: out of memory, nothing written. */
  co.workspace_limit = 4096;
  ctx = tt_context(&co);
  for (int i = 0; i < 12; ++i) tt_poison(L.q[i]);
  list_snap before;
  list_take(&L, &before);
  osft_status_t st[12];
  for (int i = 0; i < 12; ++i) st[i] = (osft_status_t)-1;
  assert_status(osft_qr_batch(ctx, &o, 12, L.ap, L.qp, L.rp, st),
                OSFT_STATUS_OUT_OF_MEMORY);
  list_expect_same(&L, &before, "out of memory");
  for (int i = 0; i < 12; ++i) assert_int_equal(st[i], (osft_status_t)-1);
  list_snap_free(&L, &before);
  assert_ok(osft_context_destroy(ctx));
  list_free(&L);
}

/* ------------------------------------------------------- power iteration */

/* A symmetric positive definite m x m with eigenvalues in [1, 5]. */
static double *spd(int64_t m) {
  double *u = random_orthonormal(m, m), *a = zeros(m * m);
  for (int64_t k = 0; k < m; ++k) {
    const double lambda = 1.0 + 4.0 * test_uniform(0, 1);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < m; ++j)
        a[i * m + j] += u[i * m + k] * lambda * u[j * m + k];
  }
  free(u);
  return a;
}

static double *matmul(const double *a, const double *b, int64_t m, int64_t k, int64_t n) {
  double *c = zeros(m * n);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t t = 0; t < k; ++t)
      for (int64_t j = 0; j < n; ++j) c[i * n + j] += a[i * k + t] * b[t * n + j];
  return c;
}

typedef struct {
  tt_dtype dtype;
  int64_t m, n, lda;
} pair_spec;

/* On CUDA the last two run on cuSOLVER streams, the others in the batched
 * kernel. */
static const pair_spec kPairs[] = {{TT_F64, 24, 24, 0},     {TT_F64, 40, 16, 45},
                                   {TT_F64, 9, 3, 0},       {TT_F32, 32, 32, 0},
                                   {TT_F32, 20, 5, 21},     {TT_F32, 1, 1, 0},
                                   {TT_F32, 160, 160, 170}, {TT_F64, 130, 100, 0}};
#define N_PAIRS ((int)(sizeof kPairs / sizeof kPairs[0]))

typedef struct {
  tt *a[N_PAIRS], *q[N_PAIRS];
  const DLTensor *ap[N_PAIRS];
  DLTensor *qp[N_PAIRS];
} pairs;

static void pairs_make(pairs *P) {
  for (int i = 0; i < N_PAIRS; ++i) {
    const pair_spec *s = &kPairs[i];
    P->a[i] = new_mat(s->dtype, s->m, s->m, s->lda);
    tt_poison(P->a[i]);
    double *a = spd(s->m);
    tt_set(P->a[i], a);
    free(a);
    P->q[i] = new_mat(s->dtype, s->m, s->n, 0);
    double *q = conditioned(s->m, s->n, 3.0);
    tt_set(P->q[i], q);
    free(q);
    P->ap[i] = &P->a[i]->t;
    P->qp[i] = &P->q[i]->t;
  }
}

static void pairs_free(pairs *P) {
  for (int i = 0; i < N_PAIRS; ++i) {
    tt_free(P->a[i]);
    tt_free(P->q[i]);
  }
}

/* The fused call equals a loop of separate QRs of A Q (products formed
 * here and rounded to the dtype), and a float64 power iteration. */
static void test_power_iteration_matches_loop(void **state) {
  const int iters = 3;
  for (int mi = 0; mi < 2; ++mi) {
    test_seed("power");
    pairs fused, loop;
    pairs_make(&fused);
    test_seed("power");
    pairs_make(&loop);
    double *start[N_PAIRS];
    for (int i = 0; i < N_PAIRS; ++i) start[i] = tt_get(fused.q[i]);
    const osft_qr_options_t o = options(kMethods[mi]);
    osft_status_t st[N_PAIRS];
    assert_ok(osft_qr_power_iteration(CTX, &o, N_PAIRS, fused.ap, fused.qp, iters, st));
    for (int it = 0; it < iters; ++it) {
      tt *prod[N_PAIRS];
      const DLTensor *pp[N_PAIRS];
      for (int i = 0; i < N_PAIRS; ++i) {
        const pair_spec *s = &kPairs[i];
        double *a = tt_get(loop.a[i]), *q = tt_get(loop.q[i]);
        double *p = matmul(a, q, s->m, s->m, s->n);
        prod[i] = new_mat(s->dtype, s->m, s->n, 0);
        tt_set(prod[i], p);
        pp[i] = &prod[i]->t;
        free(a);
        free(q);
        free(p);
      }
      assert_ok(osft_qr_batch(CTX, &o, N_PAIRS, pp, loop.qp, NULL, NULL));
      for (int i = 0; i < N_PAIRS; ++i) tt_free(prod[i]);
    }
    for (int i = 0; i < N_PAIRS; ++i) {
      const pair_spec *s = &kPairs[i];
      assert_int_equal(st[i], OSFT_STATUS_SUCCESS);
      const double tol = 200.0 * (double)s->m * eps_of(s->dtype);
      double *got = tt_get(fused.q[i]), *want = tt_get(loop.q[i]);
      double err = rel_max_err(got, want, (size_t)(s->m * s->n), 1.0);
      if (!(err <= tol)) fail_msg("pair %d: fused vs loop %.3g > %.3g", i, err, tol);
      /* float64 power iteration from the same start */
      double *a = tt_get(fused.a[i]), *q = start[i];
      for (int it = 0; it < iters; ++it) {
        double *p = matmul(a, q, s->m, s->m, s->n);
        ref_qr(p, s->m, s->n, q, NULL);
        free(p);
      }
      err = rel_max_err(got, q, (size_t)(s->m * s->n), 1.0);
      if (!(err <= tol)) fail_msg("pair %d: fused vs float64 %.3g > %.3g", i, err, tol);
      free(a);
      free(q);
      free(got);
      free(want);
    }
    pairs_free(&fused);
    pairs_free(&loop);
  }
}

/* A NaN in one A, an Inf in another, an all-zero A (rank-deficient
 * product): those pairs fail with Q untouched, the others are
 * bit-identical to a clean run. */
static void test_power_iteration_failures(void **state) {
  for (int mi = 0; mi < 2; ++mi) {
    test_seed("power_fail");
    pairs clean, dirty;
    pairs_make(&clean);
    test_seed("power_fail");
    pairs_make(&dirty);
    double *v = tt_get(dirty.a[1]);
    v[5] = NAN;
    tt_set(dirty.a[1], v);
    free(v);
    v = zeros(32 * 32);
    tt_set(dirty.a[3], v);
    free(v);
    v = tt_get(dirty.a[6]);
    v[100] = INFINITY;
    tt_set(dirty.a[6], v);
    free(v);
    snap before[N_PAIRS];
    for (int i = 0; i < N_PAIRS; ++i) before[i] = take(dirty.q[i]);
    const osft_qr_options_t o = options(kMethods[mi]);
    assert_ok(osft_qr_power_iteration(CTX, &o, N_PAIRS, clean.ap, clean.qp, 2, NULL));
    osft_status_t st[N_PAIRS];
    assert_status(osft_qr_power_iteration(CTX, &o, N_PAIRS, dirty.ap, dirty.qp, 2, st),
                  OSFT_STATUS_NUMERICAL_ERROR);
    assert_error_mentions("pair 1");
    assert_error_mentions("contains NaN or Inf");
    for (int i = 0; i < N_PAIRS; ++i) {
      const int failed = i == 1 || i == 3 || i == 6;
      assert_int_equal(st[i], failed ? OSFT_STATUS_NUMERICAL_ERROR : OSFT_STATUS_SUCCESS);
      if (failed) {
        assert_true(same(&before[i], dirty.q[i]));
      } else {
        snap want = take(clean.q[i]);
        assert_true(same(&want, dirty.q[i]));
        free(want.bytes);
      }
      free(before[i].bytes);
    }
    pairs_free(&clean);
    pairs_free(&dirty);
  }
}

/* ----------------------------------------------------------------- errors */

/* Runs `call`, expects `status` and a message naming `needle`, and checks
 * that no tensor of L (inputs, outputs) and no status changed. */
#define EXPECT_REJECTED(L, st, call, status, needle)                                   \
  do {                                                                                 \
    list_snap s_;                                                                      \
    list_take((L), &s_);                                                               \
    for (int i_ = 0; i_ < (L)->n; ++i_) (st)[i_] = (osft_status_t)-1;                  \
    assert_status((call), (status));                                                   \
    assert_error_mentions(needle);                                                     \
    list_expect_same((L), &s_, needle);                                                \
    for (int i_ = 0; i_ < (L)->n; ++i_) assert_int_equal((st)[i_], (osft_status_t)-1); \
    list_snap_free((L), &s_);                                                          \
  } while (0)

static DLTensor other_device(const DLTensor *t) {
  DLTensor x = *t;
  x.device.device_type = tt_device() == OSFT_DEVICE_CPU ? kDLCUDA : kDLCPU;
  return x;
}

static void test_list_errors_write_nothing(void **state) {
  test_seed("errors");
  const spec s[3] = {{TT_F32, 12, 8, 0}, {TT_F32, 10, 6, 0}, {TT_F32, 10, 6, 0}};
  list L;
  list_make(&L, 3, s, NULL, NULL);
  osft_status_t st[3];
  const osft_qr_options_t o = options(OSFT_QR_HOUSEHOLDER);
  const DLTensor *a[3];
  DLTensor *q[3], *r[3];
#define RESET()                      \
  do {                               \
    for (int i_ = 0; i_ < 3; ++i_) { \
      a[i_] = L.ap[i_];              \
      q[i_] = L.qp[i_];              \
      r[i_] = L.rp[i_];              \
    }                                \
  } while (0)
  RESET();
/* The call with the current a, q, r must fail; then the arrays are reset. */
#define REJECTED(opts, qs, status, needle)                                           \
  do {                                                                               \
    EXPECT_REJECTED(&L, st, osft_qr_batch(CTX, (opts), 3, a, (qs), r, st), (status), \
                    (needle));                                                       \
    RESET();                                                                         \
  } while (0)
  EXPECT_REJECTED(&L, st, osft_qr_batch(NULL, &o, 3, a, q, r, st),
                  OSFT_STATUS_INVALID_HANDLE, "ctx");
  EXPECT_REJECTED(&L, st, osft_qr_batch(CTX, &o, 3, NULL, q, r, st),
                  OSFT_STATUS_INVALID_ARGUMENT, "a: NULL");
  a[1] = NULL;
  REJECTED(&o, q, OSFT_STATUS_INVALID_ARGUMENT, "a[1]");
  q[2] = NULL;
  REJECTED(&o, q, OSFT_STATUS_INVALID_ARGUMENT, "q[2]");
  /* m < n */
  DLTensor wide = *a[1];
  int64_t wide_shape[2] = {6, 10};
  wide.shape = wide_shape;
  a[1] = &wide;
  REJECTED(&o, q, OSFT_STATUS_SHAPE_MISMATCH, "a[1]");
  /* rank 3 */
  DLTensor cube = *a[0];
  int64_t cube_shape[3] = {2, 6, 8};
  cube.ndim = 3;
  cube.shape = cube_shape;
  a[0] = &cube;
  REJECTED(&o, q, OSFT_STATUS_SHAPE_MISMATCH, "a[0]");
  /* bf16 */
  DLTensor half = *a[2];
  half.dtype.code = kDLBfloat;
  half.dtype.bits = 16;
  a[2] = &half;
  REJECTED(&o, q, OSFT_STATUS_DTYPE_MISMATCH, "a[2]");
  /* q of another dtype, of another shape; r of another shape */
  tt *q64 = new_mat(TT_F64, 12, 8, 0), *q_bad = new_mat(TT_F32, 10, 5, 0);
  tt *r_bad = new_mat(TT_F32, 5, 6, 0);
  q[0] = &q64->t;
  REJECTED(&o, q, OSFT_STATUS_DTYPE_MISMATCH, "q[0]");
  q[1] = &q_bad->t;
  REJECTED(&o, q, OSFT_STATUS_SHAPE_MISMATCH, "q[1]");
  r[2] = &r_bad->t;
  REJECTED(&o, q, OSFT_STATUS_SHAPE_MISMATCH, "r[2]");
  /* another device */
  DLTensor elsewhere = other_device(a[2]);
  a[2] = &elsewhere;
  REJECTED(&o, q, OSFT_STATUS_DEVICE_MISMATCH, "a[2]");
  DLTensor q_elsewhere = other_device(q[1]);
  q[1] = &q_elsewhere;
  REJECTED(&o, q, OSFT_STATUS_DEVICE_MISMATCH, "q[1]");
  /* column-major strides */
  DLTensor colmajor = *a[0];
  int64_t cm_strides[2] = {1, 12};
  colmajor.strides = cm_strides;
  a[0] = &colmajor;
  REJECTED(&o, q, OSFT_STATUS_BAD_LAYOUT, "a[0]");
  /* two outputs on the same memory; an output over another's input; an
   * output shifted one row against its own input; r over q */
  q[2] = q[1];
  REJECTED(&o, q, OSFT_STATUS_ALIASING, "q[1]");
  DLTensor over_a2 = *L.ap[2];
  q[1] = &over_a2;
  REJECTED(&o, q, OSFT_STATUS_ALIASING, "a[2]");
  DLTensor shifted = *L.ap[0];
  shifted.byte_offset += 8 * sizeof(float);
  q[0] = &shifted;
  REJECTED(&o, q, OSFT_STATUS_ALIASING, "q[0]");
  DLTensor r_over_q = *q[0];
  int64_t r_shape[2] = {8, 8};
  r_over_q.shape = r_shape;
  r[0] = &r_over_q;
  REJECTED(&o, q, OSFT_STATUS_ALIASING, "r[0]");
  a[2] = a[1]; /* in place: the same matrix twice is two writes to it */
  REJECTED(&o, NULL, OSFT_STATUS_ALIASING, "a[1]");
  /* options */
  osft_qr_options_t bad = o;
  bad.struct_size = 4;
  REJECTED(&bad, q, OSFT_STATUS_INVALID_STRUCT_SIZE, "opts");
  bad = o;
  memset(&bad.method, 0x7f, sizeof bad.method);
  REJECTED(&bad, q, OSFT_STATUS_INVALID_ARGUMENT, "opts->method");
  bad = o;
  bad.orthogonality_threshold = -1.0;
  REJECTED(&bad, q, OSFT_STATUS_INVALID_ARGUMENT, "opts->orthogonality_threshold");
  bad = o;
  bad.rank_tolerance = NAN;
  REJECTED(&bad, q, OSFT_STATUS_INVALID_ARGUMENT, "opts->rank_tolerance");
  bad = o;
  bad.max_concurrency = -2;
  REJECTED(&bad, q, OSFT_STATUS_INVALID_ARGUMENT, "opts->max_concurrency");
  /* count 0 needs no arrays; then a valid call works */
  assert_ok(osft_qr_batch(CTX, NULL, 0, NULL, NULL, NULL, NULL));
  assert_ok(osft_qr_batch(CTX, NULL, 3, a, q, r, st));
  tt_free(q64);
  tt_free(q_bad);
  tt_free(r_bad);
  list_free(&L);
#undef RESET
#undef REJECTED
}

static void test_power_iteration_errors(void **state) {
  test_seed("power_errors");
  const spec s[3] = {{TT_F32, 8, 8, 0}, {TT_F32, 8, 8, 0}, {TT_F64, 6, 6, 0}};
  list L; /* a: the square factors; q: starting Qs (made from a below) */
  list_make(&L, 3, s, NULL, NULL);
  for (int i = 0; i < 3; ++i) {
    double *v = tt_get(L.a[i]);
    tt_set(L.q[i], v);
    free(v);
  }
  osft_status_t st[3];
  const osft_qr_options_t o = options(OSFT_QR_HOUSEHOLDER);
  EXPECT_REJECTED(&L, st, osft_qr_power_iteration(CTX, &o, 3, L.ap, L.qp, 0, st),
                  OSFT_STATUS_INVALID_ARGUMENT, "iterations");
  EXPECT_REJECTED(&L, st, osft_qr_power_iteration(CTX, &o, 3, L.ap, NULL, 1, st),
                  OSFT_STATUS_INVALID_ARGUMENT, "q: NULL");
  tt *rect = new_mat(TT_F32, 8, 5, 0), *tall = new_mat(TT_F64, 7, 6, 0);
  tt_random(rect, -1, 1);
  const DLTensor *a[3] = {L.ap[0], &rect->t, L.ap[2]};
  EXPECT_REJECTED(&L, st, osft_qr_power_iteration(CTX, &o, 3, a, L.qp, 1, st),
                  OSFT_STATUS_SHAPE_MISMATCH, "a[1]");
  DLTensor *q[3] = {L.qp[0], L.qp[1], &tall->t};
  EXPECT_REJECTED(&L, st, osft_qr_power_iteration(CTX, &o, 3, L.ap, q, 1, st),
                  OSFT_STATUS_SHAPE_MISMATCH, "q[2]");
  DLTensor q_over_a = *L.ap[0];
  q[2] = L.qp[2];
  q[1] = &q_over_a; /* Q_1 over A_0 */
  EXPECT_REJECTED(&L, st, osft_qr_power_iteration(CTX, &o, 3, L.ap, q, 1, st),
                  OSFT_STATUS_ALIASING, "a[0]");
  assert_ok(osft_qr_power_iteration(CTX, &o, 3, L.ap, L.qp, 1, st));
  tt_free(rect);
  tt_free(tall);
  list_free(&L);
}

/* Every byte from the context's allocator comes back, failures included. */
static void test_memory_is_returned(void **state) {
  (void)state;
  test_alloc_state st;
  test_alloc_reset(&st);
  osft_allocator_t cb;
  test_alloc_callbacks(&cb, &st, 0);
  osft_context_options_t o;
  assert_ok(OSFT_CONTEXT_OPTIONS_INIT(&o));
  if (tt_device() == OSFT_DEVICE_CPU) o.allocator = &cb;
  osft_context_t ctx = tt_context(&o);
  test_seed("memory");
  list L;
  list_make(&L, 4, kMixed, NULL, kWantR);
  double *v = tt_get(L.a[2]);
  v[0] = NAN;
  tt_set(L.a[2], v);
  free(v);
  for (int mi = 0; mi < 2; ++mi) {
    const osft_qr_options_t qo = options(kMethods[mi]);
    assert_status(osft_qr_batch(ctx, &qo, 4, L.ap, L.qp, L.rp, NULL),
                  OSFT_STATUS_NUMERICAL_ERROR);
  }
  assert_ok(osft_context_destroy(ctx));
  if (tt_device() == OSFT_DEVICE_CPU) {
    assert_true(st.host_allocs > 0);
    assert_int_equal(st.host_allocs, st.host_frees);
    assert_int_equal(st.host_bytes_live, 0);
    assert_false(st.size_mismatch);
  }
  list_free(&L);
}

int main(void) {
  if (!tt_device_present()) return OSFT_TEST_SKIP;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_options_init),
      cmocka_unit_test_setup_teardown(test_mixed_shapes_out_of_place, setup, teardown),
      cmocka_unit_test_setup_teardown(test_empty_matrices, setup, teardown),
      cmocka_unit_test_setup_teardown(test_in_place, setup, teardown),
      cmocka_unit_test_setup_teardown(test_condition_numbers, setup, teardown),
      cmocka_unit_test_setup_teardown(test_near_singular_fp32, setup, teardown),
      cmocka_unit_test_setup_teardown(test_nonfinite_spares_the_rest, setup, teardown),
      cmocka_unit_test_setup_teardown(test_overflow_is_reported, setup, teardown),
      cmocka_unit_test_setup_teardown(test_rank_deficient, setup, teardown),
      cmocka_unit_test(test_concurrency_and_workspace_limit),
      cmocka_unit_test_setup_teardown(test_power_iteration_matches_loop, setup, teardown),
      cmocka_unit_test_setup_teardown(test_power_iteration_failures, setup, teardown),
      cmocka_unit_test_setup_teardown(test_list_errors_write_nothing, setup, teardown),
      cmocka_unit_test_setup_teardown(test_power_iteration_errors, setup, teardown),
      cmocka_unit_test(test_memory_is_returned),
  };
  return cmocka_run_group_tests_name("qr", tests, NULL, NULL);
}
