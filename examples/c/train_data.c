/*
 * osftrt_train — the two tasks and their batches, error helpers, a seeded
 * RNG. Plain C: nothing here calls libosftrt except to report its errors.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "train.h"

void train_check(osft_status_t st, const char *what, const char *file, int line) {
  if (st == OSFT_STATUS_SUCCESS) return;
  fflush(stdout);
  fprintf(stderr, "osftrt_train: libosftrt error %s (%d) in %s\n  at %s:%d\n  %s\n",
          osft_status_string(st), (int)st, what, file, line, osft_last_error());
  exit(2);
}

void train_fail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fflush(stdout);
  fprintf(stderr, "osftrt_train: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  exit(1);
}

void *xcalloc(size_t count, size_t size) {
  void *p = calloc(count ? count : 1, size ? size : 1);
  if (p == NULL) train_fail("out of host memory (%zu x %zu bytes)", count, size);
  return p;
}

double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* splitmix64: small, fast, and the same on every platform. */
void rng_seed(rng_t *r, uint64_t seed) {
  r->s = seed * 0x9E3779B97F4A7C15ull + 1;
}

uint64_t rng_next(rng_t *r) {
  uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

double rng_uniform(rng_t *r) {
  return (double)(rng_next(r) >> 11) * 0x1.0p-53;
}

double rng_normal(rng_t *r) {
  const double u1 = 1.0 - rng_uniform(r), u2 = rng_uniform(r);
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

void corpus_load(corpus_t *c, const char *name, const char *path) {
  FILE *f = fopen(path, "rb");
  if (f == NULL) train_fail("cannot open %s (task %s); pass --data-dir", path, name);
  fseek(f, 0, SEEK_END);
  const long size = ftell(f);
  fseek(f, 0, SEEK_SET);
  if (size < 4096) train_fail("%s: only %ld bytes, need at least 4096", path, size);
  c->name = name;
  c->bytes = xcalloc((size_t)size, 1);
  if (fread(c->bytes, 1, (size_t)size, f) != (size_t)size)
    train_fail("cannot read %s", path);
  fclose(f);
  c->size = size;
  c->train_end = size - size / 8; /* the last eighth is held out */
}

void corpus_free(corpus_t *c) {
  free(c->bytes);
  c->bytes = NULL;
}

void batch_alloc(batch_t *b, int64_t tokens, int64_t k) {
  b->tokens = tokens;
  b->k = k;
  b->context = xcalloc((size_t)(tokens * k), 1);
  b->targets = xcalloc((size_t)tokens, sizeof(int64_t));
}

void batch_free(batch_t *b) {
  free(b->context);
  free(b->targets);
}

/* Token at text position p (p >= k): context bytes p-k .. p-1, target p. */
static void set_token(batch_t *b, int64_t i, const unsigned char *text, int64_t p) {
  memcpy(b->context + i * b->k, text + p - b->k, (size_t)b->k);
  b->targets[i] = text[p];
}

void batch_sample(batch_t *b, const corpus_t *c, rng_t *r, int64_t sequences,
                  int64_t seq) {
  if (sequences * seq != b->tokens) train_fail("batch_sample: bad batch size");
  const int64_t span = c->train_end - seq - b->k;
  for (int64_t s = 0; s < sequences; ++s) {
    const int64_t start = b->k + (int64_t)(rng_next(r) % (uint64_t)span);
    for (int64_t t = 0; t < seq; ++t) set_token(b, s * seq + t, c->bytes, start + t);
  }
}

void batch_eval(batch_t *b, const corpus_t *c, int64_t first) {
  const int64_t held = c->size - c->train_end;
  for (int64_t i = 0; i < b->tokens; ++i)
    set_token(b, i, c->bytes, c->train_end + (first + i) % held);
}
