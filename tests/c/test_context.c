/* Contexts: creation options, struct_size rules, handles, stream, workspace,
 * memory statistics, independence across threads. */
#include <pthread.h>
#include <string.h>

#include "test_util.h"

#define SENTINEL ((osft_context_t)(uintptr_t)0x5e5e5e5e)

static void test_create_cpu_with_defaults(void **state) {
  (void)state;
  osft_context_t ctx = NULL;
  assert_ok(osft_context_create(&ctx, NULL));
  assert_non_null(ctx);
  osft_device_type_t type = 0;
  int id = -1;
  assert_ok(osft_context_get_device(ctx, &type, &id));
  assert_int_equal(type, OSFT_DEVICE_CPU);
  assert_int_equal(id, 0);
  assert_ok(osft_context_get_device(ctx, NULL, NULL));
  assert_ok(osft_context_synchronize(ctx));
  assert_ok(osft_context_destroy(ctx));
}

static void test_options_init(void **state) {
  (void)state;
  osft_context_options_t o;
  memset(&o, 0xAB, sizeof o);
  assert_ok(OSFT_CONTEXT_OPTIONS_INIT(&o));
  assert_int_equal(o.struct_size, sizeof o);
  assert_int_equal(o.device_type, OSFT_DEVICE_CPU);
  assert_int_equal(o.device_id, 0);
  assert_null(o.stream);
  assert_null(o.allocator);
  assert_int_equal(o.workspace_limit, 0);

  assert_status(osft_context_options_init(NULL, sizeof o), OSFT_STATUS_INVALID_ARGUMENT);
  assert_error_mentions("opts");
  unsigned char before[sizeof o];
  memset(&o, 0xCD, sizeof o);
  memcpy(before, &o, sizeof o);
  assert_status(osft_context_options_init(&o, sizeof(size_t)),
                OSFT_STATUS_INVALID_STRUCT_SIZE);
  assert_error_mentions("struct_size");
  assert_memory_equal(&o, before, sizeof o); /* nothing written */
}

/* A caller compiled against a newer header: a bigger struct. */
typedef struct {
  osft_context_options_t v1;
  uint64_t future_field;
} newer_options;

static void test_options_from_a_newer_caller(void **state) {
  (void)state;
  newer_options n;
  memset(&n, 0xEE, sizeof n);
  assert_ok(osft_context_options_init(&n.v1, sizeof n));
  assert_int_equal(n.v1.struct_size, sizeof n);
  assert_int_equal(n.future_field, 0); /* zeroed: "default" */
  osft_context_t ctx = NULL;
  assert_ok(osft_context_create(&ctx, &n.v1));
  assert_ok(osft_context_destroy(ctx));
  /* An unknown field that is set cannot be honoured: refuse. */
  n.future_field = 1;
  ctx = SENTINEL;
  assert_status(osft_context_create(&ctx, &n.v1), OSFT_STATUS_INVALID_STRUCT_SIZE);
  assert_error_mentions("newer libosftrt");
  assert_ptr_equal(ctx, SENTINEL);
}

static void test_create_rejects_bad_options(void **state) {
  (void)state;
  osft_context_options_t o;
  osft_context_t ctx = SENTINEL;

  assert_status(osft_context_create(NULL, NULL), OSFT_STATUS_INVALID_ARGUMENT);

  assert_ok(OSFT_CONTEXT_OPTIONS_INIT(&o));
  o.struct_size = 4;
  assert_status(osft_context_create(&ctx, &o), OSFT_STATUS_INVALID_STRUCT_SIZE);
  assert_error_mentions("opts->struct_size");

  assert_ok(OSFT_CONTEXT_OPTIONS_INIT(&o));
  o.device_type = (osft_device_type_t)9;
  assert_status(osft_context_create(&ctx, &o), OSFT_STATUS_INVALID_ARGUMENT);
  assert_error_mentions("opts->device_type");

  assert_ok(OSFT_CONTEXT_OPTIONS_INIT(&o));
  o.device_id = 1;
  assert_status(osft_context_create(&ctx, &o), OSFT_STATUS_INVALID_ARGUMENT);
  assert_error_mentions("opts->device_id");

  assert_ok(OSFT_CONTEXT_OPTIONS_INIT(&o));
  o.stream = &o;
  assert_status(osft_context_create(&ctx, &o), OSFT_STATUS_INVALID_ARGUMENT);
  assert_error_mentions("opts->stream");

  assert_ok(OSFT_CONTEXT_OPTIONS_INIT(&o));
  o.device_type = OSFT_DEVICE_CUDA;
  o.device_id = -1;
  assert_status(osft_context_create(&ctx, &o), OSFT_STATUS_INVALID_ARGUMENT);
  assert_error_mentions("opts->device_id");
  assert_ptr_equal(ctx, SENTINEL);
}

