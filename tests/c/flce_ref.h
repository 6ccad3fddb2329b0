/* The float64 reference of fused linear cross-entropy that every flce test
 * compares against (tests/c and tests/mpi): plain loops, runtime shapes,
 * straight from the formulas of osftrt/flce.h. Per token i (not ignored),
 * with label smoothing a (eps = a / V), z-loss scale lambda, class weights
 * w (all 1 without them; Wsum = sum_j w_j) and the logits z after the bias
 * and the softcap s tanh(z / s):
 *
 *   ce_i = (1 - a) w_y (lse - z_y) + eps (lse Wsum - sum_j w_j z_j)
 *   zl_i = lambda lse^2                   (never times a class weight)
 *   MEAN: sum_i ce_i / D + sum_i zl_i / N (D = sum of w_y, N = count, both
 *         over the tokens not ignored; a zero denominator gives 0)
 *   SUM:  sum_i (ce_i + zl_i);  NONE: ce_i + zl_i per token
 *
 * and the gradients of the loss times the upstream gradient (one value, or
 * one per token with NONE). */
#ifndef OSFTRT_TESTS_FLCE_REF_H
#define OSFTRT_TESTS_FLCE_REF_H

#include <stdint.h>

#include "osftrt/osftrt.h"

/* One problem: the inputs as doubles (the values the dtype stores). */
typedef struct {
  int64_t m, h, v;
  const double *x;            /* m x h */
  const double *w;            /* v x h */
  const double *bias;         /* v, or NULL */
  const double *class_weight; /* v, or NULL (all 1) */
  const int64_t *targets;     /* m */
  const double *grad_loss;    /* NULL (1), one value, or m with NONE */
  int64_t ignore_index;
  double label_smoothing, z_loss_scale, softcap;
  osft_flce_reduction_t reduction;
} flce_ref_problem;

/* Its outputs (malloc'ed; flce_ref_free releases them). */
typedef struct {
  double *tok;    /* m: ce_i + zl_i (0 when ignored) */
  double *ztok;   /* m: zl_i (0 when ignored) */
  double *logit;  /* m x v: the final logits of every token, ignored too */
  double loss, z; /* MEAN, SUM: the loss and z_loss; NONE: their sums */
  double *dx;     /* m x h */
  double *dw;     /* v x h */
  double *db;     /* v */
} flce_ref;

flce_ref flce_ref_compute(const flce_ref_problem *p);

void flce_ref_free(flce_ref *r);

#endif
