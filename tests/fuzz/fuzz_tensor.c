/* libFuzzer harness: tensor and option validation.
 *
 *  - the validation layer every operation runs (osfti_check_tensor,
 *    osfti_check_no_overlap; src/core/tensor_check.h) on hostile DLTensors,
 *    including strides that reach beyond the address space: an accepted
 *    tensor must really have the accepted dtype, rank, trailing dims,
 *    device, alignment and layout (checked here independently);
 *  - every *_init function and every output struct with hostile
 *    struct_size (buffers of exactly that size: a write beyond it is an
 *    ASan report; on failure nothing is written);
 *  - osft_context_create with every option field hostile (nothing written
 *    to *ctx on failure), workspace reservation, memory statistics;
 *  - the one-rank communicator's all-reduce and all-gather on hostile
 *    tensors (outputs unchanged on failure). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/tensor_check.h"
#include "fuzz_common.h"

static size_t dl_elem(DLDataType d) {
  return ((size_t)d.bits * d.lanes + 7) / 8;
}

/* Independent reading of osftrt/tensor.h: does an accepted tensor obey the
 * spec? */
static void check_accepted(const DLTensor *t, const osfti_tensor_spec *s) {
  if (t == NULL) {
    if (!s->optional)
      fz_die("osfti_check_tensor accepted a NULL tensor for a required one");
    return;
  }
  if (t->ndim < s->min_rank || t->ndim > s->max_rank)
    fz_die("osfti_check_tensor accepted rank %d outside [%d, %d]", t->ndim, s->min_rank,
           s->max_rank);
  int64_t numel = 1;
  for (int i = 0; i < t->ndim; ++i) {
    if (t->shape[i] < 0) fz_die("osfti_check_tensor accepted a negative dim");
    numel *= t->shape[i];
  }
  for (int j = 0; j < s->n_dims; ++j) {
    const int axis = t->ndim - s->n_dims + j;
    if (axis < 0 || (s->dims[j] != OSFTI_ANY && t->shape[axis] != s->dims[j]))
      fz_die("osfti_check_tensor accepted a wrong trailing dim (axis %d)", axis);
  }
  const osfti_dtype_t dt = osfti_dtype_from_dl(t->dtype);
  if (t->dtype.lanes != 1 || dt == OSFTI_DTYPE_INVALID || (s->dtypes & (unsigned)dt) == 0)
    fz_die("osfti_check_tensor accepted dtype (%d, %d, %d)", t->dtype.code, t->dtype.bits,
           t->dtype.lanes);
  const int dev = (int)t->device.device_type;
  if (dev != kDLCPU && dev != kDLCUDAHost)
    fz_die("osfti_check_tensor accepted device type %d on a CPU context", dev);
  if (numel == 0) return;
  if (t->data == NULL)
    fz_die("osfti_check_tensor accepted NULL data for a non-empty tensor");
  const size_t es = dl_elem(t->dtype);
  if (((uintptr_t)t->data + t->byte_offset) % es != 0)
    fz_die("osfti_check_tensor accepted misaligned data");
  if (t->strides == NULL) return;
  const int n = t->ndim;
  if (s->layout == OSFTI_LAYOUT_CONTIGUOUS) {
    int64_t expected = 1;
    for (int i = n - 1; i >= 0; --i) {
      if (t->shape[i] != 1 && t->strides[i] != expected)
        fz_die("osfti_check_tensor accepted non-compact strides (dim %d)", i);
      expected *= t->shape[i];
    }
    return;
  }
  /* Rows: unit last stride; leading dims flatten into rows of one stride
   * that is >= the row length (so rows never overlap). */
  if (n >= 1 && t->shape[n - 1] != 1 && t->strides[n - 1] != 1)
    fz_die("osfti_check_tensor accepted a non-unit last stride");
  const int64_t cols = n >= 1 ? t->shape[n - 1] : 1;
  int64_t inner = -1, row_stride = -1;
  for (int i = n - 2; i >= 0; --i) {
    if (t->shape[i] == 1) continue;
    if (t->strides[i] <= 0)
      fz_die("osfti_check_tensor accepted a non-positive row stride");
    if (row_stride < 0) {
      row_stride = t->strides[i];
      if (row_stride < cols) fz_die("osfti_check_tensor accepted overlapping rows");
    } else if (t->strides[i] != inner) {
      fz_die("osfti_check_tensor accepted leading dims that do not flatten");
    }
    inner = t->strides[i] * t->shape[i];
  }
}

