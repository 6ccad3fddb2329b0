/* Tiled MLP errors: every invalid creation (weights, dtypes, tiling,
 * biases, layout, device, layers, handles) and every invalid forward and
 * backward call, each with its status and message, leaving every output
 * bit-identical.
 *
 * Built twice: for the CPU, and with OSFT_TEST_CUDA for a GPU (skipped where
 * none is present). Helpers (the float64 reference, fixtures, checks) are in
 * mlp_testlib.h; no test may log a warning (tt_setup_quiet). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_tensors.h"
#include "test_util.h"

#include "mlp_testlib.h"
#include "test_fixture.h"

/* osft_mlp_create() on `ctx` must fail with `status`, name `needle` in its
 * message and hand out no MLP. A macro, so that a failure reports the line
 * of the case. */
#define EXPECT_CREATE(variant, h, i, weights, opts, status, needle)                    \
  do {                                                                                 \
    osft_mlp_t out_ = NULL;                                                            \
    assert_status(osft_mlp_create(ctx, (variant), (h), (i), (weights), (opts), &out_), \
                  (status));                                                           \
    assert_error_mentions(needle);                                                     \
    assert_null(out_);                                                                 \
  } while (0)

/* Missing arguments, an unknown variant, sizes that disagree with the
 * weights, a gate for a plain variant, a missing up projection. */
static void create_errors_arguments(osft_context_t ctx, fixture *f,
                                    osft_mlp_weights_t *w) {
  const int64_t H = f->c.H, I = f->c.I;
  osft_mlp_t out = NULL;
  EXPECT_CREATE(OSFT_MLP_SWIGLU, H, I, NULL, NULL, OSFT_STATUS_INVALID_ARGUMENT,
                "weights");
  assert_status(osft_mlp_create(ctx, OSFT_MLP_SWIGLU, H, I, w, NULL, NULL),
                OSFT_STATUS_INVALID_ARGUMENT);
  assert_status(osft_mlp_create(NULL, OSFT_MLP_SWIGLU, H, I, w, NULL, &out),
                OSFT_STATUS_INVALID_HANDLE);
  EXPECT_CREATE((osft_mlp_variant_t)N_VARIANTS, H, I, w, NULL,
                OSFT_STATUS_INVALID_ARGUMENT, "variant");
  EXPECT_CREATE(OSFT_MLP_SWIGLU, 0, I, w, NULL, OSFT_STATUS_INVALID_ARGUMENT, "hidden");
  EXPECT_CREATE(OSFT_MLP_SWIGLU, H, I + 1, w, NULL, OSFT_STATUS_SHAPE_MISMATCH, "gate");
  EXPECT_CREATE(OSFT_MLP_SWIGLU, H + 1, I, w, NULL, OSFT_STATUS_SHAPE_MISMATCH, "gate");
  /* a gate for a plain variant, a missing up */
  EXPECT_CREATE(OSFT_MLP_RELU, H, I, w, NULL, OSFT_STATUS_INVALID_ARGUMENT, "gate");
  w->up = NULL;
  EXPECT_CREATE(OSFT_MLP_SWIGLU, H, I, w, NULL, OSFT_STATUS_INVALID_ARGUMENT, "up");
  w->up = &f->w[UP]->t;
}

/* dtypes: fp64 weight, mixed weights, opts->dtype disagreeing. */
static void create_errors_dtypes(osft_context_t ctx, fixture *f, osft_mlp_weights_t *w) {
  const int64_t H = f->c.H, I = f->c.I;
  tt *w64 = mat(TT_F64, I, H), *wbf = mat(TT_BF16, I, H);
  tt_random(w64, -1, 1);
  tt_random(wbf, -1, 1);
  w->up = &w64->t;
  EXPECT_CREATE(OSFT_MLP_SWIGLU, H, I, w, NULL, OSFT_STATUS_DTYPE_MISMATCH, "up");
  w->up = &wbf->t;
  EXPECT_CREATE(OSFT_MLP_SWIGLU, H, I, w, NULL, OSFT_STATUS_DTYPE_MISMATCH, "up");
  w->up = &f->w[UP]->t;
  osft_mlp_options_t o;
  assert_ok(OSFT_MLP_OPTIONS_INIT(&o));
  o.dtype = dl_dtype(TT_BF16);
  EXPECT_CREATE(OSFT_MLP_SWIGLU, H, I, w, &o, OSFT_STATUS_DTYPE_MISMATCH, "dtype");
  o.dtype.code = kDLInt;
  EXPECT_CREATE(OSFT_MLP_SWIGLU, H, I, w, &o, OSFT_STATUS_DTYPE_MISMATCH, "dtype");
  tt_free(w64);
  tt_free(wbf);
}

