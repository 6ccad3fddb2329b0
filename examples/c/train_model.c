/*
 * osftrt_train — the byte-level language model.
 *
 * For each token the last k bytes are embedded (e floats each) and
 * concatenated into the residual stream x (h = k * e). Then `blocks`
 * pre-norm residual blocks
 *
 *     x += mix(rmsnorm(x))            a projection h x h
 *     x += swiglu_mlp(rmsnorm(x))     down(silu(gate a) * up a), tiled
 *
 * and the LM head: loss = cross_entropy(rmsnorm(x) head^T, next byte).
 *
 * What runs where:
 *   - embedding lookup, RMSNorm, residual adds: plain C (the model's glue);
 *   - dense projections (pre-training, full fine-tuning): the mixer with
 *     CBLAS, the MLP with osft_mlp_* over dense weights;
 *   - OSFT projections: every weight (mixer, gate, up, down, head) is a
 *     libosftrt factorized layer (osft_flinear_create_from_weight); the
 *     mixer runs osft_flinear_forward/backward, the MLP osft_mlp_* over the
 *     layers, and the head is merged (osft_flinear_merge) for the loss,
 *     whose dense gradient G is turned into factor gradients with the OSFT
 *     formulas (dU_low = G V_low^T S_low, dV_low = S_low U_low^T G,
 *     dS_low = diag(U_low^T G V_low^T));
 *   - the loss and its gradients: osft_flce_compute (logits never formed).
 * Every OSFT layer is registered with one projector (a one-rank
 * communicator), which the training loop calls once per step.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "train.h"

void gemm(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
          const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c,
          int64_t ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, (int)m, (int)n, (int)k, alpha, a,
              (int)lda, b, (int)ldb, beta, c, (int)ldc);
}

/* ------------------------------------------------------------ weights */

static float *fvec(int64_t n) {
  return xcalloc((size_t)n, sizeof(float));
}

void weights_alloc(weights_t *w, const dims_t *d) {
  memset(w, 0, sizeof *w);
  w->emb = fvec(VOCAB * d->e);
  for (int64_t b = 0; b < d->blocks; ++b) {
    w->norm1[b] = fvec(d->h);
    w->mix[b] = fvec(d->h * d->h);
    w->norm2[b] = fvec(d->h);
    w->gate[b] = fvec(d->inter * d->h);
    w->up[b] = fvec(d->inter * d->h);
    w->down[b] = fvec(d->h * d->inter);
  }
  w->normf = fvec(d->h);
  w->head = fvec(VOCAB * d->h);
}

static void fill_normal(float *p, int64_t n, double stddev, rng_t *r) {
  for (int64_t i = 0; i < n; ++i) p[i] = (float)(stddev * rng_normal(r));
}

static void fill_ones(float *p, int64_t n) {
  for (int64_t i = 0; i < n; ++i) p[i] = 1.0f;
}

void weights_init(weights_t *w, const dims_t *d, rng_t *r) {
  const double resid = 1.0 / sqrt(2.0 * (double)d->blocks);
  fill_normal(w->emb, VOCAB * d->e, 1.0, r);
  for (int64_t b = 0; b < d->blocks; ++b) {
    fill_ones(w->norm1[b], d->h);
    fill_ones(w->norm2[b], d->h);
    fill_normal(w->mix[b], d->h * d->h, resid / sqrt((double)d->h), r);
    fill_normal(w->gate[b], d->inter * d->h, 1.0 / sqrt((double)d->h), r);
    fill_normal(w->up[b], d->inter * d->h, 1.0 / sqrt((double)d->h), r);
    fill_normal(w->down[b], d->h * d->inter, resid / sqrt((double)d->inter), r);
  }
  fill_ones(w->normf, d->h);
  fill_normal(w->head, VOCAB * d->h, 1.0 / sqrt((double)d->h), r);
}

