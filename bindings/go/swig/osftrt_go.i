/*
 * libosftrt — the Go part of the SWIG interface (bindings/swig/osftrt.i
 * %includes this file inside #ifdef SWIGGO, before the public headers).
 *
 * Generate (bindings/go/osftrt/internal/capi/generate.sh does it):
 *   swig -go -cgo -intgosize 64 -I<repo>/include -I<repo>/bindings/go/swig \
 *        -outdir internal/capi -o internal/capi/osftrt_wrap.c bindings/swig/osftrt.i
 *
 * What is Go-specific:
 *   - opaque handles are plain `uintptr` values in Go, and the out-parameter
 *     of every *_create a `*uintptr` (SWIG's default makes both unusable
 *     interface types);
 *   - `void *` parameters named GOMEM-style below are `unsafe.Pointer` in
 *     Go, so that cgo's pointer rules are checked on them (SWIG passes
 *     other pointers as uintptr, which cgo cannot check);
 *   - osftgo_call / osftgo_qr: one C entry that runs an operation on
 *     tensors whose data may live in Go memory. cgo forbids C from keeping
 *     a Go pointer after a call returns and forbids Go from storing one in C
 *     memory, so the Go layer never builds a DLTensor itself: it passes
 *     pointer-free descriptors (shape, strides, dtype; the data address
 *     only for C memory) in a Go buffer, plus each Go data pointer as its
 *     own argument; the DLTensors are built here on the C stack, used for
 *     the one call, and forgotten. Operations whose handles keep tensors
 *     (caller-owned factors, MLP weights, projector targets) refuse Go
 *     memory here as well (OSFT_STATUS_INVALID_ARGUMENT), besides the Go
 *     types that only accept C-allocated tensors for them.
 *   - the message of a failure is copied into the same Go buffer by the
 *     same C call, on the same OS thread (osft_last_error is thread-local).
 */

/* Handles: uintptr in Go. */
%define OSFTGO_HANDLE(TYPE)
%typemap(gotype) TYPE "uintptr"
%typemap(imtype) TYPE "uintptr"
%typemap(in) TYPE %{ $1 = ($1_ltype)$input; %}
%typemap(out) TYPE %{ $result = $1; %}
%typemap(goout) TYPE ""
%typemap(gotype) TYPE * "*uintptr"
%typemap(in) TYPE * %{ $1 = *($&1_ltype)&$input; %}
%enddef
OSFTGO_HANDLE(osft_context_t)
OSFTGO_HANDLE(osft_comm_t)
OSFTGO_HANDLE(osft_flce_t)
OSFTGO_HANDLE(osft_flinear_t)
OSFTGO_HANDLE(osft_mlp_t)
OSFTGO_HANDLE(osft_projector_t)

/* Go memory passed for the duration of one call (cgo-checked). */
%typemap(gotype) void *GOMEM "unsafe.Pointer"
%typemap(in) void *GOMEM %{ $1 = *($&1_ltype)&$input; %}

