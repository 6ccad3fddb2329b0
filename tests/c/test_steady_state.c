/* The steady state allocates nothing: for every operation a training step
 * calls (flinear forward and backward with every gradient, the gradient
 * projection, the tiled MLP forward and backward, FLCE with every output,
 * the batched QR and power iteration), a first call may grow the context's
 * scratch, and later calls with the same shapes take no block at all, host
 * or device: neither the context's memory statistics nor a counting
 * allocator installed on the context see one. Built with OSFT_TEST_CUDA
 * (test_steady_state_cuda) the same runs on a GPU, the device blocks then
 * coming from a counting cudaMalloc pair. Every block goes back, with its
 * size, when the context is destroyed. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_fixture.h"
#include "test_tensors.h"
#include "test_util.h"

/* Calls after the first one that must allocate nothing. */
enum { STEADY_CALLS = 3 };

typedef struct {
  uint64_t host_allocs, device_allocs; /* the context's statistics */
  long cb_host, cb_device;             /* the counting allocator's */
} alloc_counts;

static alloc_counts counts_now(osft_context_t ctx, const test_alloc_state *a) {
  assert_ok(osft_context_synchronize(ctx));
  osft_memory_stats_t s;
  memset(&s, 0, sizeof s);
  s.struct_size = sizeof s;
  assert_ok(osft_context_get_memory_stats(ctx, &s));
  alloc_counts c = {s.host_allocs, s.device_allocs, a->host_allocs, a->device_allocs};
  return c;
}

static void expect_none_since(const char *what, int call, alloc_counts before,
                              alloc_counts after) {
  if (before.host_allocs != after.host_allocs ||
      before.device_allocs != after.device_allocs || before.cb_host != after.cb_host ||
      before.cb_device != after.cb_device)
    fail_msg(
        "%s, call %d with the same shapes: %llu host and %llu device allocations "
        "in the statistics, %ld host and %ld device at the allocator (expected "
        "none)",
        what, call, (unsigned long long)(after.host_allocs - before.host_allocs),
        (unsigned long long)(after.device_allocs - before.device_allocs),
        after.cb_host - before.cb_host, after.cb_device - before.cb_device);
}

static void expect_finite(const char *what, const tt *t) {
  double *v = tt_get(t);
  const int64_t n = tt_logical_numel(t);
  for (int64_t i = 0; i < n; ++i)
    if (!isfinite(v[i])) fail_msg("%s: element %lld is %g", what, (long long)i, v[i]);
  free(v);
}

static tt *mat(tt_dtype d, int64_t rows, int64_t cols) {
  const int64_t shape[2] = {rows, cols};
  return tt_new(d, 2, shape);
}

static tt *vec(tt_dtype d, int64_t n) {
  const int64_t shape[1] = {n};
  return tt_new(d, 1, shape);
}

/* Runs `step` once (growing what it needs), then STEADY_CALLS times more,
 * asserting that none of those allocates. `check` (may be NULL) inspects the
 * outputs after every call; `step` poisons them first. */
typedef void (*step_fn)(void *user);
static void expect_steady(osft_context_t ctx, const test_alloc_state *a, const char *what,
                          step_fn step, step_fn check, void *user) {
  step(user);
  if (check) check(user);
  for (int call = 2; call <= STEADY_CALLS + 1; ++call) {
    const alloc_counts before = counts_now(ctx, a);
    step(user);
    const alloc_counts after = counts_now(ctx, a);
    expect_none_since(what, call, before, after);
    if (check) check(user);
  }
}

static void destroy_counted(osft_context_t ctx, const test_alloc_state *a) {
  assert_ok(osft_context_destroy(ctx));
  tt_expect_all_returned(a);
}

/* ------------------------------------------------------------ flinear */

typedef struct {
  osft_flinear_t layer;
  tt *x, *bias, *y, *gy, *gx, *gu, *gs, *gv, *gb;
} flinear_case;