static void fuzz_check_tensor(fz *f, osft_context_t ctx, fz_pool *pool) {
  osfti_tensor_spec s;
  memset(&s, 0, sizeof s);
  s.name = "t";
  static const unsigned masks[] = {OSFTI_F32 | OSFTI_BF16, OSFTI_F32 | OSFTI_F64,
                                   OSFTI_INTS, OSFTI_FLOATS, OSFTI_F32};
  s.dtypes = masks[fz_range(f, 0, 4)];
  s.min_rank = (int)fz_range(f, 0, 3);
  s.max_rank = s.min_rank + (int)fz_range(f, 0, 5);
  s.n_dims = (int)fz_range(f, 0, s.min_rank);
  for (int j = 0; j < s.n_dims; ++j)
    s.dims[j] = fz_bool(f) ? OSFTI_ANY : fz_range(f, 0, 6);
  s.layout = fz_bool(f) ? OSFTI_LAYOUT_ROWS : OSFTI_LAYOUT_CONTIGUOUS;
  s.optional = fz_bool(f);
  int64_t dims[8];
  const int ndim = (int)fz_range(f, 0, 5);
  for (int i = 0; i < ndim; ++i) dims[i] = fz_range(f, 0, 6);
  static const uint8_t codes[][2] = {{kDLFloat, 32}, {kDLBfloat, 16}, {kDLFloat, 64},
                                     {kDLInt, 32},   {kDLInt, 64},    {kDLFloat, 16}};
  const int k = (int)fz_range(f, 0, 5);
  fz_tensor *t = fz_tensor_new(pool, f, "t", FZ_IN, fz_dt(codes[k][0], codes[k][1]), ndim,
                               dims, FZ_VALUES_ANY, 1.0, 8);
  /* Strides that reach beyond the address space (the check must not
   * overflow computing the extent); the data is then never touched. */
  const int wild = (int)fz_range(f, 0, 7);
  if (wild == 7 && ndim >= 1) {
    t->t.strides = t->strides;
    const int d = (int)fz_range(f, 0, ndim - 1);
    static const int64_t big[] = {INT64_MAX,           INT64_MIN,
                                  (int64_t)1 << 62,    (int64_t)1 << 61,
                                  -((int64_t)1 << 62), (int64_t)1 << 60};
    t->strides[d] = big[fz_range(f, 0, 5)];
  }
  const DLTensor *arg = fz_range(f, 0, 15) == 15 ? NULL : &t->t;
  /* Internal functions record a pending message, which the public entry
   * point turns into osft_last_error(): only the status is checked here. */
  const osft_status_t st = osfti_check_tensor(ctx, arg, &s);
  if (st < OSFT_STATUS_SUCCESS || st >= OSFT_STATUS_INTERNAL_ERROR)
    fz_die("osfti_check_tensor returned %d", (int)st);
  if (st == OSFT_STATUS_SUCCESS) check_accepted(arg, &s);

  /* Overlap of two tensors (never dereferenced). */
  if (arg != NULL && st == OSFT_STATUS_SUCCESS) {
    DLTensor b = t->t;
    int64_t bstrides[9];
    if (t->t.strides) {
      memcpy(bstrides, t->strides, sizeof bstrides);
      b.strides = bstrides;
    }
    const int64_t shift = fz_range(f, -64, 64);
    if (t->t.data != NULL)
      b.data = (uint8_t *)t->t.data + shift * (int64_t)dl_elem(b.dtype);
    const osft_status_t so = osfti_check_no_overlap("a", &t->t, "b", &b);
    if (so != OSFT_STATUS_SUCCESS && so != OSFT_STATUS_ALIASING)
      fz_die("osfti_check_no_overlap returned %d", (int)so);
    if (shift == 0 && t->numel > 0 && so == OSFT_STATUS_SUCCESS)
      fz_die("osfti_check_no_overlap: a tensor does not overlap itself");
  }
}

/* Every *_init with a hostile struct_size into a buffer of exactly that
 * many bytes. */
