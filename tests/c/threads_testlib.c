/* The CPU thread tests' round of calls (threads_testlib.h). */
#include "threads_testlib.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* FLCE: 64 x 4096 logits (256K elements) split over the threads. */
enum { F_M = 64, F_H = 32, F_V = 4096 };
/* OSFT layer: 256 tokens x 512 outputs (128K elements a pass). */
enum { L_M = 256, L_N = 512, L_K = 512 };
/* MLP: 256 tokens x 1024 intermediate, in one tile. */
enum { M_M = 256, M_H = 64, M_I = 1024 };

static tt *mat(tt_dtype d, int64_t rows, int64_t cols) {
  const int64_t shape[2] = {rows, cols};
  return tt_new(d, 2, shape);
}

static tt *vec(tt_dtype d, int64_t n) {
  const int64_t shape[1] = {n};
  return tt_new(d, 1, shape);
}

static void init_flce(threads_work *w) {
  w->fx = mat(TT_F32, F_M, F_H), w->fw = mat(TT_F32, F_V, F_H);
  w->fy = vec(TT_I64, F_M);
  tt_random(w->fx, -1.0, 1.0), tt_random(w->fw, -0.5, 0.5);
  double y[F_M];
  for (int i = 0; i < F_M; ++i) y[i] = (double)((i * 7919) % F_V);
  tt_set(w->fy, y);
  const int64_t one[1] = {1};
  w->floss = tt_new(TT_F32, 1, one);
  w->fgx = mat(TT_F32, F_M, F_H), w->fgw = mat(TT_F32, F_V, F_H);
  assert_ok(osft_flce_create(w->ctx, NULL, &w->flce));
}

static void init_layer(threads_work *w) {
  w->lw = mat(TT_F32, L_N, L_K);
  tt_random(w->lw, -1.0, 1.0);
  osft_flinear_options_t o;
  assert_ok(OSFT_FLINEAR_OPTIONS_INIT(&o));
  o.rank_ratio = 0.5;
  assert_ok(osft_flinear_create_from_weight(w->ctx, &w->lw->t, &o, &w->layer));
  int64_t l = 0;
  assert_ok(osft_flinear_get_dims(w->layer, NULL, NULL, NULL, &l));
  w->lx = mat(TT_F32, L_M, L_K), w->lb = vec(TT_F32, L_N), w->ly = mat(TT_F32, L_M, L_N);
  w->lgy = mat(TT_F32, L_M, L_N), w->lgx = mat(TT_F32, L_M, L_K);
  w->lgu = mat(TT_F32, L_N, l), w->lgs = vec(TT_F32, l), w->lgv = mat(TT_F32, l, L_K);
  w->lgb = vec(TT_F32, L_N);
  tt_random(w->lx, -1.0, 1.0), tt_random(w->lb, -0.5, 0.5), tt_random(w->lgy, -1.0, 1.0);
  assert_ok(osft_comm_create_self(w->ctx, NULL, &w->comm));
  assert_ok(osft_projector_create(w->ctx, w->comm, NULL, &w->proj));
  assert_ok(osft_projector_add_layer(w->proj, w->layer, &w->lgu->t, &w->lgv->t, NULL));
  assert_ok(osft_projector_prepare(w->proj));
}

static void init_mlp(threads_work *w) {
  w->mw[0] = mat(TT_F32, M_I, M_H), w->mw[1] = mat(TT_F32, M_I, M_H);
  w->mw[2] = mat(TT_F32, M_H, M_I);
  osft_mlp_weights_t wts;
  assert_ok(OSFT_MLP_WEIGHTS_INIT(&wts));
  for (int p = 0; p < 3; ++p) {
    tt_random(w->mw[p], -0.3, 0.3);
    w->mgw[p] = mat(TT_F32, w->mw[p]->shape[0], w->mw[p]->shape[1]);
  }
  wts.gate = &w->mw[0]->t, wts.up = &w->mw[1]->t, wts.down = &w->mw[2]->t;
  assert_ok(osft_mlp_create(w->ctx, OSFT_MLP_SWIGLU, M_H, M_I, &wts, NULL, &w->mlp));
  w->mx = mat(TT_F32, M_M, M_H), w->my = mat(TT_F32, M_M, M_H);
  w->mgy = mat(TT_F32, M_M, M_H), w->mgx = mat(TT_F32, M_M, M_H);
  tt_random(w->mx, -1.0, 1.0), tt_random(w->mgy, -1.0, 1.0);
}

static void init_qr(threads_work *w) {
  const int64_t m[THREADS_QR_COUNT] = {96, 80, 64, 48};
  const int64_t n[THREADS_QR_COUNT] = {64, 80, 32, 48};
  for (int i = 0; i < THREADS_QR_COUNT; ++i) {
    w->qa[i] = mat(i % 2 ? TT_F64 : TT_F32, m[i], n[i]);
    tt_random(w->qa[i], -1.0, 1.0);
    w->qq[i] = mat(w->qa[i]->dtype, m[i], n[i]);
    w->qr[i] = mat(w->qa[i]->dtype, n[i], n[i]);
  }
}

void threads_work_init(threads_work *w, osft_context_t ctx, unsigned seed) {
  memset(w, 0, sizeof *w);
  w->ctx = ctx;
  char name[32];
  snprintf(name, sizeof name, "threads work %u", seed);
  test_seed(name);
  init_flce(w);
  init_layer(w);
  init_mlp(w);
  init_qr(w);
}

