/* Helpers of the batched QR tests (test_qr_*.c): matrices of a chosen
 * condition number, the float64 checks of a factorization (Q R = A, Q
 * orthonormal, R upper triangular), lists of matrices with their outputs
 * and statuses, snapshots that prove a failed call wrote nothing, and a log
 * capture. */
#ifndef OSFTRT_QR_TESTLIB_H
#define OSFTRT_QR_TESTLIB_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_tensors.h"
#include "test_util.h"

#define NMAX 16 /* most matrices in one test list */

/* Every method, for the tests that run each one. */
#define N_QR_METHODS 3
extern const osft_qr_method_t kMethods[N_QR_METHODS];

/* ------------------------------------------------------- float64 helpers */

double eps_of(tt_dtype d);

double *zeros(int64_t n);

/* Modified Gram-Schmidt applied twice, in float64: the reference Q (m x n)
 * and R (n x n, may be NULL) of a full-rank a (m x n, row-major), with
 * diag(R) > 0 by construction. */
void ref_qr(const double *a, int64_t m, int64_t n, double *q, double *r);

/* A random m x n matrix with orthonormal columns. */
double *random_orthonormal(int64_t m, int64_t n);

/* A = U diag(sigma) V^T with random orthonormal U (m x n), V (n x n) and
 * singular values log-spaced from 1 down to 1 / kappa. */
double *conditioned(int64_t m, int64_t n, double kappa);

/* SOAP's input: P Q, P = U diag(lambda) U^T a symmetric positive definite
 * n x n with the power-law spectrum lambda_k = (1 + k)^-alpha (alpha such
 * that lambda_0 / lambda_{n-1} = kappa: fast decay from the top, like a
 * Kronecker factor of gradients), U and Q random orthogonal. */
double *soap_like(int64_t n, double kappa);

double frob(const double *x, int64_t n);

/* c (m x n) = a (m x k) b (k x n), row-major, malloc'ed. */
double *matmul(const double *a, const double *b, int64_t m, int64_t k, int64_t n);

/* ||Q^T Q - I||_F of the row-major m x n q, in float64. */
double orthogonality(const double *q, int64_t m, int64_t n);

/* Checks Q (and R if given) of A: ||Q^T Q - I||_F and ||Q R - A||_F / ||A||_F
 * within 30 max(m, n) eps; R upper triangular with diag(R) >= 0 (without
 * R: diag(Q^T A) > 0); Q within 20 kappa max(m, n) eps of the Gram-Schmidt
 * reference (skipped when that bound is meaningless). */
void expect_qr(const char *what, const double *a, const double *q, const double *r,
               int64_t m, int64_t n, tt_dtype d, double kappa);

/* ---------------------------------------------------------- tensor lists */

typedef struct {
  tt_dtype dtype;
  int64_t m, n, ld; /* ld 0: compact */
} spec;

tt *new_mat(tt_dtype d, int64_t m, int64_t n, int64_t ld);

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
void list_make(list *L, int n, const spec *s, const double *kappa, const int *want_r);

void list_free(list *L);

/* Checks entry i's results (Q from `qt`, which is q[i] or, in place, a[i])
 * against the input values `a`. */
void expect_entry(const list *L, int i, const tt *qt, const double *a);

osft_qr_options_t options(osft_qr_method_t method);

/* Byte snapshots, for "unchanged" and "bit-identical" checks. */
typedef struct {
  void *bytes;
  size_t size;
} snap;

snap take(const tt *t);

int same(const snap *s, const tt *t);

/* All bytes of a list: inputs, outputs. */
typedef struct {
  snap a[NMAX], q[NMAX], r[NMAX];
} list_snap;

void list_take(const list *L, list_snap *S);

void list_expect_same(const list *L, const list_snap *S, const char *what);

void list_snap_free(const list *L, list_snap *S);

/* Mixed shapes and dtypes, padded rows, R for some entries. On CUDA the
 * last two are too big for the batched kernel's shared memory and run on
 * cuSOLVER streams. */
enum { N_MIXED = 12 };
extern const spec kMixed[N_MIXED]; /* N_MIXED: its number of entries */

extern const int kWantR[N_MIXED];

/* ------------------------------------------------------- power iteration */

/* A symmetric positive definite m x m with eigenvalues in [1, 5]. */
double *spd(int64_t m);

typedef struct {
  tt_dtype dtype;
  int64_t m, n, lda;
} pair_spec;

/* On CUDA the last two run on cuSOLVER streams, the others in the batched
 * kernel. */
enum { N_PAIRS = 8 };
extern const pair_spec kPairs[N_PAIRS]; /* N_PAIRS: its number of entries */

typedef struct {
  tt *a[N_PAIRS], *q[N_PAIRS];
  const DLTensor *ap[N_PAIRS];
  DLTensor *qp[N_PAIRS];
} pairs;

void pairs_make(pairs *P);

void pairs_free(pairs *P);

/* Pair i's tolerance against float64: 200 m eps of its dtype. */
double pair_tol(int i);

/* Checks pair i's Q against `iters` float64 power-iteration steps from
 * `start` (its Q before the call; overwritten): Q <- qr(A Q). */
void expect_power_steps(const pairs *P, int i, double *start, int iters,
                        const char *what);

#endif
