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
 *
 * Every tensor a libosftrt call sees is on the context's device: the device
 * side of a mirrored buffer (train_device.c), uploaded before the call and
 * downloaded after it for the C glue; the OSFT factors are the library's
 * own memory, mirrored on the host for the optimizer and the head's
 * gradient. model_step leaves the gradients on the device side;
 * model_grads_to_host / model_params_to_dev / model_params_to_host move the
 * trainable tensors around the optimizer. On the CPU (DEV_HOST) every copy
 * is a no-op and each buffer is one host array.
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

static void wtensor(wtensor_t *t, const char *name, int64_t block, float *data,
                    int64_t rows, int64_t cols, int projection) {
  if (block < 0)
    snprintf(t->name, sizeof t->name, "%s", name);
  else
    snprintf(t->name, sizeof t->name, "block%lld.%s", (long long)block, name);
  t->data = data;
  t->rows = rows;
  t->cols = cols;
  t->projection = projection;
}

int weights_list(const weights_t *w, const dims_t *d, wtensor_t *out) {
  int n = 0;
  wtensor(&out[n++], "emb", -1, w->emb, VOCAB, d->e, 0);
  for (int64_t b = 0; b < d->blocks; ++b) {
    wtensor(&out[n++], "norm1", b, w->norm1[b], 1, d->h, 0);
    wtensor(&out[n++], "mix", b, w->mix[b], d->h, d->h, 1);
    wtensor(&out[n++], "norm2", b, w->norm2[b], 1, d->h, 0);
    wtensor(&out[n++], "gate", b, w->gate[b], d->inter, d->h, 1);
    wtensor(&out[n++], "up", b, w->up[b], d->inter, d->h, 1);
    wtensor(&out[n++], "down", b, w->down[b], d->h, d->inter, 1);
  }
  wtensor(&out[n++], "normf", -1, w->normf, 1, d->h, 0);
  wtensor(&out[n++], "head", -1, w->head, VOCAB, d->h, 1);
  return n;
}

void weights_copy(weights_t *dst, const weights_t *src, const dims_t *d) {
  wtensor_t to[MAX_WTENSORS], from[MAX_WTENSORS];
  const int n = weights_list(dst, d, to);
  weights_list(src, d, from);
  for (int i = 0; i < n; ++i)
    memcpy(to[i].data, from[i].data, sizeof(float) * (size_t)(to[i].rows * to[i].cols));
}

