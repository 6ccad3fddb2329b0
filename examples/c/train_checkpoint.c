/*
 * osftrt_train — checkpoints: --save DIR, --resume DIR, --inspect DIR.
 *
 * One file, DIR/train.ckpt, written whole at every save: a temporary file
 * in DIR (train.ckpt.tmp), fsync, rename over the old checkpoint, fsync of
 * DIR. A process killed at any instant leaves either the old checkpoint or
 * the new one, never a mix; a stale train.ckpt.tmp is overwritten by the
 * next save.
 *
 * Format, version 1. Every number is little-endian; CRC32 is zlib's
 * (IEEE 802.3).
 *
 *   header, 64 bytes
 *      0  magic "OSFTCKPT"
 *      8  u32  format version (1)
 *     12  u32  entries n
 *     16  u64  file size in bytes
 *     24  u64  directory offset (64)
 *     32  u64  data offset
 *     40  u32  CRC32 of the directory
 *     44  u32  bytes per directory entry (128)
 *     48  12 zero bytes
 *     60  u32  CRC32 of bytes 0..59
 *   directory, n entries of 128 bytes
 *      0  name, NUL-padded (at most 79 bytes)
 *     80  u32  dtype: 1 f32, 2 f64, 3 i64, 4 u8 (text)
 *     84  u32  dims (0: a scalar, 1, 2)
 *     88  u64  shape[2] (1 where unused)
 *    104  u64  offset of the data in the file (a multiple of 64)
 *    112  u64  bytes of data (= the shape's product x the dtype's size)
 *    120  u32  CRC32 of the data
 *    124  u32  zero
 *   data: each tensor row-major and compact, zero bytes between.
 *
 * What a checkpoint holds (names):
 *   meta/writer                  text: the trainer and library version
 *   config/<flag>                every flag the trajectory depends on
 *   data/task_{a,b}/{bytes,crc32} the two texts' sizes and checksums
 *   state/...                    the phase, its steps done, the batch RNG,
 *                                the log window's sums
 *   run/<phase>/...              what each phase so far reported
 *   pretrained/<weight>          fine-tuning phases: the starting weights
 *   model/<weight>               the model's dense tensors (OSFT: the
 *                                embedding and norms, frozen)
 *   osft/<layer>/<factor>        OSFT: u_high s_high v_high u_low s_low
 *                                v_low of each layer (osft_flinear_get_factor)
 *   optim/...                    the step, and per trainable tensor its
 *                                moments m, v (SOAP: factors l, r and
 *                                eigenbases ql, qr)
 *
 * Reading verifies everything before anything is used: size, magic,
 * version, both header checksums, every entry's bounds and checksum, that
 * the bytes between tensors are zero (so any damaged byte is found); then
 * the configuration and the data against this run's; then each tensor's
 * dtype and shape as it is loaded. Any failure stops the program with a
 * message naming the file and the field (exit 1).
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "train.h"

enum {
  HEADER_BYTES = 64,
  ENTRY_BYTES = 128,
  NAME_BYTES = 80,
  ALIGN = 64,
  FORMAT_VERSION = 1
};
static const char MAGIC[8] = {'O', 'S', 'F', 'T', 'C', 'K', 'P', 'T'};
static const char FILE_NAME[] = "train.ckpt";

typedef enum { DT_F32 = 1, DT_F64 = 2, DT_I64 = 3, DT_U8 = 4 } dtype_t;

static size_t dtype_size(uint32_t dt) {
  switch (dt) {
    case DT_F32: return 4;
    case DT_F64:
    case DT_I64: return 8;
    case DT_U8: return 1;
    default: return 0;
  }
}

static const char *dtype_name(uint32_t dt) {
  switch (dt) {
    case DT_F32: return "f32";
    case DT_F64: return "f64";
    case DT_I64: return "i64";
    case DT_U8: return "u8";
    default: return "?";
  }
}

/* ------------------------------------------------------ byte helpers */

static uint32_t crc32_update(uint32_t crc, const void *data, size_t n) {
  static uint32_t table[256];
  static int ready = 0;
  if (!ready) {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      table[i] = c;
    }
    ready = 1;
  }
  const unsigned char *p = data;
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) crc = table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return ~crc;
}

static void put32(unsigned char *p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = (unsigned char)(v >> (8 * i));
}

static void put64(unsigned char *p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = (unsigned char)(v >> (8 * i));
}

static uint32_t get32(const unsigned char *p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = v << 8 | p[i];
  return v;
}

static uint64_t get64(const unsigned char *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = v << 8 | p[i];
  return v;
}

/* `count` elements of `size` bytes between host order and little-endian
 * (the same operation both ways). */
static void le_copy(void *dst, const void *src, size_t count, size_t size) {
  const uint16_t one = 1;
  if (*(const unsigned char *)&one == 1 || size == 1) {
    memcpy(dst, src, count * size);
    return;
  }
  unsigned char *d = dst;
  const unsigned char *s = src;
  for (size_t i = 0; i < count; ++i)
    for (size_t b = 0; b < size; ++b) d[i * size + b] = s[i * size + size - 1 - b];
}

/* -------------------------------------------------------- the entries */

typedef struct {
  char name[NAME_BYTES];
  uint32_t dtype, ndim;
  uint64_t shape[2], offset, bytes;
  uint32_t crc;
} entry_t;

static void entry_encode(const entry_t *e, unsigned char *p) {
  memset(p, 0, ENTRY_BYTES);
  memcpy(p, e->name, strlen(e->name));
  put32(p + 80, e->dtype);
  put32(p + 84, e->ndim);
  put64(p + 88, e->shape[0]);
  put64(p + 96, e->shape[1]);
  put64(p + 104, e->offset);
  put64(p + 112, e->bytes);
  put32(p + 120, e->crc);
}

