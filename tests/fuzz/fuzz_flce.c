/* libFuzzer harness: fused linear cross-entropy (osftrt/flce.h).
 *
 * Every option field hostile (NaN/Inf/negative smoothing, z-loss, softcap,
 * unknown enums, budgets, chunk sizes, vocab-parallel fields with and
 * without a one-rank communicator), every input and output tensor hostile
 * or absent, targets out of range, accumulate bits; osft_flce_compute and
 * osft_flce_get_plan. Beyond the common promises: a target outside [0, V)
 * that is not ignore_index must make compute fail, and a successful call
 * keeps row padding of its outputs untouched. */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fz f;
  fz_init(&f, data, size);
  osft_context_t ctx = fz_context(&f);
  fz_pool pool = {0};

  /* Options. */
  osft_flce_options_t o;
  OSFT_FLCE_OPTIONS_INIT(&o);
  int must_fail = 0;
  o.ignore_index = fz_i64(&f, -100);
  o.label_smoothing = fz_double(&f, fz_bool(&f) ? 0.1 : 0.0);
  if (!(o.label_smoothing >= 0 && o.label_smoothing <= 1)) must_fail = 1;
  o.z_loss_scale = fz_double(&f, fz_bool(&f) ? 1e-4 : 0.0);
  if (!(o.z_loss_scale >= 0 && isfinite(o.z_loss_scale))) must_fail = 1;
  o.softcap = fz_double(&f, fz_bool(&f) ? 30.0 : 0.0);
  if (!(o.softcap >= 0 && isfinite(o.softcap))) must_fail = 1;
  o.reduction = (osft_flce_reduction_t)fz_enum(&f, (int)fz_range(&f, 0, 2), 3);
  if ((int)o.reduction < 0 || (int)o.reduction > 2) must_fail = 1;
  o.accumulator = (osft_flce_accumulator_t)fz_enum(&f, (int)fz_range(&f, 0, 1), 2);
  if ((int)o.accumulator < 0 || (int)o.accumulator > 1) must_fail = 1;
  static const size_t budgets[] = {0, 0, 0, 1, 64, 600, 4096, 1 << 20};
  o.memory_budget = budgets[fz_range(&f, 0, 7)];
  o.chunk_rows = fz_i64(&f, fz_range(&f, 0, 3));
  if (o.chunk_rows < 0) must_fail = 1;
  o.chunking = (osft_flce_chunking_t)fz_enum(&f, (int)fz_range(&f, 0, 2), 3);
  const int chunking_fail = (int)o.chunking < 0 || (int)o.chunking > 2;
  o.slice_cols = fz_i64(&f, fz_range(&f, 0, 3));
  const int slice_fail = o.slice_cols < 0;
  osft_comm_t comm = NULL;
  const int comm_mode = (int)fz_range(&f, 0, 3);
  if (comm_mode == 1) {
    fz_before();
    if (fz_status(osft_comm_create_self(ctx, NULL, &comm), "osft_comm_create_self", 0)) {
      comm = NULL; /* the caller's allocator refused */
      goto done;
    }
    o.comm = comm;
  }
  int vocab_fail = 0; /* faults of the fields appended after 1.0 */
  if (comm_mode >= 1) {
    o.vocab_offset = fz_range(&f, 0, 3) == 3 ? fz_i64(&f, 0) : 0;
    o.vocab_size_global = fz_range(&f, 0, 3) == 3 ? fz_i64(&f, 0) : 0;
    if (o.vocab_offset != 0) vocab_fail = 1;
    if (comm == NULL && o.vocab_size_global != 0) vocab_fail = 1;
    if (comm != NULL && o.vocab_size_global < 0) vocab_fail = 1;
  }
  void *opts = fz_struct(&f, &o, sizeof o, &must_fail);
  /* An older caller's struct_size: the library does not see the fields it
   * does not cover. */