static void flinear_step(void *user) {
  flinear_case *c = user;
  tt_poison(c->y);
  tt_poison(c->gx), tt_poison(c->gu), tt_poison(c->gs), tt_poison(c->gv);
  tt_poison(c->gb);
  assert_ok(osft_flinear_forward(c->layer, &c->x->t, &c->bias->t, &c->y->t));
  osft_flinear_grads_t g;
  assert_ok(OSFT_FLINEAR_GRADS_INIT(&g));
  g.grad_x = &c->gx->t;
  g.grad_u_low = &c->gu->t;
  g.grad_s_low = &c->gs->t;
  g.grad_v_low = &c->gv->t;
  g.grad_bias = &c->gb->t;
  assert_ok(osft_flinear_backward(c->layer, &c->x->t, &c->gy->t, &g));
}

static void flinear_check(void *user) {
  const flinear_case *c = user;
  expect_finite("flinear y", c->y);
  expect_finite("flinear grad_x", c->gx);
  expect_finite("flinear grad_u_low", c->gu);
  expect_finite("flinear grad_s_low", c->gs);
  expect_finite("flinear grad_v_low", c->gv);
  expect_finite("flinear grad_bias", c->gb);
}

static void run_flinear(tt_dtype dtype, osft_flinear_strategy_t strategy,
                        const char *what) {
  test_alloc_state a;
  osft_context_t ctx = tt_counting_context(&a);
  const int64_t n = 48, k = 40, m = 600; /* m: enough tokens to chunk the sums */
  tt *w = mat(dtype, n, k);
  tt_random(w, -1.0, 1.0);
  osft_flinear_options_t o;
  assert_ok(OSFT_FLINEAR_OPTIONS_INIT(&o));
  o.rank_ratio = 0.5;
  o.strategy = strategy;
  flinear_case c;
  assert_ok(osft_flinear_create_from_weight(ctx, &w->t, &o, &c.layer));
  int64_t r = 0, l = 0;
  assert_ok(osft_flinear_get_dims(c.layer, NULL, NULL, &r, &l));
  c.x = mat(dtype, m, k), c.bias = vec(dtype, n), c.y = mat(dtype, m, n);
  c.gy = mat(dtype, m, n), c.gx = mat(dtype, m, k);
  c.gu = mat(TT_F32, n, l), c.gs = vec(TT_F32, l), c.gv = mat(TT_F32, l, k);
  c.gb = vec(TT_F32, n);
  tt_random(c.x, -1.0, 1.0), tt_random(c.bias, -0.5, 0.5), tt_random(c.gy, -1.0, 1.0);
  expect_steady(ctx, &a, what, flinear_step, flinear_check, &c);
  assert_ok(osft_flinear_destroy(c.layer));
  tt *all[] = {w, c.x, c.bias, c.y, c.gy, c.gx, c.gu, c.gs, c.gv, c.gb};
  for (size_t i = 0; i < sizeof all / sizeof *all; ++i) tt_free(all[i]);
  destroy_counted(ctx, &a);
}

static void test_flinear_steady(void **state) {
  (void)state;
  run_flinear(TT_F32, OSFT_FLINEAR_FACTORIZED, "flinear fp32 factorized");
  run_flinear(TT_F32, OSFT_FLINEAR_DENSE, "flinear fp32 dense");
  run_flinear(TT_BF16, OSFT_FLINEAR_FACTORIZED, "flinear bf16 factorized");
  run_flinear(TT_BF16, OSFT_FLINEAR_DENSE, "flinear bf16 dense");
  run_flinear(TT_F32, OSFT_FLINEAR_HYBRID, "flinear fp32 hybrid");
  run_flinear(TT_BF16, OSFT_FLINEAR_HYBRID, "flinear bf16 hybrid");
}

/* ------------------------------------------------------------ projection */

typedef struct {
  osft_projector_t proj;
  tt *uh, *gu, *vh, *gv;
} projection_case;

static void projection_step(void *user) {
  projection_case *c = user;
  assert_ok(osft_projector_project(c->proj));
}

static void projection_check(void *user) {
  const projection_case *c = user;
  expect_finite("projection grad_u_low", c->gu);
  expect_finite("projection grad_v_low", c->gv);
}

