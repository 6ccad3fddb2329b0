/*
 * osftrt_train — optimizers: AdamW, and SOAP on the 2-D weights.
 *
 * SOAP (Vyas et al., 2024) runs Adam in the eigenbasis of Shampoo's
 * preconditioner. For a weight W (m x n) with gradient G it keeps the
 * Kronecker factors L = EMA(G G^T) (m x m) and R = EMA(G^T G) (n x n) and
 * orthonormal bases Q_L, Q_R of their eigenvectors, and per step
 *
 *   G' = Q_L^T G Q_R            the gradient in the eigenbasis
 *   v  = b2 v + (1 - b2) G'^2   Adam's second moment, in the eigenbasis
 *   M' = Q_L^T M Q_R            the first moment M, kept in W's basis
 *   W -= lr Q_L (M' / (sqrt(v) + eps)) Q_R^T   (with bias corrections)
 *
 * The eigenbases are refreshed every `refresh_every` steps by one step of
 * power iteration, Q <- qr(L Q), for EVERY factor of every weight in ONE
 * batched libosftrt call (osft_qr_power_iteration); the first basis takes
 * `init_iterations` steps from the identity. L and R are rank-deficient
 * early on (G G^T has rank <= min(m, n)), so the call turns the rank check
 * off (rank_tolerance < 0), as the header suggests for singular
 * preconditioners. Sides larger than max_precond are not rotated.
 * 1-D tensors and the embedding use AdamW. The trainer's own GEMMs use CBLAS.
 *
 * The optimizer works on the host sides of the parameters and gradients;
 * only the batched QR runs on the context's device, its matrices staged
 * there and back (train_device.c; no copies on the CPU).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train.h"

static int soap_on(const optimizer_t *o, const param_t *p) {
  return o->kind == OPT_SOAP && p->matrix;
}

static float *fvec(int64_t n) {
  return xcalloc((size_t)n, sizeof(float));
}

static void identity(float *q, int64_t n) {
  memset(q, 0, sizeof(float) * (size_t)(n * n));
  for (int64_t i = 0; i < n; ++i) q[i * n + i] = 1.0f;
}

void optimizer_init(optimizer_t *o, osft_context_t ctx, param_t *params, int nparams) {
  o->ctx = ctx;
  o->nparams = nparams;
  o->params = xcalloc((size_t)nparams, sizeof(param_t *));
  o->step = 0;
  o->qr_seconds = 0;
  o->qr_calls = o->qr_matrices = 0;
  int64_t most = 0;
  for (int i = 0; i < nparams; ++i)
    if (params[i].rows * params[i].cols > most) most = params[i].rows * params[i].cols;
  for (int i = 0; i < 3; ++i) o->scratch[i] = fvec(most);
  for (int i = 0; i < nparams; ++i) {
    param_t *p = &params[i];
    o->params[i] = p;
    const int64_t n = p->rows * p->cols;
    p->m = fvec(n);
    p->v = fvec(n);
    if (soap_on(o, p)) {
      if (p->rows <= o->max_precond) {
        p->l = fvec(p->rows * p->rows);
        p->ql = fvec(p->rows * p->rows);
        identity(p->ql, p->rows);
      }
      if (p->cols <= o->max_precond) {
        p->r = fvec(p->cols * p->cols);
        p->qr = fvec(p->cols * p->cols);
        identity(p->qr, p->cols);
      }
    }
  }
}

void optimizer_free(optimizer_t *o) {
  for (int i = 0; i < o->nparams; ++i) {
    param_t *p = o->params[i];
    free(p->m);
    free(p->v);
    free(p->l);
    free(p->r);
    free(p->ql);
    free(p->qr);
    p->m = p->v = p->l = p->r = p->ql = p->qr = NULL;
  }
  free(o->params);
  o->params = NULL;
  for (int i = 0; i < 3; ++i) free(o->scratch[i]);
}

size_t optimizer_state_bytes(const optimizer_t *o) {
  size_t bytes = 0;
  for (int i = 0; i < o->nparams; ++i) {
    const param_t *p = o->params[i];
    bytes += 2 * (size_t)(p->rows * p->cols);
    if (p->l) bytes += 2 * (size_t)(p->rows * p->rows);
    if (p->r) bytes += 2 * (size_t)(p->cols * p->cols);
  }
  return bytes * sizeof(float);
}

/* Stages an n x n host matrix for the batched QR: a device side in *buf,
 * uploaded, and a tensor over it. */