#define COPY(field, n) memcpy(dst->field, src->field, sizeof(float) * (size_t)(n))
void weights_copy(weights_t *dst, const weights_t *src, const dims_t *d) {
  COPY(emb, VOCAB * d->e);
  for (int64_t b = 0; b < d->blocks; ++b) {
    COPY(norm1[b], d->h);
    COPY(mix[b], d->h * d->h);
    COPY(norm2[b], d->h);
    COPY(gate[b], d->inter * d->h);
    COPY(up[b], d->inter * d->h);
    COPY(down[b], d->h * d->inter);
  }
  COPY(normf, d->h);
  COPY(head, VOCAB * d->h);
}
#undef COPY

void weights_free(weights_t *w, const dims_t *d) {
  free(w->emb);
  for (int64_t b = 0; b < d->blocks; ++b) {
    free(w->norm1[b]);
    free(w->mix[b]);
    free(w->norm2[b]);
    free(w->gate[b]);
    free(w->up[b]);
    free(w->down[b]);
  }
  free(w->normf);
  free(w->head);
  memset(w, 0, sizeof *w);
}

/* ------------------------------------------------------------ tensors */

void tview_mat(tview_t *v, float *data, int64_t rows, int64_t cols, int64_t ld) {
  memset(v, 0, sizeof *v);
  v->shape[0] = rows;
  v->shape[1] = cols;
  v->strides[0] = ld;
  v->strides[1] = 1;
  v->t.data = data;
  v->t.device.device_type = kDLCPU;
  v->t.ndim = 2;
  v->t.dtype.code = kDLFloat;
  v->t.dtype.bits = 32;
  v->t.dtype.lanes = 1;
  v->t.shape = v->shape;
  v->t.strides = v->strides;
}

void tview_vec(tview_t *v, float *data, int64_t n) {
  tview_mat(v, data, n, 1, 1);
  v->t.ndim = 1;
  v->strides[0] = 1;
}

/* A view of one factor of a layer, as a tview (row stride kept). */
static void factor_view(osft_flinear_t layer, osft_flinear_factor_t which, tview_t *v) {
  DLTensor t;
  CHECK(osft_flinear_get_factor(layer, which, &t));
  if (t.ndim == 1) {
    tview_vec(v, t.data, t.shape[0]);
  } else {
    const int64_t ld = t.strides != NULL ? t.strides[0] : t.shape[1];
    tview_mat(v, t.data, t.shape[0], t.shape[1], ld);
  }
}

/* --------------------------------------------------------- parameters */

static param_t *add_param(model_t *m, const char *name, float *data, int64_t rows,
                          int64_t cols, int64_t ld, int matrix, int decay) {
  if (m->nparams == MAX_PARAMS) train_fail("too many parameters");
  param_t *p = &m->params[m->nparams++];
  memset(p, 0, sizeof *p);
  p->name = name;
  p->data = data;
  p->rows = rows;
  p->cols = cols;
  p->ld = ld;
  p->matrix = matrix;
  p->decay = decay;
  return p;
}

/* A dense weight and its gradient buffer (the gradient lives in m->g). */
static void add_dense(model_t *m, const char *name, float *data, float *grad,
                      int64_t rows, int64_t cols, int matrix) {
  param_t *p = add_param(m, name, data, rows, cols, cols, matrix, matrix);
  p->grad = grad;
}

/* Decomposes a dense weight into an OSFT layer, registers it with the
 * projector and its trainable factors with the optimizer. */