static void run_projection(tt_dtype grad_dtype, const char *what) {
  test_alloc_state a;
  osft_context_t ctx = tt_counting_context(&a);
  const int64_t n = 40, k = 36, r = 12, l = 8;
  projection_case c;
  c.uh = mat(TT_F32, n, r), c.gu = mat(grad_dtype, n, l);
  c.vh = mat(TT_F32, r, k), c.gv = mat(grad_dtype, l, k);
  tt_random(c.uh, -1.0, 1.0), tt_random(c.gu, -1.0, 1.0);
  tt_random(c.vh, -1.0, 1.0), tt_random(c.gv, -1.0, 1.0);
  osft_comm_t comm = NULL;
  assert_ok(osft_comm_create_self(ctx, NULL, &comm));
  assert_ok(osft_projector_create(ctx, comm, NULL, &c.proj));
  osft_projection_target_t t;
  assert_ok(OSFT_PROJECTION_TARGET_INIT(&t));
  t.u_high = &c.uh->t;
  t.grad_u_low = &c.gu->t;
  t.v_high = &c.vh->t;
  t.grad_v_low = &c.gv->t;
  assert_ok(osft_projector_add_target(c.proj, &t, NULL));
  /* A second target through the same projector: the batched path. */
  tt *gu2 = mat(grad_dtype, n, l), *gv2 = mat(grad_dtype, l, k);
  tt_random(gu2, -1.0, 1.0), tt_random(gv2, -1.0, 1.0);
  t.grad_u_low = &gu2->t;
  t.grad_v_low = &gv2->t;
  assert_ok(osft_projector_add_target(c.proj, &t, NULL));
  assert_ok(osft_projector_prepare(c.proj));
  expect_steady(ctx, &a, what, projection_step, projection_check, &c);
  assert_ok(osft_projector_destroy(c.proj));
  assert_ok(osft_comm_destroy(comm));
  tt_free(c.uh), tt_free(c.gu), tt_free(c.vh), tt_free(c.gv), tt_free(gu2), tt_free(gv2);
  destroy_counted(ctx, &a);
}

static void test_projection_steady(void **state) {
  (void)state;
  run_projection(TT_F32, "projection fp32");
  run_projection(TT_BF16, "projection bf16 gradients");
}

/* ------------------------------------------------------------ tiled MLP */

typedef struct {
  osft_mlp_t mlp;
  tt *x, *y, *gy, *gx, *gw[3], *gb[3];
  int64_t tiles;
  osft_flinear_t up_layer; /* NULL: dense up projection */
  tt *fg[3];               /* the layer's grad_u_low, grad_s_low, grad_v_low */
} mlp_case;

static void mlp_step(void *user) {
  mlp_case *c = user;
  tt_poison(c->y), tt_poison(c->gx);
  for (int p = 0; p < 3; ++p) tt_poison(c->gw[p]), tt_poison(c->gb[p]);
  if (c->up_layer)
    for (int i = 0; i < 3; ++i) tt_poison(c->fg[i]);
  assert_ok(osft_mlp_forward(c->mlp, &c->x->t, &c->y->t, c->tiles));
  osft_mlp_grads_t g;
  assert_ok(OSFT_MLP_GRADS_INIT(&g));
  g.grad_x = &c->gx->t;
  g.grad_gate = &c->gw[0]->t, g.grad_up = &c->gw[1]->t, g.grad_down = &c->gw[2]->t;
  osft_flinear_grads_t fg;
  if (c->up_layer) {
    assert_ok(OSFT_FLINEAR_GRADS_INIT(&fg));
    fg.grad_u_low = &c->fg[0]->t, fg.grad_s_low = &c->fg[1]->t;
    fg.grad_v_low = &c->fg[2]->t;
    g.grad_up = NULL;
    g.up_factors = &fg;
  }
  g.grad_gate_bias = &c->gb[0]->t, g.grad_up_bias = &c->gb[1]->t;
  g.grad_down_bias = &c->gb[2]->t;
  assert_ok(osft_mlp_backward(c->mlp, &c->x->t, &c->gy->t, &g, c->tiles));
}

static void mlp_check(void *user) {
  const mlp_case *c = user;
  expect_finite("mlp y", c->y);
  expect_finite("mlp grad_x", c->gx);
  for (int p = 0; p < 3; ++p) {
    if (p != 1 || !c->up_layer) expect_finite("mlp weight gradient", c->gw[p]);
    expect_finite("mlp bias gradient", c->gb[p]);
    if (c->up_layer) expect_finite("mlp layer factor gradient", c->fg[p]);
  }
}