%{
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define OSFTGO_MAX_DIMS 8
#define OSFTGO_SLOTS 20

/* A tensor descriptor without pointers into Go memory (mirrored by the Go
 * type cDesc; osftgo_layout() lets the Go tests compare the layouts). */
typedef struct {
  uint64_t data;   /* C address when present == 2 */
  int64_t present; /* 0: no tensor (NULL), 1: data in Go memory (g[slot]), 2: C memory */
  int32_t ndim;
  uint8_t code, bits;
  uint16_t lanes;
  int64_t shape[OSFTGO_MAX_DIMS];
  int64_t strides[OSFTGO_MAX_DIMS];
  int64_t has_strides;
} osftgo_desc_t;

/* The per-call buffer (Go memory, mirrored by the Go type callBuf). */
typedef struct {
  osftgo_desc_t d[OSFTGO_SLOTS];
  uint64_t h[6];  /* handles and C struct pointers */
  int64_t i[4];   /* integer arguments */
  int64_t out[8]; /* scalar results */
  char err[1024]; /* osft_last_error() of a failure */
} osftgo_call_t;


static void osftgo_fill(DLTensor *t, const osftgo_desc_t *d, void *g) {
  memset(t, 0, sizeof *t);
  t->data = d->present == 1 ? g : (void *)(uintptr_t)d->data;
  t->device.device_type = kDLCPU;
  t->device.device_id = 0;
  t->ndim = d->ndim;
  t->dtype.code = d->code;
  t->dtype.bits = d->bits;
  t->dtype.lanes = d->lanes;
  t->shape = (int64_t *)d->shape;
  t->strides = d->has_strides ? (int64_t *)d->strides : NULL;
  t->byte_offset = 0;
}

static osft_status_t osftgo_fail(osftgo_call_t *c, osft_status_t st, const char *msg) {
  if (st != OSFT_STATUS_SUCCESS) {
    const char *m = msg ? msg : osft_last_error();
    strncpy(c->err, m, sizeof c->err - 1);
    c->err[sizeof c->err - 1] = '\0';
  }
  return st;
}
%}

%apply void *GOMEM { void *call, void *g0, void *g1, void *g2, void *g3, void *g4, void *g5,
                     void *g6, void *g7, void *g8, void *g9, void *g10, void *g11, void *g12,
                     void *g13, void *g14, void *g15, void *g16, void *g17, void *g18,
                     void *g19, void *status, void *flags };

