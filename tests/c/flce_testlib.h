/* Helpers of the fused linear cross-entropy tests (test_flce_*.c): a case
 * (shapes, dtypes, options), its float64 reference computed row by row with
 * plain loops, the tensors of a call, and the checks that compare them. */
#ifndef OSFTRT_FLCE_TESTLIB_H
#define OSFTRT_FLCE_TESTLIB_H

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flce_ref.h"
#include "flce_test_plan.h"
#include "test_tensors.h"
#include "test_util.h"

/* ------------------------------------------------------------- the cases */

enum {
  WANT_LOSS = 1,
  WANT_DX = 2,
  WANT_DW = 4,
  WANT_DB = 8,
  WANT_Z = 16,
  WANT_EXTRA = 32
};

#define WANT_ALL (WANT_LOSS | WANT_DX | WANT_DW | WANT_DB | WANT_Z | WANT_EXTRA)

typedef struct {
  int64_t m, h, v;
  tt_dtype dtype;      /* x and W */
  int bias;            /* 0: none, else its dtype is bias_dtype */
  tt_dtype bias_dtype; /* TT_F32 or the x dtype */
  int class_weights;
  int upstream;   /* pass grad_loss (0.7 scalar, or random per token) */
  double ignored; /* fraction of ignored tokens */
  int all_ignored;
  int64_t ignore_index;
  double smoothing, z_scale, softcap;
  osft_flce_reduction_t reduction;
  osft_flce_accumulator_t accumulator;
  int64_t chunk_rows;
  size_t budget;
  uint32_t accumulate; /* OSFT_FLCE_ACCUMULATE_* (start from random values) */
  tt_dtype grad_w_dtype, grad_b_dtype;
  tt_dtype target_dtype;
  unsigned want;
  /* the plan (flce_test_plan.h: from the environment by default) */
  osft_flce_chunking_t chunking;
  int64_t slice_cols;
} flce_case;

/* Defaults, with the plan of the test run (flce_test_plan.h). */
flce_case base_case(int64_t m, int64_t h, int64_t v, tt_dtype dt);

void describe(const flce_case *c, char *buf, size_t size);

/* ------------------------------------------------------------ reference */

/* tok, ztok, logit (m x v), loss and z (MEAN / SUM reduced), dx, dw, db:
 * see flce_ref.h. */
typedef flce_ref ref_out;

/* Everything in float64 with plain loops, straight from the formulas of
 * osftrt/flce.h (flce_ref_compute on the case's options). */
ref_out reference(const flce_case *c, const double *x, const double *w, const double *b,
                  const double *cw, const int64_t *y, const double *gl);

void ref_free(ref_out *r);

/* -------------------------------------------------------------- helpers */

tt *mat(tt_dtype d, int64_t rows, int64_t cols);

tt *vec(tt_dtype d, int64_t n);

tt *scalar(void);

void expect_close(const char *what, const char *name, const tt *t, const double *ref,
                  double tol);

void expect_scalar(const char *what, const char *name, const tt *t, double ref,
                   double tol);

/* Loss tolerance: fp32 logits from GEMMs of the stored inputs. */
double loss_tol(const flce_case *c);

/* Gradient tolerance: bf16 outputs, and on CUDA bf16 gradients g. */
double grad_tol(tt_dtype out_dtype, const flce_case *c);

void case_options(const flce_case *c, osft_flce_options_t *o);

osft_flce_t make_flce(osft_context_t ctx, const flce_case *c);

/* The call's plan is the case's chunking (nothing to check for AUTO) and,
 * for the vocabulary plan, its slices tile V (exactly slice_cols wide
 * where the case sets no budget). */
void expect_plan(osft_flce_t f, const flce_case *c, const osft_flce_inputs_t *in,
                 const osft_flce_outputs_t *out, const char *name);

/* All tensors of one case. */
typedef struct {
  tt *x, *w, *b, *cw, *y, *gl;
  tt *loss, *dx, *dw, *db, *z, *acc, *amax, *tok;
  int64_t *targets;
} flce_tensors;

flce_tensors make_tensors(const flce_case *c);

void free_tensors(flce_tensors *T);

DLTensor *dl(tt *t);

void flce_bind(const flce_case *c, flce_tensors *T, osft_flce_inputs_t *in,
               osft_flce_outputs_t *out);

double *get_or_null(const tt *t);

/* Expected = initial (when accumulating) + reference. */
double *plus_initial(const double *init, const double *ref, int64_t n);

/* Checks argmax against the reference logits (a near-tie may pick either)
 * and the accuracy against the argmax the call reported. */
void check_argmax(const flce_case *c, const flce_tensors *T, const ref_out *r,
                  const char *name);

/* Runs one case and checks every requested output. */
void run_case(osft_context_t ctx, const flce_case *c);

/* The same, on a counting context whose allocator `a` refuses allocations
 * during the compute call (test_alloc_refuse(a, device, granted)): the call
 * either succeeds with every output checked, or returns
 * OSFT_STATUS_OUT_OF_MEMORY with every output byte as it was. The refusal
 * is left on: the caller ends it with test_alloc_unrefuse(). */
osft_status_t run_case_refusing(osft_context_t ctx, const flce_case *c,
                                test_alloc_state *a, long granted, int device);

/* ---- what a call counted: its "flce: counts:" debug line */

typedef struct {
  long long chunks, slices, calls, conversions, converted, vh_passes, waits, allocations;
  int held, lines;
} flce_counts;

/* Runs a case (every output checked against the float64 reference) and
 * returns what the call counted (slices: 1 for token chunks). */
flce_counts counted_case(osft_context_t ctx, const flce_case *c);

#endif
