/* libFuzzer harness: the tiled MLP (osftrt/mlp.h).
 *
 * Every variant (and unknown ones), hostile sizes, dense weights and
 * biases (or factorized layers instead) with hostile layouts and values,
 * every option field (tiling rule, tile size, budget, dtype), then forward
 * and backward with hostile activations, every gradient optional, factor
 * gradients for layers, accumulate bits and tile counts. Beyond the common
 * promises: weights, biases and layer factors are never modified, and a
 * successful call keeps row padding of its outputs untouched. */
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"

static osft_flinear_t make_layer(fz *f, osft_context_t ctx, fz_pool *keep, int64_t out,
                                 int64_t in) {
  /* A finite weight, so that the layer exists; its faults are flinear's. */
  fz_tensor *w = fz_tensor_2d(keep, f, "layer_weight", FZ_IN | FZ_CLEAN, FZ_F32, out, in,
                              FZ_VALUES_FINITE);
  osft_flinear_t layer = NULL;
  if (osft_flinear_create_from_weight(ctx, &w->t, NULL, &layer) != OSFT_STATUS_SUCCESS)
    return NULL; /* e.g. out or in < 2, or the caller's allocator refused */
  return layer;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fz f;
  fz_init(&f, data, size);
  osft_context_t ctx = fz_context(&f);
  fz_pool wpool = {0}; /* weights, biases: live as long as the MLP */
  fz_pool pool = {0};  /* one call's tensors */
  osft_flinear_t layers[3] = {NULL, NULL, NULL};
  osft_mlp_t mlp = (osft_mlp_t)(uintptr_t)0x5a5a;
  int must_fail = 0;

  int variant = fz_enum(&f, (int)fz_range(&f, 0, 6), 7);
  if (variant < 0 || variant > 6) must_fail = 1;
  const int gated = variant >= 0 && variant <= 2;
  const int64_t H = fz_range(&f, 1, 8), I = fz_range(&f, 1, 8);
  const DLDataType dt = fz_bool(&f) ? FZ_BF16 : FZ_F32;

  osft_mlp_weights_t w;
  OSFT_MLP_WEIGHTS_INIT(&w);
  /* Projections: 0 gate, 1 up, 2 down; each dense or a layer. */
  const int64_t outs[3] = {I, I, H}, ins[3] = {H, H, I};
  static const char *names[3] = {"gate", "up", "down"};
  int is_layer[3] = {0, 0, 0};
  int all_layers = 1;
  for (int p = 0; p < 3; ++p) {
    if (p == 0 && !gated) {
      if (fz_range(&f, 0, 15) == 15) { /* a gate for a plain variant */
        w.gate = &fz_tensor_2d(&wpool, &f, "gate", FZ_IN, dt, I, H, FZ_VALUES_ANY)->t;
        must_fail = 1;
      }
      continue;
    }
    if (fz_range(&f, 0, 5) == 5) {
      layers[p] = make_layer(&f, ctx, &wpool, outs[p], ins[p]);
      if (layers[p]) {
        is_layer[p] = 1;
        if (p == 0) w.gate_layer = layers[p];
        if (p == 1) w.up_layer = layers[p];
        if (p == 2) w.down_layer = layers[p];
        continue;
      }
    }
    all_layers = 0;
    const DLTensor *t =
        &fz_tensor_2d(&wpool, &f, names[p], FZ_IN, dt, outs[p], ins[p], FZ_VALUES_ANY)->t;
    if (fz_range(&f, 0, 31) == 31) {
      t = NULL; /* neither weight nor layer */
      must_fail = 1;
    }
    if (p == 0) w.gate = t;
    if (p == 1) w.up = t;
    if (p == 2) w.down = t;
  }
  if (gated && fz_range(&f, 0, 3) == 3)
    w.gate_bias = &fz_tensor_1d(&wpool, &f, "gate_bias", FZ_IN, fz_bool(&f) ? FZ_F32 : dt,
                                I, FZ_VALUES_ANY)
                       ->t;
  if (fz_range(&f, 0, 3) == 3)
    w.up_bias = &fz_tensor_1d(&wpool, &f, "up_bias", FZ_IN, fz_bool(&f) ? FZ_F32 : dt, I,
                              FZ_VALUES_ANY)
                     ->t;
  if (fz_range(&f, 0, 3) == 3)
    w.down_bias = &fz_tensor_1d(&wpool, &f, "down_bias", FZ_IN, fz_bool(&f) ? FZ_F32 : dt,
                                H, FZ_VALUES_ANY)
                       ->t;
  if (fz_any_faulty(&wpool)) must_fail = 1;

  osft_mlp_options_t o;
  OSFT_MLP_OPTIONS_INIT(&o);
  int opt_fail = 0; /* faults of the options: only count when they are passed */
  o.tiling = (osft_mlp_tiling_t)fz_enum(&f, (int)fz_range(&f, 0, 2), 3);
  if ((int)o.tiling < 0 || (int)o.tiling > 2) opt_fail = 1;
  o.tile_tokens = fz_i64(&f, fz_range(&f, 1, 4));
  if (o.tiling == OSFT_MLP_TILING_TOKENS && o.tile_tokens < 1) opt_fail = 1;
  static const size_t budgets[] = {0, 1, 64, 256, 4096, 1 << 20};
  o.memory_budget = budgets[fz_range(&f, 0, 5)];
  static const uint8_t odt[][2] = {
      {0, 0}, {kDLFloat, 32}, {kDLBfloat, 16}, {kDLFloat, 64}};
  const int c = (int)fz_range(&f, 0, 3);
  o.dtype = fz_dt(odt[c][0], odt[c][1]);
  if (c == 3) opt_fail = 1;
  void *opts = fz_bool(&f) ? NULL : fz_struct(&f, &o, sizeof o, &opt_fail);
  int64_t hh = H, ii = I;
  if (fz_range(&f, 0, 15) == 15) {
    hh = fz_i64(&f, H);
    ii = fz_i64(&f, I);
    if (hh < 1 || ii < 1) must_fail = 1;
  }
  void *wp = fz_struct(&f, &w, sizeof w, &must_fail);
  fz_snapshot(&wpool);
  fz_before();
  const osft_status_t cst = osft_mlp_create(ctx, (osft_mlp_variant_t)variant, hh, ii,
                                            (const osft_mlp_weights_t *)wp,
                                            (const osft_mlp_options_t *)opts, &mlp);
  free(wp);
  const int failed = fz_status(cst, "osft_mlp_create", must_fail || (opts && opt_fail));
  free(opts);
  fz_check_tensors(&wpool, failed, "osft_mlp_create");
  if (failed) {
    if (mlp != (osft_mlp_t)(uintptr_t)0x5a5a)
      fz_die("osft_mlp_create failed but wrote *mlp");
    goto done;
  }
  (void)all_layers;

  for (int op_i = (int)fz_range(&f, 1, 2); op_i > 0; --op_i) {
    const DLDataType adt =
        fz_range(&f, 0, 7) == 7 ? (dt.code == kDLBfloat ? FZ_F32 : FZ_BF16) : dt;
    const int is3d = fz_range(&f, 0, 3) == 3;
    int64_t xd[3];
    int lead = 0;
    if (is3d) xd[lead++] = fz_range(&f, 0, 2);
    xd[lead++] = fz_range(&f, 0, 9);
    xd[lead] = H;
    const int64_t num_tiles =
        fz_range(&f, 0, 7) == 7 ? fz_i64(&f, 0) : fz_range(&f, 0, 3);
    fz_tensor *x =
        fz_tensor_new(&pool, &f, "x", FZ_IN, adt, lead + 1, xd, FZ_VALUES_ANY, 1, 0);
    int mf = num_tiles < 0;
    if (fz_bool(&f)) {
      fz_tensor *y =
          fz_tensor_new(&pool, &f, "y", FZ_OUT, adt, lead + 1, xd, FZ_VALUES_ANY, 1, 0);
      DLTensor *yarg = &y->t;
      if (fz_range(&f, 0, 15) == 15 && fz_has_values(x) && !x->faulty) {
        yarg = &x->t;
        mf = 1;
      }
      mf |= fz_any_faulty(&pool);
      fz_snapshot(&wpool);
      fz_snapshot(&pool);
      fz_before();
      const osft_status_t st = osft_mlp_forward(mlp, &x->t, yarg, num_tiles);
      const int fl = fz_status(st, "osft_mlp_forward", mf);
      fz_check_tensors(&pool, fl, "osft_mlp_forward");
      fz_check_tensors(&wpool, 0, "osft_mlp_forward");
      if (!fl) fz_check_padding(&pool, "osft_mlp_forward");
    } else {
      fz_tensor *gy = fz_tensor_new(&pool, &f, "grad_y", FZ_IN, adt, lead + 1, xd,
                                    FZ_VALUES_ANY, 1, 0);
      osft_mlp_grads_t g;
      OSFT_MLP_GRADS_INIT(&g);
      osft_flinear_grads_t fg[3];
      const unsigned want = (unsigned)fz_range(&f, 0, 127) ^ 0x7f;
      if (want & 1)
        g.grad_x = &fz_tensor_new(&pool, &f, "grad_x", FZ_INOUT, adt, lead + 1, xd,
                                  FZ_VALUES_ANY, 1, 0)
                        ->t;
      DLTensor **dense[3] = {&g.grad_gate, &g.grad_up, &g.grad_down};
      DLTensor **bias[3] = {&g.grad_gate_bias, &g.grad_up_bias, &g.grad_down_bias};
      const osft_flinear_grads_t **facs[3] = {&g.gate_factors, &g.up_factors,
                                              &g.down_factors};
      for (int p = 0; p < 3; ++p) {
        if (p == 0 && !gated) continue;
        const DLDataType gdt = fz_bool(&f) ? FZ_F32 : FZ_BF16;
        if ((want >> (1 + p)) & 1) {
          if (!is_layer[p]) {
            *dense[p] = &fz_tensor_2d(&pool, &f, names[p], FZ_INOUT, gdt, outs[p], ins[p],
                                      FZ_VALUES_ANY)
                             ->t;
          } else {
            int64_t r = 0, l = 0;
            osft_flinear_get_dims(layers[p], NULL, NULL, &r, &l);
            OSFT_FLINEAR_GRADS_INIT(&fg[p]);
            fg[p].grad_u_low = &fz_tensor_2d(&pool, &f, "grad_u_low", FZ_INOUT, FZ_F32,
                                             outs[p], l, FZ_VALUES_ANY)
                                    ->t;
            if (fz_bool(&f))
              fg[p].grad_s_low = &fz_tensor_1d(&pool, &f, "grad_s_low", FZ_INOUT, FZ_F32,
                                               l, FZ_VALUES_ANY)
                                      ->t;
            if (fz_bool(&f))
              fg[p].grad_v_low = &fz_tensor_2d(&pool, &f, "grad_v_low", FZ_INOUT, FZ_F32,
                                               l, ins[p], FZ_VALUES_ANY)
                                      ->t;
            fg[p].accumulate = (uint32_t)fz_range(&f, 0, 15);
            *facs[p] = &fg[p];
          }
        }
        if ((want >> (4 + p)) & 1)
          *bias[p] =
              &fz_tensor_1d(&pool, &f, "grad_bias", FZ_INOUT, gdt, outs[p], FZ_VALUES_ANY)
                   ->t;
      }
      g.accumulate = (uint32_t)fz_range(&f, 0, 127);
      if (fz_range(&f, 0, 15) == 15) {
        g.accumulate |= 0x80u << fz_range(&f, 0, 3);
        mf = 1; /* unknown accumulate bits */
      }
      mf |= fz_any_faulty(&pool);
      void *gp = fz_struct(&f, &g, sizeof g, &mf);
      fz_snapshot(&wpool);
      fz_snapshot(&pool);
      fz_before();
      const osft_status_t st =
          osft_mlp_backward(mlp, &x->t, &gy->t, (const osft_mlp_grads_t *)gp, num_tiles);
      free(gp);
      const int fl = fz_status(st, "osft_mlp_backward", mf);
      fz_check_tensors(&pool, fl, "osft_mlp_backward");
      fz_check_tensors(&wpool, 0, "osft_mlp_backward");
      if (!fl) fz_check_padding(&pool, "osft_mlp_backward");
    }
    fz_pool_free(&pool);
  }
  {
    int64_t nt = -1;
    const int64_t tokens = fz_i64(&f, 7);
    fz_before();
    if (!fz_status(osft_mlp_get_tile_count(mlp, tokens, &nt, NULL),
                   "osft_mlp_get_tile_count", tokens < 0) &&
        (nt < 0 || (tokens == 0 && nt != 0) || (tokens > 0 && nt < 1)))
      fz_die("osft_mlp_get_tile_count: %lld tiles for %lld tokens", (long long)nt,
             (long long)tokens);
  }
  fz_before();
  if (fz_status(osft_mlp_destroy(mlp), "osft_mlp_destroy", 0))
    fz_die("osft_mlp_destroy failed");
done:
  for (int p = 0; p < 3; ++p)
    if (layers[p] && osft_flinear_destroy(layers[p]) != OSFT_STATUS_SUCCESS)
      fz_die("osft_flinear_destroy: %s", osft_last_error());
  fz_pool_free(&pool);
  fz_pool_free(&wpool);
  fz_context_destroy(ctx);
  return 0;
}