/* tiling: tile size 0, unknown rule, budget below one token; then struct
 * sizes of the options and the weights. */
static void create_errors_options(osft_context_t ctx, fixture *f, osft_mlp_weights_t *w) {
  const int64_t H = f->c.H, I = f->c.I;
  osft_mlp_options_t o;
  assert_ok(OSFT_MLP_OPTIONS_INIT(&o));
  o.tiling = OSFT_MLP_TILING_TOKENS;
  EXPECT_CREATE(OSFT_MLP_SWIGLU, H, I, w, &o, OSFT_STATUS_INVALID_ARGUMENT,
                "tile_tokens");
  o.tile_tokens = -3;
  EXPECT_CREATE(OSFT_MLP_SWIGLU, H, I, w, &o, OSFT_STATUS_INVALID_ARGUMENT,
                "tile_tokens");
  o.tiling = (osft_mlp_tiling_t)5;
  EXPECT_CREATE(OSFT_MLP_SWIGLU, H, I, w, &o, OSFT_STATUS_INVALID_ARGUMENT, "tiling");
  o.tiling = OSFT_MLP_TILING_BUDGET;
  o.memory_budget = 3 * I * 4 - 1;
  EXPECT_CREATE(OSFT_MLP_SWIGLU, H, I, w, &o, OSFT_STATUS_INVALID_ARGUMENT,
                "memory_budget");
  o.struct_size = 3;
  EXPECT_CREATE(OSFT_MLP_SWIGLU, H, I, w, &o, OSFT_STATUS_INVALID_STRUCT_SIZE, "opts");
  w->struct_size = 3;
  EXPECT_CREATE(OSFT_MLP_SWIGLU, H, I, w, NULL, OSFT_STATUS_INVALID_STRUCT_SIZE,
                "weights");
  w->struct_size = sizeof *w;
}

/* biases: wrong length, wrong dtype; a transposed weight; a weight on the
 * other device. */
static void create_errors_bias_layout_device(osft_context_t ctx, fixture *f,
                                             osft_mlp_weights_t *w) {
  const int64_t H = f->c.H, I = f->c.I;
  tt *b = vec(TT_F32, I + 1), *b64 = vec(TT_F64, I);
  tt_random(b, -1, 1);
  tt_random(b64, -1, 1);
  w->up_bias = &b->t;
  EXPECT_CREATE(OSFT_MLP_SWIGLU, H, I, w, NULL, OSFT_STATUS_SHAPE_MISMATCH, "up_bias");
  w->up_bias = &b64->t;
  EXPECT_CREATE(OSFT_MLP_SWIGLU, H, I, w, NULL, OSFT_STATUS_DTYPE_MISMATCH, "up_bias");
  w->up_bias = NULL;
  /* layout and device */
  DLTensor trans = f->w[UP]->t;
  int64_t ts[2] = {1, H};
  trans.strides = ts;
  w->up = &trans;
  EXPECT_CREATE(OSFT_MLP_SWIGLU, H, I, w, NULL, OSFT_STATUS_BAD_LAYOUT, "up");
  DLTensor other = f->w[UP]->t;
  other.device.device_type = tt_device() == OSFT_DEVICE_CPU ? kDLCUDA : kDLCPU;
  w->up = &other;
  EXPECT_CREATE(OSFT_MLP_SWIGLU, H, I, w, NULL, OSFT_STATUS_DEVICE_MISMATCH, "up");
  w->up = &f->w[UP]->t;
  tt_free(b);
  tt_free(b64);
}

/* layers: both a weight and a layer, wrong shape, destroyed, other context;
 * then handles of the wrong kind (`keep` is a live MLP). */