typedef osft_status_t (*init_fn)(void *, size_t);
static void fuzz_inits(fz *f) {
  static const struct {
    init_fn fn;
    size_t size;
  } inits[] = {
      {(init_fn)osft_allocator_init, sizeof(osft_allocator_t)},
      {(init_fn)osft_context_options_init, sizeof(osft_context_options_t)},
      {(init_fn)osft_comm_options_init, sizeof(osft_comm_options_t)},
      {(init_fn)osft_comm_callbacks_init, sizeof(osft_comm_callbacks_t)},
      {(init_fn)osft_flinear_options_init, sizeof(osft_flinear_options_t)},
      {(init_fn)osft_flinear_factors_init, sizeof(osft_flinear_factors_t)},
      {(init_fn)osft_flinear_grads_init, sizeof(osft_flinear_grads_t)},
      {(init_fn)osft_projector_options_init, sizeof(osft_projector_options_t)},
      {(init_fn)osft_projection_target_init, sizeof(osft_projection_target_t)},
      {(init_fn)osft_mlp_weights_init, sizeof(osft_mlp_weights_t)},
      {(init_fn)osft_mlp_options_init, sizeof(osft_mlp_options_t)},
      {(init_fn)osft_mlp_grads_init, sizeof(osft_mlp_grads_t)},
      {(init_fn)osft_flce_options_init, sizeof(osft_flce_options_t)},
      {(init_fn)osft_flce_inputs_init, sizeof(osft_flce_inputs_t)},
      {(init_fn)osft_flce_outputs_init, sizeof(osft_flce_outputs_t)},
      {(init_fn)osft_qr_options_init, sizeof(osft_qr_options_t)},
  };
  const int which = (int)fz_range(f, 0, (int64_t)(sizeof inits / sizeof inits[0]) - 1);
  const size_t claimed = fz_struct_size(f, inits[which].size);
  const size_t bytes = claimed ? claimed : 1;
  uint8_t *buf = (uint8_t *)malloc(bytes);
  uint8_t *snap = (uint8_t *)malloc(bytes);
  for (size_t i = 0; i < bytes; ++i) buf[i] = (uint8_t)fz_next(f);
  memcpy(snap, buf, bytes);
  const int null_ptr = fz_range(f, 0, 15) == 15;
  fz_before();
  const osft_status_t st = inits[which].fn(null_ptr ? NULL : buf, claimed);
  const int failed = fz_status(st, "osft_*_init", null_ptr || claimed <= sizeof(size_t));
  if (failed && memcmp(buf, snap, bytes) != 0)
    fz_die("init function %d failed but wrote its struct", which);
  if (!failed) {
    size_t got;
    memcpy(&got, buf, sizeof got);
    if (got != claimed)
      fz_die("init %d wrote struct_size %zu, not %zu", which, got, claimed);
    for (size_t i = inits[which].size; i < claimed; ++i)
      if (buf[i] != 0)
        fz_die("init %d left byte %zu beyond its struct non-zero", which, i);
  }
  free(buf);
  free(snap);
}

static void fuzz_context(fz *f) {
  osft_context_options_t o;
  OSFT_CONTEXT_OPTIONS_INIT(&o);
  int must_fail = 0;
  o.device_type = (osft_device_type_t)fz_enum(f, OSFT_DEVICE_CPU, 3);
  if (o.device_type != OSFT_DEVICE_CPU) must_fail = 1; /* unknown, or CUDA not built */
  o.device_id = (int)fz_i64(f, 0);
  if (o.device_id != 0) must_fail = 1;
  if (fz_range(f, 0, 7) == 7) {
    o.stream = (void *)&o;
    must_fail = 1;
  }
  static const size_t limits[] = {0, 1, 64, 4096, (size_t)-1};
  o.workspace_limit = limits[fz_range(f, 0, 4)];
  osft_allocator_t a;
  OSFT_ALLOCATOR_INIT(&a);
  const int alloc_mode = (int)fz_range(f, 0, 4);
  if (alloc_mode == 1) {
    a.host_alloc = (void *(*)(void *, size_t, size_t))(uintptr_t)1; /* never called */
    must_fail = 1;                                                  /* half a pair */
  } else if (alloc_mode == 2) {
    a.device_free = (void (*)(void *, void *, size_t, int, void *))(uintptr_t)1;
    must_fail = 1;
  }
  void *aptr = NULL;
  if (alloc_mode != 0) {
    aptr = fz_struct(f, &a, sizeof a, &must_fail);
    o.allocator = (const osft_allocator_t *)aptr;
  }
  void *optr = fz_struct(f, &o, sizeof o, &must_fail);
  osft_context_t ctx = (osft_context_t)(uintptr_t)0x5a5a;
  const int null_opts = fz_range(f, 0, 7) == 7;
  fz_before();
  const osft_status_t st =
      osft_context_create(&ctx, null_opts ? NULL : (const osft_context_options_t *)optr);
  const int failed = fz_status(st, "osft_context_create", null_opts ? 0 : must_fail);
  if (failed && ctx != (osft_context_t)(uintptr_t)0x5a5a)
    fz_die("osft_context_create failed but wrote *ctx");
  if (!failed) {
    const size_t reserve = (size_t)fz_i64(f, 1024);
    fz_before();
    fz_status(osft_context_reserve_workspace(ctx, reserve),
              "osft_context_reserve_workspace", 0);
    /* Output struct with a hostile struct_size: writes at most that many
     * bytes into a buffer of exactly that size. */
    const size_t claimed = fz_struct_size(f, sizeof(osft_memory_stats_t));
    uint8_t *buf =
        (uint8_t *)calloc(1, claimed > sizeof(size_t) ? claimed : sizeof(size_t));
    memcpy(buf, &claimed, sizeof claimed);
    fz_before();
    fz_status(osft_context_get_memory_stats(ctx, (osft_memory_stats_t *)buf),
              "osft_context_get_memory_stats", claimed <= sizeof(size_t));
    free(buf);
    fz_before();
    fz_status(osft_context_release_workspace(ctx), "osft_context_release_workspace", 0);
    if (osft_context_destroy(ctx) != OSFT_STATUS_SUCCESS)
      fz_die("osft_context_destroy: %s", osft_last_error());
  }
  free(optr);
  free(aptr);
}