static void test_cuda_request_without_gpu(void **state) {
  (void)state;
  int gpus = 0;
  assert_ok(osft_device_count(OSFT_DEVICE_CUDA, &gpus));
  osft_context_options_t o;
  assert_ok(OSFT_CONTEXT_OPTIONS_INIT(&o));
  o.device_type = OSFT_DEVICE_CUDA;
  o.device_id = gpus; /* one past the last GPU: never exists */
  osft_context_t ctx = SENTINEL;
  const osft_status_t expected = osft_has_feature(OSFT_FEATURE_CUDA)
                                     ? OSFT_STATUS_NO_DEVICE
                                     : OSFT_STATUS_NOT_SUPPORTED;
  assert_status(osft_context_create(&ctx, &o), expected);
  assert_error_mentions("opts->device_id");
  assert_ptr_equal(ctx, SENTINEL);
}

static void test_destroy_null_and_twice(void **state) {
  (void)state;
  assert_ok(osft_context_destroy(NULL));
  osft_context_t ctx = NULL;
  assert_ok(osft_context_create(&ctx, NULL));
  assert_ok(osft_context_destroy(ctx));
  assert_status(osft_context_destroy(ctx), OSFT_STATUS_INVALID_HANDLE);
  assert_error_mentions("ctx");
}

/* Every function that takes a context rejects NULL, a destroyed one and a
 * pointer that was never a context. */
static void expect_invalid_handle(osft_context_t ctx) {
  osft_device_type_t type;
  int id;
  void *stream;
  size_t bytes;
  osft_memory_stats_t stats;
  stats.struct_size = sizeof stats;
  assert_status(osft_context_get_device(ctx, &type, &id), OSFT_STATUS_INVALID_HANDLE);
  assert_status(osft_context_set_stream(ctx, NULL), OSFT_STATUS_INVALID_HANDLE);
  assert_status(osft_context_get_stream(ctx, &stream), OSFT_STATUS_INVALID_HANDLE);
  assert_status(osft_context_synchronize(ctx), OSFT_STATUS_INVALID_HANDLE);
  assert_status(osft_context_reserve_workspace(ctx, 64), OSFT_STATUS_INVALID_HANDLE);
  assert_status(osft_context_release_workspace(ctx), OSFT_STATUS_INVALID_HANDLE);
  assert_status(osft_context_get_workspace_size(ctx, &bytes), OSFT_STATUS_INVALID_HANDLE);
  assert_status(osft_context_get_memory_stats(ctx, &stats), OSFT_STATUS_INVALID_HANDLE);
  assert_status(osft_context_reset_peak_memory(ctx), OSFT_STATUS_INVALID_HANDLE);
  assert_error_mentions("ctx");
}

static void test_invalid_handles_are_rejected(void **state) {
  (void)state;
  expect_invalid_handle(NULL);
  osft_context_t ctx = NULL;
  assert_ok(osft_context_create(&ctx, NULL));
  assert_ok(osft_context_destroy(ctx));
  expect_invalid_handle(ctx);
  long not_a_context[16] = {0};
  expect_invalid_handle((osft_context_t)not_a_context);
  assert_status(osft_context_destroy((osft_context_t)not_a_context),
                OSFT_STATUS_INVALID_HANDLE);
}