static void run_mlp(tt_dtype dtype, int64_t tiles, int up_layer, const char *what) {
  test_alloc_state a;
  osft_context_t ctx = tt_counting_context(&a);
  const int64_t h = 32, inter = 56, m = 300;
  tt *w[3] = {mat(dtype, inter, h), mat(dtype, inter, h), mat(dtype, h, inter)};
  tt *b[3] = {vec(dtype, inter), vec(dtype, inter), vec(dtype, h)};
  for (int p = 0; p < 3; ++p) tt_random(w[p], -0.3, 0.3), tt_random(b[p], -0.1, 0.1);
  osft_mlp_weights_t wts;
  assert_ok(OSFT_MLP_WEIGHTS_INIT(&wts));
  wts.gate = &w[0]->t, wts.up = &w[1]->t, wts.down = &w[2]->t;
  wts.gate_bias = &b[0]->t, wts.up_bias = &b[1]->t, wts.down_bias = &b[2]->t;
  mlp_case c;
  c.up_layer = NULL;
  if (up_layer) {
    /* The up projection as an OSFT layer: the MLP's buffers then stay out
     * of the workspace, which the layer's calls take. */
    osft_flinear_options_t lo;
    assert_ok(OSFT_FLINEAR_OPTIONS_INIT(&lo));
    lo.rank_ratio = 0.5;
    assert_ok(osft_flinear_create_from_weight(ctx, &w[1]->t, &lo, &c.up_layer));
    int64_t l = 0;
    assert_ok(osft_flinear_get_dims(c.up_layer, NULL, NULL, NULL, &l));
    c.fg[0] = mat(TT_F32, inter, l), c.fg[1] = vec(TT_F32, l),
    c.fg[2] = mat(TT_F32, l, h);
    wts.up = NULL;
    wts.up_layer = c.up_layer;
  }
  osft_mlp_options_t o;
  assert_ok(OSFT_MLP_OPTIONS_INIT(&o));
  if (dtype == TT_BF16) {
    o.dtype.code = kDLBfloat;
    o.dtype.bits = 16;
    o.dtype.lanes = 1;
  }
  c.tiles = tiles;
  assert_ok(osft_mlp_create(ctx, OSFT_MLP_SWIGLU, h, inter, &wts, &o, &c.mlp));
  c.x = mat(dtype, m, h), c.y = mat(dtype, m, h), c.gy = mat(dtype, m, h);
  c.gx = mat(dtype, m, h);
  for (int p = 0; p < 3; ++p) {
    c.gw[p] = mat(TT_F32, w[p]->shape[0], w[p]->shape[1]);
    c.gb[p] = vec(TT_F32, b[p]->shape[0]);
  }
  tt_random(c.x, -1.0, 1.0), tt_random(c.gy, -1.0, 1.0);
  expect_steady(ctx, &a, what, mlp_step, mlp_check, &c);
  assert_ok(osft_mlp_destroy(c.mlp));
  if (c.up_layer) {
    assert_ok(osft_flinear_destroy(c.up_layer));
    for (int i = 0; i < 3; ++i) tt_free(c.fg[i]);
  }
  for (int p = 0; p < 3; ++p)
    tt_free(w[p]), tt_free(b[p]), tt_free(c.gw[p]), tt_free(c.gb[p]);
  tt_free(c.x), tt_free(c.y), tt_free(c.gy), tt_free(c.gx);
  destroy_counted(ctx, &a);
}

static void test_mlp_steady(void **state) {
  (void)state;
  run_mlp(TT_F32, 3, 0, "tiled MLP fp32, 3 tiles");
  run_mlp(TT_F32, 0, 0, "tiled MLP fp32, automatic tiles");
  run_mlp(TT_BF16, 3, 0, "tiled MLP bf16, 3 tiles");
  run_mlp(TT_F32, 3, 1, "tiled MLP fp32, up projection an OSFT layer");
}

/* ------------------------------------------------------------ FLCE */

typedef struct {
  osft_flce_t flce;
  tt *x, *w, *bias, *cw, *targets;
  tt *loss, *gx, *gw, *gb, *z, *acc, *argmax, *tok;
} flce_case;

