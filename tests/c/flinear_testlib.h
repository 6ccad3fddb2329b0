/* Helpers of the factorized linear layer tests (test_flinear_*.c): the
 * layer's factors read back as doubles, a float64 reference of its forward
 * and backward with plain loops, tolerances and tensor helpers. */
#ifndef OSFTRT_FLINEAR_TESTLIB_H
#define OSFTRT_FLINEAR_TESTLIB_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_tensors.h"
#include "test_util.h"

/* ----------------------------------------------------------- references */

typedef struct {
  int64_t n, kin, r, l;
  double *f[6]; /* u_high, s_high, v_high, u_low, s_low, v_low as stored */
} ref_layer;

ref_layer ref_read(osft_flinear_t layer);

void ref_free(ref_layer *R);

/* W = U_high diag(S_high) V_high + U_low diag(S_low) V_low (n x kin). */
double *ref_weight(const ref_layer *R);

/* c (m x n) = a (m x k) b^T (n x k) */
double *matmul_nt(const double *a, const double *b, int64_t m, int64_t n, int64_t k);

double *ref_forward(const ref_layer *R, const double *x, const double *bias, int64_t m);

typedef struct {
  double *dx, *du, *ds, *dv, *db;
} ref_grads;

ref_grads ref_backward(const ref_layer *R, const double *x, const double *g, int64_t m);

void ref_grads_free(ref_grads *g);

void expect_close(const char *what, const tt *t, const double *ref, double tol);

tt *mat(tt_dtype d, int64_t rows, int64_t cols);

tt *vec(tt_dtype d, int64_t n);

/* Backward outputs over these tensors (NULL: not computed), overwritten. */
osft_flinear_grads_t grads_of(tt *dx, tt *du, tt *ds, tt *dv, tt *db);

osft_flinear_t decompose(osft_context_t ctx, tt *w, double ratio,
                         osft_flinear_strategy_t strategy);

#endif