static void osft_proj_create(model_t *m, osft_proj_t *p, const char *name, float *weight,
                             int64_t rows, int64_t cols, double rank_ratio) {
  tview_t w;
  tview_mat(&w, weight, rows, cols, cols);
  osft_flinear_options_t o;
  CHECK(OSFT_FLINEAR_OPTIONS_INIT(&o));
  o.rank_ratio = rank_ratio;
  CHECK(osft_flinear_create_from_weight(m->ctx, &w.t, &o, &p->layer));
  CHECK(osft_flinear_get_dims(p->layer, &p->n, &p->k, &p->r, &p->l));
  p->du = fvec(p->n * p->l);
  p->ds = fvec(p->l);
  p->dv = fvec(p->l * p->k);
  tview_mat(&p->du_t, p->du, p->n, p->l, p->l);
  tview_vec(&p->ds_t, p->ds, p->l);
  tview_mat(&p->dv_t, p->dv, p->l, p->k, p->k);
  CHECK(OSFT_FLINEAR_GRADS_INIT(&p->grads));
  p->grads.grad_u_low = &p->du_t.t;
  p->grads.grad_s_low = &p->ds_t.t;
  p->grads.grad_v_low = &p->dv_t.t;
  factor_view(p->layer, OSFT_FACTOR_U_LOW, &p->u_low);
  factor_view(p->layer, OSFT_FACTOR_S_LOW, &p->s_low);
  factor_view(p->layer, OSFT_FACTOR_V_LOW, &p->v_low);
  factor_view(p->layer, OSFT_FACTOR_U_HIGH, &p->u_high);
  factor_view(p->layer, OSFT_FACTOR_S_HIGH, &p->s_high);
  factor_view(p->layer, OSFT_FACTOR_V_HIGH, &p->v_high);
  CHECK(osft_projector_add_layer(m->proj, p->layer, &p->du_t.t, &p->dv_t.t, NULL));
  /* The optimizer updates the trainable factors in place, through the
   * layer's own views. No weight decay on singular vectors. */
  param_t *u = add_param(m, name, p->u_low.t.data, p->n, p->l, p->u_low.strides[0], 1, 0);
  u->grad = p->du;
  param_t *s = add_param(m, name, p->s_low.t.data, 1, p->l, p->l, 0, 0);
  s->grad = p->ds;
  param_t *v = add_param(m, name, p->v_low.t.data, p->l, p->k, p->v_low.strides[0], 1, 0);
  v->grad = p->dv;
}

static void osft_proj_destroy(osft_proj_t *p) {
  CHECK(osft_flinear_destroy(p->layer));
  free(p->du);
  free(p->ds);
  free(p->dv);
}

/* -------------------------------------------------------------- model */

