/* libFuzzer harness: the factorized linear (OSFT) layer (osftrt/flinear.h).
 *
 * A layer from a hostile dense weight (NaN/Inf must be refused with
 * OSFT_STATUS_NUMERICAL_ERROR) and hostile options, or over six hostile
 * caller-owned factors (separate, or adjacent views of one U and one V^T);
 * then a few of forward, backward (every gradient optional, accumulate
 * bits), merge, redecompose, get_factor, choose/set_strategy on hostile
 * tensors. Beyond the common promises: factors are inputs of forward,
 * backward and merge (never modified), and a failed redecompose leaves the
 * factors, runtime-owned or caller-owned, byte-identical. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"

/* The bytes of the six factors as the layer exposes them. */
typedef struct {
  uint8_t *bytes[6];
  size_t size[6];
} factor_snap;

static size_t view_bytes(const DLTensor *v) {
  const size_t es = ((size_t)v->dtype.bits + 7) / 8;
  if (v->ndim == 1) return (size_t)v->shape[0] * es;
  const int64_t ld = v->strides ? v->strides[0] : v->shape[1];
  return v->shape[0] == 0 ? 0 : (size_t)((v->shape[0] - 1) * ld + v->shape[1]) * es;
}

static void snap_factors(osft_flinear_t layer, factor_snap *s) {
  for (int i = 0; i < 6; ++i) {
    DLTensor v;
    if (osft_flinear_get_factor(layer, (osft_flinear_factor_t)i, &v) !=
        OSFT_STATUS_SUCCESS)
      fz_die("osft_flinear_get_factor(%d): %s", i, osft_last_error());
    s->size[i] = view_bytes(&v);
    s->bytes[i] = (uint8_t *)malloc(s->size[i] ? s->size[i] : 1);
    memcpy(s->bytes[i], (uint8_t *)v.data + v.byte_offset, s->size[i]);
  }
}

static void check_factors(osft_flinear_t layer, const factor_snap *s, const char *call) {
  for (int i = 0; i < 6; ++i) {
    DLTensor v;
    if (osft_flinear_get_factor(layer, (osft_flinear_factor_t)i, &v) !=
        OSFT_STATUS_SUCCESS)
      fz_die("osft_flinear_get_factor(%d): %s", i, osft_last_error());
    if (view_bytes(&v) != s->size[i] ||
        memcmp((uint8_t *)v.data + v.byte_offset, s->bytes[i], s->size[i]) != 0)
      fz_die("%s failed (%s) but changed factor %d", call, osft_last_error(), i);
  }
}

static void free_snap(factor_snap *s) {
  for (int i = 0; i < 6; ++i) free(s->bytes[i]);
}

/* A view of rows [r0, r0 + rows) and columns [c0, c0 + cols) of a row-major
 * matrix tensor (for adjacent factors). */
static void sub_view(DLTensor *v, int64_t *shape, int64_t *strides, const fz_tensor *m,
                     int64_t r0, int64_t rows, int64_t c0, int64_t cols) {
  *v = m->t;
  const int64_t ld = m->t.strides ? m->strides[0] : m->shape[1];
  const size_t es = ((size_t)m->t.dtype.bits + 7) / 8;
  shape[0] = rows;
  shape[1] = cols;
  strides[0] = ld;
  strides[1] = 1;
  v->shape = shape;
  v->strides = strides;
  v->byte_offset = m->t.byte_offset + (uint64_t)((r0 * ld + c0) * (int64_t)es);
}