static void test_stream_on_cpu(void **state) {
  (void)state;
  osft_context_t ctx = NULL;
  assert_ok(osft_context_create(&ctx, NULL));
  void *stream = &ctx;
  assert_ok(osft_context_get_stream(ctx, &stream));
  assert_null(stream);
  assert_ok(osft_context_set_stream(ctx, NULL));
  assert_status(osft_context_set_stream(ctx, &ctx), OSFT_STATUS_INVALID_ARGUMENT);
  assert_error_mentions("stream");
  assert_ok(osft_context_get_stream(ctx, &stream));
  assert_null(stream);
  assert_status(osft_context_get_stream(ctx, NULL), OSFT_STATUS_INVALID_ARGUMENT);
  assert_ok(osft_context_destroy(ctx));
}

static void test_workspace_grows_and_releases(void **state) {
  (void)state;
  osft_context_t ctx = NULL;
  assert_ok(osft_context_create(&ctx, NULL));
  size_t bytes = 1;
  assert_ok(osft_context_get_workspace_size(ctx, &bytes));
  assert_int_equal(bytes, 0);
  assert_ok(osft_context_reserve_workspace(ctx, 1000));
  assert_ok(osft_context_get_workspace_size(ctx, &bytes));
  assert_true(bytes >= 1000);
  assert_ok(osft_context_reserve_workspace(ctx, 10)); /* never shrinks */
  size_t after = 0;
  assert_ok(osft_context_get_workspace_size(ctx, &after));
  assert_int_equal(after, bytes);
  assert_ok(osft_context_reserve_workspace(ctx, 0));
  assert_ok(osft_context_release_workspace(ctx));
  assert_ok(osft_context_get_workspace_size(ctx, &bytes));
  assert_int_equal(bytes, 0);
  assert_ok(osft_context_release_workspace(ctx)); /* idempotent */
  assert_status(osft_context_get_workspace_size(ctx, NULL), OSFT_STATUS_INVALID_ARGUMENT);
  assert_ok(osft_context_destroy(ctx));
}

static void test_workspace_limit(void **state) {
  (void)state;
  osft_context_options_t o;
  assert_ok(OSFT_CONTEXT_OPTIONS_INIT(&o));
  o.workspace_limit = 4096;
  osft_context_t ctx = NULL;
  assert_ok(osft_context_create(&ctx, &o));
  assert_ok(osft_context_reserve_workspace(ctx, 4096));
  assert_status(osft_context_reserve_workspace(ctx, 4097), OSFT_STATUS_OUT_OF_MEMORY);
  assert_error_mentions("workspace_limit");
  size_t bytes = 0;
  assert_ok(osft_context_get_workspace_size(ctx, &bytes));
  assert_int_equal(bytes, 4096); /* the old workspace is kept */
  assert_ok(osft_context_destroy(ctx));
}

