/* A whole training step captured in a CUDA graph (GPU only; skips without
 * one): on a context whose stream is a non-blocking stream of the test's
 * own, cudaStreamBeginCapture around flinear forward + backward (every
 * gradient), the tiled MLP forward + backward, FLCE with the device-side
 * target check (device_target_check) and the gradient projection on the
 * self communicator; the graph is instantiated and replayed three times,
 * and every output of every replay equals, bit for bit, the same step run
 * uncaptured. The capture must allocate nothing (the memory statistics do
 * not move) and the target record stays clear. */
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_tensors.h"
#include "test_util.h"

#define CUDA_OK(call)                                                         \
  do {                                                                        \
    cudaError_t e_ = (call);                                                  \
    if (e_ != cudaSuccess) fail_msg("%s: %s", #call, cudaGetErrorString(e_)); \
  } while (0)

enum { M = 256, K = 64, N = 80, HID = 64, INTER = 96, V = 100 };

static tt *mat(tt_dtype d, int64_t rows, int64_t cols) {
  const int64_t shape[2] = {rows, cols};
  return tt_new(d, 2, shape);
}

static tt *vec(tt_dtype d, int64_t n) {
  const int64_t shape[1] = {n};
  return tt_new(d, 1, shape);
}

typedef struct {
  osft_context_t ctx;
  cudaStream_t stream;
  /* flinear */
  osft_flinear_t layer;
  tt *x, *bias, *y, *gy, *gx, *gu, *gs, *gv, *gb;
  /* MLP */
  osft_mlp_t mlp;
  tt *w[3], *mx, *my, *mgy, *mgx, *mgw[3];
  /* FLCE */
  osft_flce_t flce;
  tt *fx, *fw, *targets, *loss, *fgx, *fgw, *tok;
  /* projection: the gradients are restored from pristine copies first */
  osft_comm_t comm;
  osft_projector_t proj;
  tt *uh, *vh, *pgu, *pgv, *pgu0, *pgv0;
} step_state;

/* Every output of the step, for the comparison. */
static int outputs(step_state *s, tt **out) {
  int n = 0;
  tt *all[] = {s->y,   s->gx,  s->gu,     s->gs,     s->gv,     s->gb,
               s->my,  s->mgx, s->mgw[0], s->mgw[1], s->mgw[2], s->loss,
               s->fgx, s->fgw, s->tok,    s->pgu,    s->pgv};
  for (size_t i = 0; i < sizeof all / sizeof *all; ++i) out[n++] = all[i];
  return n;
}

/* Storage bytes of a test tensor, without touching it (tt_bytes would
 * download it: a synchronous copy that would break the capture). */
static size_t storage_bytes(const tt *t) {
  const size_t e = t->dtype == TT_F64 || t->dtype == TT_I64 ? 8
                   : t->dtype == TT_BF16                    ? 2
                                                            : 4;
  return (size_t)t->numel * e;
}

static void copy_on_stream(step_state *s, tt *dst, const tt *src) {
  const size_t bytes = storage_bytes(src);
  CUDA_OK(
      cudaMemcpyAsync(dst->dev, src->dev, bytes, cudaMemcpyDeviceToDevice, s->stream));
}

static void step(step_state *s) {
  assert_ok(osft_flinear_forward(s->layer, &s->x->t, &s->bias->t, &s->y->t));
  osft_flinear_grads_t g;
  assert_ok(OSFT_FLINEAR_GRADS_INIT(&g));
  g.grad_x = &s->gx->t, g.grad_u_low = &s->gu->t, g.grad_s_low = &s->gs->t;
  g.grad_v_low = &s->gv->t, g.grad_bias = &s->gb->t;
  assert_ok(osft_flinear_backward(s->layer, &s->x->t, &s->gy->t, &g));

  assert_ok(osft_mlp_forward(s->mlp, &s->mx->t, &s->my->t, 2));
  osft_mlp_grads_t mg;
  assert_ok(OSFT_MLP_GRADS_INIT(&mg));
  mg.grad_x = &s->mgx->t, mg.grad_gate = &s->mgw[0]->t, mg.grad_up = &s->mgw[1]->t;
  mg.grad_down = &s->mgw[2]->t;
  assert_ok(osft_mlp_backward(s->mlp, &s->mx->t, &s->mgy->t, &mg, 2));

  osft_flce_inputs_t in;
  assert_ok(OSFT_FLCE_INPUTS_INIT(&in));
  in.x = &s->fx->t, in.weight = &s->fw->t, in.targets = &s->targets->t;
  osft_flce_outputs_t out;
  assert_ok(OSFT_FLCE_OUTPUTS_INIT(&out));
  out.loss = &s->loss->t, out.grad_x = &s->fgx->t, out.grad_weight = &s->fgw->t;
  out.token_loss = &s->tok->t;
  assert_ok(osft_flce_compute(s->flce, &in, &out));

  copy_on_stream(s, s->pgu, s->pgu0);
  copy_on_stream(s, s->pgv, s->pgv0);
  assert_ok(osft_projector_project(s->proj));
}

static void setup_step(step_state *s) {
  test_seed("capture");
  CUDA_OK(cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking));
  osft_context_options_t o;
  assert_ok(OSFT_CONTEXT_OPTIONS_INIT(&o));
  o.stream = s->stream;
  s->ctx = tt_context(&o);
  /* flinear */
  tt *w = mat(TT_F32, N, K);
  tt_random(w, -1.0, 1.0);
  osft_flinear_options_t lo;
  assert_ok(OSFT_FLINEAR_OPTIONS_INIT(&lo));
  lo.rank_ratio = 0.5;
  lo.strategy = OSFT_FLINEAR_FACTORIZED;
  assert_ok(osft_flinear_create_from_weight(s->ctx, &w->t, &lo, &s->layer));
  tt_free(w);
  int64_t l = 0;
  assert_ok(osft_flinear_get_dims(s->layer, NULL, NULL, NULL, &l));
  s->x = mat(TT_F32, M, K), s->bias = vec(TT_F32, N), s->y = mat(TT_F32, M, N);
  s->gy = mat(TT_F32, M, N), s->gx = mat(TT_F32, M, K), s->gu = mat(TT_F32, N, l);
  s->gs = vec(TT_F32, l), s->gv = mat(TT_F32, l, K), s->gb = vec(TT_F32, N);
  tt_random(s->x, -1, 1), tt_random(s->bias, -1, 1), tt_random(s->gy, -1, 1);
  /* MLP */
  s->w[0] = mat(TT_F32, INTER, HID), s->w[1] = mat(TT_F32, INTER, HID);
  s->w[2] = mat(TT_F32, HID, INTER);
  for (int p = 0; p < 3; ++p) tt_random(s->w[p], -0.2, 0.2);
  osft_mlp_weights_t mw;
  assert_ok(OSFT_MLP_WEIGHTS_INIT(&mw));
  mw.gate = &s->w[0]->t, mw.up = &s->w[1]->t, mw.down = &s->w[2]->t;
  assert_ok(osft_mlp_create(s->ctx, OSFT_MLP_SWIGLU, HID, INTER, &mw, NULL, &s->mlp));
  s->mx = mat(TT_F32, M, HID), s->my = mat(TT_F32, M, HID), s->mgy = mat(TT_F32, M, HID);
  s->mgx = mat(TT_F32, M, HID);
  for (int p = 0; p < 3; ++p)
    s->mgw[p] = mat(TT_F32, s->w[p]->shape[0], s->w[p]->shape[1]);
  tt_random(s->mx, -1, 1), tt_random(s->mgy, -1, 1);
  /* FLCE with the device-side target check */
  osft_flce_options_t fo;
  assert_ok(OSFT_FLCE_OPTIONS_INIT(&fo));
  fo.device_target_check = 1;
  fo.chunk_rows = 64;
  assert_ok(osft_flce_create(s->ctx, &fo, &s->flce));
  s->fx = mat(TT_F32, M, HID), s->fw = mat(TT_F32, V, HID), s->targets = vec(TT_I64, M);
  tt_random(s->fx, -1, 1), tt_random(s->fw, -0.5, 0.5);
  double y[M];
  for (int i = 0; i < M; ++i) y[i] = i % 13 == 0 ? -100 : (i * 31) % V;
  tt_set(s->targets, y);
  const int64_t one[1] = {1};
  s->loss = tt_new(TT_F32, 1, one), s->fgx = mat(TT_F32, M, HID);
  s->fgw = mat(TT_F32, V, HID), s->tok = vec(TT_F32, M);
  /* projection on the self communicator */
  assert_ok(osft_comm_create_self(s->ctx, NULL, &s->comm));
  assert_ok(osft_projector_create(s->ctx, s->comm, NULL, &s->proj));
  s->uh = mat(TT_F32, 48, 12), s->vh = mat(TT_F32, 12, 40);
  s->pgu = mat(TT_F32, 48, 6), s->pgv = mat(TT_F32, 6, 40);
  s->pgu0 = mat(TT_F32, 48, 6), s->pgv0 = mat(TT_F32, 6, 40);
  tt_random(s->uh, -1, 1), tt_random(s->vh, -1, 1);
  tt_random(s->pgu0, -1, 1), tt_random(s->pgv0, -1, 1);
  osft_projection_target_t t;
  assert_ok(OSFT_PROJECTION_TARGET_INIT(&t));
  t.u_high = &s->uh->t, t.grad_u_low = &s->pgu->t;
  t.v_high = &s->vh->t, t.grad_v_low = &s->pgv->t;
  assert_ok(osft_projector_add_target(s->proj, &t, NULL));
  assert_ok(osft_projector_prepare(s->proj));
}

