#include "qr_testlib.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_tensors.h"
#include "test_util.h"

const osft_qr_method_t kMethods[N_QR_METHODS] = {
    OSFT_QR_HOUSEHOLDER, OSFT_QR_CHOLESKY_QR2, OSFT_QR_CHOLESKY_TF32};

double eps_of(tt_dtype d) {
  return d == TT_F64 ? 2.220446049250313e-16 : 1.1920928955078125e-07;
}

double *zeros(int64_t n) {
  return calloc((size_t)(n > 0 ? n : 1), sizeof(double));
}

/* The columns of the row-major m x n a, each contiguous (n x m). */
static double *columns(const double *a, int64_t m, int64_t n) {
  double *c = zeros(m * n);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) c[j * m + i] = a[i * n + j];
  return c;
}

void ref_qr(const double *a, int64_t m, int64_t n, double *q, double *r) {
  double *c = columns(a, m, n); /* column j at c + j m */
  if (r) memset(r, 0, sizeof(double) * (size_t)(n * n));
  for (int64_t j = 0; j < n; ++j) {
    double *qj = c + j * m;
    for (int pass = 0; pass < 2; ++pass)
      for (int64_t k = 0; k < j; ++k) {
        const double *qk = c + k * m;
        double d = 0;
        for (int64_t i = 0; i < m; ++i) d += qk[i] * qj[i];
        for (int64_t i = 0; i < m; ++i) qj[i] -= d * qk[i];
        if (r) r[k * n + j] += d;
      }
    double nrm = 0;
    for (int64_t i = 0; i < m; ++i) nrm += qj[i] * qj[i];
    nrm = sqrt(nrm);
    for (int64_t i = 0; i < m; ++i) qj[i] /= nrm;
    if (r) r[j * n + j] = nrm;
  }
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) q[i * n + j] = c[j * m + i];
  free(c);
}

double *random_orthonormal(int64_t m, int64_t n) {
  double *g = zeros(m * n), *q = zeros(m * n);
  for (int64_t i = 0; i < m * n; ++i) g[i] = test_uniform(-1, 1);
  ref_qr(g, m, n, q, NULL);
  free(g);
  return q;
}

double *conditioned(int64_t m, int64_t n, double kappa) {
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

double *soap_like(int64_t n, double kappa) {
  const double alpha = n > 1 ? log(kappa) / log((double)n) : 0.0;
  double *u = random_orthonormal(n, n), *q = random_orthonormal(n, n), *p = zeros(n * n);
  double *ut = columns(u, n, n); /* ut[k n + j] = u[j n + k] */
  for (int64_t i = 0; i < n; ++i)
    for (int64_t k = 0; k < n; ++k) {
      const double uk = u[i * n + k] * pow(1.0 + (double)k, -alpha);
      for (int64_t j = 0; j < n; ++j) p[i * n + j] += uk * ut[k * n + j];
    }
  double *a = matmul(p, q, n, n, n);
  free(u);
  free(ut);
  free(q);
  free(p);
  return a;
}

double *matmul(const double *a, const double *b, int64_t m, int64_t k, int64_t n) {
  double *c = zeros(m * n);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t t = 0; t < k; ++t)
      for (int64_t j = 0; j < n; ++j) c[i * n + j] += a[i * k + t] * b[t * n + j];
  return c;
}

double frob(const double *x, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += x[i] * x[i];
  return sqrt(s);
}

double orthogonality(const double *q, int64_t m, int64_t n) {
  double *c = columns(q, m, n), sum = 0;
  for (int64_t p = 0; p < n; ++p)
    for (int64_t k = 0; k < n; ++k) {
      double dot = 0;
      for (int64_t i = 0; i < m; ++i) dot += c[p * m + i] * c[k * m + i];
      sum += (dot - (p == k)) * (dot - (p == k));
    }
  free(c);
  return sqrt(sum);
}

void expect_qr(const char *what, const double *a, const double *q, const double *r,
               int64_t m, int64_t n, tt_dtype d, double kappa) {
  const double tol = 30.0 * (double)(m > n ? m : n) * eps_of(d);
  const double orth = orthogonality(q, m, n);
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
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t t = 0; t < n; ++t)
      for (int64_t j = 0; j < n; ++j) res[i * n + j] += q[i * n + t] * rr[t * n + j];
    for (int64_t j = 0; j < n; ++j) res[i * n + j] -= a[i * n + j];
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

tt *new_mat(tt_dtype d, int64_t m, int64_t n, int64_t ld) {
  if (ld > 0) return tt_new_padded(d, m, n, ld);
  const int64_t shape[2] = {m, n};
  return tt_new(d, 2, shape);
}

