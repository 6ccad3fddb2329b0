/* Caller allocator callbacks: every byte goes through them, every block
 * comes back, and injected failures are reported without leaks or damage. */
#include <string.h>

#include "test_util.h"

#define SENTINEL ((osft_context_t)(uintptr_t)0x5e5e5e5e)

static void assert_balanced(const test_alloc_state *s) {
  assert_int_equal(s->host_allocs, s->host_frees);
  assert_int_equal(s->device_allocs, s->device_frees);
  assert_int_equal(s->host_bytes_live, 0);
  assert_int_equal(s->device_bytes_live, 0);
  assert_false(s->size_mismatch);
}

static void test_allocator_init(void **state) {
  (void)state;
  osft_allocator_t a;
  memset(&a, 0xAB, sizeof a);
  assert_ok(OSFT_ALLOCATOR_INIT(&a));
  assert_int_equal(a.struct_size, sizeof a);
  assert_null(a.user);
  assert_null(a.host_alloc);
  assert_null(a.host_free);
  assert_null(a.device_alloc);
  assert_null(a.device_free);
  assert_status(osft_allocator_init(NULL, sizeof a), OSFT_STATUS_INVALID_ARGUMENT);
  assert_error_mentions("allocator");
  osft_allocator_t before = a;
  assert_status(osft_allocator_init(&a, 3), OSFT_STATUS_INVALID_STRUCT_SIZE);
  assert_memory_equal(&a, &before, sizeof a);
}

static void test_every_host_byte_goes_through_the_callbacks(void **state) {
  (void)state;
  test_alloc_state s;
  test_alloc_reset(&s);
  osft_allocator_t a;
  test_alloc_callbacks(&a, &s, 0);
  osft_context_options_t o;
  assert_ok(OSFT_CONTEXT_OPTIONS_INIT(&o));
  o.allocator = &a;
  osft_context_t ctx = NULL;
  assert_ok(osft_context_create(&ctx, &o));
  assert_int_equal(s.host_allocs, 1); /* the context itself */
  assert_ok(osft_context_reserve_workspace(ctx, 12345));
  assert_int_equal(s.host_allocs, 2);
  assert_true(s.host_bytes_live >= 12345);
  osft_memory_stats_t st;
  st.struct_size = sizeof st;
  assert_ok(osft_context_get_memory_stats(ctx, &st));
  assert_int_equal(st.host_in_use, s.host_bytes_live); /* counted identically */
  assert_int_equal(st.host_allocs, 2);
  assert_ok(osft_context_reserve_workspace(ctx, 99999));
  assert_int_equal(s.host_frees, 1); /* the smaller workspace went back */
  assert_ok(osft_context_destroy(ctx));
  assert_balanced(&s);
}

static void test_allocator_struct_is_copied(void **state) {
  (void)state;
  test_alloc_state s;
  test_alloc_reset(&s);
  osft_allocator_t a;
  test_alloc_callbacks(&a, &s, 0);
  osft_context_options_t o;
  assert_ok(OSFT_CONTEXT_OPTIONS_INIT(&o));
  o.allocator = &a;
  osft_context_t ctx = NULL;
  assert_ok(osft_context_create(&ctx, &o));
  memset(&a, 0, sizeof a); /* the caller's struct need not outlive create */
  assert_ok(osft_context_reserve_workspace(ctx, 100));
  assert_ok(osft_context_destroy(ctx));
  assert_int_equal(s.host_allocs, 2);
  assert_balanced(&s);
}

static void test_half_set_pairs_are_rejected(void **state) {
  (void)state;
  test_alloc_state s;
  test_alloc_reset(&s);
  osft_allocator_t a;
  osft_context_options_t o;
  assert_ok(OSFT_CONTEXT_OPTIONS_INIT(&o));
  o.allocator = &a;
  osft_context_t ctx = SENTINEL;

  test_alloc_callbacks(&a, &s, 0);
  a.host_free = NULL;
  assert_status(osft_context_create(&ctx, &o), OSFT_STATUS_INVALID_ARGUMENT);
  assert_error_mentions("host_free");

  test_alloc_callbacks(&a, &s, 1);
  a.device_alloc = NULL;
  assert_status(osft_context_create(&ctx, &o), OSFT_STATUS_INVALID_ARGUMENT);
  assert_error_mentions("device_alloc");

  test_alloc_callbacks(&a, &s, 0);
  a.struct_size = 2;
  assert_status(osft_context_create(&ctx, &o), OSFT_STATUS_INVALID_STRUCT_SIZE);
  assert_error_mentions("opts->allocator->struct_size");
  assert_ptr_equal(ctx, SENTINEL);
  assert_int_equal(s.host_allocs, 0);
}

