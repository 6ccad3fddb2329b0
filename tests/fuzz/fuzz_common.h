/* Shared pieces of the libFuzzer harnesses (tests/fuzz/): a decoder that
 * turns the fuzzer's bytes into choices, hostile DLTensors over buffers of
 * exactly the extent their descriptors claim, and the checks of the ABI's
 * promises (tests/fuzz/README.md).
 *
 * Decoding: every choice reads from the input; an exhausted input reads as
 * zeros, and choice 0 is always the well-formed one, so short inputs make
 * valid calls that reach the kernels, and longer ones add faults. */
#ifndef OSFTRT_FUZZ_COMMON_H
#define OSFTRT_FUZZ_COMMON_H

#include <stddef.h>
#include <stdint.h>

#include "osftrt/osftrt.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------ decoding */

typedef struct fz_s {
  const uint8_t *p;
  size_t n;
  uint64_t rng; /* seeded from the input: fills values without consuming */
} fz;

void fz_init(fz *f, const uint8_t *data, size_t size);
uint32_t fz_u32(fz *f);
/* A value in [lo, hi] (inclusive); lo when the input is exhausted. */
int64_t fz_range(fz *f, int64_t lo, int64_t hi);
int fz_bool(fz *f); /* 0 when exhausted */
/* A double for an option: `normal` unless the input picks one of the
 * hostile values (NaN, +-Inf, huge, tiny, negative, 0, ...). */
double fz_double(fz *f, double normal);
/* An int64 for a size/count option: `normal`, or a hostile one (0, -1,
 * INT64_MAX, INT64_MIN, normal +- 1, a small number). */
int64_t fz_i64(fz *f, int64_t normal);
/* A struct_size for a struct whose compiled size is `size`: `size`, or a
 * smaller one, 0, a larger one (with a zeroed or non-zeroed tail, see
 * fz_struct). */
size_t fz_struct_size(fz *f, size_t size);
/* A copy of the struct `init` (`size` bytes, struct_size first) in a fresh
 * buffer of exactly max(size, claimed) bytes, with struct_size = claimed
 * from fz_struct_size(); bytes beyond `size` are zero, or (the input's
 * choice) one is not. Sets *must_fail when the ABI says such a struct is
 * refused (struct_size below any layout, or a non-zero unknown tail).
 * free() it. */
void *fz_struct(fz *f, const void *init, size_t size, int *must_fail);
/* The struct_size the last fz_struct() claimed (fields beyond it are not
 * read by the library: their faults do not count). */
size_t fz_struct_claimed(void);
/* An enum value: `normal`, or any int (in range or not). */
int fz_enum(fz *f, int normal, int n_values);
/* Deterministic pseudo-random numbers from the input's seed. */
uint64_t fz_next(fz *f);
double fz_uniform(fz *f, double lo, double hi);

/* ------------------------------------------------------------- tensors */

enum {
  FZ_IN = 0,        /* read-only input: must never change */
  FZ_OUT = 1,       /* output: unchanged on failure */
  FZ_INOUT = 2,     /* read and written (accumulators, in-place): as FZ_OUT */
  FZ_CLEAN = 1 << 4 /* no faults: only well-formed variants */
};

/* Value fills. */
enum { FZ_VALUES_ANY = 0, FZ_VALUES_FINITE = 1 };

typedef struct fz_tensor_s {
  DLTensor t;
  int64_t shape[9];
  int64_t strides[9];
  uint8_t *alloc; /* what was malloc'ed (exactly `bytes`, plus a misalignment) */
  uint8_t *buf;   /* first byte of the extent */
  size_t bytes;   /* the extent the descriptor claims */
  uint8_t *snap;  /* copy of buf before the call */
  int role;       /* FZ_IN / FZ_OUT / FZ_INOUT */
  int faulty;     /* a fault that the ABI says must be refused */
  int nonfinite;  /* a logical element is NaN or Inf */
  int64_t numel;  /* logical elements (0 for an invalid shape) */
  const char *name;
  struct fz_tensor_s *next; /* the harness's list of every tensor */
} fz_tensor;