static void create_errors_layers(osft_context_t ctx, fixture *f, osft_mlp_weights_t *w,
                                 osft_mlp_t keep) {
  const int64_t H = f->c.H, I = f->c.I;
  tt *lw = mat(TT_F32, I, H), *lw_bad = mat(TT_F32, H, H);
  tt_random(lw, -1, 1);
  tt_random(lw_bad, -1, 1);
  osft_flinear_t layer = NULL, bad_layer = NULL, foreign = NULL;
  assert_ok(osft_flinear_create_from_weight(ctx, &lw->t, NULL, &layer));
  assert_ok(osft_flinear_create_from_weight(ctx, &lw_bad->t, NULL, &bad_layer));
  osft_context_t ctx2 = tt_context(NULL);
  assert_ok(osft_flinear_create_from_weight(ctx2, &lw->t, NULL, &foreign));
  w->up_layer = layer;
  EXPECT_CREATE(OSFT_MLP_SWIGLU, H, I, w, NULL, OSFT_STATUS_INVALID_ARGUMENT,
                "exactly one");
  w->up = NULL;
  w->up_layer = bad_layer;
  EXPECT_CREATE(OSFT_MLP_SWIGLU, H, I, w, NULL, OSFT_STATUS_SHAPE_MISMATCH, "up_layer");
  w->up_layer = foreign;
  EXPECT_CREATE(OSFT_MLP_SWIGLU, H, I, w, NULL, OSFT_STATUS_INVALID_ARGUMENT,
                "another context");
  w->up_layer = (osft_flinear_t)(void *)w;
  EXPECT_CREATE(OSFT_MLP_SWIGLU, H, I, w, NULL, OSFT_STATUS_INVALID_HANDLE, "up_layer");
  /* a layer destroyed after the MLP was made: calls say so */
  w->up_layer = layer;
  osft_mlp_t out = NULL;
  assert_ok(osft_mlp_create(ctx, OSFT_MLP_SWIGLU, H, I, w, NULL, &out));
  assert_status(osft_context_destroy(ctx), OSFT_STATUS_INVALID_ARGUMENT);
  assert_ok(osft_flinear_destroy(layer));
  const int64_t lead[2] = {3, 2};
  tt *x = activations(f, 3, lead), *y = activations(f, 3, lead);
  assert_status(osft_mlp_forward(out, &x->t, &y->t, 0), OSFT_STATUS_INVALID_HANDLE);
  assert_error_mentions("up layer");
  assert_ok(osft_mlp_destroy(out));
  assert_status(osft_mlp_destroy(out), OSFT_STATUS_INVALID_HANDLE);
  assert_status(osft_mlp_forward(out, &x->t, &y->t, 0), OSFT_STATUS_INVALID_HANDLE);
  assert_ok(osft_mlp_destroy(NULL));
  assert_status(osft_mlp_destroy((osft_mlp_t)(void *)w), OSFT_STATUS_INVALID_HANDLE);
  /* an MLP is not a layer and vice versa */
  assert_status(osft_mlp_destroy((osft_mlp_t)(void *)bad_layer),
                OSFT_STATUS_INVALID_HANDLE);
  assert_status(osft_flinear_destroy((osft_flinear_t)(void *)keep),
                OSFT_STATUS_INVALID_HANDLE);
  assert_ok(osft_flinear_destroy(bad_layer));
  assert_ok(osft_flinear_destroy(foreign));
  assert_ok(osft_context_destroy(ctx2));
  tt *rest[4] = {lw, lw_bad, x, y};
  for (int i = 0; i < 4; ++i) tt_free(rest[i]);
}

/* The init functions and the tile-count query (`keep` is a live MLP). */
static void create_errors_inits_and_query(osft_mlp_t keep) {
  osft_mlp_weights_t w;
  osft_mlp_options_t o;
  assert_status(osft_mlp_weights_init(NULL, sizeof w), OSFT_STATUS_INVALID_ARGUMENT);
  assert_status(osft_mlp_options_init(&o, 2), OSFT_STATUS_INVALID_STRUCT_SIZE);
  osft_mlp_grads_t g;
  assert_status(osft_mlp_grads_init(&g, 1), OSFT_STATUS_INVALID_STRUCT_SIZE);
  /* the query */
  int64_t n;
  assert_status(osft_mlp_get_tile_count(keep, -1, &n, NULL),
                OSFT_STATUS_INVALID_ARGUMENT);
  assert_status(osft_mlp_get_tile_count(keep, 4, NULL, NULL),
                OSFT_STATUS_INVALID_ARGUMENT);
  assert_status(osft_mlp_get_tile_count(NULL, 4, &n, NULL), OSFT_STATUS_INVALID_HANDLE);
}

#undef EXPECT_CREATE

/* Every invalid creation fails with its status and message and hands out
 * no MLP; handles of the wrong kind are refused. */