static void entry_decode(const unsigned char *p, entry_t *e) {
  memcpy(e->name, p, NAME_BYTES);
  e->name[NAME_BYTES - 1] = '\0';
  e->dtype = get32(p + 80);
  e->ndim = get32(p + 84);
  e->shape[0] = get64(p + 88);
  e->shape[1] = get64(p + 96);
  e->offset = get64(p + 104);
  e->bytes = get64(p + 112);
  e->crc = get32(p + 120);
}

static void shape_text(const entry_t *e, char *buf, size_t n) {
  if (e->ndim == 0)
    snprintf(buf, n, "%s scalar", dtype_name(e->dtype));
  else if (e->ndim == 1)
    snprintf(buf, n, "%s [%llu]", dtype_name(e->dtype), (unsigned long long)e->shape[1]);
  else
    snprintf(buf, n, "%s [%llu x %llu]", dtype_name(e->dtype),
             (unsigned long long)e->shape[0], (unsigned long long)e->shape[1]);
}

/* ---------------------------------------------------------- the writer */

typedef struct {
  entry_t *e;
  int n, cap;
  unsigned char *data; /* the data section being built */
  size_t len, data_cap;
} writer_t;

static void *grow(void *p, size_t *cap, size_t need, size_t size) {
  if (need <= *cap) return p;
  size_t c = *cap ? *cap : 64;
  while (c < need) c *= 2;
  p = realloc(p, c * size);
  if (p == NULL) train_fail("checkpoint: out of host memory");
  *cap = c;
  return p;
}

/* Appends a tensor: rows x cols elements of `dtype` with row stride `ld`
 * elements (ndim 0 or 1: rows = 1), stored compact and little-endian. */
static void put(writer_t *w, const char *name, uint32_t dtype, int ndim, const void *src,
                int64_t rows, int64_t cols, int64_t ld) {
  if (strlen(name) >= NAME_BYTES)
    train_fail("checkpoint: tensor name too long: %s", name);
  size_t cap = (size_t)w->cap;
  w->e = grow(w->e, &cap, (size_t)w->n + 1, sizeof(entry_t));
  w->cap = (int)cap;
  entry_t *e = &w->e[w->n++];
  memset(e, 0, sizeof *e);
  snprintf(e->name, sizeof e->name, "%s", name);
  const size_t size = dtype_size(dtype), row = (size_t)cols * size;
  e->dtype = dtype;
  e->ndim = (uint32_t)ndim;
  e->shape[0] = (uint64_t)rows;
  e->shape[1] = (uint64_t)cols;
  e->bytes = (uint64_t)rows * row;
  e->offset = (w->len + ALIGN - 1) / ALIGN * ALIGN; /* within the data section */
  w->data = grow(w->data, &w->data_cap, (size_t)(e->offset + e->bytes), 1);
  memset(w->data + w->len, 0, (size_t)e->offset - w->len);
  for (int64_t i = 0; i < rows; ++i)
    le_copy(w->data + e->offset + (size_t)i * row,
            (const char *)src + (size_t)(i * ld) * size, (size_t)cols, size);
  e->crc = crc32_update(0, w->data + e->offset, (size_t)e->bytes);
  w->len = (size_t)(e->offset + e->bytes);
}

static void put_f32(writer_t *w, const char *name, const float *p, int64_t rows,
                    int64_t cols, int64_t ld) {
  put(w, name, DT_F32, rows == 1 ? 1 : 2, p, rows, cols, ld);
}

static void put_i64(writer_t *w, const char *name, int64_t v) {
  put(w, name, DT_I64, 0, &v, 1, 1, 1);
}

static void put_f64(writer_t *w, const char *name, double v) {
  put(w, name, DT_F64, 0, &v, 1, 1, 1);
}

static void put_text(writer_t *w, const char *name, const char *text) {
  put(w, name, DT_U8, 1, text, 1, (int64_t)strlen(text), 0);
}

static void writer_free(writer_t *w) {
  free(w->e);
  free(w->data);
  memset(w, 0, sizeof *w);
}

/* The header and directory for the data section built so far. */
static unsigned char *encode_head(const writer_t *w, size_t *head_bytes) {
  const size_t dir = (size_t)w->n * ENTRY_BYTES;
  const size_t data_off = (HEADER_BYTES + dir + ALIGN - 1) / ALIGN * ALIGN;
  unsigned char *h = xcalloc(data_off, 1);
  for (int i = 0; i < w->n; ++i) {
    entry_t e = w->e[i];
    e.offset += data_off;
    entry_encode(&e, h + HEADER_BYTES + (size_t)i * ENTRY_BYTES);
  }
  memcpy(h, MAGIC, sizeof MAGIC);
  put32(h + 8, FORMAT_VERSION);
  put32(h + 12, (uint32_t)w->n);
  put64(h + 16, (uint64_t)(data_off + w->len));
  put64(h + 24, HEADER_BYTES);
  put64(h + 32, (uint64_t)data_off);
  put32(h + 40, crc32_update(0, h + HEADER_BYTES, dir));
  put32(h + 44, ENTRY_BYTES);
  put32(h + 60, crc32_update(0, h, 60));
  *head_bytes = data_off;
  return h;
}

static void write_all(int fd, const void *p, size_t n, const char *path) {
  const char *c = p;
  while (n > 0) {
    const ssize_t k = write(fd, c, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) train_fail("checkpoint %s: write failed: %s", path, strerror(errno));
    c += k;
    n -= (size_t)k;
  }
}

