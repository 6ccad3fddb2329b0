/* Float64 references for the projection tests (the CMocka test in
 * tests/c/test_projection.c and the MPI programs here): random orthonormal
 * bases and the OSFT projections written as plain loops, never through
 * libosftrt. Header-only, C11. */
#ifndef OSFTRT_TESTS_PROJECTION_REF_H
#define OSFTRT_TESTS_PROJECTION_REF_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* A deterministic generator: every rank of an MPI test draws the same
 * numbers from the same seed, so all ranks know the full matrices. */
typedef struct {
  uint64_t s;
} ref_rng;

static inline double ref_uniform(ref_rng *g, double lo, double hi) {
  g->s ^= g->s << 13;
  g->s ^= g->s >> 7;
  g->s ^= g->s << 17;
  return lo + (hi - lo) * ((double)(g->s >> 11) / 9007199254740992.0);
}

static inline double *ref_alloc(int64_t n) {
  double *p = calloc((size_t)(n > 0 ? n : 1), sizeof(double));
  if (p == NULL) abort();
  return p;
}

static inline double *ref_random(ref_rng *g, int64_t n, double lo, double hi) {
  double *p = ref_alloc(n);
  for (int64_t i = 0; i < n; ++i) p[i] = ref_uniform(g, lo, hi);
  return p;
}

/* A rows x cols matrix (rows >= cols) with orthonormal columns: modified
 * Gram-Schmidt, run twice for full accuracy. */
static inline double *ref_orthonormal_cols(ref_rng *g, int64_t rows, int64_t cols) {
  double *a = ref_random(g, rows * cols, -1, 1);
  for (int pass = 0; pass < 2; ++pass)
    for (int64_t j = 0; j < cols; ++j) {
      for (int64_t p = 0; p < j; ++p) {
        double dot = 0;
        for (int64_t i = 0; i < rows; ++i) dot += a[i * cols + p] * a[i * cols + j];
        for (int64_t i = 0; i < rows; ++i) a[i * cols + j] -= dot * a[i * cols + p];
      }
      double norm = 0;
      for (int64_t i = 0; i < rows; ++i) norm += a[i * cols + j] * a[i * cols + j];
      norm = sqrt(norm);
      for (int64_t i = 0; i < rows; ++i) a[i * cols + j] /= norm;
    }
  return a;
}

/* The transpose of a rows x cols matrix. */
static inline double *ref_transpose(const double *a, int64_t rows, int64_t cols) {
  double *t = ref_alloc(rows * cols);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) t[j * rows + i] = a[i * cols + j];
  return t;
}

/* Columns [c0, c0 + n) of a rows x cols matrix, compact. */
static inline double *ref_cols(const double *a, int64_t rows, int64_t cols, int64_t c0,
                               int64_t n) {
  double *out = ref_alloc(rows * n);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < n; ++j) out[i * n + j] = a[i * cols + c0 + j];
  return out;
}

/* Rows [r0, r0 + n) and columns [c0, c0 + m) of a matrix with `cols`
 * columns, compact. */
static inline double *ref_block(const double *a, int64_t cols, int64_t r0, int64_t n,
                                int64_t c0, int64_t m) {
  double *out = ref_alloc(n * m);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < m; ++j) out[i * m + j] = a[(r0 + i) * cols + c0 + j];
  return out;
}

/* x (n x l) -= uh (n x r) C with C = uh^T x, each element of C passed
 * through round_c first (NULL: kept; e.g. rounded to bf16, as an update
 * arithmetic that rounds C does). */
static inline void ref_project_u_rounded(const double *uh, int64_t n, int64_t r,
                                         double *x, int64_t l,
                                         double (*round_c)(double)) {
  double *c = ref_alloc(r * l);
  for (int64_t a = 0; a < r; ++a)
    for (int64_t b = 0; b < l; ++b) {
      for (int64_t i = 0; i < n; ++i) c[a * l + b] += uh[i * r + a] * x[i * l + b];
      if (round_c) c[a * l + b] = round_c(c[a * l + b]);
    }
  for (int64_t i = 0; i < n; ++i)
    for (int64_t b = 0; b < l; ++b) {
      double s = 0;
      for (int64_t a = 0; a < r; ++a) s += uh[i * r + a] * c[a * l + b];
      x[i * l + b] -= s;
    }
  free(c);
}

/* x (n x l) -= uh (n x r) (uh^T x). */
static inline void ref_project_u(const double *uh, int64_t n, int64_t r, double *x,
                                 int64_t l) {
  ref_project_u_rounded(uh, n, r, x, l, NULL);
}