static void test_memory_stats(void **state) {
  (void)state;
  osft_context_t ctx = NULL;
  assert_ok(osft_context_create(&ctx, NULL));
  osft_memory_stats_t s;
  s.struct_size = sizeof s;
  assert_ok(osft_context_get_memory_stats(ctx, &s));
  assert_int_equal(s.struct_size, sizeof s);
  const uint64_t base = s.host_in_use; /* the context's own bookkeeping */
  assert_true(base > 0);
  assert_int_equal(s.device_in_use, 0);
  assert_int_equal(s.workspace_bytes, 0);

  assert_ok(osft_context_reserve_workspace(ctx, 1 << 20));
  assert_ok(osft_context_get_memory_stats(ctx, &s));
  assert_int_equal(s.host_in_use, base + (1 << 20));
  assert_int_equal(s.workspace_bytes, 1 << 20);
  assert_ok(osft_context_reserve_workspace(ctx, 3 << 20));
  assert_ok(osft_context_get_memory_stats(ctx, &s));
  /* The old block is freed before the new one is allocated: the peak is
   * the larger block, not both. */
  assert_int_equal(s.host_peak, base + (3 << 20));
  assert_ok(osft_context_release_workspace(ctx));
  assert_ok(osft_context_get_memory_stats(ctx, &s));
  assert_int_equal(s.host_in_use, base);
  assert_int_equal(s.host_peak, base + (3 << 20));
  assert_ok(osft_context_reset_peak_memory(ctx));
  assert_ok(osft_context_get_memory_stats(ctx, &s));
  assert_int_equal(s.host_peak, base);
  const uint64_t allocs = s.host_allocs;
  assert_int_equal(allocs, 3); /* context, 1 MiB, 3 MiB */

  /* Errors write nothing. */
  osft_memory_stats_t small;
  memset(&small, 0x77, sizeof small);
  small.struct_size = 8;
  osft_memory_stats_t copy = small;
  assert_status(osft_context_get_memory_stats(ctx, &small),
                OSFT_STATUS_INVALID_STRUCT_SIZE);
  assert_memory_equal(&small, &copy, sizeof small);
  assert_status(osft_context_get_memory_stats(ctx, NULL), OSFT_STATUS_INVALID_ARGUMENT);
  assert_error_mentions("stats");
  assert_ok(osft_context_destroy(ctx));
}

static void test_memory_stats_into_a_newer_struct(void **state) {
  (void)state;
  struct {
    osft_memory_stats_t v1;
    uint64_t future[2];
  } n;
  memset(&n, 0x77, sizeof n);
  n.v1.struct_size = sizeof n;
  osft_context_t ctx = NULL;
  assert_ok(osft_context_create(&ctx, NULL));
  assert_ok(osft_context_get_memory_stats(ctx, &n.v1));
  assert_int_equal(n.v1.struct_size, sizeof n);
  assert_int_equal(n.future[0], 0);
  assert_int_equal(n.future[1], 0);
  assert_true(n.v1.host_in_use > 0);
  assert_ok(osft_context_destroy(ctx));
}

/* Distinct contexts on distinct threads are independent. */
static void *context_churn(void *p) {
  int *ok = p;
  *ok = 1;
  for (int i = 0; i < 200 && *ok; ++i) {
    osft_context_t ctx = NULL;
    *ok &= osft_context_create(&ctx, NULL) == OSFT_STATUS_SUCCESS;
    *ok &=
        osft_context_reserve_workspace(ctx, (size_t)(i + 1) * 256) == OSFT_STATUS_SUCCESS;
    size_t bytes = 0;
    *ok &= osft_context_get_workspace_size(ctx, &bytes) == OSFT_STATUS_SUCCESS &&
           bytes == (size_t)(i + 1) * 256;
    *ok &= osft_context_destroy(ctx) == OSFT_STATUS_SUCCESS;
  }
  return NULL;
}

static void test_contexts_on_many_threads(void **state) {
  (void)state;
  pthread_t threads[4];
  int ok[4];
  for (int i = 0; i < 4; ++i)
    assert_int_equal(pthread_create(&threads[i], NULL, context_churn, &ok[i]), 0);
  for (int i = 0; i < 4; ++i) pthread_join(threads[i], NULL);
  for (int i = 0; i < 4; ++i) assert_true(ok[i]);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_create_cpu_with_defaults),
      cmocka_unit_test(test_options_init),
      cmocka_unit_test(test_options_from_a_newer_caller),
      cmocka_unit_test(test_create_rejects_bad_options),
      cmocka_unit_test(test_cuda_request_without_gpu),
      cmocka_unit_test(test_destroy_null_and_twice),
      cmocka_unit_test(test_invalid_handles_are_rejected),
      cmocka_unit_test(test_stream_on_cpu),
      cmocka_unit_test(test_workspace_grows_and_releases),
      cmocka_unit_test(test_workspace_limit),
      cmocka_unit_test(test_memory_stats),
      cmocka_unit_test(test_memory_stats_into_a_newer_struct),
      cmocka_unit_test(test_contexts_on_many_threads),
  };
  return cmocka_run_group_tests_name("context", tests, NULL, NULL);
}