static void checkpoint_path(char *buf, size_t n, const char *dir, const char *suffix) {
  if ((size_t)snprintf(buf, n, "%s/%s%s", dir, FILE_NAME, suffix) >= n)
    train_fail("checkpoint directory name too long: %s", dir);
}

/* mkdir -p: DIR and its missing parents. */
static void ensure_dir(const char *dir) {
  char path[4096];
  if ((size_t)snprintf(path, sizeof path, "%s", dir) >= sizeof path)
    train_fail("--save %s: name too long", dir);
  for (char *p = path + 1;; ++p) {
    const int end = *p == '\0';
    if (*p != '/' && !end) continue;
    *p = '\0';
    struct stat st;
    if (stat(path, &st) != 0 && mkdir(path, 0777) != 0 && errno != EEXIST)
      train_fail("--save %s: cannot create %s: %s", dir, path, strerror(errno));
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))
      train_fail("--save %s: %s is not a directory", dir, path);
    if (end) return;
    *p = '/';
  }
}

static void fsync_dir(const char *dir) {
  const int fd = open(dir, O_RDONLY | O_DIRECTORY);
  if (fd < 0 || fsync(fd) != 0)
    train_fail("checkpoint: cannot sync the directory %s: %s", dir, strerror(errno));
  close(fd);
}

/* The atomic replacement of DIR/train.ckpt by the writer's tensors. */
static void writer_commit(const writer_t *w, const char *dir) {
  char path[4096], tmp[4096];
  checkpoint_path(path, sizeof path, dir, "");
  checkpoint_path(tmp, sizeof tmp, dir, ".tmp");
  ensure_dir(dir);
  size_t head_bytes;
  unsigned char *head = encode_head(w, &head_bytes);
  const int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0666);
  if (fd < 0) train_fail("checkpoint %s: cannot create: %s", tmp, strerror(errno));
  write_all(fd, head, head_bytes, tmp);
  write_all(fd, w->data, w->len, tmp);
  if (fsync(fd) != 0) train_fail("checkpoint %s: fsync failed: %s", tmp, strerror(errno));
  if (close(fd) != 0) train_fail("checkpoint %s: close failed: %s", tmp, strerror(errno));
  if (rename(tmp, path) != 0)
    train_fail("checkpoint: cannot rename %s to %s: %s", tmp, path, strerror(errno));
  fsync_dir(dir);
  free(head);
}

/* ---------------------------------------------------------- the reader */

struct checkpoint_s {
  char path[4096];
  unsigned char *bytes;
  size_t size;
  entry_t *e;
  int n;
};

static void ck_fail(const checkpoint_t *ck, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  train_fail("checkpoint %s: %s", ck->path, msg);
}

static void read_file(checkpoint_t *ck) {
  FILE *f = fopen(ck->path, "rb");
  if (f == NULL)
    ck_fail(ck, "cannot open (%s); --resume needs a directory written by --save",
            strerror(errno));
  if (fseek(f, 0, SEEK_END) != 0) ck_fail(ck, "cannot seek");
  const long size = ftell(f);
  if (size < 0 || fseek(f, 0, SEEK_SET) != 0) ck_fail(ck, "cannot read its size");
  ck->size = (size_t)size;
  ck->bytes = xcalloc(ck->size + 1, 1);
  if (fread(ck->bytes, 1, ck->size, f) != ck->size) ck_fail(ck, "read failed");
  fclose(f);
}

static void verify_header(const checkpoint_t *ck, uint64_t *data_off) {
  const unsigned char *h = ck->bytes;
  if (ck->size < HEADER_BYTES)
    ck_fail(ck, "truncated: %zu bytes, shorter than the %d-byte header", ck->size,
            HEADER_BYTES);
  if (memcmp(h, MAGIC, sizeof MAGIC) != 0)
    ck_fail(ck, "not an osftrt_train checkpoint (no OSFTCKPT magic)");
  if (get32(h + 60) != crc32_update(0, h, 60))
    ck_fail(
        ck, "header checksum mismatch (stored %08x, computed %08x): corrupted%s",
        get32(h + 60), crc32_update(0, h, 60),
        get32(h + 8) != FORMAT_VERSION ? ", or of a format version other than 1" : "");
  if (get32(h + 8) != FORMAT_VERSION)
    ck_fail(ck, "format version %u; this trainer reads version %d", get32(h + 8),
            FORMAT_VERSION);
  const uint64_t file = get64(h + 16), n = get32(h + 12);
  if (ck->size < file)
    ck_fail(ck, "truncated: %zu bytes, the header says %llu", ck->size,
            (unsigned long long)file);
  if (ck->size > file)
    ck_fail(ck, "%zu bytes, the header says %llu: trailing bytes", ck->size,
            (unsigned long long)file);
  *data_off = get64(h + 32);
  if (get64(h + 24) != HEADER_BYTES || get32(h + 44) != ENTRY_BYTES ||
      *data_off < HEADER_BYTES + n * ENTRY_BYTES || *data_off > file)
    ck_fail(ck, "header: bad directory layout");
  if (get32(h + 40) != crc32_update(0, h + HEADER_BYTES, (size_t)n * ENTRY_BYTES))
    ck_fail(ck, "directory checksum mismatch (stored %08x, computed %08x): corrupted",
            get32(h + 40), crc32_update(0, h + HEADER_BYTES, (size_t)n * ENTRY_BYTES));
}

