#include "projection_testlib.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../mpi/projection_ref.h"
#include "test_tensors.h"
#include "test_util.h"

tt *make_tensor(tt_dtype d, int64_t rows, int64_t cols, const double *values,
                int64_t pad) {
  const int64_t shape[2] = {rows, cols};
  tt *t = pad > 0 ? tt_new_padded(d, rows, cols, cols + pad) : tt_new(d, 2, shape);
  tt_set(t, values);
  return t;
}

target_tensors make_tensors(const problem *P, tt_dtype high, tt_dtype grad, int64_t pad) {
  target_tensors T;
  T.uh = make_tensor(high, P->n, P->r, P->uh, pad);
  T.gu = make_tensor(grad, P->n, P->l, P->gu, 0);
  T.ul = make_tensor(grad, P->n, P->l, P->ul, pad);
  T.vh = make_tensor(high, P->r, P->k, P->vh, 0);
  T.gv = make_tensor(grad, P->l, P->k, P->gv, pad);
  T.vl = make_tensor(grad, P->l, P->k, P->vl, 0);
  return T;
}

void free_tensors(target_tensors *T) {
  tt_free(T->uh);
  tt_free(T->gu);
  tt_free(T->ul);
  tt_free(T->vh);
  tt_free(T->gv);
  tt_free(T->vl);
}

osft_projection_target_t replicated_target(const target_tensors *T, int with_u,
                                           int with_v, int with_low) {
  osft_projection_target_t t;
  assert_ok(OSFT_PROJECTION_TARGET_INIT(&t));
  if (with_u) {
    t.u_high = &T->uh->t;
    t.grad_u_low = &T->gu->t;
    if (with_low) t.u_low = &T->ul->t;
  }
  if (with_v) {
    t.v_high = &T->vh->t;
    t.grad_v_low = &T->gv->t;
    if (with_low) t.v_low = &T->vl->t;
  }
  return t;
}

double *expected_u(const tt *high, const tt *x) {
  double *h = tt_get(high), *out = tt_get(x);
  ref_project_u(h, high->shape[0], high->shape[1], out, x->shape[1]);
  free(h);
  return out;
}

double *expected_v(const tt *high, const tt *x) {
  double *h = tt_get(high), *out = tt_get(x);
  ref_project_v(h, high->shape[0], high->shape[1], out, x->shape[0]);
  free(h);
  return out;
}

void expect_close(const char *what, const tt *t, const double *ref, double tol) {
  double *got = tt_get(t);
  const double err = ref_rel_err(got, ref, tt_logical_numel(t), 1e-6);
  free(got);
  if (!(err <= tol)) fail_msg("%s: relative max error %.3g > %.3g", what, err, tol);
}

osft_projector_t new_projector(osft_context_t ctx, osft_comm_t comm) {
  osft_projector_t p = NULL;
  assert_ok(osft_projector_create(ctx, comm, NULL, &p));
  return p;
}

adam_run adam_start(const problem *P, const char *seed) {
  adam_run a;
  a.sizes[0] = P->n * P->l;
  a.sizes[1] = P->l * P->k;
  for (int i = 0; i < 2; ++i)
    a.m[i] = ref_alloc(a.sizes[i]), a.v[i] = ref_alloc(a.sizes[i]);
  a.g = ref_seed(seed);
  a.step = 0;
  return a;
}

void adam_free(adam_run *a) {
  for (int i = 0; i < 2; ++i) free(a->m[i]), free(a->v[i]);
}

double adam_step(adam_run *a, osft_projector_t proj, target_tensors *T, double lr) {
  const double b1 = 0.9, b2 = 0.999, eps = 1e-8;
  tt *params[2] = {T->ul, T->vl}, *grads[2] = {T->gu, T->gv};
  const int step = ++a->step;
  for (int i = 0; i < 2; ++i) {
    double *gr = ref_random(&a->g, a->sizes[i], -1, 1);
    tt_set(grads[i], gr);
    free(gr);
  }
  assert_ok(osft_projector_project(proj));
  for (int i = 0; i < 2; ++i) {
    double *gr = tt_get(grads[i]), *x = tt_get(params[i]);
    double *m = a->m[i], *v = a->v[i];
    for (int64_t e = 0; e < a->sizes[i]; ++e) {
      m[e] = b1 * m[e] + (1 - b1) * gr[e];
      v[e] = b2 * v[e] + (1 - b2) * gr[e] * gr[e];
      const double mh = m[e] / (1 - pow(b1, step)), vh = v[e] / (1 - pow(b2, step));
      x[e] -= lr * mh / (sqrt(vh) + eps);
    }
    tt_set(params[i], x);
    free(gr), free(x);
  }
  assert_ok(osft_projector_project_params(proj));
  double mu, mv;
  assert_ok(osft_projector_orthogonality(proj, &mu, &mv));
  return fmax(mu, mv);
}

osft_status_t sum_one_rank(void *user, DLTensor *buf) {
  (void)buf;
  counter *c = user;
  c->calls++;
  return c->answer;
}

osft_status_t gather_one_rank(void *user, const DLTensor *send, DLTensor *recv,
                              const int64_t *counts, int64_t n) {
  (void)user, (void)send, (void)recv, (void)counts, (void)n;
  fail_msg("no all-gather expected with one rank");
  return OSFT_STATUS_COMM_ERROR;
}

osft_comm_t counting_comm(osft_context_t ctx, counter *c) {
  osft_comm_callbacks_t cb;
  assert_ok(OSFT_COMM_CALLBACKS_INIT(&cb));
  cb.user = c;
  cb.allreduce_sum = sum_one_rank;
  cb.allgather = gather_one_rank;
  osft_comm_t comm = NULL;
  assert_ok(osft_comm_create_callbacks(ctx, &cb, NULL, &comm));
  return comm;
}
