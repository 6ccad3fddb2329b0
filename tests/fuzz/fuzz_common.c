/* Shared pieces of the libFuzzer harnesses: see fuzz_common.h. */
#include "fuzz_common.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ decoding */

void fz_init(fz *f, const uint8_t *data, size_t size) {
  f->p = data;
  f->n = size;
  /* FNV-1a over the whole input: the values change with every byte. */
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < size; ++i) h = (h ^ data[i]) * 1099511628211ull;
  f->rng = h | 1;
}

static uint8_t fz_byte(fz *f) {
  if (f->n == 0) return 0;
  --f->n;
  return *f->p++;
}

uint32_t fz_u32(fz *f) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v = (v << 8) | fz_byte(f);
  return v;
}

int64_t fz_range(fz *f, int64_t lo, int64_t hi) {
  if (hi <= lo) return lo;
  const uint64_t span = (uint64_t)(hi - lo) + 1;
  uint64_t v = fz_byte(f);
  if (span > 256) v = (v << 8) | fz_byte(f);
  if (span > 65536) v = (v << 16) | ((uint64_t)fz_byte(f) << 8) | fz_byte(f);
  return lo + (int64_t)(v % span);
}

int fz_bool(fz *f) {
  return fz_byte(f) & 1;
}

uint64_t fz_next(fz *f) {
  uint64_t x = f->rng;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  f->rng = x;
  return x;
}

double fz_uniform(fz *f, double lo, double hi) {
  return lo + (hi - lo) * ((double)(fz_next(f) >> 11) / 9007199254740992.0);
}

double fz_double(fz *f, double normal) {
  switch (fz_range(f, 0, 15)) {
    case 1: return NAN;
    case 2: return INFINITY;
    case 3: return -INFINITY;
    case 4: return 1e300;
    case 5: return -1.0;
    case 6: return 0.0;
    case 7: return 1e-310;
    case 8: return 1.0;
    case 9: return -0.0;
    case 10: return normal * 2.0;
    case 11: return 0.5;
    case 12: return 1e-3;
    default: return normal;
  }
}

int64_t fz_i64(fz *f, int64_t normal) {
  switch (fz_range(f, 0, 15)) {
    case 1: return 0;
    case 2: return -1;
    case 3: return INT64_MAX;
    case 4: return INT64_MIN;
    case 5: return normal + 1;
    case 6: return normal - 1;
    case 7: return fz_range(f, 1, 9);
    case 8: return (int64_t)1 << 40;
    default: return normal;
  }
}

size_t fz_struct_size(fz *f, size_t size) {
  switch (fz_range(f, 0, 15)) {
    case 1: return 0;
    case 2: return size - 1;
    case 3: return sizeof(size_t);
    case 4: return size + 8;
    case 5: return size + 64;
    default: return size;
  }
}

static size_t g_claimed;

size_t fz_struct_claimed(void) {
  return g_claimed;
}

void *fz_struct(fz *f, const void *init, size_t size, int *must_fail) {
  const size_t claimed = fz_struct_size(f, size);
  g_claimed = claimed;
  const size_t bytes = claimed > size ? claimed : size;
  uint8_t *p = (uint8_t *)calloc(1, bytes);
  if (p == NULL) abort();
  memcpy(p, init, size);
  memcpy(p, &claimed, sizeof claimed);
  if (claimed <= sizeof(size_t)) *must_fail = 1;
  if (claimed > size && fz_bool(f)) {
    p[size + (size_t)fz_range(f, 0, (int64_t)(claimed - size - 1))] = 1;
    *must_fail = 1;
  }
  return p;
}

int fz_enum(fz *f, int normal, int n_values) {
  switch (fz_range(f, 0, 15)) {
    case 1: return (int)fz_range(f, 0, n_values - 1);
    case 2: return n_values;
    case 3: return -1;
    case 4: return 0x7fffffff;
    case 5: return (int)fz_range(f, 0, n_values - 1);
    default: return normal;
  }
}

/* ------------------------------------------------------------- reports */