static void verify_entry(const checkpoint_t *ck, const entry_t *e, uint64_t data_off) {
  const size_t size = dtype_size(e->dtype);
  if (e->name[0] == '\0') ck_fail(ck, "an entry without a name");
  if (size == 0 || e->ndim > 2 || e->shape[0] == 0 ||
      e->shape[1] > ck->size / size / e->shape[0] ||
      e->bytes != e->shape[0] * e->shape[1] * size)
    ck_fail(ck, "tensor '%s': bad dtype or shape", e->name);
  if (e->offset < data_off || e->offset > ck->size || e->bytes > ck->size - e->offset)
    ck_fail(ck, "tensor '%s': data outside the file", e->name);
  const uint32_t crc = crc32_update(0, ck->bytes + e->offset, (size_t)e->bytes);
  if (crc != e->crc) {
    char shape[64];
    shape_text(e, shape, sizeof shape);
    ck_fail(ck,
            "tensor '%s' (%s at offset %llu): checksum mismatch (stored %08x, computed "
            "%08x): corrupted",
            e->name, shape, (unsigned long long)e->offset, e->crc, crc);
  }
}

static int by_offset(const void *a, const void *b) {
  const uint64_t x = ((const entry_t *)a)->offset, y = ((const entry_t *)b)->offset;
  return (x > y) - (x < y);
}

/* The bytes no checksum covers, between the directory and the data and
 * between tensors, must be zero; tensors must not overlap. */
static void verify_padding(const checkpoint_t *ck, uint64_t dir_end) {
  entry_t *sorted = xcalloc((size_t)ck->n + 1, sizeof(entry_t));
  memcpy(sorted, ck->e, (size_t)ck->n * sizeof(entry_t));
  qsort(sorted, (size_t)ck->n, sizeof(entry_t), by_offset);
  sorted[ck->n].offset = ck->size; /* the end of the file */
  uint64_t at = dir_end;
  for (int i = 0; i <= ck->n; ++i) {
    if (sorted[i].offset < at)
      ck_fail(ck, "tensor '%s' overlaps the data before it", sorted[i].name);
    for (; at < sorted[i].offset; ++at)
      if (ck->bytes[at] != 0)
        ck_fail(ck, "byte %llu (padding, before tensor '%s') is not zero: corrupted",
                (unsigned long long)at, i < ck->n ? sorted[i].name : "(end of file)");
    at = sorted[i].offset + sorted[i].bytes;
  }
  free(sorted);
}

/* Reads and verifies the whole file (format, checksums, names unique). */
static checkpoint_t *checkpoint_read(const char *dir) {
  checkpoint_t *ck = xcalloc(1, sizeof *ck);
  checkpoint_path(ck->path, sizeof ck->path, dir, "");
  read_file(ck);
  uint64_t data_off;
  verify_header(ck, &data_off);
  ck->n = (int)get32(ck->bytes + 12);
  ck->e = xcalloc((size_t)ck->n, sizeof(entry_t));
  for (int i = 0; i < ck->n; ++i) {
    entry_decode(ck->bytes + HEADER_BYTES + (size_t)i * ENTRY_BYTES, &ck->e[i]);
    verify_entry(ck, &ck->e[i], data_off);
    for (int j = 0; j < i; ++j)
      if (strcmp(ck->e[j].name, ck->e[i].name) == 0)
        ck_fail(ck, "tensor '%s' appears twice", ck->e[i].name);
  }
  verify_padding(ck, HEADER_BYTES + (uint64_t)ck->n * ENTRY_BYTES);
  return ck;
}

void checkpoint_close(checkpoint_t *ck) {
  if (ck == NULL) return;
  free(ck->bytes);
  free(ck->e);
  free(ck);
}

static const entry_t *find(const checkpoint_t *ck, const char *name) {
  for (int i = 0; i < ck->n; ++i)
    if (strcmp(ck->e[i].name, name) == 0) return &ck->e[i];
  return NULL;
}

/* The data of tensor `name`, which must have this dtype and shape. */
static const unsigned char *get(const checkpoint_t *ck, const char *name, uint32_t dtype,
                                int ndim, int64_t rows, int64_t cols) {
  const entry_t *e = find(ck, name);
  if (e == NULL) ck_fail(ck, "tensor '%s' is missing", name);
  const entry_t want = {"", dtype, (uint32_t)ndim, {(uint64_t)rows, (uint64_t)cols}};
  if (e->dtype != dtype || e->ndim != (uint32_t)ndim || e->shape[0] != (uint64_t)rows ||
      e->shape[1] != (uint64_t)cols) {
    char have[64], need[64];
    shape_text(e, have, sizeof have);
    shape_text(&want, need, sizeof need);
    ck_fail(ck, "tensor '%s' is %s; this run needs %s", name, have, need);
  }
  return ck->bytes + e->offset;
}

/* Into rows x cols floats with row stride ld. */
static void get_f32(const checkpoint_t *ck, const char *name, float *dst, int64_t rows,
                    int64_t cols, int64_t ld) {
  const unsigned char *p = get(ck, name, DT_F32, rows == 1 ? 1 : 2, rows, cols);
  for (int64_t i = 0; i < rows; ++i)
    le_copy(dst + i * ld, p + (size_t)(i * cols) * 4, (size_t)cols, 4);
}

static int64_t get_i64(const checkpoint_t *ck, const char *name) {
  int64_t v;
  le_copy(&v, get(ck, name, DT_I64, 0, 1, 1), 1, 8);
  return v;
}

static double get_f64(const checkpoint_t *ck, const char *name) {
  double v;
  le_copy(&v, get(ck, name, DT_F64, 0, 1, 1), 1, 8);
  return v;
}

