/* Helpers of the tiled-MLP tests (test_mlp_*.c): an untiled float64
 * reference computed token by token with plain loops, a fixture that builds
 * an MLP with random weights (dense or factorized projections) together with
 * its reference, gradient outputs, and the checks that compare them. */
#ifndef OSFTRT_MLP_TESTLIB_H
#define OSFTRT_MLP_TESTLIB_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_tensors.h"
#include "test_util.h"

enum { GATE = 0, UP = 1, DOWN = 2 };

enum { ACT_SILU, ACT_GELU_TANH, ACT_GELU_ERF, ACT_RELU };

/* Every variant of the public API (osft_mlp_variant_t, in order); the
 * numerics and precision tests run each. A new variant goes here and into
 * variant_gated(), variant_act() and act_eval(). */
enum { N_VARIANTS = 7 };
extern const osft_mlp_variant_t kVariants[N_VARIANTS];

int variant_gated(osft_mlp_variant_t v);

int variant_act(osft_mlp_variant_t v);

/* ----------------------------------------------------------- reference */

/* act(z) and act'(z) in float64, written from the definitions. */
double act_eval(int act, double z, double *df);

/* The MLP as float64 arrays: effective weights (a layer's merged weight). */
typedef struct {
  int gated, act;
  int64_t H, I;
  double *w[3]; /* gate I x H, up I x H, down H x I (NULL: absent) */
  double *b[3]; /* biases (NULL: none) */
} ref_mlp;

/* Gradients of the sum over tokens: dW = sum_t grad_out_t^T in_t, etc. */
typedef struct {
  double *y, *dx, *dw[3], *db[3];
} ref_out;

double dot(const double *a, const double *b, int64_t n);

/* Token by token, untiled: y, and with gy the gradients. */
ref_out ref_run(const ref_mlp *R, const double *x, const double *gy, int64_t m);

void ref_out_free(ref_out *o);

/* A factorized layer's factors as stored, read back as doubles. */
typedef struct {
  int64_t n, kin, r, l;
  double *f[6]; /* u_high, s_high, v_high, u_low, s_low, v_low */
} ref_layer;

ref_layer ref_layer_read(osft_flinear_t layer);

/* W = U_high diag(S_high) V_high + U_low diag(S_low) V_low. */
double *ref_layer_weight(const ref_layer *L);

/* The factor gradients from the dense one, G = sum grad_out^T in:
 * dU_low = G V_low^T S_low, dS_low = diag(U_low^T G V_low^T),
 * dV_low = S_low U_low^T G. out[0..2] = du, ds, dv (malloc'ed). */
void ref_factor_grads(const ref_layer *L, const double *G, double *out[3]);

/* ----------------------------------------------------------- fixtures */

typedef struct {
  osft_mlp_variant_t variant;
  tt_dtype dtype;  /* compute dtype: weights, activations */
  int bias;        /* biases on */
  int layers;      /* bit p: projection p is a factorized layer */
  tt_dtype fdtype; /* the layers' factor dtype */
  tt_dtype gdtype; /* dense weight and bias gradients */
  int64_t H, I;
} cfg;

typedef struct {
  cfg c;
  tt *w[3], *b[3];
  osft_flinear_t layer[3];
  ref_layer L[3];
  ref_mlp R;
  osft_mlp_t mlp;
} fixture;

tt *mat(tt_dtype d, int64_t rows, int64_t cols);

tt *vec(tt_dtype d, int64_t n);

DLDataType dl_dtype(tt_dtype d);

int is_layer(const fixture *f, int p);

osft_flinear_t make_layer(osft_context_t ctx, const cfg *c, int64_t out, int64_t in);

osft_status_t create_mlp(osft_context_t ctx, fixture *f, const osft_mlp_options_t *given);

fixture *fx_new(osft_context_t ctx, cfg c);

void fx_free(fixture *f);

/* The gradient outputs of one backward, as tensors. */
typedef struct {
  tt *dx, *dw[3], *db[3], *df[3][3]; /* df: u_low, s_low, v_low per layer */
  osft_flinear_grads_t fg[3];
  osft_mlp_grads_t g;
} grads;

void grads_new(const fixture *f, const tt *x, grads *G);

/* Every gradient output in fixed slots: 0 grad_x, then per projection p
 * 1 + 5p weight, 2 + 5p bias, 3 + 5p + q factor q (NULL: not requested). */
enum { SLOTS = 16 };

void grad_slots(const grads *G, tt *slot[SLOTS]);

void grads_free(grads *G);

/* --------------------------------------------------------------- checks */

double tol_for(tt_dtype d);

void expect_close(const char *what, const tt *t, const double *ref, double tol);

/* ref + prior (accumulation), or ref alone. */
double *plus(const double *ref, const double *prior, int64_t n);

extern const char *const kProj[3];

/* Compares every gradient with the reference (plus prior values where the
 * call accumulated; prior[] by grad_slots()). */
void expect_grads(const fixture *f, const grads *G, const ref_out *o,
                  double *const *prior, const char *label);

/* x of shape dims (any rank >= 2, last = H), random; gy likewise. */
tt *activations(const fixture *f, int ndim, const int64_t *lead);

/* Forward and backward with `tiles`, all gradients requested (poisoned
 * first, or random priors with accumulate), against the reference. */
void check_pass(fixture *f, int ndim, const int64_t *lead, int64_t tiles, int accumulate,
                const char *label);

cfg base_cfg(osft_mlp_variant_t v, tt_dtype d);

/* ------------------------------------------------------------- errors */

/* Every output of a call (y and the gradients), filled with random values
 * and remembered byte for byte, to prove a failing call wrote nothing. */
typedef tt_snapshot snapshot;

void snapshot_take(snapshot *s, tt *y, const grads *G);

/* Asserts that nothing changed, and forgets the snapshot. */
void snapshot_expect_untouched(snapshot *s);

#endif