%inline %{
/* The operations of osftgo_call (Go sees them as capi.OSFTGO_*). */
enum {
  OSFTGO_FLCE_COMPUTE = 1,
  OSFTGO_FLCE_PLAN,
  OSFTGO_FLINEAR_CREATE_WEIGHT,
  OSFTGO_FLINEAR_CREATE_FACTORS,
  OSFTGO_FLINEAR_FORWARD,
  OSFTGO_FLINEAR_BACKWARD,
  OSFTGO_FLINEAR_MERGE,
  OSFTGO_FLINEAR_REDECOMPOSE,
  OSFTGO_MLP_CREATE,
  OSFTGO_MLP_FORWARD,
  OSFTGO_MLP_BACKWARD,
  OSFTGO_COMM_ALLREDUCE,
  OSFTGO_COMM_ALLGATHER,
  OSFTGO_PROJECTOR_ADD_TARGET,
  OSFTGO_PROJECTOR_ADD_LAYER,
  OSFTGO_PROJECTOR_SET_GRADS
};

/* sizeof / offsetof of the call buffer, for the Go layout test. */
int64_t osftgo_layout(int what) {
  switch (what) {
    case 0: return (int64_t)sizeof(osftgo_call_t);
    case 1: return (int64_t)sizeof(osftgo_desc_t);
    case 2: return (int64_t)offsetof(osftgo_call_t, h);
    case 3: return (int64_t)offsetof(osftgo_call_t, i);
    case 4: return (int64_t)offsetof(osftgo_call_t, out);
    case 5: return (int64_t)offsetof(osftgo_call_t, err);
    case 6: return (int64_t)offsetof(osftgo_desc_t, ndim);
    case 7: return (int64_t)offsetof(osftgo_desc_t, shape);
    case 8: return (int64_t)offsetof(osftgo_desc_t, has_strides);
    default: return -1;
  }
}

/* C memory for tensors the library keeps (64-byte aligned, zeroed). */
uintptr_t osftgo_alloc(int64_t bytes) {
  void *p = NULL;
  if (bytes <= 0) bytes = 1;
  if (posix_memalign(&p, 64, (size_t)bytes) != 0) return 0;
  memset(p, 0, (size_t)bytes);
  return (uintptr_t)p;
}
void osftgo_free(uintptr_t p) { free((void *)p); }

/* Runs one operation; see the enum above for what c->h, c->i and the slots
 * hold per operation. g<k> is slot k's data when it lives in Go memory. */
osft_status_t osftgo_call(int op, void *call, void *g0, void *g1, void *g2, void *g3,
                          void *g4, void *g5, void *g6, void *g7, void *g8, void *g9,
                          void *g10, void *g11, void *g12, void *g13, void *g14, void *g15,
                          void *g16, void *g17, void *g18, void *g19) {
  osftgo_call_t *c = (osftgo_call_t *)call;
  void *g[OSFTGO_SLOTS] = {g0, g1, g2, g3, g4, g5, g6, g7, g8, g9,
                           g10, g11, g12, g13, g14, g15, g16, g17, g18, g19};
  DLTensor t[OSFTGO_SLOTS];
  const DLTensor *p[OSFTGO_SLOTS];
  int keeps = op == OSFTGO_FLINEAR_CREATE_FACTORS || op == OSFTGO_MLP_CREATE ||
              op == OSFTGO_PROJECTOR_ADD_TARGET || op == OSFTGO_PROJECTOR_ADD_LAYER ||
              op == OSFTGO_PROJECTOR_SET_GRADS;
  for (int k = 0; k < OSFTGO_SLOTS; ++k) {
    const osftgo_desc_t *d = &c->d[k];
    if (d->present == 0) {
      p[k] = NULL;
      continue;
    }
    if (d->ndim < 0 || d->ndim > OSFTGO_MAX_DIMS)
      return osftgo_fail(c, OSFT_STATUS_INVALID_ARGUMENT, "osftgo: malformed tensor descriptor");
    if (d->present == 1 && !g[k]) { /* a Go tensor without data must be empty */
      int64_t n = 1;
      for (int j = 0; j < d->ndim; ++j) n *= d->shape[j];
      if (n != 0)
        return osftgo_fail(c, OSFT_STATUS_INVALID_ARGUMENT, "osftgo: a Go tensor without data");
    }
    if (keeps && d->present == 1)
      return osftgo_fail(c, OSFT_STATUS_INVALID_ARGUMENT,
                         "osftgo: the library keeps this tensor after the call; it must be "
                         "in C memory (osftrt.NewCTensor), not a Go slice");
    osftgo_fill(&t[k], d, g[k]);
    p[k] = &t[k];
  }
#define T(k) ((DLTensor *)p[k])
  osft_status_t st = OSFT_STATUS_INVALID_ARGUMENT;
  switch (op) {
    case OSFTGO_FLCE_COMPUTE:
    case OSFTGO_FLCE_PLAN: {
      osft_flce_inputs_t in;
      osft_flce_outputs_t out;
      OSFT_FLCE_INPUTS_INIT(&in);
      OSFT_FLCE_OUTPUTS_INIT(&out);
      in.x = p[0];
      in.weight = p[1];
      in.targets = p[2];
      in.bias = p[3];
      in.class_weight = p[4];
      in.grad_loss = p[5];
      out.loss = T(6);
      out.grad_x = T(7);
      out.grad_weight = T(8);
      out.grad_bias = T(9);
      out.z_loss = T(10);
      out.accuracy = T(11);
      out.argmax = T(12);
      out.token_loss = T(13);
      out.accumulate = (uint32_t)c->i[0];
      if (op == OSFTGO_FLCE_COMPUTE) {
        st = osft_flce_compute((osft_flce_t)(uintptr_t)c->h[0], &in, &out);
      } else {
        osft_flce_plan_t plan;
        memset(&plan, 0, sizeof plan);
        plan.struct_size = sizeof plan;
        st = osft_flce_get_plan((osft_flce_t)(uintptr_t)c->h[0], &in, &out, &plan);
        if (st == OSFT_STATUS_SUCCESS) {
          c->out[0] = plan.tokens;
          c->out[1] = plan.chunk_rows;
          c->out[2] = plan.chunks;
          c->out[3] = (int64_t)plan.scratch_bytes;
          c->out[4] = (int64_t)plan.budget_bytes;
          c->out[5] = (int64_t)plan.chunking;
          c->out[6] = plan.slices;
          c->out[7] = plan.slice_cols;
        }
      }
      break;
    }
    case OSFTGO_FLINEAR_CREATE_WEIGHT: {
      osft_flinear_t layer = NULL;
      st = osft_flinear_create_from_weight((osft_context_t)(uintptr_t)c->h[0], p[0],
                                           (const osft_flinear_options_t *)(uintptr_t)c->h[1],
                                           &layer);
      if (st == OSFT_STATUS_SUCCESS) c->out[0] = (int64_t)(uintptr_t)layer;
      break;
    }
    case OSFTGO_FLINEAR_CREATE_FACTORS: {
      osft_flinear_factors_t f;
      osft_flinear_t layer = NULL;
      OSFT_FLINEAR_FACTORS_INIT(&f);
      f.u_high = p[0];
      f.s_high = p[1];
      f.v_high = p[2];
      f.u_low = p[3];
      f.s_low = p[4];
      f.v_low = p[5];
      st = osft_flinear_create_from_factors((osft_context_t)(uintptr_t)c->h[0], &f,
                                            (const osft_flinear_options_t *)(uintptr_t)c->h[1],
                                            &layer);
      if (st == OSFT_STATUS_SUCCESS) c->out[0] = (int64_t)(uintptr_t)layer;
      break;
    }
    case OSFTGO_FLINEAR_FORWARD:
      st = osft_flinear_forward((osft_flinear_t)(uintptr_t)c->h[0], p[0], p[1], T(2));
      break;
    case OSFTGO_FLINEAR_BACKWARD: {
      osft_flinear_grads_t gr;
      OSFT_FLINEAR_GRADS_INIT(&gr);
      gr.grad_x = T(2);
      gr.grad_u_low = T(3);
      gr.grad_s_low = T(4);
      gr.grad_v_low = T(5);
      gr.grad_bias = T(6);
      gr.accumulate = (uint32_t)c->i[0];
      st = osft_flinear_backward((osft_flinear_t)(uintptr_t)c->h[0], p[0], p[1], &gr);
      break;
    }
    case OSFTGO_FLINEAR_MERGE:
      st = osft_flinear_merge((osft_flinear_t)(uintptr_t)c->h[0], T(0));
      break;
    case OSFTGO_FLINEAR_REDECOMPOSE:
      st = osft_flinear_redecompose((osft_flinear_t)(uintptr_t)c->h[0], p[0]);
      break;
    case OSFTGO_MLP_CREATE: {
      osft_mlp_weights_t w;
      osft_mlp_t mlp = NULL;
      OSFT_MLP_WEIGHTS_INIT(&w);
      w.gate = p[0];
      w.up = p[1];
      w.down = p[2];
      w.gate_bias = p[3];
      w.up_bias = p[4];
      w.down_bias = p[5];
      w.gate_layer = (osft_flinear_t)(uintptr_t)c->h[2];
      w.up_layer = (osft_flinear_t)(uintptr_t)c->h[3];
      w.down_layer = (osft_flinear_t)(uintptr_t)c->h[4];
      st = osft_mlp_create((osft_context_t)(uintptr_t)c->h[0], (osft_mlp_variant_t)c->i[0],
                           c->i[1], c->i[2], &w,
                           (const osft_mlp_options_t *)(uintptr_t)c->h[1], &mlp);
      if (st == OSFT_STATUS_SUCCESS) c->out[0] = (int64_t)(uintptr_t)mlp;
      break;
    }
    case OSFTGO_MLP_FORWARD:
      st = osft_mlp_forward((osft_mlp_t)(uintptr_t)c->h[0], p[0], T(1), c->i[0]);
      break;
    case OSFTGO_MLP_BACKWARD: {
      /* slots: 0 x, 1 grad_y, 2 grad_x, 3-5 grad_gate/up/down, 6-8 their biases,
       * 9-11 gate factor grads (u, s, v), 12-14 up's, 15-17 down's;
       * i[0] accumulate, i[1] num_tiles, i[2] factor accumulate bits (8 per
       * projection), h[1..3] non-zero: that projection has factor grads. */
      osft_mlp_grads_t gr;
      osft_flinear_grads_t fg[3];
      OSFT_MLP_GRADS_INIT(&gr);
      gr.grad_x = T(2);
      gr.grad_gate = T(3);
      gr.grad_up = T(4);
      gr.grad_down = T(5);
      gr.grad_gate_bias = T(6);
      gr.grad_up_bias = T(7);
      gr.grad_down_bias = T(8);
      for (int j = 0; j < 3; ++j) {
        OSFT_FLINEAR_GRADS_INIT(&fg[j]);
        fg[j].grad_u_low = T(9 + 3 * j);
        fg[j].grad_s_low = T(10 + 3 * j);
        fg[j].grad_v_low = T(11 + 3 * j);
        fg[j].accumulate = (uint32_t)((c->i[2] >> (8 * j)) & 0xff);
      }
      gr.gate_factors = c->h[1] ? &fg[0] : NULL;
      gr.up_factors = c->h[2] ? &fg[1] : NULL;
      gr.down_factors = c->h[3] ? &fg[2] : NULL;
      gr.accumulate = (uint32_t)c->i[0];
      st = osft_mlp_backward((osft_mlp_t)(uintptr_t)c->h[0], p[0], p[1], &gr, c->i[1]);
      break;
    }
    case OSFTGO_COMM_ALLREDUCE:
      st = osft_comm_allreduce_sum((osft_comm_t)(uintptr_t)c->h[0], T(0));
      break;
    case OSFTGO_COMM_ALLGATHER:
      /* g2: the counts (int64, Go memory), c->i[0] of them */
      st = osft_comm_allgather((osft_comm_t)(uintptr_t)c->h[0], p[0], T(1),
                               (const int64_t *)g2, c->i[0]);
      break;
    case OSFTGO_PROJECTOR_ADD_TARGET: {
      /* slots: u_high, grad_u_low, u_low, v_high, grad_v_low, v_low; h[1], h[2]:
       * the shard arrays (C memory, kept by the Go projector), i[0..3]: layouts
       * and shard counts (u_layout | n_u << 8, v_layout | n_v << 8). */
      osft_projection_target_t tg;
      int64_t idx = -1;
      OSFT_PROJECTION_TARGET_INIT(&tg);
      tg.u_high = p[0];
      tg.grad_u_low = p[1];
      tg.u_low = p[2];
      tg.v_high = p[3];
      tg.grad_v_low = p[4];
      tg.v_low = p[5];
      tg.u_layout = (osft_shard_layout_t)c->i[0];
      tg.n_u_shards = c->i[1];
      tg.u_shards = (const int64_t *)(uintptr_t)c->h[1];
      tg.v_layout = (osft_shard_layout_t)c->i[2];
      tg.n_v_shards = c->i[3];
      tg.v_shards = (const int64_t *)(uintptr_t)c->h[2];
      st = osft_projector_add_target((osft_projector_t)(uintptr_t)c->h[0], &tg, &idx);
      if (st == OSFT_STATUS_SUCCESS) c->out[0] = idx;
      break;
    }
    case OSFTGO_PROJECTOR_ADD_LAYER: {
      int64_t idx = -1;
      st = osft_projector_add_layer((osft_projector_t)(uintptr_t)c->h[0],
                                    (osft_flinear_t)(uintptr_t)c->h[1], p[0], p[1], &idx);
      if (st == OSFT_STATUS_SUCCESS) c->out[0] = idx;
      break;
    }
    case OSFTGO_PROJECTOR_SET_GRADS:
      st = osft_projector_set_grads((osft_projector_t)(uintptr_t)c->h[0], c->i[0], p[0], p[1]);
      break;
    default:
      return osftgo_fail(c, OSFT_STATUS_INVALID_ARGUMENT, "osftgo: unknown operation");
  }
#undef T
  return osftgo_fail(c, st, NULL);
}

/* osft_qr_batch (power == 0) or osft_qr_power_iteration (power = the
 * iterations) over `count` matrices: g0 holds 3 * count descriptors (a, q,
 * r; q entries absent = in place, r entries absent = no R) whose data is C
 * memory (present 2: the address) or a byte offset into g1 (present 3), a
 * pointer-free Go buffer the Go side copied the Go-slice entries into.
 * The options come by value in the call buffer (no C struct to build from
 * Go): i[0] != 0 means given, i[1] the method, i[2] max_concurrency, h[0]
 * and h[1] the bits of orthogonality_threshold and rank_tolerance.
 * status: `count` int32 (Go memory). flags: NULL, or `count` int32 (Go
 * memory, only with options given) that become
 * osft_qr_options_t.rank_deficient for this call. */
osft_status_t osftgo_qr(uintptr_t ctx, int64_t count, int power, void *call, void *g0,
                        void *g1, void *status, void *flags) {
  osftgo_call_t *c = (osftgo_call_t *)call;
  const osftgo_desc_t *d = (const osftgo_desc_t *)g0;
  char *stage = (char *)g1;
  if (count < 0) return osftgo_fail(c, OSFT_STATUS_INVALID_ARGUMENT, "osftgo: count < 0");
  osft_qr_options_t o;
  const osft_qr_options_t *opts = NULL;
  if (c->i[0]) {
    OSFT_QR_OPTIONS_INIT(&o);
    o.method = (osft_qr_method_t)c->i[1];
    o.max_concurrency = (int)c->i[2];
    memcpy(&o.orthogonality_threshold, &c->h[0], sizeof(double));
    memcpy(&o.rank_tolerance, &c->h[1], sizeof(double));
    o.rank_deficient = (int *)flags; /* NULL unless QROptions.RankDeficient */
    opts = &o;
  }
  size_t n = (size_t)count;
  /* one block: the DLTensors, then the a, q and r pointer lists */
  char *block = (char *)calloc(1, (3 * n + 1) * sizeof(DLTensor) + 3 * (n + 1) * sizeof(void *));
  if (!block) return osftgo_fail(c, OSFT_STATUS_OUT_OF_MEMORY, "osftgo: out of memory");
  DLTensor *t = (DLTensor *)block;
  const DLTensor **pa = (const DLTensor **)(t + 3 * n + 1);
  DLTensor **pq = (DLTensor **)(pa + n + 1);
  DLTensor **pr = pq + n + 1;
  osft_status_t st;
  int inplace = 1, anyr = 0;
  for (size_t k = 0; k < 3 * n; ++k) {
    if (d[k].present == 1 || (d[k].present == 3 && stage == NULL)) {
      st = osftgo_fail(c, OSFT_STATUS_INVALID_ARGUMENT, "osftgo: QR lists take C memory");
      goto done;
    }
    if (d[k].present >= 2) osftgo_fill(&t[k], &d[k], NULL);
    if (d[k].present == 3) t[k].data = stage + d[k].data;
  }
  for (size_t k = 0; k < n; ++k) {
    pa[k] = d[3 * k].present ? &t[3 * k] : NULL;
    pq[k] = d[3 * k + 1].present ? &t[3 * k + 1] : NULL;
    pr[k] = d[3 * k + 2].present ? &t[3 * k + 2] : NULL;
    if (pq[k]) inplace = 0;
    if (pr[k]) anyr = 1;
  }
  /* a missing Q entry in a list that has others: that matrix in place */
  for (size_t k = 0; !inplace && k < n; ++k)
    if (!pq[k]) pq[k] = (DLTensor *)pa[k];
  if (power > 0)
    st = osft_qr_power_iteration((osft_context_t)ctx, opts, n, pa, pq, power,
                                 (osft_status_t *)status);
  else
    st = osft_qr_batch((osft_context_t)ctx, opts, n, pa, inplace ? NULL : pq,
                       anyr ? pr : NULL, (osft_status_t *)status);
  st = osftgo_fail(c, st, NULL);
done:
  free(block);
  return st;
}
%}