/* A text entry into buf (NUL-terminated; cut at n - 1 bytes). */
static void get_text(const checkpoint_t *ck, const char *name, char *buf, size_t n) {
  const entry_t *e = find(ck, name);
  const int64_t len = e != NULL ? (int64_t)e->shape[1] : 0;
  const unsigned char *p = get(ck, name, DT_U8, 1, 1, len);
  const size_t k = (size_t)len < n - 1 ? (size_t)len : n - 1;
  memcpy(buf, p, k);
  buf[k] = '\0';
}

/* A tensor's name from a format; stops the program if it does not fit. */
static const char *tensor_name(char *buf, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  const int n = vsnprintf(buf, NAME_BYTES, fmt, ap);
  va_end(ap);
  if (n < 0 || n >= NAME_BYTES) train_fail("checkpoint: tensor name too long (%s)", fmt);
  return buf;
}

/* ----------------------------------------------- the trainer's fields */

/* One configuration value, as a checkpoint names and stores it. */
typedef struct {
  const char *name, *flag;
  int kind; /* 0 integer, 1 real, 2 text */
  int64_t i;
  double x;
  const char *text;
} cfg_item_t;

enum { MAX_CFG = 24 };

/* Every flag the trajectory depends on (not the device: cpu and staged
 * give the same bits; not what only prints or checks). */
static int config_items(const config_t *c, cfg_item_t *it) {
  int n = 0;
#define INT_ITEM(nm, fl, v) it[n++] = (cfg_item_t){nm, fl, 0, (int64_t)(v), 0, NULL}
#define REAL_ITEM(nm, fl, v) \
  it[n++] = (cfg_item_t) {   \
    nm, fl, 1, 0, (v), NULL  \
  }
  INT_ITEM("config/context", "--context", c->d.k);
  INT_ITEM("config/embed", "--embed", c->d.e);
  INT_ITEM("config/inter", "--inter", c->d.inter);
  INT_ITEM("config/blocks", "--blocks", c->d.blocks);
  REAL_ITEM("config/rank_ratio", "--rank-ratio", c->rank_ratio);
  it[n++] = (cfg_item_t){
      "config/optimizer", "--optimizer", 2, 0, 0, c->opt == OPT_SOAP ? "soap" : "adamw"};
  INT_ITEM("config/seed", "--seed", c->seed);
  INT_ITEM("config/pretrain_steps", "--pretrain-steps", c->pretrain_steps);
  INT_ITEM("config/steps", "--steps", c->steps);
  INT_ITEM("config/batch", "--batch", c->batch);
  INT_ITEM("config/seq", "--seq", c->seq);
  REAL_ITEM("config/lr", "--lr", c->lr);
  REAL_ITEM("config/ft_lr", "--ft-lr", c->ft_lr);
  INT_ITEM("config/refresh", "--refresh", c->refresh_every);
  INT_ITEM("config/tile_budget", "--tile-budget", c->tile_budget);
  INT_ITEM("config/loss_budget", "--loss-budget", c->loss_budget);
  INT_ITEM("config/log_every", "--log-every", c->log_every);
  INT_ITEM("config/eval_every", "--eval-every", c->eval_every);
  INT_ITEM("config/eval_tokens", "--eval-tokens", c->eval_tokens);
#undef INT_ITEM
#undef REAL_ITEM
  return n;
}

static void put_config(writer_t *w, const config_t *c) {
  cfg_item_t it[MAX_CFG];
  const int n = config_items(c, it);
  for (int i = 0; i < n; ++i) {
    if (it[i].kind == 0) put_i64(w, it[i].name, it[i].i);
    if (it[i].kind == 1) put_f64(w, it[i].name, it[i].x);
    if (it[i].kind == 2) put_text(w, it[i].name, it[i].text);
  }
}

static void item_text(const cfg_item_t *it, char *buf, size_t n) {
  if (it->kind == 0) snprintf(buf, n, "%lld", (long long)it->i);
  if (it->kind == 1) { /* the shortest form that reads back as the same double */
    snprintf(buf, n, "%.15g", it->x);
    if (strtod(buf, NULL) != it->x) snprintf(buf, n, "%.17g", it->x);
  }
  if (it->kind == 2) snprintf(buf, n, "%s", it->text);
}

static void check_config(const checkpoint_t *ck, const config_t *c) {
  cfg_item_t it[MAX_CFG];
  const int n = config_items(c, it);
  for (int i = 0; i < n; ++i) {
    cfg_item_t saved = it[i];
    char text[256] = "";
    if (it[i].kind == 0) saved.i = get_i64(ck, it[i].name);
    if (it[i].kind == 1) saved.x = get_f64(ck, it[i].name);
    if (it[i].kind == 2) get_text(ck, it[i].name, text, sizeof text);
    saved.text = text;
    const int same = it[i].kind == 0   ? saved.i == it[i].i
                     : it[i].kind == 1 ? memcmp(&saved.x, &it[i].x, sizeof(double)) == 0
                                       : strcmp(saved.text, it[i].text) == 0;
    if (!same) {
      char was[256], now[256];
      item_text(&saved, was, sizeof was);
      item_text(&it[i], now, sizeof now);
      ck_fail(ck,
              "%s: written by a run with %s %s, this run has %s %s (resume with the "
              "flags of the run that wrote it)",
              it[i].name, it[i].flag, was, it[i].flag, now);
    }
  }
}

static void data_names(char *bytes, char *crc, const char *task) {
  tensor_name(bytes, "data/%s/bytes", task);
  tensor_name(crc, "data/%s/crc32", task);
}