static void teardown_step(step_state *s) {
  assert_ok(osft_projector_destroy(s->proj));
  assert_ok(osft_comm_destroy(s->comm));
  assert_ok(osft_flce_destroy(s->flce));
  assert_ok(osft_mlp_destroy(s->mlp));
  assert_ok(osft_flinear_destroy(s->layer));
  assert_ok(osft_context_destroy(s->ctx));
  tt *all[] = {s->x,       s->bias, s->y,      s->gy,     s->gx,     s->gu, s->gs,
               s->gv,      s->gb,   s->w[0],   s->w[1],   s->w[2],   s->mx, s->my,
               s->mgy,     s->mgx,  s->mgw[0], s->mgw[1], s->mgw[2], s->fx, s->fw,
               s->targets, s->loss, s->fgx,    s->fgw,    s->tok,    s->uh, s->vh,
               s->pgu,     s->pgv,  s->pgu0,   s->pgv0};
  for (size_t i = 0; i < sizeof all / sizeof *all; ++i) tt_free(all[i]);
  cudaStreamDestroy(s->stream);
}

static uint64_t allocs(osft_context_t ctx) {
  osft_memory_stats_t st;
  memset(&st, 0, sizeof st);
  st.struct_size = sizeof st;
  assert_ok(osft_context_get_memory_stats(ctx, &st));
  return st.host_allocs + st.device_allocs;
}