static void flce_step(void *user) {
  flce_case *c = user;
  tt *outs[] = {c->loss, c->gx, c->gw, c->gb, c->z, c->acc, c->argmax, c->tok};
  for (size_t i = 0; i < sizeof outs / sizeof *outs; ++i) tt_poison(outs[i]);
  osft_flce_inputs_t in;
  assert_ok(OSFT_FLCE_INPUTS_INIT(&in));
  in.x = &c->x->t, in.weight = &c->w->t, in.targets = &c->targets->t;
  in.bias = &c->bias->t, in.class_weight = &c->cw->t;
  osft_flce_outputs_t out;
  assert_ok(OSFT_FLCE_OUTPUTS_INIT(&out));
  out.loss = &c->loss->t, out.grad_x = &c->gx->t, out.grad_weight = &c->gw->t;
  out.grad_bias = &c->gb->t, out.z_loss = &c->z->t, out.accuracy = &c->acc->t;
  out.argmax = &c->argmax->t, out.token_loss = &c->tok->t;
  assert_ok(osft_flce_compute(c->flce, &in, &out));
}

static void flce_check(void *user) {
  const flce_case *c = user;
  expect_finite("flce loss", c->loss);
  expect_finite("flce grad_x", c->gx);
  expect_finite("flce grad_weight", c->gw);
  expect_finite("flce grad_bias", c->gb);
  expect_finite("flce z_loss", c->z);
  expect_finite("flce accuracy", c->acc);
  expect_finite("flce token_loss", c->tok);
  double *am = tt_get(c->argmax);
  for (int64_t i = 0; i < tt_logical_numel(c->argmax); ++i)
    if (!(am[i] >= 0 && am[i] < (double)c->w->shape[0]))
      fail_msg("flce argmax[%lld] = %g", (long long)i, am[i]);
  free(am);
}

static void run_flce(tt_dtype dtype, int64_t chunk_rows, int device_check,
                     const char *what) {
  test_alloc_state a;
  osft_context_t ctx = tt_counting_context(&a);
  const int64_t m = 160, h = 24, v = 70;
  flce_case c;
  c.x = mat(dtype, m, h), c.w = mat(dtype, v, h), c.bias = vec(TT_F32, v);
  c.cw = vec(TT_F32, v), c.targets = vec(TT_I64, m);
  tt_random(c.x, -1.0, 1.0), tt_random(c.w, -0.5, 0.5), tt_random(c.bias, -0.2, 0.2);
  tt_random(c.cw, 0.5, 1.5);
  double *y = malloc(sizeof(double) * (size_t)m);
  for (int64_t i = 0; i < m; ++i) y[i] = i % 9 == 4 ? -100 : (double)((i * 37) % v);
  tt_set(c.targets, y);
  free(y);
  const int64_t one[1] = {1};
  c.loss = tt_new(TT_F32, 1, one), c.z = tt_new(TT_F32, 1, one);
  c.acc = tt_new(TT_F32, 1, one);
  c.gx = mat(dtype, m, h), c.gw = mat(TT_F32, v, h), c.gb = vec(TT_F32, v);
  c.argmax = vec(TT_I64, m), c.tok = vec(TT_F32, m);
  osft_flce_options_t o;
  assert_ok(OSFT_FLCE_OPTIONS_INIT(&o));
  o.label_smoothing = 0.1;
  o.z_loss_scale = 1e-3;
  o.softcap = 20.0;
  o.chunk_rows = chunk_rows;
  o.device_target_check = device_check;
  assert_ok(osft_flce_create(ctx, &o, &c.flce));
  expect_steady(ctx, &a, what, flce_step, flce_check, &c);
  if (device_check) assert_ok(osft_flce_check_targets(c.flce));
  assert_ok(osft_flce_destroy(c.flce));
  tt *all[] = {c.x,  c.w,  c.bias, c.cw,  c.targets, c.loss, c.gx,
               c.gw, c.gb, c.z,    c.acc, c.argmax,  c.tok};
  for (size_t i = 0; i < sizeof all / sizeof *all; ++i) tt_free(all[i]);
  destroy_counted(ctx, &a);
}