static void test_creation_errors(void **state) {
  test_seed("create errors");
  cfg c = base_cfg(OSFT_MLP_SWIGLU, TT_F32);
  c.bias = 1;
  fixture *f = fx_new(CTX, c);
  osft_mlp_weights_t w;
  assert_ok(OSFT_MLP_WEIGHTS_INIT(&w));
  w.gate = &f->w[GATE]->t;
  w.up = &f->w[UP]->t;
  w.down = &f->w[DOWN]->t;
  create_errors_arguments(CTX, f, &w);
  create_errors_dtypes(CTX, f, &w);
  create_errors_options(CTX, f, &w);
  create_errors_bias_layout_device(CTX, f, &w);
  create_errors_layers(CTX, f, &w, f->mlp);
  create_errors_inits_and_query(f->mlp);
  fx_free(f);
}
/* The inputs and outputs of the failing calls: an MLP with a factorized
 * down projection, x, gy, y and every gradient, and an x with too few
 * tokens. */
typedef struct {
  fixture *f;
  tt *x, *gy, *y, *x_short;
  grads G;
} call_case;

/* forward: x of the wrong width, length or dtype, missing tensors, a
 * negative tile count, y over x, a weight or a factor, y on the other
 * device or transposed. */
static void call_errors_forward(call_case *k) {
  fixture *f = k->f;
  tt *x = k->x, *y = k->y;
  const int64_t H = f->c.H;
  tt *xh = tt_new(TT_F32, 2, (int64_t[]){10, H + 1}), *xb = tt_new(TT_BF16, 3, x->shape);
  tt_random(xh, -1, 1);
  tt_random(xb, -1, 1);
  assert_status(osft_mlp_forward(f->mlp, &xh->t, &y->t, 0), OSFT_STATUS_SHAPE_MISMATCH);
  assert_error_mentions("x");
  assert_status(osft_mlp_forward(f->mlp, &k->x_short->t, &y->t, 0),
                OSFT_STATUS_SHAPE_MISMATCH);
  assert_error_mentions("leading");
  assert_status(osft_mlp_forward(f->mlp, &xb->t, &y->t, 0), OSFT_STATUS_DTYPE_MISMATCH);
  assert_status(osft_mlp_forward(f->mlp, NULL, &y->t, 0), OSFT_STATUS_INVALID_ARGUMENT);
  assert_status(osft_mlp_forward(f->mlp, &x->t, NULL, 0), OSFT_STATUS_INVALID_ARGUMENT);
  assert_status(osft_mlp_forward(f->mlp, &x->t, &y->t, -1), OSFT_STATUS_INVALID_ARGUMENT);
  assert_error_mentions("num_tiles");
  assert_status(osft_mlp_forward(f->mlp, &y->t, &y->t, 0), OSFT_STATUS_ALIASING);
  DLTensor y_on_w = y->t; /* the output over the gate weight */
  y_on_w.data = f->w[GATE]->t.data;
  int64_t ys[2] = {f->c.I * H / H / 2, H};
  y_on_w.ndim = 2;
  y_on_w.shape = ys;
  DLTensor x2 = x->t;
  int64_t xs[2] = {ys[0], H};
  x2.ndim = 2;
  x2.shape = xs;
  assert_status(osft_mlp_forward(f->mlp, &x2, &y_on_w, 0), OSFT_STATUS_ALIASING);
  assert_error_mentions("weights->gate");
  DLTensor y_on_factor = y_on_w; /* over the down layer's factors */
  DLTensor uview;
  assert_ok(osft_flinear_get_factor(f->layer[DOWN], OSFT_FACTOR_U_HIGH, &uview));
  y_on_factor.data = uview.data;
  assert_status(osft_mlp_forward(f->mlp, &x2, &y_on_factor, 0), OSFT_STATUS_ALIASING);
  assert_error_mentions("down layer");
  DLTensor ydev = y->t;
  ydev.device.device_type = tt_device() == OSFT_DEVICE_CPU ? kDLCUDA : kDLCPU;
  assert_status(osft_mlp_forward(f->mlp, &x->t, &ydev, 0), OSFT_STATUS_DEVICE_MISMATCH);
  DLTensor ytrans = y->t;
  int64_t tstr[3] = {1, 2, 10};
  ytrans.strides = tstr;
  assert_status(osft_mlp_forward(f->mlp, &x->t, &ytrans, 0), OSFT_STATUS_BAD_LAYOUT);
  tt_free(xh);
  tt_free(xb);
}

/* backward: the grads struct, a short gy, a negative tile count, gradient
 * shapes and dtypes, and gradients over an input, a bias or each other. */