static void put_data(writer_t *w, const corpus_t *c, const char *task) {
  char nb[NAME_BYTES], nc[NAME_BYTES];
  data_names(nb, nc, task);
  put_i64(w, nb, c->size);
  put_i64(w, nc, crc32_update(0, c->bytes, (size_t)c->size));
}

static void check_data(const checkpoint_t *ck, const corpus_t *c, const char *task) {
  char nb[NAME_BYTES], nc[NAME_BYTES];
  data_names(nb, nc, task);
  const int64_t size = get_i64(ck, nb), crc = get_i64(ck, nc);
  const int64_t now = crc32_update(0, c->bytes, (size_t)c->size);
  if (size != c->size || crc != now)
    ck_fail(ck,
            "data/%s: written for a text of %lld bytes (CRC32 %08llx), this run's %s has "
            "%lld bytes (%08llx) (--data-dir)",
            task, (long long)size, (long long)crc, task, (long long)c->size,
            (long long)now);
}

/* A run's fields, by pointer, for writing and for reading back. */
typedef struct {
  const char *name;
  int real;
  void *p;
  int size; /* of the integer field */
} run_item_t;

static int run_items(run_t *r, run_item_t *it) {
  int n = 0;
#define RI(f) it[n++] = (run_item_t){#f, 0, &r->f, (int)sizeof r->f}
#define RR(f)              \
  it[n++] = (run_item_t) { \
#f, 1, &r->f, 0        \
  }
  RI(trainable);
  RR(a_before);
  RR(b_before);
  RR(a_after);
  RR(b_after);
  RR(first_loss);
  RR(last_loss);
  RR(seconds);
  RR(tokens_per_s);
  RR(qr_seconds);
  RI(qr_calls);
  RI(qr_matrices);
  RI(lib_peak);
  RI(state_bytes);
  RR(orth_max);
  RI(nevals);
#undef RI
#undef RR
  return n;
}

/* Its evaluations (nevals of each). */
static void run_arrays(run_t *r, run_item_t *it) {
  it[0] = (run_item_t){"eval_step", 0, r->eval_step, 8};
  it[1] = (run_item_t){"eval_a", 1, r->eval_a, 0};
  it[2] = (run_item_t){"eval_b", 1, r->eval_b, 0};
}

static const char *const phase_names[PHASES] = {"pre", "full", "osft"};

static int64_t int_field(const run_item_t *it) {
  if (it->size == 4) return *(const int *)it->p;
  int64_t v;
  memcpy(&v, it->p, 8);
  return v;
}

static void set_int_field(const run_item_t *it, int64_t v) {
  if (it->size == 4)
    *(int *)it->p = (int)v;
  else
    memcpy(it->p, &v, 8);
}

static void put_run(writer_t *w, int phase, const run_t *r) {
  run_t copy = *r;
  run_item_t it[32];
  const int n = run_items(&copy, it);
  char name[NAME_BYTES];
  for (int i = 0; i < n; ++i) {
    tensor_name(name, "run/%s/%s", phase_names[phase], it[i].name);
    if (it[i].real)
      put_f64(w, name, *(const double *)it[i].p);
    else
      put_i64(w, name, int_field(&it[i]));
  }
  run_arrays(&copy, it);
  for (int i = 0; i < 3 && r->nevals > 0; ++i)
    put(w, tensor_name(name, "run/%s/%s", phase_names[phase], it[i].name),
        it[i].real ? DT_F64 : DT_I64, 1, it[i].p, 1, r->nevals, r->nevals);
}

void checkpoint_load_run(const checkpoint_t *ck, int phase, run_t *r) {
  run_item_t it[32];
  const int n = run_items(r, it);
  char name[NAME_BYTES];
  for (int i = 0; i < n; ++i) {
    tensor_name(name, "run/%s/%s", phase_names[phase], it[i].name);
    if (it[i].real)
      *(double *)it[i].p = get_f64(ck, name);
    else
      set_int_field(&it[i], get_i64(ck, name));
  }
  if (r->nevals < 0 || r->nevals > MAX_EVALS)
    ck_fail(ck, "run/%s/nevals: %d outside [0, %d]", phase_names[phase], r->nevals,
            MAX_EVALS);
  run_arrays(r, it);
  for (int i = 0; i < 3 && r->nevals > 0; ++i)
    le_copy(it[i].p,
            get(ck, tensor_name(name, "run/%s/%s", phase_names[phase], it[i].name),
                it[i].real ? DT_F64 : DT_I64, 1, 1, r->nevals),
            (size_t)r->nevals, 8);
}

/* ------------------------------------------------ weights and factors */

static void put_weights(writer_t *w, const char *prefix, const weights_t *wt,
                        const dims_t *d, int skip_projections) {
  wtensor_t t[MAX_WTENSORS];
  const int n = weights_list(wt, d, t);
  char name[NAME_BYTES];
  for (int i = 0; i < n; ++i) {
    if (skip_projections && t[i].projection) continue;
    tensor_name(name, "%s/%s", prefix, t[i].name);
    put_f32(w, name, t[i].data, t[i].rows, t[i].cols, t[i].cols);
  }
}

static void get_weights(const checkpoint_t *ck, const char *prefix, weights_t *wt,
                        const dims_t *d, int skip_projections) {
  wtensor_t t[MAX_WTENSORS];
  const int n = weights_list(wt, d, t);
  char name[NAME_BYTES];
  for (int i = 0; i < n; ++i) {
    if (skip_projections && t[i].projection) continue;
    tensor_name(name, "%s/%s", prefix, t[i].name);
    get_f32(ck, name, t[i].data, t[i].rows, t[i].cols, t[i].cols);
  }
}