void list_make(list *L, int n, const spec *s, const double *kappa, const int *want_r) {
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

void list_free(list *L) {
  for (int i = 0; i < L->n; ++i) {
    tt_free(L->a[i]);
    tt_free(L->q[i]);
    tt_free(L->r[i]);
  }
}

void expect_entry(const list *L, int i, const tt *qt, const double *a) {
  char what[64];
  snprintf(what, sizeof what, "entry %d (%lldx%lld %s)", i, (long long)L->s[i].m,
           (long long)L->s[i].n, L->s[i].dtype == TT_F64 ? "f64" : "f32");
  double *q = tt_get(qt);
  double *r = L->r[i] ? tt_get(L->r[i]) : NULL;
  expect_qr(what, a, q, r, L->s[i].m, L->s[i].n, L->s[i].dtype, L->kappa[i]);
  free(q);
  free(r);
}

osft_qr_options_t options(osft_qr_method_t method) {
  osft_qr_options_t o;
  assert_ok(OSFT_QR_OPTIONS_INIT(&o));
  o.method = method;
  return o;
}

snap take(const tt *t) {
  snap s = {NULL, 0};
  if (t) s.bytes = tt_bytes(t, &s.size);
  return s;
}

int same(const snap *s, const tt *t) {
  if (!t) return s->bytes == NULL;
  size_t size;
  void *now = tt_bytes(t, &size);
  const int eq = size == s->size && memcmp(now, s->bytes, size) == 0;
  free(now);
  return eq;
}

void list_take(const list *L, list_snap *S) {
  for (int i = 0; i < L->n; ++i) {
    S->a[i] = take(L->a[i]);
    S->q[i] = take(L->q[i]);
    S->r[i] = take(L->r[i]);
  }
}

void list_expect_same(const list *L, const list_snap *S, const char *what) {
  for (int i = 0; i < L->n; ++i)
    if (!same(&S->a[i], L->a[i]) || !same(&S->q[i], L->q[i]) || !same(&S->r[i], L->r[i]))
      fail_msg("%s: entry %d changed", what, i);
}

void list_snap_free(const list *L, list_snap *S) {
  for (int i = 0; i < L->n; ++i) {
    free(S->a[i].bytes);
    free(S->q[i].bytes);
    free(S->r[i].bytes);
  }
}

const spec kMixed[] = {
    {TT_F32, 5, 3, 0},    {TT_F64, 16, 16, 0},   {TT_F32, 40, 12, 15},
    {TT_F32, 64, 64, 0},  {TT_F64, 1, 1, 0},     {TT_F32, 7, 1, 0},
    {TT_F64, 130, 70, 0}, {TT_F32, 33, 33, 40},  {TT_F64, 96, 24, 30},
    {TT_F32, 130, 70, 0}, {TT_F32, 180, 150, 0}, {TT_F64, 140, 100, 110},
};

const int kWantR[N_MIXED] = {1, 0, 1, 1, 1, 0, 1, 0, 1, 1, 1, 0};

double *spd(int64_t m) {
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

const pair_spec kPairs[] = {{TT_F64, 24, 24, 0},     {TT_F64, 40, 16, 45},
                            {TT_F64, 9, 3, 0},       {TT_F32, 32, 32, 0},
                            {TT_F32, 20, 5, 21},     {TT_F32, 1, 1, 0},
                            {TT_F32, 160, 160, 170}, {TT_F64, 130, 100, 0}};

void pairs_make(pairs *P) {
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

void pairs_free(pairs *P) {
  for (int i = 0; i < N_PAIRS; ++i) {
    tt_free(P->a[i]);
    tt_free(P->q[i]);
  }
}

double pair_tol(int i) {
  return 200.0 * (double)kPairs[i].m * eps_of(kPairs[i].dtype);
}

void expect_power_steps(const pairs *P, int i, double *start, int iters,
                        const char *what) {
  const pair_spec *s = &kPairs[i];
  double *a = tt_get(P->a[i]), *got = tt_get(P->q[i]);
  for (int it = 0; it < iters; ++it) {
    double *p = matmul(a, start, s->m, s->m, s->n);
    ref_qr(p, s->m, s->n, start, NULL);
    free(p);
  }
  const double err = rel_max_err(got, start, (size_t)(s->m * s->n), 1.0);
  if (!(err <= pair_tol(i)))
    fail_msg("pair %d: %s vs float64 %.3g > %.3g", i, what, err, pair_tol(i));
  free(a);
  free(got);
}