static void call_errors_backward(call_case *k) {
  fixture *f = k->f;
  tt *x = k->x, *gy = k->gy;
  grads *G = &k->G;
  const int64_t H = f->c.H;
  assert_status(osft_mlp_backward(f->mlp, &x->t, &gy->t, NULL, 0),
                OSFT_STATUS_INVALID_ARGUMENT);
  G->g.struct_size = 4;
  assert_status(osft_mlp_backward(f->mlp, &x->t, &gy->t, &G->g, 0),
                OSFT_STATUS_INVALID_STRUCT_SIZE);
  G->g.struct_size = sizeof G->g;
  G->g.accumulate = 1u << 12;
  assert_status(osft_mlp_backward(f->mlp, &x->t, &gy->t, &G->g, 0),
                OSFT_STATUS_INVALID_ARGUMENT);
  assert_error_mentions("accumulate");
  G->g.accumulate = 0;
  assert_status(osft_mlp_backward(f->mlp, &x->t, &k->x_short->t, &G->g, 0),
                OSFT_STATUS_SHAPE_MISMATCH);
  assert_status(osft_mlp_backward(f->mlp, &x->t, &gy->t, &G->g, -2),
                OSFT_STATUS_INVALID_ARGUMENT);
  /* gradient shapes and dtypes */
  DLTensor *keep_up = G->g.grad_up;
  tt *wrong = mat(TT_F32, f->c.I, H + 1), *w64 = mat(TT_F64, f->c.I, H);
  G->g.grad_up = &wrong->t;
  assert_status(osft_mlp_backward(f->mlp, &x->t, &gy->t, &G->g, 0),
                OSFT_STATUS_SHAPE_MISMATCH);
  assert_error_mentions("grad_up");
  G->g.grad_up = &w64->t;
  assert_status(osft_mlp_backward(f->mlp, &x->t, &gy->t, &G->g, 0),
                OSFT_STATUS_DTYPE_MISMATCH);
  G->g.grad_up = keep_up;
  DLTensor *keep_dx = G->g.grad_x;
  G->g.grad_x = &k->x_short->t;
  assert_status(osft_mlp_backward(f->mlp, &x->t, &gy->t, &G->g, 0),
                OSFT_STATUS_SHAPE_MISMATCH);
  G->g.grad_x = &x->t; /* over the input */
  assert_status(osft_mlp_backward(f->mlp, &x->t, &gy->t, &G->g, 0), OSFT_STATUS_ALIASING);
  G->g.grad_x = keep_dx;
  G->g.grad_gate_bias = G->g.grad_up_bias; /* two outputs in one buffer */
  assert_status(osft_mlp_backward(f->mlp, &x->t, &gy->t, &G->g, 0), OSFT_STATUS_ALIASING);
  G->g.grad_gate_bias = &G->db[GATE]->t;
  DLTensor bias_view = f->b[UP]->t; /* writing a gradient over a bias */
  G->g.grad_up_bias = &bias_view;
  assert_status(osft_mlp_backward(f->mlp, &x->t, &gy->t, &G->g, 0), OSFT_STATUS_ALIASING);
  G->g.grad_up_bias = &G->db[UP]->t;
  tt_free(wrong);
  tt_free(w64);
}

/* backward with factor gradients: a dense gradient for the layer, factors
 * for a dense projection, a factor struct with grad_x set, unknown bits,
 * wrong shape, dtype or struct size, a gradient over its own parameter;
 * and a gate gradient for a plain variant. */