void model_create(model_t *m, osft_context_t ctx, const dims_t *d, const weights_t *from,
                  int osft, const model_options_t *o) {
  memset(m, 0, sizeof *m);
  m->d = *d;
  m->osft = osft;
  m->ctx = ctx;
  m->max_tokens = o->max_tokens;
  weights_alloc(&m->w, d);
  weights_copy(&m->w, from, d);
  const int64_t h = d->h, t = o->max_tokens;
  for (int64_t b = 0; b <= d->blocks; ++b) m->x[b] = fvec(t * h);
  for (int64_t b = 0; b < d->blocks; ++b) {
    m->a1[b] = fvec(t * h);
    m->xm[b] = fvec(t * h);
    m->a2[b] = fvec(t * h);
    m->rstd1[b] = fvec(t);
    m->rstd2[b] = fvec(t);
  }
  m->fin = fvec(t * h);
  m->rstdf = fvec(t);
  m->dx = fvec(t * h);
  m->dxm = fvec(t * h);
  m->dtmp = fvec(t * h);
  m->dfin = fvec(t * h);

  osft_flce_options_t fo;
  CHECK(OSFT_FLCE_OPTIONS_INIT(&fo));
  fo.reduction = OSFT_FLCE_MEAN;
  fo.memory_budget = o->loss_budget;
  CHECK(osft_flce_create(ctx, &fo, &m->ce));

  osft_mlp_options_t mo;
  CHECK(OSFT_MLP_OPTIONS_INIT(&mo));
  mo.tiling = OSFT_MLP_TILING_BUDGET;
  mo.memory_budget = o->tile_budget;

  if (!osft) {
    weights_alloc(&m->g, d);
    add_dense(m, "emb", m->w.emb, m->g.emb, VOCAB, d->e, 0);
    for (int64_t b = 0; b < d->blocks; ++b) {
      add_dense(m, "norm1", m->w.norm1[b], m->g.norm1[b], 1, h, 0);
      add_dense(m, "mix", m->w.mix[b], m->g.mix[b], h, h, 1);
      add_dense(m, "norm2", m->w.norm2[b], m->g.norm2[b], 1, h, 0);
      add_dense(m, "gate", m->w.gate[b], m->g.gate[b], d->inter, h, 1);
      add_dense(m, "up", m->w.up[b], m->g.up[b], d->inter, h, 1);
      add_dense(m, "down", m->w.down[b], m->g.down[b], h, d->inter, 1);
      tview_mat(&m->mlp_w[b][0], m->w.gate[b], d->inter, h, h);
      tview_mat(&m->mlp_w[b][1], m->w.up[b], d->inter, h, h);
      tview_mat(&m->mlp_w[b][2], m->w.down[b], h, d->inter, d->inter);
      osft_mlp_weights_t mw;
      CHECK(OSFT_MLP_WEIGHTS_INIT(&mw));
      mw.gate = &m->mlp_w[b][0].t;
      mw.up = &m->mlp_w[b][1].t;
      mw.down = &m->mlp_w[b][2].t;
      CHECK(osft_mlp_create(ctx, OSFT_MLP_SWIGLU, h, d->inter, &mw, &mo, &m->mlp[b]));
    }
    add_dense(m, "normf", m->w.normf, m->g.normf, 1, h, 0);
    add_dense(m, "head", m->w.head, m->g.head, VOCAB, h, 1);
    return;
  }

  /* OSFT: embedding and norms stay frozen; every projection is decomposed
   * and only its low-rank part trains. */
  CHECK(osft_comm_create_self(ctx, NULL, &m->comm));
  CHECK(osft_projector_create(ctx, m->comm, NULL, &m->proj));
  for (int64_t b = 0; b < d->blocks; ++b) {
    osft_proj_create(m, &m->mix_p[b], "mix", m->w.mix[b], h, h, o->rank_ratio);
    osft_proj_create(m, &m->gate_p[b], "gate", m->w.gate[b], d->inter, h, o->rank_ratio);
    osft_proj_create(m, &m->up_p[b], "up", m->w.up[b], d->inter, h, o->rank_ratio);
    osft_proj_create(m, &m->down_p[b], "down", m->w.down[b], h, d->inter, o->rank_ratio);
    osft_mlp_weights_t mw;
    CHECK(OSFT_MLP_WEIGHTS_INIT(&mw));
    mw.gate_layer = m->gate_p[b].layer;
    mw.up_layer = m->up_p[b].layer;
    mw.down_layer = m->down_p[b].layer;
    CHECK(osft_mlp_create(ctx, OSFT_MLP_SWIGLU, h, d->inter, &mw, &mo, &m->mlp[b]));
  }
  osft_proj_create(m, &m->head_p, "head", m->w.head, VOCAB, h, o->rank_ratio);
  m->head_merged = fvec(VOCAB * h);
  m->head_grad = fvec(VOCAB * h);
  m->head_tmp = fvec(VOCAB * m->head_p.l);
  CHECK(osft_projector_prepare(m->proj));
}