static void fuzz_comm(fz *f, osft_context_t ctx, fz_pool *pool) {
  osft_comm_options_t co;
  OSFT_COMM_OPTIONS_INIT(&co);
  int must_fail = 0;
  co.timeout_seconds = fz_double(f, 300.0);
  if (!(co.timeout_seconds > 0)) must_fail = 1;
  void *cptr = fz_struct(f, &co, sizeof co, &must_fail);
  osft_comm_t comm = NULL;
  fz_before();
  if (fz_status(osft_comm_create_self(ctx, (const osft_comm_options_t *)cptr, &comm),
                "osft_comm_create_self", must_fail)) {
    free(cptr);
    return;
  }
  free(cptr);
  static const uint8_t codes[][2] = {{kDLFloat, 32}, {kDLBfloat, 16}};
  const DLDataType dt = fz_dt(codes[fz_range(f, 0, 1)][0], codes[fz_range(f, 0, 1)][1]);
  const int64_t n = fz_range(f, 0, 9);
  if (fz_bool(f)) {
    fz_tensor *buf = fz_tensor_1d(pool, f, "buf", FZ_INOUT, dt, n, FZ_VALUES_ANY);
    fz_snapshot(pool);
    fz_before();
    const int failed = fz_status(osft_comm_allreduce_sum(comm, &buf->t),
                                 "osft_comm_allreduce_sum", buf->faulty);
    fz_check_tensors(pool, failed, "osft_comm_allreduce_sum");
    /* one rank: the sum is the value itself */
    if (!failed && buf->bytes && memcmp(buf->buf, buf->snap, buf->bytes) != 0)
      fz_die("a one-rank all-reduce changed its buffer");
  } else {
    fz_tensor *send = fz_tensor_1d(pool, f, "send", FZ_IN, dt, n, FZ_VALUES_ANY);
    fz_tensor *recv = fz_tensor_1d(pool, f, "recv", FZ_OUT, dt, n, FZ_VALUES_ANY);
    int64_t counts[2] = {fz_i64(f, n), 0};
    const int64_t n_counts = fz_bool(f) ? 1 : fz_range(f, 0, 2);
    fz_snapshot(pool);
    fz_before();
    const int failed =
        fz_status(osft_comm_allgather(comm, &send->t, &recv->t, counts, n_counts),
                  "osft_comm_allgather",
                  send->faulty || recv->faulty || n_counts != 1 || counts[0] < 0);
    fz_check_tensors(pool, failed, "osft_comm_allgather");
  }
  osft_comm_stats_t stats;
  stats.struct_size = sizeof stats;
  if (osft_comm_get_stats(comm, &stats) != OSFT_STATUS_SUCCESS)
    fz_die("osft_comm_get_stats: %s", osft_last_error());
  if (osft_comm_destroy(comm) != OSFT_STATUS_SUCCESS)
    fz_die("osft_comm_destroy: %s", osft_last_error());
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fz f;
  fz_init(&f, data, size);
  fz_pool pool = {0};
  const int what = (int)fz_range(&f, 0, 4);
  if (what == 1) {
    fuzz_inits(&f);
  } else if (what == 2) {
    fuzz_context(&f);
  } else {
    osft_context_t ctx = fz_context(&f);
    if (what == 3)
      fuzz_comm(&f, ctx, &pool);
    else
      fuzz_check_tensor(&f, ctx, &pool);
    fz_pool_free(&pool);
    fz_context_destroy(ctx);
  }
  /* Any status code has a name. */
  if (osft_status_string((osft_status_t)fz_enum(&f, 0, 18)) == NULL)
    fz_die("osft_status_string returned NULL");
  return 0;
}