static void call_errors_factor_grads(osft_context_t ctx, call_case *k) {
  fixture *f = k->f;
  tt *x = k->x, *gy = k->gy;
  grads *G = &k->G;
  tt *wrong = mat(TT_F32, f->c.I, f->c.H + 1);
  G->g.grad_down = &G->dw[GATE]->t;
  assert_status(osft_mlp_backward(f->mlp, &x->t, &gy->t, &G->g, 0),
                OSFT_STATUS_INVALID_ARGUMENT);
  assert_error_mentions("down_factors");
  G->g.grad_down = NULL;
  G->g.up_factors = &G->fg[DOWN];
  assert_status(osft_mlp_backward(f->mlp, &x->t, &gy->t, &G->g, 0),
                OSFT_STATUS_INVALID_ARGUMENT);
  G->g.up_factors = NULL;
  /* factor struct: grad_x set, unknown bits, wrong shape/dtype, struct size */
  G->fg[DOWN].grad_x = &G->dx->t;
  assert_status(osft_mlp_backward(f->mlp, &x->t, &gy->t, &G->g, 0),
                OSFT_STATUS_INVALID_ARGUMENT);
  assert_error_mentions("grad_x");
  G->fg[DOWN].grad_x = NULL;
  G->fg[DOWN].accumulate = 1u << 7;
  assert_status(osft_mlp_backward(f->mlp, &x->t, &gy->t, &G->g, 0),
                OSFT_STATUS_INVALID_ARGUMENT);
  G->fg[DOWN].accumulate = 0;
  DLTensor *keep_u = G->fg[DOWN].grad_u_low;
  G->fg[DOWN].grad_u_low = &wrong->t;
  assert_status(osft_mlp_backward(f->mlp, &x->t, &gy->t, &G->g, 0),
                OSFT_STATUS_SHAPE_MISMATCH);
  assert_error_mentions("down_factors->grad_u_low");
  tt *ubf = mat(TT_BF16, f->L[DOWN].n, f->L[DOWN].l);
  G->fg[DOWN].grad_u_low = &ubf->t;
  assert_status(osft_mlp_backward(f->mlp, &x->t, &gy->t, &G->g, 0),
                OSFT_STATUS_DTYPE_MISMATCH);
  G->fg[DOWN].grad_u_low = keep_u;
  DLTensor u_param;
  assert_ok(osft_flinear_get_factor(f->layer[DOWN], OSFT_FACTOR_U_LOW, &u_param));
  G->fg[DOWN].grad_u_low = &u_param; /* a gradient over its own parameter */
  assert_status(osft_mlp_backward(f->mlp, &x->t, &gy->t, &G->g, 0), OSFT_STATUS_ALIASING);
  G->fg[DOWN].grad_u_low = keep_u;
  G->fg[DOWN].struct_size = 5;
  assert_status(osft_mlp_backward(f->mlp, &x->t, &gy->t, &G->g, 0),
                OSFT_STATUS_INVALID_STRUCT_SIZE);
  G->fg[DOWN].struct_size = sizeof G->fg[DOWN];
  /* a plain variant's gate gradient */
  cfg cp = base_cfg(OSFT_MLP_RELU, TT_F32);
  fixture *fp = fx_new(ctx, cp);
  osft_mlp_grads_t pg;
  assert_ok(OSFT_MLP_GRADS_INIT(&pg));
  pg.grad_gate = G->g.grad_up;
  assert_status(osft_mlp_backward(fp->mlp, &x->t, &gy->t, &pg, 0),
                OSFT_STATUS_INVALID_ARGUMENT);
  assert_error_mentions("grad_gate");
  fx_free(fp);
  tt_free(wrong);
  tt_free(ubf);
}

/* Every failing call leaves every output bit-identical. */
static void test_call_errors_write_nothing(void **state) {
  test_seed("call errors");
  cfg c = base_cfg(OSFT_MLP_SWIGLU, TT_F32);
  c.bias = 1;
  c.layers = 1 << DOWN;
  call_case k;
  k.f = fx_new(CTX, c);
  const int64_t lead[2] = {2, 5};
  k.x = activations(k.f, 3, lead);
  k.gy = activations(k.f, 3, lead);
  k.y = activations(k.f, 3, lead);
  grads_new(k.f, k.x, &k.G);
  snapshot snap;
  snapshot_take(&snap, k.y, &k.G);
  const int64_t lead_bad[2] = {2, 4};
  k.x_short = activations(k.f, 3, lead_bad);

  call_errors_forward(&k);
  call_errors_backward(&k);
  call_errors_factor_grads(CTX, &k);

  snapshot_expect_untouched(&snap);
  /* and the valid call still works afterwards */
  assert_ok(osft_mlp_backward(k.f->mlp, &k.x->t, &k.gy->t, &k.G.g, 0));
  tt *rest[4] = {k.x, k.gy, k.y, k.x_short};
  for (int i = 0; i < 4; ++i) tt_free(rest[i]);
  grads_free(&k.G);
  fx_free(k.f);
}

int main(void) {
  if (!tt_device_present()) return OSFT_TEST_SKIP;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_creation_errors, tt_setup_quiet,
                                      tt_teardown_quiet),
      cmocka_unit_test_setup_teardown(test_call_errors_write_nothing, tt_setup_quiet,
                                      tt_teardown_quiet),
  };
  return cmocka_run_group_tests_name("mlp_errors", tests, NULL, NULL);
}
