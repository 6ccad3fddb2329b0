/* The CMocka fixture the capability tests share: each test gets a fresh
 * context on the device under test (the CPU, or a GPU when the file is built
 * with OSFT_TEST_CUDA) in *state, destroyed when the test ends. Register a
 * test with
 *
 *   cmocka_unit_test_setup_teardown(test_x, tt_setup, tt_teardown)
 *
 * and reach its context as CTX. Tests that build their own context (a
 * counting allocator, a workspace limit) use plain cmocka_unit_test(). */
#ifndef OSFTRT_TEST_FIXTURE_H
#define OSFTRT_TEST_FIXTURE_H

#include "osftrt/osftrt.h"
#include "test_util.h"

/* Creates the context (tt_context(NULL)) into *state. */
int tt_setup(void **state);
/* Destroys it; fails the test if the context refuses to go (a handle of
 * the test still alive). */
int tt_teardown(void **state);

/* The same fixture, and the test fails if the library logged a warning
 * while it ran (e.g. a layer outgrowing the workspace an operation reserved
 * for it). It owns the log callback for the test's duration. */
int tt_setup_quiet(void **state);
int tt_teardown_quiet(void **state);

/* The fixture's context, inside a test function taking `void **state`. */
#define CTX ((osft_context_t)*state)

#endif