static void test_flce_steady(void **state) {
  (void)state;
  run_flce(TT_F32, 48, 0, "FLCE fp32, 4 chunks");
  run_flce(TT_F32, 0, 0, "FLCE fp32, automatic chunks");
  run_flce(TT_BF16, 48, 0, "FLCE bf16, 4 chunks");
  run_flce(TT_F32, 48, 1, "FLCE fp32, targets checked on the device");
}

/* ------------------------------------------------------------ QR */

enum { QR_COUNT = 4 };

typedef struct {
  osft_context_t ctx;
  osft_qr_options_t o;
  int power;
  tt *a[QR_COUNT], *q[QR_COUNT], *r[QR_COUNT], *q0[QR_COUNT];
  const DLTensor *ap[QR_COUNT];
  DLTensor *qp[QR_COUNT], *rp[QR_COUNT];
  osft_status_t st[QR_COUNT];
} qr_case;

static void qr_step(void *user) {
  qr_case *c = user;
  for (int i = 0; i < QR_COUNT; ++i) {
    if (c->power) {
      /* The starting Q again, so every call does the same work. */
      double *q0 = tt_get(c->q0[i]);
      tt_set(c->q[i], q0);
      free(q0);
    } else {
      tt_poison(c->q[i]), tt_poison(c->r[i]);
    }
  }
  if (c->power)
    assert_ok(osft_qr_power_iteration(c->ctx, &c->o, QR_COUNT, c->ap, c->qp, 2, c->st));
  else
    assert_ok(osft_qr_batch(c->ctx, &c->o, QR_COUNT, c->ap, c->qp, c->rp, c->st));
}

static void qr_check(void *user) {
  const qr_case *c = user;
  for (int i = 0; i < QR_COUNT; ++i) {
    assert_int_equal(c->st[i], OSFT_STATUS_SUCCESS);
    expect_finite("QR Q", c->q[i]);
    if (!c->power) expect_finite("QR R", c->r[i]);
  }
}

static void run_qr(osft_qr_method_t method, int power, const char *what) {
  test_alloc_state a;
  qr_case c;
  c.ctx = tt_counting_context(&a);
  c.power = power;
  assert_ok(OSFT_QR_OPTIONS_INIT(&c.o));
  c.o.method = method;
  /* Small ones (one batched kernel on a GPU) and large ones (the lanes). */
  const int64_t m[QR_COUNT] = {24, 40, 300, 520};
  const int64_t n[QR_COUNT] = {8, 40, 64, 96};
  const tt_dtype d[QR_COUNT] = {TT_F32, TT_F64, TT_F32, TT_F64};
  for (int i = 0; i < QR_COUNT; ++i) {
    c.a[i] = power ? mat(d[i], m[i], m[i]) : mat(d[i], m[i], n[i]);
    tt_random(c.a[i], -1.0, 1.0);
    c.q[i] = mat(d[i], m[i], n[i]);
    c.q0[i] = mat(d[i], m[i], n[i]);
    tt_random(c.q0[i], -1.0, 1.0);
    c.r[i] = mat(d[i], n[i], n[i]);
    c.ap[i] = &c.a[i]->t, c.qp[i] = &c.q[i]->t, c.rp[i] = &c.r[i]->t;
  }
  expect_steady(c.ctx, &a, what, qr_step, qr_check, &c);
  for (int i = 0; i < QR_COUNT; ++i)
    tt_free(c.a[i]), tt_free(c.q[i]), tt_free(c.q0[i]), tt_free(c.r[i]);
  destroy_counted(c.ctx, &a);
}

static void test_qr_steady(void **state) {
  (void)state;
  run_qr(OSFT_QR_HOUSEHOLDER, 0, "batched QR, Householder");
  run_qr(OSFT_QR_CHOLESKY_QR2, 0, "batched QR, CholeskyQR2");
  run_qr(OSFT_QR_HOUSEHOLDER, 1, "power iteration");
}

int main(void) {
  if (!tt_device_present()) return OSFT_TEST_SKIP;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_flinear_steady), cmocka_unit_test(test_projection_steady),
      cmocka_unit_test(test_mlp_steady),     cmocka_unit_test(test_flce_steady),
      cmocka_unit_test(test_qr_steady),
  };
  return cmocka_run_group_tests_name("steady_state", tests, NULL, NULL);
}
