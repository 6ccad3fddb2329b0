/* libFuzzer harness: communicators and the OSFT gradient projector
 * (osftrt/comm.h, osftrt/projection.h).
 *
 * A one-rank communicator (built-in, or host callbacks that may fail or
 * time out), a projector with hostile options, targets with hostile
 * tensors, layouts and shard arrays (and a factorized layer as a target),
 * then project / project_params / orthogonality / set_grads / prepare /
 * invalidate. Beyond the common promises: frozen factors are never
 * modified; a failed add_target registers nothing; a failed projection
 * (also on a communication error) changes no gradient and no parameter. */
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"

typedef struct {
  int fail; /* 0: succeed, else the status to return */
} cb_state;

static osft_status_t cb_allreduce(void *user, DLTensor *buf) {
  (void)buf; /* one rank: the sum is the buffer itself */
  return (osft_status_t)((cb_state *)user)->fail;
}

static osft_status_t cb_allgather(void *user, const DLTensor *send, DLTensor *recv,
                                  const int64_t *counts, int64_t n_counts) {
  const cb_state *s = (const cb_state *)user;
  if (s->fail) return (osft_status_t)s->fail;
  if (n_counts != 1) abort();
  const size_t es = ((size_t)send->dtype.bits + 7) / 8;
  memcpy((char *)recv->data + recv->byte_offset,
         (const char *)send->data + send->byte_offset, (size_t)counts[0] * es);
  return OSFT_STATUS_SUCCESS;
}