static const DLTensor *qr_stage(dbuf_t *buf, tview_t *view, float *a, int64_t n) {
  dbuf_mirror_host(buf, a, n, n, n);
  dbuf_upload(buf);
  tview_dev(view, buf, n);
  return &view->t;
}

/* Every eigenbasis of every weight, refreshed by one batched call on the
 * context's device (the factors and bases staged there and back). */
static void refresh_bases(optimizer_t *o, int iterations) {
  size_t count = 0;
  for (int i = 0; i < o->nparams; ++i)
    count += (o->params[i]->l != NULL) + (o->params[i]->r != NULL);
  if (count == 0) return;
  tview_t *views = xcalloc(2 * count, sizeof(tview_t));
  dbuf_t *bufs = xcalloc(2 * count, sizeof(dbuf_t));
  const DLTensor **a = xcalloc(count, sizeof(DLTensor *));
  DLTensor **q = xcalloc(count, sizeof(DLTensor *));
  osft_status_t *st = xcalloc(count, sizeof(osft_status_t));
  size_t c = 0;
  for (int i = 0; i < o->nparams; ++i) {
    param_t *p = o->params[i];
    for (int side = 0; side < 2; ++side) {
      float *f = side ? p->r : p->l, *qf = side ? p->qr : p->ql;
      const int64_t n = side ? p->cols : p->rows;
      if (f == NULL) continue;
      a[c] = qr_stage(&bufs[2 * c], &views[2 * c], f, n);
      q[c] = (DLTensor *)qr_stage(&bufs[2 * c + 1], &views[2 * c + 1], qf, n);
      c++;
    }
  }
  osft_qr_options_t qo;
  CHECK(OSFT_QR_OPTIONS_INIT(&qo));
  qo.rank_tolerance = -1.0; /* singular preconditioners are expected */
  const double t0 = now_seconds();
  CHECK(osft_qr_power_iteration(o->ctx, &qo, count, a, q, iterations, st));
  for (size_t j = 0; j < 2 * count; ++j) {
    if (j % 2 == 1) dbuf_download(&bufs[j]); /* the new basis */
    dbuf_free(&bufs[j]);
  }
  o->qr_seconds += now_seconds() - t0;
  o->qr_calls++;
  o->qr_matrices += (int64_t)count;
  free(views);
  free(bufs);
  free(a);
  free(q);
  free(st);
}

/* w -= lr * (update + wd * w) for a rows x cols view with row stride ld. */
static void apply(param_t *p, const float *update, double lr, double wd) {
  const float flr = (float)lr, fwd = p->decay ? (float)wd : 0.0f;
  for (int64_t i = 0; i < p->rows; ++i)
    for (int64_t j = 0; j < p->cols; ++j) {
      float *w = &p->data[i * p->ld + j];
      *w -= flr * (update[i * p->cols + j] + fwd * *w);
    }
}

static void adamw(optimizer_t *o, param_t *p, double lr, float *scratch) {
  const int64_t n = p->rows * p->cols;
  const float b1 = (float)o->beta1, b2 = (float)o->beta2, eps = (float)o->eps;
  const float bc1 = (float)(1.0 - pow(o->beta1, (double)o->step));
  const float bc2 = (float)(1.0 - pow(o->beta2, (double)o->step));
  for (int64_t i = 0; i < n; ++i) {
    const float g = p->grad[i];
    p->m[i] = b1 * p->m[i] + (1 - b1) * g;
    p->v[i] = b2 * p->v[i] + (1 - b2) * g * g;
    scratch[i] = (p->m[i] / bc1) / (sqrtf(p->v[i] / bc2) + eps);
  }
  apply(p, scratch, lr, o->weight_decay);
}