static void flce_call(threads_work *w) {
  tt_poison(w->floss), tt_poison(w->fgx), tt_poison(w->fgw);
  osft_flce_inputs_t in;
  assert_ok(OSFT_FLCE_INPUTS_INIT(&in));
  in.x = &w->fx->t, in.weight = &w->fw->t, in.targets = &w->fy->t;
  osft_flce_outputs_t out;
  assert_ok(OSFT_FLCE_OUTPUTS_INIT(&out));
  out.loss = &w->floss->t, out.grad_x = &w->fgx->t, out.grad_weight = &w->fgw->t;
  assert_ok(osft_flce_compute(w->flce, &in, &out));
}

static void layer_call(threads_work *w) {
  tt *outs[] = {w->ly, w->lgx, w->lgu, w->lgs, w->lgv, w->lgb};
  for (size_t i = 0; i < sizeof outs / sizeof *outs; ++i) tt_poison(outs[i]);
  assert_ok(osft_flinear_forward(w->layer, &w->lx->t, &w->lb->t, &w->ly->t));
  osft_flinear_grads_t g;
  assert_ok(OSFT_FLINEAR_GRADS_INIT(&g));
  g.grad_x = &w->lgx->t, g.grad_u_low = &w->lgu->t, g.grad_s_low = &w->lgs->t;
  g.grad_v_low = &w->lgv->t, g.grad_bias = &w->lgb->t;
  assert_ok(osft_flinear_backward(w->layer, &w->lx->t, &w->lgy->t, &g));
  assert_ok(osft_projector_project(w->proj));
}

static void mlp_call(threads_work *w) {
  tt_poison(w->my), tt_poison(w->mgx);
  for (int p = 0; p < 3; ++p) tt_poison(w->mgw[p]);
  assert_ok(osft_mlp_forward(w->mlp, &w->mx->t, &w->my->t, 1));
  osft_mlp_grads_t g;
  assert_ok(OSFT_MLP_GRADS_INIT(&g));
  g.grad_x = &w->mgx->t;
  g.grad_gate = &w->mgw[0]->t, g.grad_up = &w->mgw[1]->t, g.grad_down = &w->mgw[2]->t;
  assert_ok(osft_mlp_backward(w->mlp, &w->mx->t, &w->mgy->t, &g, 1));
}

static void qr_call(threads_work *w) {
  const DLTensor *a[THREADS_QR_COUNT];
  DLTensor *q[THREADS_QR_COUNT], *r[THREADS_QR_COUNT];
  osft_status_t st[THREADS_QR_COUNT];
  for (int i = 0; i < THREADS_QR_COUNT; ++i) {
    tt_poison(w->qq[i]), tt_poison(w->qr[i]);
    a[i] = &w->qa[i]->t, q[i] = &w->qq[i]->t, r[i] = &w->qr[i]->t;
  }
  assert_ok(osft_qr_batch(w->ctx, NULL, THREADS_QR_COUNT, a, q, r, st));
}

void threads_round(threads_work *w) {
  flce_call(w);
  layer_call(w);
  mlp_call(w);
  qr_call(w);
}

/* FNV-1a over the tensors' bytes. */
static uint64_t hash_tensor(uint64_t h, const tt *t) {
  size_t n = 0;
  unsigned char *b = tt_bytes(t, &n);
  for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  free(b);
  return h;
}

uint64_t threads_checksum(const threads_work *w) {
  const tt *outs[] = {w->floss,  w->fgx,    w->fgw,   w->ly,    w->lgx,   w->lgu,
                      w->lgs,    w->lgv,    w->lgb,   w->my,    w->mgx,   w->mgw[0],
                      w->mgw[1], w->mgw[2], w->qq[0], w->qq[1], w->qq[2], w->qq[3],
                      w->qr[0],  w->qr[1],  w->qr[2], w->qr[3]};
  uint64_t h = 14695981039346656037ull;
  for (size_t i = 0; i < sizeof outs / sizeof *outs; ++i) h = hash_tensor(h, outs[i]);
  return h;
}

double threads_loss(const threads_work *w) {
  double *v = tt_get(w->floss);
  const double loss = v[0];
  free(v);
  return loss;
}

void threads_work_free(threads_work *w) {
  assert_ok(osft_projector_destroy(w->proj));
  assert_ok(osft_comm_destroy(w->comm));
  assert_ok(osft_flinear_destroy(w->layer));
  assert_ok(osft_flce_destroy(w->flce));
  assert_ok(osft_mlp_destroy(w->mlp));
  tt *all[] = {w->fx,    w->fw,    w->fy,     w->floss,  w->fgx,   w->fgw, w->lw,
               w->lx,    w->lb,    w->ly,     w->lgy,    w->lgx,   w->lgu, w->lgs,
               w->lgv,   w->lgb,   w->mx,     w->my,     w->mgy,   w->mgx, w->mw[0],
               w->mw[1], w->mw[2], w->mgw[0], w->mgw[1], w->mgw[2]};
  for (size_t i = 0; i < sizeof all / sizeof *all; ++i) tt_free(all[i]);
  for (int i = 0; i < THREADS_QR_COUNT; ++i)
    tt_free(w->qa[i]), tt_free(w->qq[i]), tt_free(w->qr[i]);
}
