/* libFuzzer harness: batched QR and power iteration (osftrt/qr.h).
 *
 * Lists of mixed shapes and dtypes, in place or not, R wanted or not,
 * hostile options and values. Beyond the common promises (status, message,
 * inputs never modified, outputs unchanged on failure), a per-matrix
 * failure must leave that matrix's outputs exactly as they were, a matrix
 * with NaN/Inf must fail, and a successful call must report SUCCESS for
 * every matrix and keep row padding untouched. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"

#define MAXN 6

typedef struct {
  fz_tensor *a, *q, *r; /* q == a when in place */
  int nonfinite;        /* the input (A, or for power iteration A or Q) */
} entry;

static int tensor_same(const fz_tensor *t) {
  return t->bytes == 0 || memcmp(t->buf, t->snap, t->bytes) == 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fz f;
  fz_init(&f, data, size);
  osft_context_t ctx = fz_context(&f);
  fz_pool pool = {0};
  int must_fail = 0;

  const int power = fz_range(&f, 0, 3) == 3;
  const size_t count = (size_t)fz_range(&f, 0, MAXN);

  /* Options. */
  osft_qr_options_t o;
  OSFT_QR_OPTIONS_INIT(&o);
  void *opts = NULL;
  if (fz_range(&f, 0, 3) != 0) {
    o.method = (osft_qr_method_t)fz_enum(&f, (int)fz_range(&f, 0, 2), 3);
    if ((int)o.method < 0 || (int)o.method > 2) must_fail = 1;
    o.orthogonality_threshold = fz_double(&f, 0.0);
    if (!(o.orthogonality_threshold >= 0)) must_fail = 1;
    o.rank_tolerance = fz_double(&f, 0.0);
    if (o.rank_tolerance != o.rank_tolerance) must_fail = 1;
    static const int conc[] = {0, 1, 2, 3, 8, -1, 1000};
    o.max_concurrency = conc[fz_range(&f, 0, 6)];
    if (o.max_concurrency < 0) must_fail = 1;
    opts = fz_struct(&f, &o, sizeof o, &must_fail);
  }

  /* The list. */
  entry e[MAXN];
  const DLTensor *a_ptr[MAXN];
  DLTensor *q_ptr[MAXN], *r_ptr[MAXN];
  DLTensor q_alias[MAXN];
  const int q_mode =
      (int)fz_range(&f, 0, 4); /* 0,1 separate; 2 NULL array; 3 per entry */
  const int r_mode = (int)fz_range(&f, 0, 2); /* 0 per entry; 1 NULL array; 2 all */
  const int pm_mode = (int)fz_range(&f, 0, 1);
  for (size_t i = 0; i < count; ++i) {
    const DLDataType dt = fz_bool(&f) ? FZ_F64 : FZ_F32;
    const int64_t m = fz_range(&f, 0, 9);
    int64_t n = fz_range(&f, 0, m);
    if (fz_range(&f, 0, 15) == 15) n = m + 1; /* m < n: refused */
    const int in_place = !power && (q_mode == 2 || (q_mode == 3 && fz_bool(&f)));
    if (power) {
      e[i].a = fz_tensor_2d(&pool, &f, "a", FZ_IN, dt, m, m, FZ_VALUES_ANY);
      e[i].q = fz_tensor_2d(&pool, &f, "q", FZ_INOUT, dt, m, n, FZ_VALUES_ANY);
      e[i].r = NULL;
      /* A pair with n = 0 needs nothing: its A is not examined. */
      e[i].nonfinite = e[i].q->numel > 0 && (e[i].a->nonfinite || e[i].q->nonfinite);
    } else {
      e[i].a = fz_tensor_2d(&pool, &f, "a", in_place ? FZ_INOUT : FZ_IN, dt, m, n,
                            FZ_VALUES_ANY);
      e[i].q = in_place ? e[i].a
                        : fz_tensor_2d(&pool, &f, "q", FZ_OUT, dt, m, n, FZ_VALUES_ANY);
      e[i].r = NULL;
      if (r_mode == 2 || (r_mode == 0 && fz_bool(&f)))
        e[i].r = fz_tensor_2d(&pool, &f, "r", FZ_OUT, dt, n, n, FZ_VALUES_ANY);
      e[i].nonfinite = e[i].a->nonfinite;
    }
    a_ptr[i] = &e[i].a->t;
    q_alias[i] = e[i].q->t;
    q_ptr[i] = &q_alias[i];
    r_ptr[i] = e[i].r ? &e[i].r->t : NULL;
  }
  /* List faults. */
  const int list_fault = count > 0 ? (int)fz_range(&f, 0, 7) : 0;
  size_t fi = count > 0 ? (size_t)fz_range(&f, 0, (int64_t)count - 1) : 0;
  if (list_fault == 5) {
    a_ptr[fi] = NULL;
    must_fail = 1;
  } else if (list_fault == 6 && !(!power && q_mode == 2)) {
    q_ptr[fi] = NULL;
    must_fail = 1;
  } else if (list_fault == 7 && count >= 2 && !(!power && q_mode == 2)) {
    /* two entries writing the same memory */
    const size_t fj = (fi + 1) % count;
    q_ptr[fj] = q_ptr[fi];
    e[fj].q->faulty = 0; /* no longer passed */
    e[fj].q = e[fi].q;   /* what entry fj now writes */
    if (power)
      e[fj].nonfinite = e[fj].q->numel > 0 && (e[fj].a->nonfinite || e[fj].q->nonfinite);
    if (e[fi].q->numel > 0) must_fail = 1;
  }
  osft_status_t *pm = NULL;
  if (pm_mode == 0 && count > 0) {
    pm = (osft_status_t *)malloc(count * sizeof *pm);
    memset(pm, 0x5a, count * sizeof *pm);
  }
  osft_status_t *pm_snap = NULL;
  if (pm) {
    pm_snap = (osft_status_t *)malloc(count * sizeof *pm);
    memcpy(pm_snap, pm, count * sizeof *pm);
  }
  const int iterations = power ? (int)fz_i64(&f, fz_range(&f, 1, 3)) : 1;
  if (power && iterations < 1) must_fail = 1;
  for (fz_tensor *t = pool.head; t; t = t->next)
    if (t->faulty) must_fail = 1;

  const int q_null = !power && q_mode == 2;
  fz_snapshot(&pool);
  fz_before();
  osft_status_t st;
  const char *call;
  if (power) {
    call = "osft_qr_power_iteration";
    st = osft_qr_power_iteration(ctx, (const osft_qr_options_t *)opts, count,
                                 count ? a_ptr : NULL, count ? q_ptr : NULL, iterations,
                                 pm);
  } else {
    call = "osft_qr_batch";
    st = osft_qr_batch(ctx, (const osft_qr_options_t *)opts, count, count ? a_ptr : NULL,
                       q_null || count == 0 ? NULL : q_ptr,
                       r_mode == 1 || count == 0 ? NULL : r_ptr, pm);
  }
  const int failed = fz_status(st, call, must_fail);

  if (st == OSFT_STATUS_NUMERICAL_ERROR && pm != NULL &&
      memcmp(pm, pm_snap, count * sizeof *pm) != 0) {
    /* Per-matrix failures: the list was valid and the factorizations ran. */
    fz_check_tensors(&pool, 0, call);
    int n_failed = 0;
    for (size_t i = 0; i < count; ++i) {
      if (pm[i] == OSFT_STATUS_SUCCESS) {
        if (e[i].nonfinite) fz_die("%s: matrix %zu has NaN/Inf but succeeded", call, i);
        continue;
      }
      if (pm[i] != OSFT_STATUS_NUMERICAL_ERROR)
        fz_die("%s: per_matrix_status[%zu] = %d", call, i, (int)pm[i]);
      ++n_failed;
      if (!tensor_same(e[i].q) || (e[i].r && !tensor_same(e[i].r)))
        fz_die("%s: matrix %zu failed (%s) but its outputs changed", call, i,
               osft_last_error());
    }
    if (n_failed == 0) fz_die("%s returned NUMERICAL_ERROR with no failed matrix", call);
  } else if (st == OSFT_STATUS_NUMERICAL_ERROR && pm == NULL) {
    /* Cannot tell which failed: every failed matrix is unchanged, every
     * input unchanged; the matrices with NaN/Inf are among the failed. */
    fz_check_tensors(&pool, 0, call);
    for (size_t i = 0; i < count; ++i)
      if (e[i].nonfinite && (!tensor_same(e[i].q) || (e[i].r && !tensor_same(e[i].r))))
        fz_die("%s: matrix %zu has NaN/Inf but its outputs changed", call, i);
  } else {
    fz_check_tensors(&pool, failed, call);
    if (failed && pm && memcmp(pm, pm_snap, count * sizeof *pm) != 0)
      fz_die("%s failed before running (%s) but wrote per_matrix_status", call,
             osft_last_error());
    if (!failed) {
      for (size_t i = 0; i < count; ++i) {
        if (e[i].nonfinite) {
          for (int which = 0; which < 2; ++which) {
            const fz_tensor *t = which ? e[i].q : e[i].a;
            fprintf(stderr, "%s[%zu] (before the call):", which ? "q" : "a", i);
            for (size_t b = 0; b + 4 <= t->bytes && t->t.dtype.bits == 32; b += 4) {
              float v;
              memcpy(&v, t->snap + b, 4);
              fprintf(stderr, " %g", v);
            }
            fprintf(stderr, "\n");
          }
          fz_die("%s succeeded on matrix %zu with NaN/Inf", call, i);
        }
        if (pm && pm[i] != OSFT_STATUS_SUCCESS)
          fz_die("%s succeeded but per_matrix_status[%zu] = %d", call, i, (int)pm[i]);
      }
      fz_check_padding(&pool, call);
    }
  }

  free(pm);
  free(pm_snap);
  free(opts);
  fz_pool_free(&pool);
  fz_context_destroy(ctx);
  return 0;
}