/* The pool of the call in progress (set by fz_snapshot), for the report. */
static fz_pool *g_pool;

static void dump_pool(void) {
  if (g_pool == NULL) return;
  for (const fz_tensor *t = g_pool->head; t; t = t->next) {
    fprintf(stderr,
            "  %-8s role %d faulty %d nonfinite %d dtype (%d,%d,%d) dev (%d,%d) ndim %d "
            "shape [",
            t->name, t->role, t->faulty, t->nonfinite, t->t.dtype.code, t->t.dtype.bits,
            t->t.dtype.lanes, (int)t->t.device.device_type, t->t.device.device_id,
            t->t.ndim);
    for (int i = 0; i < t->t.ndim && i < 9; ++i)
      fprintf(stderr, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    fprintf(stderr, "] strides ");
    if (t->t.strides) {
      fprintf(stderr, "[");
      for (int i = 0; i < t->t.ndim && i < 9; ++i)
        fprintf(stderr, "%s%lld", i ? ", " : "", (long long)t->strides[i]);
      fprintf(stderr, "]");
    } else {
      fprintf(stderr, "NULL");
    }
    fprintf(stderr, " byte_offset %llu data %s bytes %zu\n",
            (unsigned long long)t->t.byte_offset, t->t.data ? "set" : "NULL", t->bytes);
  }
}

void fz_die(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "\nFUZZ FINDING: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  fprintf(stderr, "last error: %s\ntensors of the call:\n", osft_last_error());
  dump_pool();
  abort();
}

void fz_before(void) {
  osft_clear_last_error();
}

int fz_status(osft_status_t st, const char *call, int must_fail) {
  if (st == OSFT_STATUS_SUCCESS) {
    if (must_fail)
      fz_die("%s succeeded, but an argument carried a fault the ABI says is refused",
             call);
    return 0;
  }
  if ((int)st < 1 || (int)st > OSFT_STATUS_INTERNAL_ERROR)
    fz_die("%s returned %d, not a known status code", call, (int)st);
  if (st == OSFT_STATUS_INTERNAL_ERROR)
    fz_die("%s returned OSFT_STATUS_INTERNAL_ERROR: %s", call, osft_last_error());
  const char *msg = osft_last_error();
  if (msg == NULL || msg[0] == '\0')
    fz_die("%s failed with %d (%s) but left osft_last_error() empty", call, (int)st,
           osft_status_string(st));
  return 1;
}

/* ------------------------------------------------------------- tensors */

DLDataType fz_dt(uint8_t code, uint8_t bits) {
  DLDataType d;
  d.code = code;
  d.bits = bits;
  d.lanes = 1;
  return d;
}

static size_t elem_size(DLDataType d) {
  size_t b = ((size_t)d.bits * (d.lanes ? d.lanes : 1) + 7) / 8;
  return b ? b : 1;
}

static int is_known_float(DLDataType d) {
  return d.lanes == 1 &&
         ((d.code == kDLFloat && (d.bits == 32 || d.bits == 64 || d.bits == 16)) ||
          (d.code == kDLBfloat && d.bits == 16));
}

/* Element offset (in elements, may be negative) of logical index `i`. */
static int64_t offset_of(const fz_tensor *t, int64_t i) {
  int64_t off = 0, compact = 1;
  for (int d = t->t.ndim - 1; d >= 0; --d) {
    const int64_t n = t->shape[d];
    const int64_t stride = t->t.strides ? t->strides[d] : compact;
    off += (i % n) * stride;
    i /= n;
    compact *= n;
  }
  return off;
}

static uint8_t *elem_ptr(const fz_tensor *t, int64_t i) {
  return (uint8_t *)t->t.data + t->t.byte_offset +
         (ptrdiff_t)(offset_of(t, i) * (int64_t)elem_size(t->t.dtype));
}

static uint16_t to_bf16(float v) {
  uint32_t u;
  memcpy(&u, &v, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

static void store_double(const fz_tensor *t, int64_t i, double v) {
  uint8_t *p = elem_ptr(t, i);
  const DLDataType d = t->t.dtype;
  if (d.lanes != 1) return;
  if (d.code == kDLFloat && d.bits == 32) {
    const float x = (float)v;
    memcpy(p, &x, 4);
  } else if (d.code == kDLFloat && d.bits == 64) {
    memcpy(p, &v, 8);
  } else if (d.code == kDLBfloat && d.bits == 16) {
    const uint16_t x = to_bf16((float)v);
    memcpy(p, &x, 2);
  } else if (d.code == kDLFloat && d.bits == 16) {
    /* a crude half: enough for validation paths */
    const uint16_t x = isnan(v) ? 0x7e00 : isinf(v) ? (v > 0 ? 0x7c00 : 0xfc00) : 0x3c00;
    memcpy(p, &x, 2);
  }
}

void fz_set_int(fz_tensor *t, int64_t i, int64_t value) {
  if (i < 0 || i >= t->numel || t->t.data == NULL) return;
  uint8_t *p = elem_ptr(t, i);
  const DLDataType d = t->t.dtype;
  if (d.lanes != 1) return;
  if (d.code == kDLInt && d.bits == 32) {
    const int32_t x = (int32_t)value;
    memcpy(p, &x, 4);
  } else if (d.code == kDLInt && d.bits == 64) {
    memcpy(p, &value, 8);
  }
}

int64_t fz_get_int(const fz_tensor *t, int64_t i) {
  if (i < 0 || i >= t->numel || t->t.data == NULL || t->t.dtype.lanes != 1) return 0;
  const uint8_t *p = elem_ptr(t, i);
  if (t->t.dtype.code == kDLInt && t->t.dtype.bits == 32) {
    int32_t x;
    memcpy(&x, p, 4);
    return x;
  }
  if (t->t.dtype.code == kDLInt && t->t.dtype.bits == 64) {
    int64_t x;
    memcpy(&x, p, 8);
    return x;
  }
  return 0;
}

int fz_has_values(const fz_tensor *t) {
  return t->t.data != NULL && t->numel > 0;
}

static void fill_values(fz *f, fz_tensor *t, int values, double scale, int64_t int_hi) {
  /* Every byte first (padding included), so that a stray write shows. */
  for (size_t b = 0; b < t->bytes; ++b) t->buf[b] = (uint8_t)fz_next(f);
  if (t->numel <= 0 || t->t.data == NULL) return;
  const DLDataType d = t->t.dtype;
  if (d.code == kDLInt && d.lanes == 1) {
    const int mode = (int)fz_range(f, 0, 3);
    for (int64_t i = 0; i < t->numel; ++i) {
      int64_t v = int_hi > 0 ? (int64_t)(fz_next(f) % (uint64_t)int_hi) : 0;
      if (mode == 1 && fz_next(f) % 4 == 0) v = -100; /* the default ignore_index */
      fz_set_int(t, i, v);
    }
    if (mode == 2 || mode == 3) {
      static const int64_t bad[] = {-1,        -2,        INT32_MAX, INT32_MIN,
                                    INT64_MAX, INT64_MIN, 0};
      const int64_t at = (int64_t)(fz_next(f) % (uint64_t)t->numel);
      int64_t v = bad[fz_next(f) % 7];
      if (mode == 3) v = int_hi; /* just out of range */
      fz_set_int(t, at, v);
    }
    return;
  }
  if (!is_known_float(d)) return;
  int mode = (int)fz_range(f, 0, 3);
  if (values == FZ_VALUES_FINITE && mode == 1) mode = 0;
  for (int64_t i = 0; i < t->numel; ++i) {
    double v = fz_uniform(f, -1.0, 1.0);
    if (v > -1e-3 && v < 1e-3) v = 0.5; /* never zero */
    if (mode == 2) v *= 1e30;
    if (mode == 3) v = 0.0;
    store_double(t, i, v * scale);
  }
  if (mode == 1) {
    static const double special[] = {NAN, INFINITY, -INFINITY, 3e38, -3e38, 1e-45};
    const int count = 1 + (int)(fz_next(f) % 3);
    for (int k = 0; k < count; ++k) {
      const int64_t at = (int64_t)(fz_next(f) % (uint64_t)t->numel);
      const double v = special[fz_next(f) % 6];
      store_double(t, at, v);
    }
  }
  /* Read back what the elements hold (a special may have been overwritten,
   * or rounded to Inf in bf16). */
  t->nonfinite = 0;
  for (int64_t i = 0; i < t->numel && !t->nonfinite; ++i) {
    const uint8_t *p = elem_ptr(t, i);
    double v = 0;
    if (d.code == kDLFloat && d.bits == 32) {
      float x;
      memcpy(&x, p, 4);
      v = x;
    } else if (d.code == kDLFloat && d.bits == 64) {
      memcpy(&v, p, 8);
    } else if (d.code == kDLBfloat && d.bits == 16) {
      uint16_t h;
      memcpy(&h, p, 2);
      const uint32_t u = (uint32_t)h << 16;
      float x;
      memcpy(&x, &u, 4);
      v = x;
    } else if (d.code == kDLFloat && d.bits == 16) {
      uint16_t h;
      memcpy(&h, p, 2);
      v = (h & 0x7c00) == 0x7c00 ? NAN : 0.0;
    }
    if (!isfinite(v)) t->nonfinite = 1;
  }
}

int fz_present(fz *f) {
  return fz_range(f, 0, 3) != 3;
}

fz_tensor *fz_tensor_new(fz_pool *pool, fz *f, const char *name, int role,
                         DLDataType dtype, int ndim, const int64_t *dims, int values,
                         double scale, int64_t int_hi) {
  fz_tensor *t = (fz_tensor *)calloc(1, sizeof *t);
  if (t == NULL) abort();
  t->name = name;
  t->role = role & 3;
  t->next = pool->head;
  pool->head = t;
  for (int i = 0; i < ndim && i < 8; ++i) t->shape[i] = dims[i];
  t->t.ndim = ndim;
  t->t.dtype = dtype;
  t->t.device.device_type = kDLCPU;
  t->t.device.device_id = 0;
  t->t.shape = t->shape;

  /* Layout (all well-formed). */
  int padded = 0;
  size_t byte_offset = 0;
  switch (fz_range(f, 0, 5)) {
    case 1: t->t.strides = t->strides; break; /* explicit compact */
    case 2:
      padded = 1 + (int)fz_range(f, 0, 3);
      t->t.strides = t->strides;
      break;
    case 3: byte_offset = elem_size(dtype) * (size_t)fz_range(f, 1, 4); break;
    default: break;
  }
  int64_t compact = 1;
  for (int d = ndim - 1; d >= 0; --d) {
    t->strides[d] = compact;
    if (d == ndim - 2 && padded) t->strides[d] = t->shape[ndim - 1] + padded;
    compact = t->strides[d] * t->shape[d];
  }
  int misalign = 0, null_data = 0, huge = 0;

  /* Fault. */
  const int fault = (role & FZ_CLEAN) ? 0 : (int)fz_range(f, 0, 23);
  switch (fault) {
    case 12: { /* another dtype, maybe still an accepted one */
      static const uint8_t codes[][2] = {
          {kDLFloat, 32},   {kDLFloat, 64}, {kDLFloat, 16},  {kDLBfloat, 16},
          {kDLInt, 32},     {kDLInt, 64},   {kDLUInt, 8},    {kDLInt, 8},
          {kDLComplex, 64}, {kDLFloat, 8},  {kDLBfloat, 32}, {kDLUInt, 32}};
      const int k = (int)fz_range(f, 0, 11);
      t->t.dtype = fz_dt(codes[k][0], codes[k][1]);
      break;
    }
    case 13: /* lanes */
      t->t.dtype.lanes = (uint16_t)fz_range(f, 2, 4);
      t->faulty = 1;
      break;
    case 14: { /* one dim changed */
      if (ndim <= 0) break;
      const int d = (int)fz_range(f, 0, ndim - 1);
      static const int64_t delta[] = {0, 1, -1, 2};
      const int k = (int)fz_range(f, 0, 4);
      if (k == 4) {
        t->shape[d] = -1 - fz_range(f, 0, 2);
        t->faulty = 1;
      } else if (k == 0) {
        t->shape[d] = 0;
      } else {
        t->shape[d] = t->shape[d] + delta[k];
        if (t->shape[d] < 0) t->shape[d] = 0;
      }
      t->t.strides = NULL;
      break;
    }
    case 15: { /* rank */
      const int k = (int)fz_range(f, 0, 3);
      if (k == 0 && ndim < 8) { /* a leading 1 */
        memmove(t->shape + 1, t->shape, sizeof(int64_t) * (size_t)ndim);
        t->shape[0] = 1;
        t->t.ndim = ndim + 1;
      } else if (k == 1 && ndim > 0) { /* drop the first dim */
        memmove(t->shape, t->shape + 1, sizeof(int64_t) * (size_t)(ndim - 1));
        t->t.ndim = ndim - 1;
      } else if (k == 2) {
        t->t.ndim = 9; /* above the library's maximum rank */
        for (int i = ndim; i < 9; ++i) t->shape[i] = 1;
        t->faulty = 1;
      } else {
        t->t.ndim = -1;
        t->faulty = 1;
      }
      t->t.strides = NULL;
      break;
    }
    case 16: { /* a non-unit last stride / a transposed matrix */
      if (ndim <= 0) break;
      t->t.strides = t->strides;
      if (ndim >= 2 && fz_bool(f)) {
        const int64_t a = t->strides[ndim - 1];
        t->strides[ndim - 1] = t->strides[ndim - 2];
        t->strides[ndim - 2] = a;
        if (t->shape[ndim - 1] > 1 && t->shape[ndim - 2] > 1) t->faulty = 1;
      } else {
        t->strides[ndim - 1] = 2;
        for (int d = ndim - 2; d >= 0; --d)
          t->strides[d] = t->strides[d + 1] * t->shape[d + 1] * 2;
        if (t->shape[ndim - 1] > 1) t->faulty = 1;
      }
      break;
    }
    case 17: { /* a negative or zero stride */
      if (ndim <= 0) break;
      t->t.strides = t->strides;
      const int d = (int)fz_range(f, 0, ndim - 1);
      t->strides[d] = fz_bool(f) ? 0 : -t->strides[d];
      if (t->shape[d] > 1) t->faulty = 1;
      break;
    }
    case 18: /* overlapping rows: row stride below the row length */
      if (ndim >= 2 && t->shape[ndim - 1] > 1) {
        t->t.strides = t->strides;
        t->strides[ndim - 2] = t->shape[ndim - 1] - 1;
        if (t->shape[ndim - 2] > 1) t->faulty = 1;
      }
      break;
    case 19: /* misaligned data + byte_offset */
      if (elem_size(t->t.dtype) > 1) {
        misalign = (int)elem_size(t->t.dtype) / 2;
        t->faulty = 1; /* if non-empty, fixed below */
      }
      break;
    case 20: { /* device */
      static const int types[] = {kDLCUDA, kDLCUDAHost, kDLOpenCL, kDLCUDAManaged, 0, 99};
      const int k = (int)fz_range(f, 0, 5);
      t->t.device.device_type = (DLDeviceType)types[k];
      t->t.device.device_id = (int)fz_range(f, 0, 1);
      if (types[k] != kDLCUDAHost) t->faulty = 1;
      break;
    }
    case 21: /* NULL data */
      null_data = 1;
      t->faulty = 1; /* if non-empty, fixed below */
      break;
    case 22: /* an element count beyond int64 / the address space */
      if (ndim >= 1) {
        t->shape[0] = (int64_t)1 << 62; /* bytes overflow int64 even in 1-D */
        if (ndim >= 2) t->shape[ndim - 1] = (int64_t)1 << 40;
        t->t.strides = NULL;
        huge = 1;
        t->faulty = 1;
      }
      break;
    default: break;
  }

  /* The extent the descriptor claims. */
  const int n = t->t.ndim;
  int64_t numel = (n < 0 || n > 9) ? 0 : 1;
  int valid_shape = numel == 1;
  for (int d = 0; d < n && valid_shape; ++d) {
    if (t->shape[d] < 0 || huge)
      valid_shape = 0;
    else
      numel *= t->shape[d];
  }
  if (!valid_shape || huge) numel = 0;
  t->numel = numel;
  if (numel == 0) { /* nothing to misalign or to dereference */
    /* layout, alignment and data are not examined for an empty tensor */
    if (fault == 16 || fault == 17 || fault == 18 || fault == 19 || fault == 21)
      t->faulty = 0;
  }
  int64_t lo = 0, hi = 0, comp = 1;
  if (numel > 0) {
    for (int d = n - 1; d >= 0; --d) {
      const int64_t stride = t->t.strides ? t->strides[d] : comp;
      const int64_t reach = (t->shape[d] - 1) * stride;
      if (reach < 0)
        lo += reach;
      else
        hi += reach;
      comp *= t->shape[d];
    }
  }
  const size_t es = elem_size(t->t.dtype);
  t->bytes = numel > 0 ? (size_t)(hi - lo + 1) * es : 0;
  t->alloc = (uint8_t *)malloc(t->bytes + (size_t)misalign);
  if (t->alloc == NULL) abort();
  t->buf = t->alloc + misalign;
  t->snap = (uint8_t *)malloc(t->bytes ? t->bytes : 1);
  if (t->snap == NULL) abort();
  t->t.byte_offset = byte_offset;
  if (huge) {
    t->t.data = t->buf; /* never to be dereferenced: the call must refuse */
  } else if (null_data) {
    t->t.data = NULL;
  } else {
    t->t.data = t->buf - (ptrdiff_t)byte_offset - (ptrdiff_t)(lo * (int64_t)es);
  }
  if (!huge && !null_data)
    fill_values(f, t, values, scale, int_hi);
  else
    for (size_t b = 0; b < t->bytes; ++b) t->buf[b] = (uint8_t)fz_next(f);
  return t;
}

fz_tensor *fz_tensor_2d(fz_pool *pool, fz *f, const char *name, int role, DLDataType dt,
                        int64_t rows, int64_t cols, int values) {
  const int64_t dims[2] = {rows, cols};
  return fz_tensor_new(pool, f, name, role, dt, 2, dims, values, 1.0, 0);
}

fz_tensor *fz_tensor_1d(fz_pool *pool, fz *f, const char *name, int role, DLDataType dt,
                        int64_t len, int values) {
  const int64_t dims[1] = {len};
  return fz_tensor_new(pool, f, name, role, dt, 1, dims, values, 1.0, 0);
}

void fz_snapshot(fz_pool *pool) {
  g_pool = pool;
  for (fz_tensor *t = pool->head; t; t = t->next)
    if (t->bytes) memcpy(t->snap, t->buf, t->bytes);
}

static size_t first_diff(const uint8_t *a, const uint8_t *b, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (a[i] != b[i]) return i;
  return n;
}

void fz_check_tensors(fz_pool *pool, int failed, const char *call) {
  for (fz_tensor *t = pool->head; t; t = t->next) {
    if (t->bytes == 0) continue;
    if (t->role != FZ_IN && !failed) continue;
    const size_t at = first_diff(t->buf, t->snap, t->bytes);
    if (at == t->bytes) continue;
    if (t->role == FZ_IN)
      fz_die("%s modified its input %s (byte %zu of %zu)", call, t->name, at, t->bytes);
    fz_die("%s failed (%s) but modified output %s (byte %zu of %zu)", call,
           osft_last_error(), t->name, at, t->bytes);
  }
}

void fz_check_padding(fz_pool *pool, const char *call) {
  for (fz_tensor *t = pool->head; t; t = t->next) {
    if (t->role == FZ_IN || t->bytes == 0 || t->numel <= 0 || t->t.data == NULL) continue;
    uint8_t *mask = (uint8_t *)calloc(t->bytes, 1);
    if (mask == NULL) abort();
    const size_t es = elem_size(t->t.dtype);
    for (int64_t i = 0; i < t->numel; ++i) {
      const uint8_t *p = elem_ptr(t, i);
      if (p < t->buf || p + es > t->buf + t->bytes) continue;
      memset(mask + (p - t->buf), 1, es);
    }
    for (size_t b = 0; b < t->bytes; ++b) {
      if (!mask[b] && t->buf[b] != t->snap[b]) {
        free(mask);
        fz_die("%s wrote byte %zu of %s, which is row padding, not an element", call, b,
               t->name);
      }
    }
    free(mask);
  }
}

int fz_any_faulty(const fz_pool *pool) {
  for (const fz_tensor *t = pool->head; t; t = t->next)
    if (t->faulty) return 1;
  return 0;
}

void fz_pool_free(fz_pool *pool) {
  fz_tensor *t = pool->head;
  while (t) {
    fz_tensor *next = t->next;
    free(t->alloc);
    free(t->snap);
    free(t);
    t = next;
  }
  pool->head = NULL;
  if (g_pool == pool) g_pool = NULL;
}

/* ------------------------------------------------------------- context */

typedef struct {
  long allocs, frees, fail_after;
  size_t live;
} fz_alloc_state;

static fz_alloc_state g_alloc;

static void *fz_host_alloc(void *user, size_t bytes, size_t alignment) {
  fz_alloc_state *s = (fz_alloc_state *)user;
  if (s->fail_after >= 0 && s->allocs >= s->fail_after) return NULL;
  ++s->allocs;
  s->live += bytes;
  const size_t rounded = (bytes + alignment - 1) / alignment * alignment;
  return aligned_alloc(alignment, rounded);
}

static void fz_host_free(void *user, void *ptr, size_t bytes) {
  fz_alloc_state *s = (fz_alloc_state *)user;
  ++s->frees;
  s->live -= bytes;
  free(ptr);
}

osft_context_t fz_context(fz *f) {
  osft_context_options_t o;
  OSFT_CONTEXT_OPTIONS_INIT(&o);
  static const size_t limits[] = {0, 0, 0, 0, 256, 4096, 65536, 1 << 20};
  o.workspace_limit = limits[fz_range(f, 0, 7)];
  osft_allocator_t a;
  OSFT_ALLOCATOR_INIT(&a);
  memset(&g_alloc, 0, sizeof g_alloc);
  g_alloc.fail_after = -1;
  if (fz_range(f, 0, 3) == 3) {
    /* The caller's allocator, failing from the n-th allocation on. */
    g_alloc.fail_after = 1 + fz_range(f, 0, 12);
    a.user = &g_alloc;
    a.host_alloc = fz_host_alloc;
    a.host_free = fz_host_free;
    o.allocator = &a;
  }
  osft_context_t ctx = NULL;
  if (osft_context_create(&ctx, &o) != OSFT_STATUS_SUCCESS) {
    o.allocator = NULL;
    if (osft_context_create(&ctx, &o) != OSFT_STATUS_SUCCESS)
      fz_die("osft_context_create failed with valid options: %s", osft_last_error());
  }
  return ctx;
}

void fz_context_destroy(osft_context_t ctx) {
  const osft_status_t st = osft_context_destroy(ctx);
  if (st != OSFT_STATUS_SUCCESS)
    fz_die("osft_context_destroy failed after every handle was destroyed: %s",
           osft_last_error());
  if (g_alloc.allocs != g_alloc.frees || g_alloc.live != 0)
    fz_die(
        "the context returned %ld of %ld blocks (%zu bytes still out) to the "
        "caller's allocator",
        g_alloc.frees, g_alloc.allocs, g_alloc.live);
}