/* Q_L^T X Q_R (into out), with identity for a side that is not rotated. */
static void rotate(const param_t *p, const float *x, float *tmp, float *out) {
  const int64_t m = p->rows, n = p->cols;
  const float *src = x;
  if (p->ql) {
    gemm(1, 0, m, n, m, 1.0f, p->ql, m, src, n, 0.0f, tmp, n);
    src = tmp;
  }
  if (p->qr)
    gemm(0, 0, m, n, n, 1.0f, src, n, p->qr, n, 0.0f, out, n);
  else
    memcpy(out, src, sizeof(float) * (size_t)(m * n));
}

/* Q_L X Q_R^T (into out). */
static void rotate_back(const param_t *p, const float *x, float *tmp, float *out) {
  const int64_t m = p->rows, n = p->cols;
  const float *src = x;
  if (p->ql) {
    gemm(0, 0, m, n, m, 1.0f, p->ql, m, src, n, 0.0f, tmp, n);
    src = tmp;
  }
  if (p->qr)
    gemm(0, 1, m, n, n, 1.0f, src, n, p->qr, n, 0.0f, out, n);
  else
    memcpy(out, src, sizeof(float) * (size_t)(m * n));
}

static void soap_statistics(optimizer_t *o, param_t *p) {
  const int64_t m = p->rows, n = p->cols;
  const float sb = (float)o->shampoo_beta;
  if (p->l) gemm(0, 1, m, m, n, 1.0f - sb, p->grad, n, p->grad, n, sb, p->l, m);
  if (p->r) gemm(1, 0, n, n, m, 1.0f - sb, p->grad, n, p->grad, n, sb, p->r, n);
}

static void soap(optimizer_t *o, param_t *p, double lr, float *s1, float *s2, float *s3) {
  const int64_t n = p->rows * p->cols;
  const float b1 = (float)o->beta1, b2 = (float)o->beta2, eps = (float)o->eps;
  const float bc1 = (float)(1.0 - pow(o->beta1, (double)o->step));
  const float bc2 = (float)(1.0 - pow(o->beta2, (double)o->step));
  for (int64_t i = 0; i < n; ++i) p->m[i] = b1 * p->m[i] + (1 - b1) * p->grad[i];
  rotate(p, p->grad, s1, s2); /* s2 = G' */
  for (int64_t i = 0; i < n; ++i) p->v[i] = b2 * p->v[i] + (1 - b2) * s2[i] * s2[i];
  rotate(p, p->m, s1, s3); /* s3 = M' */
  for (int64_t i = 0; i < n; ++i) s3[i] = (s3[i] / bc1) / (sqrtf(p->v[i] / bc2) + eps);
  rotate_back(p, s3, s1, s2);
  apply(p, s2, lr, o->weight_decay);
}

void optimizer_step(optimizer_t *o, double lr) {
  o->step++;
  float *s1 = o->scratch[0], *s2 = o->scratch[1], *s3 = o->scratch[2];
  int any_soap = 0;
  for (int i = 0; i < o->nparams; ++i)
    if (soap_on(o, o->params[i])) {
      soap_statistics(o, o->params[i]);
      any_soap = 1;
    }
  if (any_soap) {
    if (o->step == 1)
      refresh_bases(o, o->init_iterations);
    else if (o->step % o->refresh_every == 0)
      refresh_bases(o, 1);
  }
  for (int i = 0; i < o->nparams; ++i) {
    param_t *p = o->params[i];
    if (soap_on(o, p))
      soap(o, p, lr, s1, s2, s3);
    else
      adamw(o, p, lr, s1);
  }
}
