/* The plan the fused linear cross-entropy tests run (header-only, shared
 * with tests/mpi): every numerics test runs twice under ctest, once as
 * built (the planner's automatic choice, mostly token chunks at these
 * shapes) and once with OSFT_TEST_FLCE_CHUNKING=vocab in the environment
 * (the `_vocab` entries of tests/CMakeLists.txt), which forces the
 * vocabulary plan with about three slices per call, the last one ragged. */
#ifndef OSFTRT_FLCE_TEST_PLAN_H
#define OSFTRT_FLCE_TEST_PLAN_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "osftrt/flce.h"

/* OSFT_FLCE_CHUNKING_VOCAB under OSFT_TEST_FLCE_CHUNKING=vocab, TOKENS under
 * =tokens, else AUTO. */
static inline osft_flce_chunking_t flce_test_chunking(void) {
  const char *e = getenv("OSFT_TEST_FLCE_CHUNKING");
  if (e != NULL && strcmp(e, "vocab") == 0) return OSFT_FLCE_CHUNKING_VOCAB;
  if (e != NULL && strcmp(e, "tokens") == 0) return OSFT_FLCE_CHUNKING_TOKENS;
  return OSFT_FLCE_CHUNKING_AUTO;
}

/* Classes per slice for V classes under the vocabulary plan: three slices
 * where V allows (the last one narrower unless 3 divides V), one for V = 1. */
static inline int64_t flce_test_slice_cols(int64_t v) {
  return v < 3 ? 1 : (v + 2) / 3;
}

/* Sets the plan of the test run on a handle's options. */
static inline void flce_test_plan_options(osft_flce_options_t *o, int64_t v) {
  o->chunking = flce_test_chunking();
  o->slice_cols = o->chunking == OSFT_FLCE_CHUNKING_VOCAB ? flce_test_slice_cols(v) : 0;
}

#endif