/* All tensors of one input, freed together. */
typedef struct fz_pool_s {
  fz_tensor *head;
} fz_pool;

/* dtypes */
DLDataType fz_dt(uint8_t code, uint8_t bits);
#define FZ_F32 fz_dt(kDLFloat, 32)
#define FZ_F64 fz_dt(kDLFloat, 64)
#define FZ_BF16 fz_dt(kDLBfloat, 16)
#define FZ_I32 fz_dt(kDLInt, 32)
#define FZ_I64 fz_dt(kDLInt, 64)

/*
 * A tensor meant to be `dtype` with `ndim` dims `dims`, over a fresh
 * buffer, after the input's choice of layout (NULL or explicit compact
 * strides, padded rows, an aligned byte_offset, extra leading 1-dims) and,
 * unless FZ_CLEAN, of fault (wrong dtype or lanes, a wrong or negative or
 * zero dim, rank +-1, padded/negative/zero/overlapping/permuted strides, a
 * misaligned byte_offset, a foreign device or device_id, NULL data). The
 * buffer holds exactly the bytes from the lowest to the highest element
 * address the descriptor reaches, so any access outside it is an ASan
 * report. Values: finite uniform in [-1, 1] times `scale`, or (with
 * FZ_VALUES_ANY) scattered NaN / Inf / huge / denormal values. Integer
 * tensors get values in [0, int_hi) with some out of range.
 */
fz_tensor *fz_tensor_new(fz_pool *pool, fz *f, const char *name, int role,
                         DLDataType dtype, int ndim, const int64_t *dims, int values,
                         double scale, int64_t int_hi);
/* Same, with the dims as arguments. */
fz_tensor *fz_tensor_2d(fz_pool *pool, fz *f, const char *name, int role, DLDataType dt,
                        int64_t rows, int64_t cols, int values);
fz_tensor *fz_tensor_1d(fz_pool *pool, fz *f, const char *name, int role, DLDataType dt,
                        int64_t n, int values);
/* An optional tensor: NULL when the input says so (one choice). */
int fz_present(fz *f);

/* Integer value for element i (any dtype), for targets. */
void fz_set_int(fz_tensor *t, int64_t logical_index, int64_t value);

/* Integer value of logical element i (int32/int64 tensors; 0 otherwise). */
int64_t fz_get_int(const fz_tensor *t, int64_t logical_index);
/* 1 if a tensor is well-formed enough that its values were set (not
 * faulty, data present). */
int fz_has_values(const fz_tensor *t);

/* Snapshot every tensor of the pool (before a call). */
void fz_snapshot(fz_pool *pool);
/* Aborts if an FZ_IN tensor changed (always a bug), or, when `failed`, if
 * an output changed. */
void fz_check_tensors(fz_pool *pool, int failed, const char *call);
/* Aborts unless every byte of an output that is not one of its logical
 * elements (row padding) is unchanged: called after a successful call. */
void fz_check_padding(fz_pool *pool, const char *call);
/* 1 if some tensor of the pool carries a fault the ABI must refuse. */
int fz_any_faulty(const fz_pool *pool);
void fz_pool_free(fz_pool *pool);

/* ------------------------------------------------------------- checks */

/* Clears the thread's last error; call right before the API call. */
void fz_before(void);
/*
 * The ABI's promise on the status: SUCCESS, or a known error code with a
 * non-empty osft_last_error(). Aborts otherwise. Returns 1 if the call
 * failed. When `must_fail` and the call succeeded, aborts as well (an
 * argument the ABI says is refused was accepted).
 */
int fz_status(osft_status_t st, const char *call, int must_fail);
/* Aborts with a message (a finding). */
void fz_die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

/* A CPU context from the input's options (workspace limit, allocator
 * choice); never fails. */
osft_context_t fz_context(fz *f);
/* Destroys it; aborts unless that succeeds and every block of the caller's
 * allocator came back. */
void fz_context_destroy(osft_context_t ctx);

#ifdef __cplusplus
}
#endif

#endif
