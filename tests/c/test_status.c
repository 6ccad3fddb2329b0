/* Status codes, osft_status_string and the thread-local error message. */
#include <pthread.h>
#include <string.h>

#include "test_util.h"

static void test_status_names_are_distinct(void **state) {
  (void)state;
  const char *seen[18];
  for (int s = 0; s <= OSFT_STATUS_INTERNAL_ERROR; ++s) {
    const char *name = osft_status_string((osft_status_t)s);
    assert_non_null(name);
    assert_true(strlen(name) > 0);
    assert_string_not_equal(name, "unknown status");
    for (int j = 0; j < s; ++j) assert_string_not_equal(name, seen[j]);
    seen[s] = name;
  }
  assert_string_equal(osft_status_string((osft_status_t)18), "unknown status");
  assert_string_equal(osft_status_string((osft_status_t)-1), "unknown status");
}

static void test_status_values_are_fixed(void **state) {
  (void)state;
  /* ABI: these numbers are frozen (ABI.md). */
  assert_int_equal(OSFT_STATUS_SUCCESS, 0);
  assert_int_equal(OSFT_STATUS_INVALID_ARGUMENT, 1);
  assert_int_equal(OSFT_STATUS_INVALID_HANDLE, 2);
  assert_int_equal(OSFT_STATUS_INVALID_STRUCT_SIZE, 3);
  assert_int_equal(OSFT_STATUS_DTYPE_MISMATCH, 4);
  assert_int_equal(OSFT_STATUS_SHAPE_MISMATCH, 5);
  assert_int_equal(OSFT_STATUS_BAD_LAYOUT, 6);
  assert_int_equal(OSFT_STATUS_DEVICE_MISMATCH, 7);
  assert_int_equal(OSFT_STATUS_ALIASING, 8);
  assert_int_equal(OSFT_STATUS_INDEX_OUT_OF_RANGE, 9);
  assert_int_equal(OSFT_STATUS_OUT_OF_MEMORY, 10);
  assert_int_equal(OSFT_STATUS_NO_DEVICE, 11);
  assert_int_equal(OSFT_STATUS_NOT_SUPPORTED, 12);
  assert_int_equal(OSFT_STATUS_BACKEND_ERROR, 13);
  assert_int_equal(OSFT_STATUS_COMM_ERROR, 14);
  assert_int_equal(OSFT_STATUS_TIMEOUT, 15);
  assert_int_equal(OSFT_STATUS_NUMERICAL_ERROR, 16);
  assert_int_equal(OSFT_STATUS_INTERNAL_ERROR, 17);
}

static void test_last_error_names_function_and_argument(void **state) {
  (void)state;
  osft_clear_last_error();
  assert_string_equal(osft_last_error(), "");
  assert_status(osft_context_create(NULL, NULL), OSFT_STATUS_INVALID_ARGUMENT);
  assert_error_mentions("osft_context_create");
  assert_error_mentions("ctx");
  assert_error_mentions("NULL");
}

static void test_success_keeps_last_error_until_cleared(void **state) {
  (void)state;
  assert_status(osft_context_create(NULL, NULL), OSFT_STATUS_INVALID_ARGUMENT);
  char before[512];
  strncpy(before, osft_last_error(), sizeof before - 1);
  before[sizeof before - 1] = '\0';
  int n = 0;
  assert_ok(osft_device_count(OSFT_DEVICE_CPU, &n));
  assert_string_equal(osft_last_error(), before);
  osft_clear_last_error();
  assert_string_equal(osft_last_error(), "");
}

static void test_a_new_failure_replaces_the_message(void **state) {
  (void)state;
  assert_status(osft_context_create(NULL, NULL), OSFT_STATUS_INVALID_ARGUMENT);
  assert_status(osft_device_count((osft_device_type_t)99, NULL),
                OSFT_STATUS_INVALID_ARGUMENT);
  assert_error_mentions("osft_device_count");
  assert_null(strstr(osft_last_error(), "osft_context_create"));
}

/* Two threads fail differently, in lock-step, and each must see only its
 * own message; a third thread that never failed sees "". */
typedef struct {
  pthread_barrier_t *barrier;
  int which;
  int ok;
} thread_arg;

static void *fail_in_thread(void *p) {
  thread_arg *a = p;
  pthread_barrier_wait(a->barrier);
  if (a->which == 0) {
    a->ok = osft_context_create(NULL, NULL) == OSFT_STATUS_INVALID_ARGUMENT;
  } else if (a->which == 1) {
    osft_context_options_t o;
    a->ok = osft_context_options_init(&o, 1) == OSFT_STATUS_INVALID_STRUCT_SIZE;
  } else {
    a->ok = 1;
  }
  pthread_barrier_wait(a->barrier); /* both have failed now */
  const char *msg = osft_last_error();
  if (a->which == 0)
    a->ok &= strstr(msg, "osft_context_create") != NULL &&
             strstr(msg, "osft_context_options_init") == NULL;
  else if (a->which == 1)
    a->ok &= strstr(msg, "osft_context_options_init") != NULL &&
             strstr(msg, "struct_size") != NULL;
  else
    a->ok &= msg[0] == '\0';
  return NULL;
}

static void test_last_error_is_thread_local(void **state) {
  (void)state;
  pthread_barrier_t barrier;
  pthread_barrier_init(&barrier, NULL, 3);
  pthread_t threads[3];
  thread_arg args[3];
  for (int i = 0; i < 3; ++i) {
    args[i] = (thread_arg){&barrier, i, 0};
    assert_int_equal(pthread_create(&threads[i], NULL, fail_in_thread, &args[i]), 0);
  }
  for (int i = 0; i < 3; ++i) pthread_join(threads[i], NULL);
  pthread_barrier_destroy(&barrier);
  for (int i = 0; i < 3; ++i) assert_true(args[i].ok);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_status_names_are_distinct),
      cmocka_unit_test(test_status_values_are_fixed),
      cmocka_unit_test(test_last_error_names_function_and_argument),
      cmocka_unit_test(test_success_keeps_last_error_until_cleared),
      cmocka_unit_test(test_a_new_failure_replaces_the_message),
      cmocka_unit_test(test_last_error_is_thread_local),
  };
  return cmocka_run_group_tests_name("status", tests, NULL, NULL);
}