static void poison_outputs(step_state *s) {
  tt *out[32];
  const int n = outputs(s, out);
  for (int i = 0; i < n; ++i) {
    CUDA_OK(cudaMemsetAsync(out[i]->dev, 0xff, storage_bytes(out[i]), s->stream));
  }
}

static void test_step_capture_replays_bit_for_bit(void **state) {
  (void)state;
  step_state s;
  setup_step(&s);
  step(&s); /* warm-up: grows every scratch block and creates the handles */
  assert_ok(osft_context_synchronize(s.ctx));
  poison_outputs(&s);
  step(&s);
  assert_ok(osft_context_synchronize(s.ctx));
  tt *out[32];
  const int n = outputs(&s, out);
  void *want[32];
  size_t size[32];
  for (int i = 0; i < n; ++i) {
    want[i] = tt_bytes(out[i], &size[i]);
    double *v = tt_get(out[i]);
    for (int64_t j = 0; j < tt_logical_numel(out[i]); ++j)
      if (!isfinite(v[j]))
        fail_msg("output %d[%lld] is %g uncaptured", i, (long long)j, v[j]);
    free(v);
  }

  const uint64_t before = allocs(s.ctx);
  cudaGraph_t graph = NULL;
  CUDA_OK(cudaStreamBeginCapture(s.stream, cudaStreamCaptureModeThreadLocal));
  step(&s);
  CUDA_OK(cudaStreamEndCapture(s.stream, &graph));
  assert_int_equal(allocs(s.ctx), before); /* nothing allocated while capturing */
  cudaGraphExec_t exec = NULL;
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 1; replay <= 3; ++replay) {
    poison_outputs(&s);
    CUDA_OK(cudaGraphLaunch(exec, s.stream));
    CUDA_OK(cudaStreamSynchronize(s.stream));
    for (int i = 0; i < n; ++i) {
      size_t got_size = 0;
      void *got = tt_bytes(out[i], &got_size);
      if (got_size != size[i] || memcmp(got, want[i], size[i]) != 0)
        fail_msg("replay %d: output %d differs from the uncaptured step", replay, i);
      free(got);
    }
  }
  assert_int_equal(allocs(s.ctx), before);
  assert_ok(osft_flce_check_targets(s.flce)); /* every target was valid */
  CUDA_OK(cudaGraphExecDestroy(exec));
  CUDA_OK(cudaGraphDestroy(graph));
  for (int i = 0; i < n; ++i) free(want[i]);
  teardown_step(&s);
}

int main(void) {
  if (!tt_device_present()) return OSFT_TEST_SKIP;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_step_capture_replays_bit_for_bit),
  };
  return cmocka_run_group_tests_name("capture", tests, NULL, NULL);
}