void checkpoint_load_pretrained(const checkpoint_t *ck, weights_t *w, const dims_t *d) {
  get_weights(ck, "pretrained", w, d, 0);
}

static const char *const factor_names[6] = {"u_high", "s_high", "v_high",
                                            "u_low",  "s_low",  "v_low"};

/* Every OSFT layer of the model with its name ("block0.mix", ..., "head"). */
static int osft_layers(model_t *m, osft_proj_t **p, char (*names)[32]) {
  int n = 0;
  for (int64_t b = 0; b < m->d.blocks; ++b) {
    osft_proj_t *layer[4] = {&m->mix_p[b], &m->gate_p[b], &m->up_p[b], &m->down_p[b]};
    const char *what[4] = {"mix", "gate", "up", "down"};
    for (int i = 0; i < 4; ++i) {
      p[n] = layer[i];
      snprintf(names[n++], 32, "block%lld.%s", (long long)b, what[i]);
    }
  }
  p[n] = &m->head_p;
  snprintf(names[n++], 32, "head");
  return n;
}

/* What a tensor visitor is given: a host view of one tensor of the
 * model's state. */
typedef void (*tensor_fn)(void *user, const char *name, float *data, int64_t rows,
                          int64_t cols, int64_t ld);

/* Visits the model's state: dense, every weight ("model/<weight>"); OSFT,
 * the embedding and norms and every layer's six factors
 * ("osft/<layer>/<factor>", host mirrors of the library's memory, uploaded
 * back after `fn` when `writes`). */
static void visit_model(model_t *m, int writes, tensor_fn fn, void *user) {
  wtensor_t t[MAX_WTENSORS];
  const int n = weights_list(&m->w, &m->d, t);
  char name[NAME_BYTES];
  for (int i = 0; i < n; ++i) {
    if (m->osft && t[i].projection) continue;
    tensor_name(name, "model/%s", t[i].name);
    fn(user, name, t[i].data, t[i].rows, t[i].cols, t[i].cols);
  }
  if (!m->osft) return;
  osft_proj_t *layers[4 * MAX_BLOCKS + 1];
  char names[4 * MAX_BLOCKS + 1][32];
  const int nl = osft_layers(m, layers, names);
  for (int i = 0; i < nl; ++i)
    for (int f = 0; f < 6; ++f) {
      dbuf_t b;
      factor_mirror(layers[i]->layer, (osft_flinear_factor_t)f, &b);
      tensor_name(name, "osft/%s/%s", names[i], factor_names[f]);
      fn(user, name, b.host, b.rows, b.cols, b.ld);
      if (writes) dbuf_upload(&b);
      dbuf_free(&b);
    }
}

static void put_tensor(void *user, const char *name, float *data, int64_t rows,
                       int64_t cols, int64_t ld) {
  put_f32(user, name, data, rows, cols, ld);
}

static void get_tensor(void *user, const char *name, float *data, int64_t rows,
                       int64_t cols, int64_t ld) {
  get_f32(user, name, data, rows, cols, ld);
}

static void crc_tensor(void *user, const char *name, float *data, int64_t rows,
                       int64_t cols, int64_t ld) {
  uint32_t *crc = user;
  *crc = crc32_update(*crc, name, strlen(name));
  for (int64_t i = 0; i < rows; ++i)
    *crc = crc32_update(*crc, data + i * ld, sizeof(float) * (size_t)cols);
}

/* Drops every OSFT layer's caches (the kept W): the next call builds W
 * from the factors alone, as a layer restored from them does. */
static void refresh_layers(model_t *m) {
  osft_proj_t *layers[4 * MAX_BLOCKS + 1];
  char names[4 * MAX_BLOCKS + 1][32];
  const int nl = osft_layers(m, layers, names);
  for (int i = 0; i < nl; ++i) CHECK(osft_flinear_refresh(layers[i]->layer));
}

void checkpoint_load_model(const checkpoint_t *ck, model_t *m) {
  visit_model(m, 1, get_tensor, (void *)ck);
  if (!m->osft) {
    model_params_to_dev(m); /* the weights' device sides */
    return;
  }
  refresh_layers(m);       /* frozen factors written: drop what was cached */
  model_params_to_host(m); /* the trainable factors' host mirrors */
  CHECK(osft_projector_invalidate(m->proj));
  CHECK(osft_projector_prepare(m->proj));
}

uint32_t model_digest(model_t *m) {
  uint32_t crc = 0;
  visit_model(m, 0, crc_tensor, &crc);
  return crc;
}

/* ------------------------------------------------------- the optimizer */

typedef struct {
  const char *name;
  float *data;
  int64_t rows, cols;
} state_tensor_t;

/* The optimizer's tensors of parameter p (those it has). */
static int state_tensors(const param_t *p, state_tensor_t *s) {
  int n = 0;
  s[n++] = (state_tensor_t){"m", p->m, p->rows, p->cols};
  s[n++] = (state_tensor_t){"v", p->v, p->rows, p->cols};
  if (p->l) s[n++] = (state_tensor_t){"l", p->l, p->rows, p->rows};
  if (p->ql) s[n++] = (state_tensor_t){"ql", p->ql, p->rows, p->rows};
  if (p->r) s[n++] = (state_tensor_t){"r", p->r, p->cols, p->cols};
  if (p->qr) s[n++] = (state_tensor_t){"qr", p->qr, p->cols, p->cols};
  return n;
}