static void test_failing_context_allocation(void **state) {
  (void)state;
  test_alloc_state s;
  test_alloc_reset(&s);
  s.fail_host_after = 0;
  osft_allocator_t a;
  test_alloc_callbacks(&a, &s, 0);
  osft_context_options_t o;
  assert_ok(OSFT_CONTEXT_OPTIONS_INIT(&o));
  o.allocator = &a;
  osft_context_t ctx = SENTINEL;
  assert_status(osft_context_create(&ctx, &o), OSFT_STATUS_OUT_OF_MEMORY);
  assert_error_mentions("host_alloc returned NULL");
  assert_ptr_equal(ctx, SENTINEL);
  assert_balanced(&s);
}

/* Fail the n-th allocation of a fixed sequence of calls, for every n: each
 * failure is OUT_OF_MEMORY, leaves the workspace as it was, and in the end
 * every block has come back. */
static void test_failure_at_every_allocation(void **state) {
  (void)state;
  for (long n = 0; n < 5; ++n) {
    test_alloc_state s;
    test_alloc_reset(&s);
    s.fail_host_after = n;
    osft_allocator_t a;
    test_alloc_callbacks(&a, &s, 0);
    osft_context_options_t o;
    assert_ok(OSFT_CONTEXT_OPTIONS_INIT(&o));
    o.allocator = &a;
    osft_context_t ctx = NULL;
    osft_status_t st = osft_context_create(&ctx, &o);
    if (n == 0) {
      assert_int_equal(st, OSFT_STATUS_OUT_OF_MEMORY);
      assert_balanced(&s);
      continue;
    }
    assert_int_equal(st, OSFT_STATUS_SUCCESS);
    const size_t sizes[3] = {1000, 5000, 20000};
    size_t expected = 0;
    for (int k = 0; k < 3; ++k) {
      st = osft_context_reserve_workspace(ctx, sizes[k]);
      if (k + 1 == n) {
        assert_int_equal(st, OSFT_STATUS_OUT_OF_MEMORY);
        assert_error_mentions("workspace");
        expected = 0; /* the old block was freed and cannot be had again */
      } else if (k + 1 < n) {
        assert_int_equal(st, OSFT_STATUS_SUCCESS);
        expected = sizes[k];
      } else {
        assert_int_equal(st, OSFT_STATUS_OUT_OF_MEMORY); /* still failing */
      }
      size_t bytes = 0;
      assert_ok(osft_context_get_workspace_size(ctx, &bytes));
      assert_int_equal(bytes, expected);
    }
    assert_ok(osft_context_destroy(ctx));
    assert_balanced(&s);
  }
}

/* A growth the allocator refuses (too big) gives the old size back. */
static void test_refused_growth_keeps_the_old_size(void **state) {
  (void)state;
  test_alloc_state s;
  test_alloc_reset(&s);
  osft_allocator_t a;
  test_alloc_callbacks(&a, &s, 0);
  osft_context_options_t o;
  assert_ok(OSFT_CONTEXT_OPTIONS_INIT(&o));
  o.allocator = &a;
  osft_context_t ctx = NULL;
  assert_ok(osft_context_create(&ctx, &o));
  assert_ok(osft_context_reserve_workspace(ctx, 1000));
  s.fail_host_above = 4000;
  assert_status(osft_context_reserve_workspace(ctx, 5000), OSFT_STATUS_OUT_OF_MEMORY);
  size_t bytes = 0;
  assert_ok(osft_context_get_workspace_size(ctx, &bytes));
  assert_int_equal(bytes, 1000);
  assert_ok(osft_context_destroy(ctx));
  assert_balanced(&s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_allocator_init),
      cmocka_unit_test(test_every_host_byte_goes_through_the_callbacks),
      cmocka_unit_test(test_allocator_struct_is_copied),
      cmocka_unit_test(test_half_set_pairs_are_rejected),
      cmocka_unit_test(test_failing_context_allocation),
      cmocka_unit_test(test_failure_at_every_allocation),
      cmocka_unit_test(test_refused_growth_keeps_the_old_size),
  };
  return cmocka_run_group_tests_name("allocator", tests, NULL, NULL);
}