static void set_roles(fz_pool *pool, int role) {
  for (fz_tensor *t = pool->head; t; t = t->next) t->role = role;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fz f;
  fz_init(&f, data, size);
  osft_context_t ctx = fz_context(&f);
  fz_pool pool = {0};    /* tensors of one call */
  fz_pool factors = {0}; /* caller-owned factors (live as long as the layer) */
  osft_flinear_t layer = (osft_flinear_t)(uintptr_t)0x5a5a;
  int must_fail = 0;

  const int64_t N = fz_range(&f, 2, 9), K = fz_range(&f, 2, 9);
  const int64_t k = N < K ? N : K;
  osft_flinear_options_t o;
  OSFT_FLINEAR_OPTIONS_INIT(&o);
  void *opts = NULL;
  if (fz_bool(&f)) {
    o.rank_ratio = fz_double(&f, 0.5);
    if (!(o.rank_ratio > 0 && o.rank_ratio < 1)) must_fail = 1;
    o.strategy = (osft_flinear_strategy_t)fz_enum(&f, (int)fz_range(&f, 0, 3), 4);
    if ((int)o.strategy < 0 || (int)o.strategy > 3) must_fail = 1;
    static const uint8_t fdt[][2] = {
        {0, 0}, {kDLFloat, 32}, {kDLBfloat, 16}, {kDLFloat, 64}, {kDLInt, 32}};
    const int c = (int)fz_range(&f, 0, 4);
    o.factor_dtype = fz_dt(fdt[c][0], fdt[c][1]);
    opts = fz_struct(&f, &o, sizeof o, &must_fail);
  }

  const int from_factors = fz_bool(&f);
  const char *create_call;
  osft_status_t st;
  DLDataType fdt = FZ_F32;
  int64_t r = 0, l = 0;
  if (!from_factors) {
    create_call = "osft_flinear_create_from_weight";
    static const uint8_t wdt[][2] = {{kDLFloat, 32}, {kDLFloat, 64}, {kDLBfloat, 16}};
    const int c = (int)fz_range(&f, 0, 2);
    fz_tensor *w = fz_tensor_2d(&pool, &f, "weight", FZ_IN, fz_dt(wdt[c][0], wdt[c][1]),
                                N, K, FZ_VALUES_ANY);
    const int weight_fails = w->faulty || w->nonfinite;
    fz_snapshot(&pool);
    fz_before();
    st = osft_flinear_create_from_weight(ctx, &w->t, (const osft_flinear_options_t *)opts,
                                         &layer);
    const int failed = fz_status(st, create_call, must_fail || weight_fails);
    fz_check_tensors(&pool, failed, create_call);
  } else {
    create_call = "osft_flinear_create_from_factors";
    fdt = fz_bool(&f) ? FZ_BF16 : FZ_F32;
    r = fz_range(&f, 1, k - 1);
    l = fz_range(&f, 1, k - r);
    if (fz_range(&f, 0, 15) == 15) r = 0; /* refused */
    osft_flinear_factors_t fac;
    OSFT_FLINEAR_FACTORS_INIT(&fac);
    static DLTensor views[4];
    static int64_t vshape[4][2], vstride[4][2];
    const fz_tensor *sh, *sl;
    if (fz_range(&f, 0, 2) == 2 && r >= 1) {
      /* adjacent: U (N x (r + l)) and V^T ((r + l) x K), clean layouts */
      fz_tensor *U = fz_tensor_2d(&factors, &f, "U", FZ_IN | FZ_CLEAN, fdt, N, r + l,
                                  FZ_VALUES_FINITE);
      fz_tensor *Vt = fz_tensor_2d(&factors, &f, "Vt", FZ_IN | FZ_CLEAN, fdt, r + l, K,
                                   FZ_VALUES_FINITE);
      sub_view(&views[0], vshape[0], vstride[0], U, 0, N, 0, r);
      sub_view(&views[1], vshape[1], vstride[1], U, 0, N, r, l);
      sub_view(&views[2], vshape[2], vstride[2], Vt, 0, r, 0, K);
      sub_view(&views[3], vshape[3], vstride[3], Vt, r, l, 0, K);
      fac.u_high = &views[0];
      fac.u_low = &views[1];
      fac.v_high = &views[2];
      fac.v_low = &views[3];
    } else {
      fac.u_high =
          &fz_tensor_2d(&factors, &f, "u_high", FZ_IN, fdt, N, r, FZ_VALUES_ANY)->t;
      fac.v_high =
          &fz_tensor_2d(&factors, &f, "v_high", FZ_IN, fdt, r, K, FZ_VALUES_ANY)->t;
      fac.u_low =
          &fz_tensor_2d(&factors, &f, "u_low", FZ_IN, fdt, N, l, FZ_VALUES_ANY)->t;
      fac.v_low =
          &fz_tensor_2d(&factors, &f, "v_low", FZ_IN, fdt, l, K, FZ_VALUES_ANY)->t;
    }
    sh = fz_tensor_1d(&factors, &f, "s_high", FZ_IN, fdt, r, FZ_VALUES_ANY);
    sl = fz_tensor_1d(&factors, &f, "s_low", FZ_IN, fdt, l, FZ_VALUES_ANY);
    fac.s_high = &sh->t;
    fac.s_low = &sl->t;
    if (fz_range(&f, 0, 15) == 15) { /* a missing factor */
      fac.v_low = NULL;
      must_fail = 1;
    }
    if (r == 0) must_fail = 1;
    if (fz_any_faulty(&factors)) must_fail = 1;
    void *facp = fz_struct(&f, &fac, sizeof fac, &must_fail);
    fz_snapshot(&factors);
    fz_before();
    st = osft_flinear_create_from_factors(ctx, (const osft_flinear_factors_t *)facp,
                                          (const osft_flinear_options_t *)opts, &layer);
    free(facp);
    const int failed = fz_status(st, create_call, must_fail);
    fz_check_tensors(&factors, 1, create_call); /* reads nothing */
    (void)failed;
  }
  free(opts);
  if (st != OSFT_STATUS_SUCCESS) {
    if (layer != (osft_flinear_t)(uintptr_t)0x5a5a)
      fz_die("%s failed but wrote *layer", create_call);
    goto done;
  }
  fz_pool_free(&pool);

  {
    /* The layer's own dims (a fault may have changed a shape consistently). */
    int64_t N = 0, K = 0, rr = 0, ll = 0;
    if (osft_flinear_get_dims(layer, &N, &K, &rr, &ll) != OSFT_STATUS_SUCCESS || N < 1 ||
        K < 1 || rr < 1 || ll < 1 || rr + ll > (N < K ? N : K))
      fz_die("osft_flinear_get_dims: %lld %lld %lld %lld", (long long)N, (long long)K,
             (long long)rr, (long long)ll);
    const int n_ops = (int)fz_range(&f, 1, 3);
    for (int op_i = 0; op_i < n_ops; ++op_i) {
      const int op = (int)fz_range(&f, 0, 6);
      const DLDataType adt = fz_bool(&f) ? FZ_BF16 : FZ_F32;
      const int is3d = fz_range(&f, 0, 3) == 3;
      const int64_t B = is3d ? fz_range(&f, 0, 2) : 1, S = fz_range(&f, 0, 6);
      int64_t xd[3], yd[3];
      int lead = 0;
      if (is3d) xd[lead] = yd[lead] = B, ++lead;
      xd[lead] = yd[lead] = S, ++lead;
      xd[lead] = K;
      yd[lead] = N;
      set_roles(&factors, FZ_IN);
      if (op == 0) { /* forward */
        fz_tensor *x =
            fz_tensor_new(&pool, &f, "x", FZ_IN, adt, lead + 1, xd, FZ_VALUES_ANY, 1, 0);
        fz_tensor *b = fz_present(&f) && fz_bool(&f)
                           ? fz_tensor_1d(&pool, &f, "bias", FZ_IN,
                                          fz_bool(&f) ? FZ_F32 : adt, N, FZ_VALUES_ANY)
                           : NULL;
        fz_tensor *y =
            fz_tensor_new(&pool, &f, "y", FZ_OUT, adt, lead + 1, yd, FZ_VALUES_ANY, 1, 0);
        const DLTensor *yarg = &y->t;
        int alias = 0;
        if (fz_range(&f, 0, 15) == 15 && fz_has_values(x) && !x->faulty) {
          yarg = &x->t; /* y over x */
          alias = 1;
        }
        fz_snapshot(&factors);
        fz_snapshot(&pool);
        fz_before();
        st = osft_flinear_forward(layer, &x->t, b ? &b->t : NULL, (DLTensor *)yarg);
        const int failed =
            fz_status(st, "osft_flinear_forward", fz_any_faulty(&pool) || alias);
        fz_check_tensors(&pool, failed, "osft_flinear_forward");
        fz_check_tensors(&factors, 0, "osft_flinear_forward");
        if (!failed) fz_check_padding(&pool, "osft_flinear_forward");
      } else if (op == 1) { /* backward */
        const DLDataType gdt = fz_bool(&f) ? FZ_F32 : (from_factors ? fdt : FZ_F32);
        fz_tensor *x =
            fz_tensor_new(&pool, &f, "x", FZ_IN, adt, lead + 1, xd, FZ_VALUES_ANY, 1, 0);
        fz_tensor *gy = fz_tensor_new(&pool, &f, "grad_y", FZ_IN, adt, lead + 1, yd,
                                      FZ_VALUES_ANY, 1, 0);
        osft_flinear_grads_t g;
        OSFT_FLINEAR_GRADS_INIT(&g);
        const unsigned want = (unsigned)fz_range(&f, 0, 31) ^ 0x1f;
        if (want & 1)
          g.grad_x = &fz_tensor_new(&pool, &f, "grad_x", FZ_INOUT, adt, lead + 1, xd,
                                    FZ_VALUES_ANY, 1, 0)
                          ->t;
        if (want & 2)
          g.grad_u_low =
              &fz_tensor_2d(&pool, &f, "grad_u_low", FZ_INOUT, gdt, N, ll, FZ_VALUES_ANY)
                   ->t;
        if (want & 4)
          g.grad_s_low =
              &fz_tensor_1d(&pool, &f, "grad_s_low", FZ_INOUT, gdt, ll, FZ_VALUES_ANY)->t;
        if (want & 8)
          g.grad_v_low =
              &fz_tensor_2d(&pool, &f, "grad_v_low", FZ_INOUT, gdt, ll, K, FZ_VALUES_ANY)
                   ->t;
        if (want & 16)
          g.grad_bias = &fz_tensor_1d(&pool, &f, "grad_bias", FZ_INOUT,
                                      fz_bool(&f) ? FZ_F32 : adt, N, FZ_VALUES_ANY)
                             ->t;
        g.accumulate = (uint32_t)fz_range(&f, 0, 31);
        int mf = fz_any_faulty(&pool);
        void *gp = fz_struct(&f, &g, sizeof g, &mf);
        fz_snapshot(&factors);
        fz_snapshot(&pool);
        fz_before();
        st =
            osft_flinear_backward(layer, &x->t, &gy->t, (const osft_flinear_grads_t *)gp);
        free(gp);
        const int failed = fz_status(st, "osft_flinear_backward", mf);
        fz_check_tensors(&pool, failed, "osft_flinear_backward");
        fz_check_tensors(&factors, 0, "osft_flinear_backward");
        if (!failed) fz_check_padding(&pool, "osft_flinear_backward");
      } else if (op == 2) { /* merge */
        static const uint8_t wdt[][2] = {{kDLFloat, 32}, {kDLFloat, 64}, {kDLBfloat, 16}};
        const int c = (int)fz_range(&f, 0, 2);
        fz_tensor *w = fz_tensor_2d(&pool, &f, "weight", FZ_OUT,
                                    fz_dt(wdt[c][0], wdt[c][1]), N, K, FZ_VALUES_ANY);
        fz_snapshot(&factors);
        fz_snapshot(&pool);
        fz_before();
        st = osft_flinear_merge(layer, &w->t);
        const int failed = fz_status(st, "osft_flinear_merge", fz_any_faulty(&pool));
        fz_check_tensors(&pool, failed, "osft_flinear_merge");
        fz_check_tensors(&factors, 0, "osft_flinear_merge");
        if (!failed) fz_check_padding(&pool, "osft_flinear_merge");
      } else if (op == 3) { /* redecompose */
        fz_tensor *w = NULL;
        if (fz_bool(&f)) {
          static const uint8_t wdt[][2] = {
              {kDLFloat, 32}, {kDLFloat, 64}, {kDLBfloat, 16}};
          const int c = (int)fz_range(&f, 0, 2);
          w = fz_tensor_2d(&pool, &f, "weight", FZ_IN, fz_dt(wdt[c][0], wdt[c][1]), N, K,
                           FZ_VALUES_ANY);
        }
        factor_snap s;
        snap_factors(layer, &s);
        set_roles(&factors, FZ_INOUT);
        fz_snapshot(&factors);
        fz_snapshot(&pool);
        fz_before();
        st = osft_flinear_redecompose(layer, w ? &w->t : NULL);
        int factors_nonfinite = 0;
        for (const fz_tensor *t = factors.head; t; t = t->next)
          factors_nonfinite |= t->nonfinite;
        const int failed = fz_status(
            st, "osft_flinear_redecompose",
            fz_any_faulty(&pool) || (w && w->nonfinite) || (!w && factors_nonfinite));
        fz_check_tensors(&pool, failed, "osft_flinear_redecompose");
        fz_check_tensors(&factors, failed, "osft_flinear_redecompose");
        if (failed) check_factors(layer, &s, "osft_flinear_redecompose");
        if (!failed) /* the factors now hold a finite decomposition */
          for (fz_tensor *t = factors.head; t; t = t->next) t->nonfinite = 0;
        free_snap(&s);
      } else if (op == 4) {
        DLTensor v;
        const int which = fz_enum(&f, (int)fz_range(&f, 0, 5), 6);
        fz_before();
        st = osft_flinear_get_factor(layer, (osft_flinear_factor_t)which, &v);
        fz_status(st, "osft_flinear_get_factor", which < 0 || which > 5);
      } else if (op == 5) {
        osft_flinear_strategy_t chosen = (osft_flinear_strategy_t)77;
        const int64_t tokens = fz_i64(&f, S);
        const int pass = fz_enum(&f, (int)fz_range(&f, 0, 1), 2);
        fz_before();
        st = osft_flinear_choose_strategy(layer, tokens, (osft_flinear_pass_t)pass,
                                          &chosen);
        if (!fz_status(st, "osft_flinear_choose_strategy",
                       tokens < 0 || pass < 0 || pass > 1) &&
            chosen != OSFT_FLINEAR_FACTORIZED && chosen != OSFT_FLINEAR_DENSE &&
            chosen != OSFT_FLINEAR_HYBRID)
          fz_die("osft_flinear_choose_strategy chose %d", (int)chosen);
      } else {
        const int s2 = fz_enum(&f, (int)fz_range(&f, 0, 3), 4);
        fz_before();
        fz_status(osft_flinear_set_strategy(layer, (osft_flinear_strategy_t)s2),
                  "osft_flinear_set_strategy", s2 < 0 || s2 > 3);
        fz_before();
        fz_status(osft_flinear_refresh(layer), "osft_flinear_refresh", 0);
      }
      fz_pool_free(&pool);
    }
  }
  fz_before();
  if (fz_status(osft_flinear_destroy(layer), "osft_flinear_destroy", 0))
    fz_die("osft_flinear_destroy failed");
done:
  fz_pool_free(&pool);
  fz_pool_free(&factors);
  fz_context_destroy(ctx);
  return 0;
}