#define SEES(field) \
  (fz_struct_claimed() >= offsetof(osft_flce_options_t, field) + sizeof o.field)
  const int sees_vocab = SEES(vocab_size_global);
  if (sees_vocab) must_fail |= vocab_fail;
  if (SEES(chunking)) must_fail |= chunking_fail;
  if (SEES(slice_cols)) must_fail |= slice_fail;
#undef SEES
  if (getenv("FZ_DEBUG"))
    fprintf(stderr,
            "flce options: struct_size %zu ignore %lld smoothing %g z %g softcap %g red "
            "%d acc %d "
            "budget %zu chunk %lld comm %p offset %lld global %lld must_fail %d\n",
            *(size_t *)opts, (long long)o.ignore_index, o.label_smoothing, o.z_loss_scale,
            o.softcap, (int)o.reduction, (int)o.accumulator, o.memory_budget,
            (long long)o.chunk_rows, (void *)o.comm, (long long)o.vocab_offset,
            (long long)o.vocab_size_global, must_fail);
  osft_flce_t flce = (osft_flce_t)(uintptr_t)0x5a5a;
  fz_before();
  const osft_status_t cst =
      osft_flce_create(ctx, (const osft_flce_options_t *)opts, &flce);
  free(opts);
  if (fz_status(cst, "osft_flce_create", must_fail)) {
    if (flce != (osft_flce_t)(uintptr_t)0x5a5a)
      fz_die("osft_flce_create failed but wrote *flce");
    goto done;
  }

  {
    /* Shapes: x (M, H) or (B, S, H); weight (V, H). */
    const int three_d = fz_range(&f, 0, 3) == 3;
    const int64_t B = three_d ? fz_range(&f, 0, 3) : 1;
    const int64_t S = fz_range(&f, 0, 6);
    const int64_t M = B * S;
    const int64_t H = fz_range(&f, 1, 8);
    const int64_t V = fz_range(&f, 1, 12);
    const DLDataType dt = fz_bool(&f) ? FZ_BF16 : FZ_F32;
    const DLDataType it = fz_bool(&f) ? FZ_I32 : FZ_I64;
    int64_t xd[3], td[2];
    int lead = 0;
    if (three_d) td[lead++] = B;
    td[lead++] = S;
    memcpy(xd, td, sizeof(int64_t) * (size_t)lead);
    xd[lead] = H;
    const int reduce = o.reduction != OSFT_FLCE_NONE;

    fz_tensor *x =
        fz_tensor_new(&pool, &f, "x", FZ_IN, dt, lead + 1, xd, FZ_VALUES_ANY, 1.0, 0);
    fz_tensor *w = fz_tensor_2d(&pool, &f, "weight", FZ_IN, dt, V, H, FZ_VALUES_ANY);
    fz_tensor *tg =
        fz_tensor_new(&pool, &f, "targets", FZ_IN, it, lead, td, FZ_VALUES_ANY, 1.0, V);
    fz_tensor *bias = fz_present(&f) && fz_bool(&f)
                          ? fz_tensor_1d(&pool, &f, "bias", FZ_IN,
                                         fz_bool(&f) ? FZ_F32 : dt, V, FZ_VALUES_ANY)
                          : NULL;
    fz_tensor *cw =
        fz_range(&f, 0, 3) == 3
            ? fz_tensor_1d(&pool, &f, "class_weight", FZ_IN, FZ_F32, V, FZ_VALUES_FINITE)
            : NULL;
    fz_tensor *gl = NULL;
    if (fz_range(&f, 0, 3) == 3) {
      const int64_t one = 1;
      gl = reduce ? fz_tensor_new(&pool, &f, "grad_loss", FZ_IN, FZ_F32,
                                  (int)fz_range(&f, 0, 1), &one, FZ_VALUES_ANY, 1.0, 0)
                  : fz_tensor_new(&pool, &f, "grad_loss", FZ_IN, FZ_F32, lead, td,
                                  FZ_VALUES_ANY, 1.0, 0);
    }

    /* Outputs. */
    const int64_t one = 1;
    fz_tensor *loss = NULL, *gx = NULL, *gw = NULL, *gb = NULL, *zl = NULL, *acc = NULL,
              *am = NULL, *tl = NULL;
    const unsigned want =
        (unsigned)fz_range(&f, 0, 255) ^ 0x0f; /* default: loss + grads */
    if (want & 1)
      loss = reduce ? fz_tensor_new(&pool, &f, "loss", FZ_OUT, FZ_F32,
                                    (int)fz_range(&f, 0, 1), &one, FZ_VALUES_ANY, 1.0, 0)
                    : fz_tensor_new(&pool, &f, "loss", FZ_OUT, FZ_F32, lead, td,
                                    FZ_VALUES_ANY, 1.0, 0);
    if (want & 2)
      gx = fz_tensor_new(&pool, &f, "grad_x", FZ_INOUT, dt, lead + 1, xd, FZ_VALUES_ANY,
                         1.0, 0);
    if (want & 4)
      gw = fz_tensor_2d(&pool, &f, "grad_weight", FZ_INOUT, fz_bool(&f) ? FZ_F32 : dt, V,
                        H, FZ_VALUES_ANY);
    if (want & 8)
      gb = fz_tensor_1d(&pool, &f, "grad_bias", FZ_INOUT, fz_bool(&f) ? FZ_F32 : dt, V,
                        FZ_VALUES_ANY);
    if (want & 16)
      zl = reduce ? fz_tensor_new(&pool, &f, "z_loss", FZ_OUT, FZ_F32,
                                  (int)fz_range(&f, 0, 1), &one, FZ_VALUES_ANY, 1.0, 0)
                  : fz_tensor_new(&pool, &f, "z_loss", FZ_OUT, FZ_F32, lead, td,
                                  FZ_VALUES_ANY, 1.0, 0);
    if (want & 32)
      acc = fz_tensor_new(&pool, &f, "accuracy", FZ_OUT, FZ_F32, (int)fz_range(&f, 0, 1),
                          &one, FZ_VALUES_ANY, 1.0, 0);
    if (want & 64)
      am = fz_tensor_new(&pool, &f, "argmax", FZ_OUT, fz_bool(&f) ? FZ_I32 : FZ_I64, lead,
                         td, FZ_VALUES_ANY, 1.0, V);
    if (want & 128)
      tl = fz_tensor_new(&pool, &f, "token_loss", FZ_OUT, FZ_F32, lead, td, FZ_VALUES_ANY,
                         1.0, 0);
    const int any_out = loss || gx || gw || gb || zl || acc || am || tl;
    /* grad_loss is not read without gradient outputs: its faults may pass. */
    if (gl && !(gx || gw || gb)) gl->faulty = 0;

    osft_flce_inputs_t in;
    OSFT_FLCE_INPUTS_INIT(&in);
    in.x = &x->t;
    in.weight = &w->t;
    in.targets = &tg->t;
    in.bias = bias ? &bias->t : NULL;
    in.class_weight = cw ? &cw->t : NULL;
    in.grad_loss = gl ? &gl->t : NULL;
    osft_flce_outputs_t out;
    OSFT_FLCE_OUTPUTS_INIT(&out);
    out.loss = loss ? &loss->t : NULL;
    out.grad_x = gx ? &gx->t : NULL;
    out.grad_weight = gw ? &gw->t : NULL;
    out.grad_bias = gb ? &gb->t : NULL;
    out.z_loss = zl ? &zl->t : NULL;
    out.accuracy = acc ? &acc->t : NULL;
    out.argmax = am ? &am->t : NULL;
    out.token_loss = tl ? &tl->t : NULL;
    out.accumulate = (uint32_t)fz_range(&f, 0, 7);
    int call_must_fail = fz_any_faulty(&pool) || !any_out;
    if (fz_range(&f, 0, 15) == 15) {
      out.accumulate = 8u << fz_range(&f, 0, 3);
      call_must_fail = 1;
    }
    /* Aliasing: an output over an input, or two outputs over one buffer. */
    const int alias = (int)fz_range(&f, 0, 15);
    if (alias == 15 && gx && fz_has_values(gx) && fz_has_values(x) && !gx->faulty &&
        !x->faulty) {
      out.grad_x = (DLTensor *)&x->t;
      call_must_fail = 1;
    } else if (alias == 14 && loss && tl && fz_has_values(tl) && !reduce) {
      out.loss = out.token_loss;
      call_must_fail = 1;
    }
    void *inp = fz_struct(&f, &in, sizeof in, &call_must_fail);
    void *outp = fz_struct(&f, &out, sizeof out, &call_must_fail);

    /* Targets out of range (only compute checks the values). */
    int bad_target = 0;
    if (fz_has_values(tg) && !tg->faulty && (it.bits == tg->t.dtype.bits) &&
        tg->t.dtype.code == kDLInt) {
      /* V as the call sees it: weight's rows (a fault may change them) */
      const int64_t Vw = w->t.ndim == 2 ? w->shape[0] : V;
      const int64_t Vg =
          o.vocab_size_global > 0 && comm && sees_vocab ? o.vocab_size_global : Vw;
      for (int64_t i = 0; i < tg->numel; ++i) {
        const int64_t v = fz_get_int(tg, i);
        if (v != o.ignore_index && (v < 0 || v >= Vg)) bad_target = 1;
      }
    }

    if (fz_range(&f, 0, 7) == 7) {
      osft_flce_plan_t plan;
      memset(&plan, 0x5a, sizeof plan);
      plan.struct_size = sizeof plan;
      fz_snapshot(&pool);
      fz_before();
      const osft_status_t st =
          osft_flce_get_plan(flce, (const osft_flce_inputs_t *)inp,
                             (const osft_flce_outputs_t *)outp, &plan);
      fz_status(st, "osft_flce_get_plan", call_must_fail);
      fz_check_tensors(&pool, 1, "osft_flce_get_plan"); /* writes no tensor */
      /* (a fault may change x's rows consistently: M is the plan's own) */
      if (st == OSFT_STATUS_SUCCESS &&
          (plan.tokens < 0 || plan.chunks < 0 ||
           (plan.tokens > 0 &&
            (plan.chunk_rows < 1 || plan.chunks * plan.chunk_rows < plan.tokens))))
        fz_die("osft_flce_get_plan: tokens %lld chunks %lld chunk_rows %lld",
               (long long)plan.tokens, (long long)plan.chunks,
               (long long)plan.chunk_rows);
      (void)M;
    } else {
      fz_snapshot(&pool);
      fz_before();
      const osft_status_t st = osft_flce_compute(flce, (const osft_flce_inputs_t *)inp,
                                                 (const osft_flce_outputs_t *)outp);
      if (getenv("FZ_DEBUG"))
        fprintf(stderr,
                "compute: must_fail %d bad_target %d accumulate %u any_out %d V %lld\n",
                call_must_fail, bad_target, out.accumulate, any_out, (long long)V);
      const int failed = fz_status(st, "osft_flce_compute", call_must_fail || bad_target);
      fz_check_tensors(&pool, failed, "osft_flce_compute");
      if (!failed) fz_check_padding(&pool, "osft_flce_compute");
    }
    free(inp);
    free(outp);
  }
  fz_before();
  if (fz_status(osft_flce_destroy(flce), "osft_flce_destroy", 0))
    fz_die("osft_flce_destroy failed");
done:
  if (comm && osft_comm_destroy(comm) != OSFT_STATUS_SUCCESS)
    fz_die("osft_comm_destroy: %s", osft_last_error());
  fz_pool_free(&pool);
  fz_context_destroy(ctx);
  return 0;
}