void model_destroy(model_t *m) {
  const dims_t *d = &m->d;
  for (int64_t b = 0; b < d->blocks; ++b) CHECK(osft_mlp_destroy(m->mlp[b]));
  CHECK(osft_flce_destroy(m->ce));
  if (m->osft) {
    CHECK(osft_projector_destroy(m->proj));
    CHECK(osft_comm_destroy(m->comm));
    for (int64_t b = 0; b < d->blocks; ++b) {
      osft_proj_destroy(&m->mix_p[b]);
      osft_proj_destroy(&m->gate_p[b]);
      osft_proj_destroy(&m->up_p[b]);
      osft_proj_destroy(&m->down_p[b]);
    }
    osft_proj_destroy(&m->head_p);
    free(m->head_merged);
    free(m->head_grad);
    free(m->head_tmp);
  } else {
    weights_free(&m->g, d);
  }
  weights_free(&m->w, d);
  for (int64_t b = 0; b <= d->blocks; ++b) free(m->x[b]);
  for (int64_t b = 0; b < d->blocks; ++b) {
    free(m->a1[b]);
    free(m->xm[b]);
    free(m->a2[b]);
    free(m->rstd1[b]);
    free(m->rstd2[b]);
  }
  free(m->fin);
  free(m->rstdf);
  free(m->dx);
  free(m->dxm);
  free(m->dtmp);
  free(m->dfin);
}

int64_t model_trainable(const model_t *m) {
  int64_t n = 0;
  for (int i = 0; i < m->nparams; ++i) n += m->params[i].rows * m->params[i].cols;
  return n;
}

/* ------------------------------------------------------------ glue */

/* y = x / rms(x) * gain, row by row; keeps 1 / rms per row. */
static void rmsnorm(const float *x, const float *gain, float *y, float *rstd,
                    int64_t rows, int64_t h) {
  for (int64_t i = 0; i < rows; ++i) {
    const float *xi = x + i * h;
    double ss = 0;
    for (int64_t j = 0; j < h; ++j) ss += (double)xi[j] * xi[j];
    const float r = (float)(1.0 / sqrt(ss / (double)h + 1e-6));
    rstd[i] = r;
    for (int64_t j = 0; j < h; ++j) y[i * h + j] = xi[j] * r * gain[j];
  }
}

/* dx += d(rmsnorm)/dx^T dy; dgain (if not NULL) = sum over rows of dy x r. */
static void rmsnorm_backward(const float *x, const float *gain, const float *rstd,
                             const float *dy, float *dx, float *dgain, int64_t rows,
                             int64_t h) {
  if (dgain != NULL) memset(dgain, 0, sizeof(float) * (size_t)h);
  for (int64_t i = 0; i < rows; ++i) {
    const float *xi = x + i * h, *dyi = dy + i * h;
    const float r = rstd[i];
    double dot = 0;
    for (int64_t j = 0; j < h; ++j) dot += (double)gain[j] * dyi[j] * xi[j];
    const float c = (float)(dot * r * r * r / (double)h);
    for (int64_t j = 0; j < h; ++j) {
      dx[i * h + j] += r * gain[j] * dyi[j] - xi[j] * c;
      if (dgain != NULL) dgain[j] += dyi[j] * xi[j] * r;
    }
  }
}

static void add_into(float *y, const float *a, const float *b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
}

/* The OSFT head's factor gradients from its dense gradient G (VOCAB x h). */
static void head_factor_grads(model_t *m) {
  osft_proj_t *p = &m->head_p;
  const float *u = p->u_low.t.data, *s = p->s_low.t.data, *v = p->v_low.t.data;
  const int64_t ldu = p->u_low.strides[0], ldv = p->v_low.strides[0];
  const int64_t n = p->n, k = p->k, l = p->l;
  gemm(0, 1, n, l, k, 1.0f, m->head_grad, k, v, ldv, 0.0f, m->head_tmp, l); /* G V^T */
  for (int64_t j = 0; j < l; ++j) p->ds[j] = 0;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < l; ++j) {
      const float gv = m->head_tmp[i * l + j];
      p->du[i * l + j] = gv * s[j];
      p->ds[j] += u[i * ldu + j] * gv;
    }
  gemm(1, 0, l, k, n, 1.0f, u, ldu, m->head_grad, k, 0.0f, p->dv, k); /* U^T G */
  for (int64_t j = 0; j < l; ++j)
    for (int64_t c = 0; c < k; ++c) p->dv[j * k + c] *= s[j];
}

