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