static void state_name(char *buf, int i, const param_t *p, const char *what) {
  tensor_name(buf, "optim/%03d.%s/%s", i, p->name, what);
}

static void put_optimizer(writer_t *w, const optimizer_t *o) {
  put_i64(w, "optim/step", o->step);
  put_i64(w, "optim/qr_calls", o->qr_calls);
  put_i64(w, "optim/qr_matrices", o->qr_matrices);
  put_f64(w, "optim/qr_seconds", o->qr_seconds);
  char name[NAME_BYTES];
  for (int i = 0; i < o->nparams; ++i) {
    state_tensor_t s[6];
    const int n = state_tensors(o->params[i], s);
    for (int j = 0; j < n; ++j) {
      state_name(name, i, o->params[i], s[j].name);
      put_f32(w, name, s[j].data, s[j].rows, s[j].cols, s[j].cols);
    }
  }
}

void checkpoint_load_optimizer(const checkpoint_t *ck, optimizer_t *o) {
  o->step = get_i64(ck, "optim/step");
  o->qr_calls = get_i64(ck, "optim/qr_calls");
  o->qr_matrices = get_i64(ck, "optim/qr_matrices");
  o->qr_seconds = get_f64(ck, "optim/qr_seconds");
  char name[NAME_BYTES];
  for (int i = 0; i < o->nparams; ++i) {
    state_tensor_t s[6];
    const int n = state_tensors(o->params[i], s);
    for (int j = 0; j < n; ++j) {
      state_name(name, i, o->params[i], s[j].name);
      get_f32(ck, name, s[j].data, s[j].rows, s[j].cols, s[j].cols);
    }
  }
}

/* ------------------------------------------------------ the loop state */

static void put_loop(writer_t *w, const loop_state_t *t) {
  put_i64(w, "state/phase", t->phase);
  put_i64(w, "state/step", t->step);
  put_i64(w, "state/rng", (int64_t)t->rng.s);
  put_f64(w, "state/window_loss", t->window_loss);
  put_f64(w, "state/window_time", t->window_time);
  put_i64(w, "state/window_steps", t->window_steps);
  put_f64(w, "state/train_time", t->train_time);
}

void checkpoint_load_loop(const checkpoint_t *ck, loop_state_t *t) {
  t->phase = checkpoint_phase(ck);
  t->step = get_i64(ck, "state/step");
  t->rng.s = (uint64_t)get_i64(ck, "state/rng");
  t->window_loss = get_f64(ck, "state/window_loss");
  t->window_time = get_f64(ck, "state/window_time");
  t->window_steps = get_i64(ck, "state/window_steps");
  t->train_time = get_f64(ck, "state/train_time");
}

int checkpoint_phase(const checkpoint_t *ck) {
  return (int)get_i64(ck, "state/phase");
}

/* ------------------------------------------------------------ the API */

void checkpoint_save(const char *dir, const session_t *s, const loop_state_t *t,
                     model_t *m, const optimizer_t *o) {
  writer_t w;
  memset(&w, 0, sizeof w);
  char writer[256];
  snprintf(writer, sizeof writer, "osftrt_train, libosftrt %s", osft_version_string());
  put_text(&w, "meta/writer", writer);
  put_config(&w, s->c);
  put_data(&w, s->a, "task_a");
  put_data(&w, s->b, "task_b");
  put_loop(&w, t);
  for (int p = 0; p <= t->phase; ++p) put_run(&w, p, s->runs[p]);
  if (t->phase > PHASE_PRETRAIN)
    put_weights(&w, "pretrained", s->pretrained, &s->c->d, 0);
  visit_model(m, 0, put_tensor, &w);
  put_optimizer(&w, o);
  writer_commit(&w, dir);
  writer_free(&w);
  if (m->osft) refresh_layers(m);
}

checkpoint_t *checkpoint_open(const char *dir, const config_t *c, const corpus_t *a,
                              const corpus_t *b) {
  checkpoint_t *ck = checkpoint_read(dir);
  check_config(ck, c);
  check_data(ck, a, "task_a");
  check_data(ck, b, "task_b");
  const int64_t phase = get_i64(ck, "state/phase"), step = get_i64(ck, "state/step");
  const int64_t steps = phase == PHASE_PRETRAIN ? c->pretrain_steps : c->steps;
  if (phase < 0 || phase >= PHASES || step < 0 || step > steps)
    ck_fail(ck, "state/phase %lld, state/step %lld: outside this run's phases",
            (long long)phase, (long long)step);
  return ck;
}

void checkpoint_inspect(const char *dir) {
  checkpoint_t *ck = checkpoint_read(dir);
  uint64_t bytes = 0;
  printf("%s: format version %d, %d tensors, %zu bytes, every checksum verified\n",
         ck->path, FORMAT_VERSION, ck->n, ck->size);
  for (int i = 0; i < ck->n; ++i) {
    const entry_t *e = &ck->e[i];
    char shape[64];
    shape_text(e, shape, sizeof shape);
    printf("  %-36s %-22s %10llu bytes  crc32 %08x\n", e->name, shape,
           (unsigned long long)e->bytes, e->crc);
    bytes += e->bytes;
  }
  const int64_t phase = find(ck, "state/phase") ? get_i64(ck, "state/phase") : -1;
  if (phase >= 0 && phase < PHASES && find(ck, "state/step") != NULL)
    printf("phase %lld (%s), %lld steps of it done; %llu bytes of tensors\n",
           (long long)phase, phase_names[phase], (long long)get_i64(ck, "state/step"),
           (unsigned long long)bytes);
  checkpoint_close(ck);
}