void weights_free(weights_t *w, const dims_t *d) {
  wtensor_t t[MAX_WTENSORS];
  const int n = weights_list(w, d, t);
  for (int i = 0; i < n; ++i) free(t[i].data);
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

/* A layer's factor (library memory: the device side) with a host mirror. */
void factor_mirror(osft_flinear_t layer, osft_flinear_factor_t which, dbuf_t *b) {
  DLTensor t;
  CHECK(osft_flinear_get_factor(layer, which, &t));
  if (t.ndim == 1) {
    dbuf_mirror_dev(b, t.data, 1, t.shape[0], t.shape[0]);
  } else {
    const int64_t ld = t.strides != NULL ? t.strides[0] : t.shape[1];
    dbuf_mirror_dev(b, t.data, t.shape[0], t.shape[1], ld);
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
static param_t *add_dense(model_t *m, const char *name, float *data, float *grad,
                          int64_t rows, int64_t cols, int matrix) {
  param_t *p = add_param(m, name, data, rows, cols, cols, matrix, matrix);
  p->grad = grad;
  return p;
}

/* A dense weight that libosftrt reads, and its gradient that it writes:
 * device sides for both, the weight uploaded. */
static param_t *add_dense_dev(model_t *m, const char *name, float *data, float *grad,
                              int64_t rows, int64_t cols, dbuf_t *wd, dbuf_t *gd) {
  param_t *p = add_dense(m, name, data, grad, rows, cols, 1);
  dbuf_mirror_host(wd, data, rows, cols, cols);
  dbuf_upload(wd);
  dbuf_mirror_host(gd, grad, rows, cols, cols);
  p->data_dev = wd;
  p->grad_dev = gd;
  return p;
}

/* Registers a trainable factor (host mirror `f`) and its gradient. */
static void add_factor(model_t *m, const char *name, dbuf_t *f, dbuf_t *g, int matrix) {
  param_t *p = add_param(m, name, f->host, f->rows, f->cols, f->ld, matrix, 0);
  p->grad = g->host;
  p->data_dev = f;
  p->grad_dev = g;
}

/* Decomposes a dense weight into an OSFT layer, registers it with the
 * projector and its trainable factors with the optimizer. */
static void osft_proj_create(model_t *m, osft_proj_t *p, const char *name, float *weight,
                             int64_t rows, int64_t cols, double rank_ratio) {
  dbuf_t wd; /* the weight, on the device for the decomposition */
  dbuf_mirror_host(&wd, weight, rows, cols, cols);
  dbuf_upload(&wd);
  tview_t w;
  tview_dev(&w, &wd, rows);
  osft_flinear_options_t o;
  CHECK(OSFT_FLINEAR_OPTIONS_INIT(&o));
  o.rank_ratio = rank_ratio;
  CHECK(osft_flinear_create_from_weight(m->ctx, &w.t, &o, &p->layer));
  CHECK(osft_context_synchronize(m->ctx));
  dbuf_free(&wd);
  CHECK(osft_flinear_get_dims(p->layer, &p->n, &p->k, &p->r, &p->l));
  dbuf_alloc(&p->du, p->n, p->l);
  dbuf_alloc(&p->ds, 1, p->l);
  dbuf_alloc(&p->dv, p->l, p->k);
  tview_dev(&p->du_t, &p->du, p->n);
  tview_dev_vec(&p->ds_t, &p->ds);
  tview_dev(&p->dv_t, &p->dv, p->l);
  CHECK(OSFT_FLINEAR_GRADS_INIT(&p->grads));
  p->grads.grad_u_low = &p->du_t.t;
  p->grads.grad_s_low = &p->ds_t.t;
  p->grads.grad_v_low = &p->dv_t.t;
  factor_mirror(p->layer, OSFT_FACTOR_U_LOW, &p->u_low);
  factor_mirror(p->layer, OSFT_FACTOR_S_LOW, &p->s_low);
  factor_mirror(p->layer, OSFT_FACTOR_V_LOW, &p->v_low);
  CHECK(osft_projector_add_layer(m->proj, p->layer, &p->du_t.t, &p->dv_t.t, NULL));
  /* The optimizer updates the trainable factors' host mirrors, which are
   * then uploaded into the layer. No weight decay on singular vectors. */
  add_factor(m, name, &p->u_low, &p->du, 1);
  add_factor(m, name, &p->s_low, &p->ds, 0);
  add_factor(m, name, &p->v_low, &p->dv, 1);
}

static void osft_proj_destroy(osft_proj_t *p) {
  dbuf_free(&p->u_low);
  dbuf_free(&p->s_low);
  dbuf_free(&p->v_low);
  CHECK(osft_flinear_destroy(p->layer));
  dbuf_free(&p->du);
  dbuf_free(&p->ds);
  dbuf_free(&p->dv);
}

void model_grads_to_host(const model_t *m) {
  for (int i = 0; i < m->nparams; ++i)
    if (m->params[i].grad_dev != NULL) dbuf_download(m->params[i].grad_dev);
}

void model_params_to_dev(const model_t *m) {
  for (int i = 0; i < m->nparams; ++i)
    if (m->params[i].data_dev != NULL) dbuf_upload(m->params[i].data_dev);
}

void model_params_to_host(const model_t *m) {
  for (int i = 0; i < m->nparams; ++i)
    if (m->params[i].data_dev != NULL) dbuf_download(m->params[i].data_dev);
}

/* -------------------------------------------------------------- model */

static void activations_alloc(model_t *m) {
  const int64_t h = m->d.h, t = m->max_tokens;
  for (int64_t b = 0; b <= m->d.blocks; ++b) m->x[b] = fvec(t * h);
  for (int64_t b = 0; b < m->d.blocks; ++b) {
    dbuf_alloc(&m->a1[b], t, h);
    m->xm[b] = fvec(t * h);
    dbuf_alloc(&m->a2[b], t, h);
    m->rstd1[b] = fvec(t);
    m->rstd2[b] = fvec(t);
  }
  dbuf_alloc(&m->fin, t, h);
  m->rstdf = fvec(t);
  dbuf_alloc(&m->dx, t, h);
  dbuf_alloc(&m->dxm, t, h);
  dbuf_alloc(&m->dtmp, t, h);
  dbuf_alloc(&m->dfin, t, h);
  dbuf_alloc(&m->loss, 1, 1);
  if (dev_current() != DEV_HOST)
    m->targets_dev = dev_malloc_bytes(sizeof(int64_t) * (size_t)t);
}

static void activations_free(model_t *m) {
  for (int64_t b = 0; b <= m->d.blocks; ++b) free(m->x[b]);
  for (int64_t b = 0; b < m->d.blocks; ++b) {
    dbuf_free(&m->a1[b]);
    free(m->xm[b]);
    dbuf_free(&m->a2[b]);
    free(m->rstd1[b]);
    free(m->rstd2[b]);
  }
  dbuf_free(&m->fin);
  free(m->rstdf);
  dbuf_free(&m->dx);
  dbuf_free(&m->dxm);
  dbuf_free(&m->dtmp);
  dbuf_free(&m->dfin);
  dbuf_free(&m->loss);
  dev_free_bytes(m->targets_dev, sizeof(int64_t) * (size_t)m->max_tokens);
}

/* Every weight dense and trainable; the MLPs over dense device weights. */
static void create_dense(model_t *m, const osft_mlp_options_t *mo) {
  const dims_t *d = &m->d;
  const int64_t h = d->h;
  weights_alloc(&m->g, d);
  add_dense(m, "emb", m->w.emb, m->g.emb, VOCAB, d->e, 0);
  for (int64_t b = 0; b < d->blocks; ++b) {
    add_dense(m, "norm1", m->w.norm1[b], m->g.norm1[b], 1, h, 0);
    add_dense(m, "mix", m->w.mix[b], m->g.mix[b], h, h, 1);
    add_dense(m, "norm2", m->w.norm2[b], m->g.norm2[b], 1, h, 0);
    dbuf_t *wd = m->mlp_wd[b], *gd = m->mlp_gd[b];
    add_dense_dev(m, "gate", m->w.gate[b], m->g.gate[b], d->inter, h, &wd[0], &gd[0]);
    add_dense_dev(m, "up", m->w.up[b], m->g.up[b], d->inter, h, &wd[1], &gd[1]);
    add_dense_dev(m, "down", m->w.down[b], m->g.down[b], h, d->inter, &wd[2], &gd[2]);
    for (int i = 0; i < 3; ++i) tview_dev(&m->mlp_w[b][i], &wd[i], wd[i].rows);
    osft_mlp_weights_t mw;
    CHECK(OSFT_MLP_WEIGHTS_INIT(&mw));
    mw.gate = &m->mlp_w[b][0].t;
    mw.up = &m->mlp_w[b][1].t;
    mw.down = &m->mlp_w[b][2].t;
    CHECK(osft_mlp_create(m->ctx, OSFT_MLP_SWIGLU, h, d->inter, &mw, mo, &m->mlp[b]));
  }
  add_dense(m, "normf", m->w.normf, m->g.normf, 1, h, 0);
  add_dense_dev(m, "head", m->w.head, m->g.head, VOCAB, h, &m->head_wd, &m->head_gd);
}

/* OSFT: embedding and norms stay frozen; every projection is decomposed
 * and only its low-rank part trains. */
static void create_osft(model_t *m, const osft_mlp_options_t *mo, double rank_ratio) {
  const dims_t *d = &m->d;
  const int64_t h = d->h;
  CHECK(osft_comm_create_self(m->ctx, NULL, &m->comm));
  CHECK(osft_projector_create(m->ctx, m->comm, NULL, &m->proj));
  for (int64_t b = 0; b < d->blocks; ++b) {
    osft_proj_create(m, &m->mix_p[b], "mix", m->w.mix[b], h, h, rank_ratio);
    osft_proj_create(m, &m->gate_p[b], "gate", m->w.gate[b], d->inter, h, rank_ratio);
    osft_proj_create(m, &m->up_p[b], "up", m->w.up[b], d->inter, h, rank_ratio);
    osft_proj_create(m, &m->down_p[b], "down", m->w.down[b], h, d->inter, rank_ratio);
    osft_mlp_weights_t mw;
    CHECK(OSFT_MLP_WEIGHTS_INIT(&mw));
    mw.gate_layer = m->gate_p[b].layer;
    mw.up_layer = m->up_p[b].layer;
    mw.down_layer = m->down_p[b].layer;
    CHECK(osft_mlp_create(m->ctx, OSFT_MLP_SWIGLU, h, d->inter, &mw, mo, &m->mlp[b]));
  }
  osft_proj_create(m, &m->head_p, "head", m->w.head, VOCAB, h, rank_ratio);
  dbuf_alloc(&m->head_merged, VOCAB, h);
  dbuf_alloc(&m->head_grad, VOCAB, h);
  m->head_tmp = fvec(VOCAB * m->head_p.l);
  CHECK(osft_projector_prepare(m->proj));
}

void model_create(model_t *m, osft_context_t ctx, const dims_t *d, const weights_t *from,
                  int osft, const model_options_t *o) {
  memset(m, 0, sizeof *m);
  m->d = *d;
  m->osft = osft;
  m->ctx = ctx;
  m->max_tokens = o->max_tokens;
  weights_alloc(&m->w, d);
  weights_copy(&m->w, from, d);
  activations_alloc(m);

  osft_flce_options_t fo;
  CHECK(OSFT_FLCE_OPTIONS_INIT(&fo));
  fo.reduction = OSFT_FLCE_MEAN;
  fo.memory_budget = o->loss_budget;
  CHECK(osft_flce_create(ctx, &fo, &m->ce));

  osft_mlp_options_t mo;
  CHECK(OSFT_MLP_OPTIONS_INIT(&mo));
  mo.tiling = OSFT_MLP_TILING_BUDGET;
  mo.memory_budget = o->tile_budget;
  if (osft)
    create_osft(m, &mo, o->rank_ratio);
  else
    create_dense(m, &mo);
}

void model_destroy(model_t *m) {
  const dims_t *d = &m->d;
  CHECK(osft_context_synchronize(m->ctx));
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
    dbuf_free(&m->head_merged);
    dbuf_free(&m->head_grad);
    free(m->head_tmp);
  } else {
    for (int64_t b = 0; b < d->blocks; ++b)
      for (int i = 0; i < 3; ++i) {
        dbuf_free(&m->mlp_wd[b][i]);
        dbuf_free(&m->mlp_gd[b][i]);
      }
    dbuf_free(&m->head_wd);
    dbuf_free(&m->head_gd);
    weights_free(&m->g, d);
  }
  weights_free(&m->w, d);
  activations_free(m);
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

/* The OSFT head's factor gradients from its dense gradient G (VOCAB x h),
 * on the host, then uploaded for the projection. */
static void head_factor_grads(model_t *m) {
  osft_proj_t *p = &m->head_p;
  dbuf_download(&m->head_grad);
  const float *u = p->u_low.host, *s = p->s_low.host, *v = p->v_low.host;
  const float *g = m->head_grad.host;
  float *du = p->du.host, *ds = p->ds.host, *dv = p->dv.host;
  const int64_t ldu = p->u_low.ld, ldv = p->v_low.ld;
  const int64_t n = p->n, k = p->k, l = p->l;
  gemm(0, 1, n, l, k, 1.0f, g, k, v, ldv, 0.0f, m->head_tmp, l); /* G V^T */
  for (int64_t j = 0; j < l; ++j) ds[j] = 0;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < l; ++j) {
      const float gv = m->head_tmp[i * l + j];
      du[i * l + j] = gv * s[j];
      ds[j] += u[i * ldu + j] * gv;
    }
  gemm(1, 0, l, k, n, 1.0f, u, ldu, g, k, 0.0f, dv, k); /* U^T G */
  for (int64_t j = 0; j < l; ++j)
    for (int64_t c = 0; c < k; ++c) dv[j * k + c] *= s[j];
  dbuf_upload(&p->du);
  dbuf_upload(&p->ds);
  dbuf_upload(&p->dv);
}

/* x[0]: the k context bytes of each token, embedded side by side. */
static void embed(model_t *m, const batch_t *bt) {
  const int64_t h = m->d.h, e = m->d.e, k = m->d.k;
  for (int64_t i = 0; i < bt->tokens; ++i)
    for (int64_t j = 0; j < k; ++j)
      memcpy(m->x[0] + i * h + j * e, m->w.emb + bt->context[i * k + j] * e,
             sizeof(float) * (size_t)e);
}

/* The embedding's gradient from dx (dense mode). */
static void embed_backward(model_t *m, const batch_t *bt) {
  const int64_t h = m->d.h, e = m->d.e, k = m->d.k;
  memset(m->g.emb, 0, sizeof(float) * (size_t)(VOCAB * e));
  for (int64_t i = 0; i < bt->tokens; ++i)
    for (int64_t j = 0; j < k; ++j) {
      float *ge = m->g.emb + bt->context[i * k + j] * e;
      const float *src = m->dx.host + i * h + j * e;
      for (int64_t c = 0; c < e; ++c) ge[c] += src[c];
    }
}

/* y = layer(x) on the device: x's first `tok` rows up, y's down. */
static void run_mix(model_t *m, int64_t b, int64_t tok) {
  tview_t xv, yv;
  dbuf_upload_rows(&m->a1[b], tok);
  tview_dev(&xv, &m->a1[b], tok);
  tview_dev(&yv, &m->dtmp, tok);
  CHECK(osft_flinear_forward(m->mix_p[b].layer, &xv.t, NULL, &yv.t));
  dbuf_download_rows(&m->dtmp, tok);
}

static void run_mlp(model_t *m, int64_t b, int64_t tok) {
  tview_t xv, yv;
  dbuf_upload_rows(&m->a2[b], tok);
  tview_dev(&xv, &m->a2[b], tok);
  tview_dev(&yv, &m->dtmp, tok);
  CHECK(osft_mlp_forward(m->mlp[b], &xv.t, &yv.t, 0));
  dbuf_download_rows(&m->dtmp, tok);
}

/* The blocks, x[0] -> x[blocks] (keeping a1, xm, a2 for the backward). */
static void forward_blocks(model_t *m, int64_t tok) {
  const int64_t h = m->d.h;
  for (int64_t b = 0; b < m->d.blocks; ++b) {
    rmsnorm(m->x[b], m->w.norm1[b], m->a1[b].host, m->rstd1[b], tok, h);
    if (m->osft) {
      run_mix(m, b, tok);
      add_into(m->xm[b], m->x[b], m->dtmp.host, tok * h);
    } else {
      memcpy(m->xm[b], m->x[b], sizeof(float) * (size_t)(tok * h));
      gemm(0, 1, tok, h, h, 1.0f, m->a1[b].host, h, m->w.mix[b], h, 1.0f, m->xm[b], h);
    }
    rmsnorm(m->xm[b], m->w.norm2[b], m->a2[b].host, m->rstd2[b], tok, h);
    run_mlp(m, b, tok);
    add_into(m->x[b + 1], m->xm[b], m->dtmp.host, tok * h);
  }
}

/* The batch's targets as an int64 tensor on the device. */
static void targets_view(const model_t *m, const batch_t *bt, DLTensor *t,
                         int64_t *shape) {
  memset(t, 0, sizeof *t);
  shape[0] = bt->tokens;
  t->data = bt->targets;
  if (dev_current() != DEV_HOST) {
    dev_upload_bytes(m->targets_dev, bt->targets, sizeof(int64_t) * (size_t)bt->tokens);
    t->data = m->targets_dev;
  }
  t->device.device_type = dev_current() == DEV_CUDA ? kDLCUDA : kDLCPU;
  t->ndim = 1;
  t->dtype.code = kDLInt;
  t->dtype.bits = 64;
  t->dtype.lanes = 1;
  t->shape = shape;
}

/* The loss: fused linear cross-entropy over the head (OSFT: merged on the
 * device); with `train` also dfin (downloaded) and the head's gradient
 * (dense: on its device side; OSFT: as factor gradients, uploaded). */
static float head_loss(model_t *m, const batch_t *bt, int train) {
  const int64_t tok = bt->tokens;
  tview_t hw, hg, lossv, fin, dfin;
  if (m->osft) {
    tview_dev(&hw, &m->head_merged, VOCAB);
    CHECK(osft_flinear_merge(m->head_p.layer, &hw.t));
  } else {
    tview_dev(&hw, &m->head_wd, VOCAB);
  }
  dbuf_upload_rows(&m->fin, tok);
  tview_dev(&fin, &m->fin, tok);
  tview_dev_vec(&lossv, &m->loss);
  DLTensor targets;
  int64_t tshape[1];
  targets_view(m, bt, &targets, tshape);
  osft_flce_inputs_t in;
  CHECK(OSFT_FLCE_INPUTS_INIT(&in));
  in.x = &fin.t;
  in.weight = &hw.t;
  in.targets = &targets;
  osft_flce_outputs_t out;
  CHECK(OSFT_FLCE_OUTPUTS_INIT(&out));
  out.loss = &lossv.t;
  if (train) {
    tview_dev(&dfin, &m->dfin, tok);
    tview_dev(&hg, m->osft ? &m->head_grad : &m->head_gd, VOCAB);
    out.grad_x = &dfin.t;
    out.grad_weight = &hg.t;
  }
  CHECK(osft_flce_compute(m->ce, &in, &out));
  dbuf_download(&m->loss);
  if (train) {
    dbuf_download_rows(&m->dfin, tok);
    if (m->osft) head_factor_grads(m);
  }
  return m->loss.host[0];
}

/* x[b+1] = xm + mlp(a2): dx -> dtmp (and the MLP's gradients). */
static void mlp_backward(model_t *m, int64_t b, int64_t tok) {
  osft_mlp_grads_t mg;
  CHECK(OSFT_MLP_GRADS_INIT(&mg));
  tview_t gxv, xv, gv, gw[3];
  tview_dev(&gxv, &m->dtmp, tok);
  mg.grad_x = &gxv.t;
  if (m->osft) {
    mg.gate_factors = &m->gate_p[b].grads;
    mg.up_factors = &m->up_p[b].grads;
    mg.down_factors = &m->down_p[b].grads;
  } else {
    for (int i = 0; i < 3; ++i) tview_dev(&gw[i], &m->mlp_gd[b][i], m->mlp_gd[b][i].rows);
    mg.grad_gate = &gw[0].t;
    mg.grad_up = &gw[1].t;
    mg.grad_down = &gw[2].t;
  }
  dbuf_upload_rows(&m->dx, tok);
  tview_dev(&xv, &m->a2[b], tok);
  tview_dev(&gv, &m->dx, tok);
  CHECK(osft_mlp_backward(m->mlp[b], &xv.t, &gv.t, &mg, 0));
  dbuf_download_rows(&m->dtmp, tok);
}

/* xm = x[b] + mix(a1): dxm -> dtmp (and the mixer's gradients). */
static void mix_backward(model_t *m, int64_t b, int64_t tok) {
  const int64_t h = m->d.h;
  if (!m->osft) {
    gemm(0, 0, tok, h, h, 1.0f, m->dxm.host, h, m->w.mix[b], h, 0.0f, m->dtmp.host, h);
    gemm(1, 0, h, h, tok, 1.0f, m->dxm.host, h, m->a1[b].host, h, 0.0f, m->g.mix[b], h);
    return;
  }
  osft_flinear_grads_t fg = m->mix_p[b].grads;
  tview_t gxv, xv, gv;
  tview_dev(&gxv, &m->dtmp, tok);
  fg.grad_x = &gxv.t;
  dbuf_upload_rows(&m->dxm, tok);
  tview_dev(&xv, &m->a1[b], tok);
  tview_dev(&gv, &m->dxm, tok);
  CHECK(osft_flinear_backward(m->mix_p[b].layer, &xv.t, &gv.t, &fg));
  dbuf_download_rows(&m->dtmp, tok);
}

/* From dfin back to dx (the gradient of x[0]), through every block. */
static void backward_blocks(model_t *m, int64_t tok) {
  const int64_t h = m->d.h, nb = m->d.blocks;
  const size_t bytes = sizeof(float) * (size_t)(tok * h);
  float *dx = m->dx.host, *dxm = m->dxm.host, *dtmp = m->dtmp.host;
  memset(dx, 0, bytes);
  rmsnorm_backward(m->x[nb], m->w.normf, m->rstdf, m->dfin.host, dx,
                   m->osft ? NULL : m->g.normf, tok, h);
  for (int64_t b = nb - 1; b >= 0; --b) {
    mlp_backward(m, b, tok);
    memcpy(dxm, dx, bytes);
    rmsnorm_backward(m->xm[b], m->w.norm2[b], m->rstd2[b], dtmp, dxm,
                     m->osft ? NULL : m->g.norm2[b], tok, h);
    mix_backward(m, b, tok);
    memcpy(dx, dxm, bytes);
    rmsnorm_backward(m->x[b], m->w.norm1[b], m->rstd1[b], dtmp, dx,
                     m->osft ? NULL : m->g.norm1[b], tok, h);
  }
}

double model_step(model_t *m, const batch_t *bt, int train) {
  const int64_t tok = bt->tokens;
  if (tok > m->max_tokens)
    train_fail("batch of %lld tokens > %lld", (long long)tok, (long long)m->max_tokens);
  embed(m, bt);
  forward_blocks(m, tok);
  rmsnorm(m->x[m->d.blocks], m->w.normf, m->fin.host, m->rstdf, tok, m->d.h);
  const float loss = head_loss(m, bt, train);
  if (!train) return loss;
  backward_blocks(m, tok);
  if (!m->osft) embed_backward(m, bt);
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