double model_step(model_t *m, const batch_t *bt, int train) {
  const dims_t *d = &m->d;
  const int64_t tok = bt->tokens, h = d->h, e = d->e, nb = d->blocks;
  if (tok > m->max_tokens)
    train_fail("batch of %lld tokens > %lld", (long long)tok, (long long)m->max_tokens);
  tview_t xv, yv, gv, gxv;
  /* embedding lookup: the k context bytes side by side */
  for (int64_t i = 0; i < tok; ++i)
    for (int64_t j = 0; j < d->k; ++j)
      memcpy(m->x[0] + i * h + j * e, m->w.emb + bt->context[i * d->k + j] * e,
             sizeof(float) * (size_t)e);
  for (int64_t b = 0; b < nb; ++b) {
    rmsnorm(m->x[b], m->w.norm1[b], m->a1[b], m->rstd1[b], tok, h);
    if (m->osft) {
      tview_mat(&xv, m->a1[b], tok, h, h);
      tview_mat(&yv, m->dtmp, tok, h, h);
      CHECK(osft_flinear_forward(m->mix_p[b].layer, &xv.t, NULL, &yv.t));
      add_into(m->xm[b], m->x[b], m->dtmp, tok * h);
    } else {
      memcpy(m->xm[b], m->x[b], sizeof(float) * (size_t)(tok * h));
      gemm(0, 1, tok, h, h, 1.0f, m->a1[b], h, m->w.mix[b], h, 1.0f, m->xm[b], h);
    }
    rmsnorm(m->xm[b], m->w.norm2[b], m->a2[b], m->rstd2[b], tok, h);
    tview_mat(&xv, m->a2[b], tok, h, h);
    tview_mat(&yv, m->dtmp, tok, h, h);
    CHECK(osft_mlp_forward(m->mlp[b], &xv.t, &yv.t, 0));
    add_into(m->x[b + 1], m->xm[b], m->dtmp, tok * h);
  }
  rmsnorm(m->x[nb], m->w.normf, m->fin, m->rstdf, tok, h);

  /* the loss: fused linear cross-entropy over the head */
  float *head = m->w.head;
  tview_t hw, hg, lossv, fin, dfin;
  if (m->osft) {
    tview_mat(&hw, m->head_merged, VOCAB, h, h);
    CHECK(osft_flinear_merge(m->head_p.layer, &hw.t));
    head = m->head_merged;
  }
  tview_mat(&hw, head, VOCAB, h, h);
  tview_mat(&fin, m->fin, tok, h, h);
  float loss = 0;
  tview_vec(&lossv, &loss, 1);
  DLTensor targets;
  int64_t tshape[1] = {tok};
  memset(&targets, 0, sizeof targets);
  targets.data = bt->targets;
  targets.device.device_type = kDLCPU;
  targets.ndim = 1;
  targets.dtype.code = kDLInt;
  targets.dtype.bits = 64;
  targets.dtype.lanes = 1;
  targets.shape = tshape;
  osft_flce_inputs_t in;
  CHECK(OSFT_FLCE_INPUTS_INIT(&in));
  in.x = &fin.t;
  in.weight = &hw.t;
  in.targets = &targets;
  osft_flce_outputs_t out;
  CHECK(OSFT_FLCE_OUTPUTS_INIT(&out));
  out.loss = &lossv.t;
  if (train) {
    tview_mat(&dfin, m->dfin, tok, h, h);
    tview_mat(&hg, m->osft ? m->head_grad : m->g.head, VOCAB, h, h);
    out.grad_x = &dfin.t;
    out.grad_weight = &hg.t;
  }
  CHECK(osft_flce_compute(m->ce, &in, &out));
  if (!train) return loss;

  /* backward */
  if (m->osft) head_factor_grads(m);
  memset(m->dx, 0, sizeof(float) * (size_t)(tok * h));
  rmsnorm_backward(m->x[nb], m->w.normf, m->rstdf, m->dfin, m->dx,
                   m->osft ? NULL : m->g.normf, tok, h);
  for (int64_t b = nb - 1; b >= 0; --b) {
    /* x[b+1] = xm + mlp(a2) */
    osft_mlp_grads_t mg;
    CHECK(OSFT_MLP_GRADS_INIT(&mg));
    tview_mat(&gxv, m->dtmp, tok, h, h);
    mg.grad_x = &gxv.t;
    tview_t gg, gu, gd;
    if (m->osft) {
      mg.gate_factors = &m->gate_p[b].grads;
      mg.up_factors = &m->up_p[b].grads;
      mg.down_factors = &m->down_p[b].grads;
    } else {
      tview_mat(&gg, m->g.gate[b], d->inter, h, h);
      tview_mat(&gu, m->g.up[b], d->inter, h, h);
      tview_mat(&gd, m->g.down[b], h, d->inter, d->inter);
      mg.grad_gate = &gg.t;
      mg.grad_up = &gu.t;
      mg.grad_down = &gd.t;
    }
    tview_mat(&xv, m->a2[b], tok, h, h);
    tview_mat(&gv, m->dx, tok, h, h);
    CHECK(osft_mlp_backward(m->mlp[b], &xv.t, &gv.t, &mg, 0));
    memcpy(m->dxm, m->dx, sizeof(float) * (size_t)(tok * h));
    rmsnorm_backward(m->xm[b], m->w.norm2[b], m->rstd2[b], m->dtmp, m->dxm,
                     m->osft ? NULL : m->g.norm2[b], tok, h);
    /* xm = x[b] + mix(a1) */
    if (m->osft) {
      osft_flinear_grads_t fg = m->mix_p[b].grads;
      tview_mat(&gxv, m->dtmp, tok, h, h);
      fg.grad_x = &gxv.t;
      tview_mat(&xv, m->a1[b], tok, h, h);
      tview_mat(&gv, m->dxm, tok, h, h);
      CHECK(osft_flinear_backward(m->mix_p[b].layer, &xv.t, &gv.t, &fg));
    } else {
      gemm(0, 0, tok, h, h, 1.0f, m->dxm, h, m->w.mix[b], h, 0.0f, m->dtmp, h);
      gemm(1, 0, h, h, tok, 1.0f, m->dxm, h, m->a1[b], h, 0.0f, m->g.mix[b], h);
    }
    memcpy(m->dx, m->dxm, sizeof(float) * (size_t)(tok * h));
    rmsnorm_backward(m->x[b], m->w.norm1[b], m->rstd1[b], m->dtmp, m->dx,
                     m->osft ? NULL : m->g.norm1[b], tok, h);
  }
  if (!m->osft) {
    memset(m->g.emb, 0, sizeof(float) * (size_t)(VOCAB * e));
    for (int64_t i = 0; i < tok; ++i)
      for (int64_t j = 0; j < d->k; ++j) {
        float *ge = m->g.emb + bt->context[i * d->k + j] * e;
        const float *src = m->dx + i * h + j * e;
        for (int64_t c = 0; c < e; ++c) ge[c] += src[c];
      }
  }
  return loss;
}

double model_eval(model_t *m, const corpus_t *c, int64_t tokens) {
  batch_t b;
  const int64_t chunk = m->max_tokens;
  batch_alloc(&b, chunk, m->d.k);
  double total = 0;
  for (int64_t first = 0; first < tokens; first += chunk) {
    b.tokens = tokens - first < chunk ? tokens - first : chunk;
    batch_eval(&b, c, first);
    total += model_step(m, &b, 0) * (double)b.tokens;
  }
  batch_free(&b);
  return total / (double)tokens;
}