static void set_roles(fz_pool *pool, const char *prefix, int role) {
  for (fz_tensor *t = pool->head; t; t = t->next)
    if (strncmp(t->name, prefix, strlen(prefix)) == 0) t->role = role;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fz f;
  fz_init(&f, data, size);
  osft_context_t ctx = fz_context(&f);
  fz_pool reg = {0};  /* registered tensors: live as long as the projector */
  fz_pool pool = {0}; /* one call's */
  osft_comm_t comm = NULL;
  osft_projector_t proj = (osft_projector_t)(uintptr_t)0x5a5a;
  osft_flinear_t layer = NULL;
  cb_state cbs = {0};
  int64_t n_targets = 0;

  const int comm_mode = (int)fz_range(&f, 0, 2);
  if (comm_mode == 1) {
    fz_before();
    if (fz_status(osft_comm_create_self(ctx, NULL, &comm), "osft_comm_create_self", 0))
      comm = NULL;
  } else if (comm_mode == 2) {
    osft_comm_callbacks_t cb;
    OSFT_COMM_CALLBACKS_INIT(&cb);
    cb.user = &cbs;
    cb.allreduce_sum = cb_allreduce;
    cb.allgather = cb_allgather;
    int mf = 0;
    if (fz_range(&f, 0, 7) == 7) {
      cb.rank = (int)fz_i64(&f, 0);
      cb.size = (int)fz_i64(&f, 1);
      if (cb.size < 1 || cb.rank < 0 || cb.rank >= cb.size) mf = 1;
      if (cb.size != 1) cb.size = 1, cb.rank = 0; /* one process: keep one rank */
      mf = 0;
    }
    if (fz_range(&f, 0, 15) == 15) {
      cb.allgather = NULL;
      mf = 1;
    }
    void *cbp = fz_struct(&f, &cb, sizeof cb, &mf);
    fz_before();
    if (fz_status(osft_comm_create_callbacks(ctx, (const osft_comm_callbacks_t *)cbp,
                                             NULL, &comm),
                  "osft_comm_create_callbacks", mf))
      comm = NULL;
    free(cbp);
  }

  osft_projector_options_t po;
  OSFT_PROJECTOR_OPTIONS_INIT(&po);
  po.check_consistency = (int)fz_range(&f, 0, 2);
  po.arithmetic = (osft_projection_arithmetic_t)fz_enum(&f, (int)fz_range(&f, 0, 3), 4);
  int must_fail = 0;
  if ((int)po.arithmetic < 0 || (int)po.arithmetic > 3) must_fail = 1;
  void *pop = fz_bool(&f) ? NULL : fz_struct(&f, &po, sizeof po, &must_fail);
  fz_before();
  const osft_status_t pst =
      osft_projector_create(ctx, comm, (const osft_projector_options_t *)pop, &proj);
  const int passed_opts = pop != NULL;
  free(pop);
  if (fz_status(pst, "osft_projector_create", passed_opts ? must_fail : 0)) {
    if (proj != (osft_projector_t)(uintptr_t)0x5a5a)
      fz_die("osft_projector_create wrote *projector");
    proj = NULL;
    goto done;
  }

  /* Targets. */
  for (int ti = (int)fz_range(&f, 1, 3); ti > 0; --ti) {
    if (fz_range(&f, 0, 5) == 5) { /* a layer */
      if (layer == NULL) {
        const int64_t n = fz_range(&f, 2, 8), k = fz_range(&f, 2, 8);
        fz_tensor *w = fz_tensor_2d(&reg, &f, "x_weight", FZ_IN | FZ_CLEAN, FZ_F32, n, k,
                                    FZ_VALUES_FINITE);
        if (osft_flinear_create_from_weight(ctx, &w->t, NULL, &layer) !=
            OSFT_STATUS_SUCCESS)
          layer = NULL;
      }
      if (layer) {
        int64_t n = 0, k = 0, r = 0, l = 0;
        osft_flinear_get_dims(layer, &n, &k, &r, &l);
        fz_tensor *gu = fz_present(&f) ? fz_tensor_2d(&reg, &f, "g_u", FZ_INOUT, FZ_F32,
                                                      n, l, FZ_VALUES_ANY)
                                       : NULL;
        fz_tensor *gv = fz_present(&f) ? fz_tensor_2d(&reg, &f, "g_v", FZ_INOUT, FZ_F32,
                                                      l, k, FZ_VALUES_ANY)
                                       : NULL;
        const int mf = (gu && gu->faulty) || (gv && gv->faulty);
        if (gu) gu->faulty = 0;
        if (gv) gv->faulty = 0;
        int64_t idx = -7;
        fz_snapshot(&reg);
        fz_before();
        const osft_status_t st = osft_projector_add_layer(proj, layer, gu ? &gu->t : NULL,
                                                          gv ? &gv->t : NULL, &idx);
        const int failed = fz_status(st, "osft_projector_add_layer", mf);
        fz_check_tensors(&reg, 1, "osft_projector_add_layer");
        if (failed && idx != -7)
          fz_die("osft_projector_add_layer failed but wrote *index");
        if (!failed) ++n_targets;
        continue;
      }
    }
    osft_projection_target_t t;
    OSFT_PROJECTION_TARGET_INIT(&t);
    const int64_t N = fz_range(&f, 2, 8), K = fz_range(&f, 2, 8);
    const int64_t kk = N < K ? N : K;
    const int64_t r = fz_range(&f, 1, kk - 1), l = fz_range(&f, 1, kk - r);
    int mf = 0;
    int64_t u_shards[2], v_shards[2];
    const int parts = (int)fz_range(&f, 1, 3); /* 1 U, 2 V, 3 both */
    if (parts & 1) {
      const DLDataType dt = fz_bool(&f) ? FZ_BF16 : FZ_F32;
      t.u_high = &fz_tensor_2d(&reg, &f, "h_u_high", FZ_IN, dt, N, r, FZ_VALUES_ANY)->t;
      if (fz_range(&f, 0, 3) != 1)
        t.grad_u_low = &fz_tensor_2d(&reg, &f, "g_u_low", FZ_INOUT,
                                     fz_bool(&f) ? FZ_BF16 : dt, N, l, FZ_VALUES_ANY)
                            ->t;
      if (fz_range(&f, 0, 3) != 2)
        t.u_low =
            &fz_tensor_2d(&reg, &f, "p_u_low", FZ_INOUT, dt, N, l, FZ_VALUES_ANY)->t;
      if (!t.grad_u_low && !t.u_low) mf = 1;
      t.u_layout =
          (osft_shard_layout_t)fz_enum(&f, fz_bool(&f) ? OSFT_SHARD_U_ROWS : 0, 4);
      if (t.u_layout == OSFT_SHARD_U_ROWS) {
        u_shards[0] = fz_i64(&f, t.u_high->ndim == 2 ? t.u_high->shape[0] : N);
        u_shards[1] = 0;
        t.u_shards = fz_range(&f, 0, 15) == 15 ? NULL : u_shards;
        t.n_u_shards = fz_range(&f, 0, 15) == 15 ? 2 : 1;
        /* this rank's rows: what u_high really has (a fault may change it) */
        const int64_t rows = t.u_high->ndim == 2 ? t.u_high->shape[0] : N;
        if (t.u_shards == NULL || t.n_u_shards != 1 || u_shards[0] != rows) mf = 1;
      } else if (t.u_layout != OSFT_SHARD_REPLICATED) {
        mf = 1; /* not a U layout */
      }
    }
    if (parts & 2) {
      const DLDataType dt = fz_bool(&f) ? FZ_BF16 : FZ_F32;
      t.v_high = &fz_tensor_2d(&reg, &f, "h_v_high", FZ_IN, dt, r, K, FZ_VALUES_ANY)->t;
      if (fz_range(&f, 0, 3) != 1)
        t.grad_v_low =
            &fz_tensor_2d(&reg, &f, "g_v_low", FZ_INOUT, dt, l, K, FZ_VALUES_ANY)->t;
      if (fz_range(&f, 0, 3) != 2)
        t.v_low =
            &fz_tensor_2d(&reg, &f, "p_v_low", FZ_INOUT, dt, l, K, FZ_VALUES_ANY)->t;
      if (!t.grad_v_low && !t.v_low) mf = 1;
      static const int vl[] = {OSFT_SHARD_REPLICATED, OSFT_SHARD_V_ROWS,
                               OSFT_SHARD_V_COLS};
      t.v_layout = (osft_shard_layout_t)fz_enum(&f, vl[fz_range(&f, 0, 2)], 4);
      if (t.v_layout == OSFT_SHARD_V_ROWS || t.v_layout == OSFT_SHARD_V_COLS) {
        v_shards[0] = fz_i64(&f, t.v_layout == OSFT_SHARD_V_ROWS
                                     ? (t.v_high->ndim == 2 ? t.v_high->shape[0] : r)
                                     : (t.v_high->ndim == 2 ? t.v_high->shape[1] : K));
        v_shards[1] = 0;
        t.v_shards = fz_range(&f, 0, 15) == 15 ? NULL : v_shards;
        t.n_v_shards = fz_range(&f, 0, 15) == 15 ? 2 : 1;
        const int64_t vr = t.v_high->ndim == 2 ? t.v_high->shape[0] : r;
        const int64_t vk = t.v_high->ndim == 2 ? t.v_high->shape[1] : K;
        if (t.v_shards == NULL || t.n_v_shards != 1 ||
            v_shards[0] != (t.v_layout == OSFT_SHARD_V_ROWS ? vr : vk))
          mf = 1;
      } else if (t.v_layout != OSFT_SHARD_REPLICATED) {
        mf = 1;
      }
    }
    if (fz_any_faulty(&reg)) mf = 1;
    void *tp = fz_struct(&f, &t, sizeof t, &mf);
    int64_t idx = -7;
    fz_snapshot(&reg);
    fz_before();
    const osft_status_t st =
        osft_projector_add_target(proj, (const osft_projection_target_t *)tp, &idx);
    free(tp);
    const int failed = fz_status(st, "osft_projector_add_target", mf);
    fz_check_tensors(&reg, 1, "osft_projector_add_target"); /* writes nothing */
    if (failed && idx != -7) fz_die("osft_projector_add_target failed but wrote *index");
    if (!failed && idx != n_targets)
      fz_die("osft_projector_add_target: index %lld, expected %lld", (long long)idx,
             (long long)n_targets);
    if (!failed) ++n_targets;
    /* The tensors of a failed target stay in reg as inputs (never written,
     * still checked); their faults do not concern the next target. */
    for (fz_tensor *x = reg.head; x; x = x->next) x->faulty = 0;
  }
  {
    osft_projector_info_t info;
    info.struct_size = sizeof info;
    if (osft_projector_get_info(proj, &info) != OSFT_STATUS_SUCCESS ||
        info.targets != n_targets)
      fz_die("osft_projector_get_info: %lld targets, expected %lld",
             (long long)info.targets, (long long)n_targets);
  }

  for (int op_i = (int)fz_range(&f, 1, 3); op_i > 0; --op_i) {
    const int op = (int)fz_range(&f, 0, 5);
    cbs.fail = fz_range(&f, 0, 7) == 7
                   ? (fz_bool(&f) ? OSFT_STATUS_COMM_ERROR : OSFT_STATUS_TIMEOUT)
                   : 0;
    /* roles: frozen factors always inputs */
    set_roles(&reg, "h_", FZ_IN);
    set_roles(&reg, "g_", op == 0 ? FZ_INOUT : FZ_IN);
    set_roles(&reg, "p_", op == 1 ? FZ_INOUT : FZ_IN);
    fz_snapshot(&reg);
    fz_before();
    osft_status_t st;
    const char *call;
    if (op == 0) {
      call = "osft_projector_project";
      st = osft_projector_project(proj);
    } else if (op == 1) {
      call = "osft_projector_project_params";
      st = osft_projector_project_params(proj);
    } else if (op == 2) {
      call = "osft_projector_orthogonality";
      double mu = -1, mv = -1;
      st = osft_projector_orthogonality(proj, fz_bool(&f) ? &mu : NULL, &mv);
    } else if (op == 3) {
      call = "osft_projector_prepare";
      st = osft_projector_prepare(proj);
    } else if (op == 4) {
      call = "osft_projector_invalidate";
      st = osft_projector_invalidate(proj);
    } else {
      call = "osft_projector_set_grads";
      const int64_t idx = fz_i64(&f, n_targets > 0 ? fz_range(&f, 0, n_targets - 1) : 0);
      const int64_t rows = fz_range(&f, 0, 8), cols = fz_range(&f, 0, 8);
      fz_tensor *gu = fz_present(&f) ? fz_tensor_2d(&pool, &f, "n_gu", FZ_IN, FZ_F32,
                                                    rows, cols, FZ_VALUES_ANY)
                                     : NULL;
      fz_tensor *gv = fz_present(&f) ? fz_tensor_2d(&pool, &f, "n_gv", FZ_IN, FZ_F32,
                                                    rows, cols, FZ_VALUES_ANY)
                                     : NULL;
      fz_snapshot(&pool);
      fz_before();
      st = osft_projector_set_grads(proj, idx, gu ? &gu->t : NULL, gv ? &gv->t : NULL);
      fz_status(st, call, idx < 0 || idx >= n_targets);
      fz_check_tensors(&pool, 1, call);
      /* A rebound gradient is registered now: keep it alive, as an output. */
      for (fz_tensor *t = pool.head; t; t = t->next) t->name = "g_new";
      if (pool.head) {
        fz_tensor *last = pool.head;
        while (last->next) last = last->next;
        last->next = reg.head;
        reg.head = pool.head;
        pool.head = NULL;
      }
      fz_snapshot(&reg);
      continue;
    }
    const int failed = fz_status(st, call, 0);
    fz_check_tensors(&reg, failed, call);
    if (!failed) fz_check_padding(&reg, call);
  }
  cbs.fail = 0;
  fz_before();
  if (fz_status(osft_projector_destroy(proj), "osft_projector_destroy", 0))
    fz_die("osft_projector_destroy failed");
  proj = NULL;
done:
  if (layer && osft_flinear_destroy(layer) != OSFT_STATUS_SUCCESS)
    fz_die("osft_flinear_destroy: %s", osft_last_error());
  if (comm && osft_comm_destroy(comm) != OSFT_STATUS_SUCCESS)
    fz_die("osft_comm_destroy: %s", osft_last_error());
  fz_pool_free(&pool);
  fz_pool_free(&reg);
  fz_context_destroy(ctx);
  return 0;
}
