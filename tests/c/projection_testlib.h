/* Helpers of the gradient projection tests (test_projection_*.c): problems
 * (random orthonormal frozen factors, gradients, parameters) as tensors on
 * the device under test, their registration as targets, and the float64
 * projections they must match. */
#ifndef OSFTRT_PROJECTION_TESTLIB_H
#define OSFTRT_PROJECTION_TESTLIB_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_tensors.h"
#include "test_util.h"
#include "../mpi/projection_ref.h"

/* ----------------------------------------------------------- problems */

typedef ref_problem problem;

/* A rows x cols tensor holding `values` (rounded to dtype); pad > 0 adds
 * that many elements of padding per row. */
tt *make_tensor(tt_dtype d, int64_t rows, int64_t cols, const double *values,
                int64_t pad);

/* A problem's tensors. */
typedef struct {
  tt *uh, *gu, *ul, *vh, *gv, *vl;
} target_tensors;

target_tensors make_tensors(const problem *P, tt_dtype high, tt_dtype grad, int64_t pad);

void free_tensors(target_tensors *T);

/* A target over T: U and V parts as asked, replicated. */
osft_projection_target_t replicated_target(const target_tensors *T, int with_u,
                                           int with_v, int with_low);

/* The float64 projection of what `x` holds against what `high` holds. */
double *expected_u(const tt *high, const tt *x);

double *expected_v(const tt *high, const tt *x);

void expect_close(const char *what, const tt *t, const double *ref, double tol);

osft_projector_t new_projector(osft_context_t ctx, osft_comm_t comm);

/* Adam (betas 0.9, 0.999, eps 1e-8) on a replicated target's trainable
 * factors with projection: float64 moments, the factors rounded to their
 * dtype when stored. */
typedef struct {
  double *m[2], *v[2];
  int64_t sizes[2]; /* n l (U_low), l k (V_low) */
  ref_rng g;        /* the gradients' stream */
  int step;
} adam_run;

adam_run adam_start(const problem *P, const char *seed);
void adam_free(adam_run *a);

/* One step: fresh gradients in [-1, 1) into T's grad_u_low / grad_v_low,
 * osft_projector_project, Adam with learning rate lr on u_low / v_low,
 * osft_projector_project_params; returns max(max_u, max_v) of the
 * orthogonality query after it. */
double adam_step(adam_run *a, osft_projector_t proj, target_tensors *T, double lr);

/* With one rank, the sharded layouts hold the whole matrices (shards {N},
 * {r}, {K}): the same projection, through the self communicator, a
 * size-1 callbacks communicator, or no communicator. */
/* A one-rank all-reduce (the identity) that counts its calls and answers
 * with a chosen status. */
typedef struct {
  int calls;
  osft_status_t answer;
} counter;

osft_status_t sum_one_rank(void *user, DLTensor *buf);

osft_status_t gather_one_rank(void *user, const DLTensor *send, DLTensor *recv,
                              const int64_t *counts, int64_t n);

/* A one-rank callbacks communicator over `c`. */
osft_comm_t counting_comm(osft_context_t ctx, counter *c);

#endif