/* x (l x k) -= C vh with C = x vh^T (vh r x k), rounded by round_c. */
static inline void ref_project_v_rounded(const double *vh, int64_t r, int64_t k,
                                         double *x, int64_t l,
                                         double (*round_c)(double)) {
  double *c = ref_alloc(l * r);
  for (int64_t b = 0; b < l; ++b)
    for (int64_t a = 0; a < r; ++a) {
      for (int64_t j = 0; j < k; ++j) c[b * r + a] += x[b * k + j] * vh[a * k + j];
      if (round_c) c[b * r + a] = round_c(c[b * r + a]);
    }
  for (int64_t b = 0; b < l; ++b)
    for (int64_t j = 0; j < k; ++j) {
      double s = 0;
      for (int64_t a = 0; a < r; ++a) s += c[b * r + a] * vh[a * k + j];
      x[b * k + j] -= s;
    }
  free(c);
}

/* x (l x k) -= (x vh^T) vh, vh r x k. */
static inline void ref_project_v(const double *vh, int64_t r, int64_t k, double *x,
                                 int64_t l) {
  ref_project_v_rounded(vh, r, k, x, l, NULL);
}

/* max |uh^T x| (uh n x r, x n x l). */
static inline double ref_max_u(const double *uh, int64_t n, int64_t r, const double *x,
                               int64_t l) {
  double best = 0;
  for (int64_t a = 0; a < r; ++a)
    for (int64_t b = 0; b < l; ++b) {
      double s = 0;
      for (int64_t i = 0; i < n; ++i) s += uh[i * r + a] * x[i * l + b];
      if (fabs(s) > best) best = fabs(s);
    }
  return best;
}

/* max |x vh^T| (x l x k, vh r x k). */
static inline double ref_max_v(const double *vh, int64_t r, int64_t k, const double *x,
                               int64_t l) {
  double best = 0;
  for (int64_t b = 0; b < l; ++b)
    for (int64_t a = 0; a < r; ++a) {
      double s = 0;
      for (int64_t j = 0; j < k; ++j) s += x[b * k + j] * vh[a * k + j];
      if (fabs(s) > best) best = fabs(s);
    }
  return best;
}

/* A seed from a name (FNV-1a), so each test draws its own numbers. */
static inline ref_rng ref_seed(const char *name) {
  uint64_t h = 1469598103934665603ull;
  for (const char *c = name; *c; ++c) h = (h ^ (uint8_t)*c) * 1099511628211ull;
  ref_rng g = {h ? h : 1};
  return g;
}

/* One target's full matrices: orthonormal U = [uh ul] (n x (r + l)) and
 * V = [vh; vl] ((r + l) x k, rows orthonormal), random gradients gu
 * (n x l) and gv (l x k). */
typedef struct {
  int64_t n, k, r, l;
  double *uh, *ul, *vh, *vl, *gu, *gv;
} ref_problem;

static inline ref_problem ref_problem_make(const char *seed, int64_t n, int64_t k,
                                           int64_t r, int64_t l) {
  ref_rng g = ref_seed(seed);
  ref_problem P = {n, k, r, l, NULL, NULL, NULL, NULL, NULL, NULL};
  double *u = ref_orthonormal_cols(&g, n, r + l);
  double *vt = ref_orthonormal_cols(&g, k, r + l); /* V^T: k x (r + l) */
  double *v = ref_transpose(vt, k, r + l);
  P.uh = ref_cols(u, n, r + l, 0, r);
  P.ul = ref_cols(u, n, r + l, r, l);
  P.vh = ref_block(v, k, 0, r, 0, k);
  P.vl = ref_block(v, k, r, l, 0, k);
  P.gu = ref_random(&g, n * l, -1, 1);
  P.gv = ref_random(&g, l * k, -1, 1);
  free(u);
  free(vt);
  free(v);
  return P;
}

/* Moves the trainable factors off the orthogonal complement, so that the
 * parameter projection and the orthogonality query have work to do. */
static inline void ref_problem_perturb(ref_problem *P, double scale) {
  for (int64_t i = 0; i < P->n * P->l; ++i) P->ul[i] += scale * P->gu[i];
  for (int64_t i = 0; i < P->l * P->k; ++i) P->vl[i] += scale * P->gv[i];
}

static inline void ref_problem_free(ref_problem *P) {
  free(P->uh);
  free(P->ul);
  free(P->vh);
  free(P->vl);
  free(P->gu);
  free(P->gv);
}

/* max |a - b| / max(max |b|, floor). */
static inline double ref_rel_err(const double *a, const double *b, int64_t n,
                                 double floor) {
  double diff = 0, scale = floor;
  for (int64_t i = 0; i < n; ++i) {
    const double d = fabs(a[i] - b[i]);
    if (!(d <= diff)) diff = d;
    if (fabs(b[i]) > scale) scale = fabs(b[i]);
  }
  return diff / scale;
}

#endif
