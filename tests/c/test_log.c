/* The log sink: delivery, level filtering, removal, concurrency. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "test_util.h"

typedef struct {
  pthread_mutex_t mutex;
  int count[5];
  char last[1024];
  osft_log_level_t last_level;
} log_capture;

static void capture(void *user, osft_log_level_t level, const char *message) {
  log_capture *c = user;
  pthread_mutex_lock(&c->mutex);
  if (level >= 0 && level <= 4) c->count[level]++;
  snprintf(c->last, sizeof c->last, "%s", message);
  c->last_level = level;
  pthread_mutex_unlock(&c->mutex);
}

static int setup(void **state) {
  static log_capture c;
  memset(&c, 0, sizeof c);
  pthread_mutex_init(&c.mutex, NULL);
  *state = &c;
  return 0;
}

static int teardown(void **state) {
  log_capture *c = *state;
  osft_set_log_callback(NULL, NULL, OSFT_LOG_OFF);
  pthread_mutex_destroy(&c->mutex);
  return 0;
}

static void test_errors_reach_the_callback(void **state) {
  log_capture *c = *state;
  assert_ok(osft_set_log_callback(capture, c, OSFT_LOG_ERROR));
  assert_status(osft_context_create(NULL, NULL), OSFT_STATUS_INVALID_ARGUMENT);
  assert_int_equal(c->count[OSFT_LOG_ERROR], 1);
  assert_int_equal(c->last_level, OSFT_LOG_ERROR);
  assert_string_equal(c->last, osft_last_error());
}

static void test_level_filters_messages(void **state) {
  log_capture *c = *state;
  osft_context_t ctx = NULL;
  /* ERROR: context creation (INFO) is not delivered. */
  assert_ok(osft_set_log_callback(capture, c, OSFT_LOG_ERROR));
  assert_ok(osft_context_create(&ctx, NULL));
  assert_ok(osft_context_destroy(ctx));
  assert_int_equal(c->count[OSFT_LOG_INFO], 0);
  /* INFO: it is; DEBUG messages (workspace growth) are not. */
  assert_ok(osft_set_log_callback(capture, c, OSFT_LOG_INFO));
  assert_ok(osft_context_create(&ctx, NULL));
  assert_int_equal(c->count[OSFT_LOG_INFO], 1);
  assert_non_null(strstr(c->last, "CPU context"));
  assert_ok(osft_context_reserve_workspace(ctx, 4096));
  assert_int_equal(c->count[OSFT_LOG_DEBUG], 0);
  /* DEBUG: workspace growth is reported. */
  assert_ok(osft_set_log_callback(capture, c, OSFT_LOG_DEBUG));
  assert_ok(osft_context_reserve_workspace(ctx, 8192));
  assert_int_equal(c->count[OSFT_LOG_DEBUG], 1);
  assert_non_null(strstr(c->last, "workspace"));
  assert_ok(osft_context_destroy(ctx));
  /* OFF: nothing at all, not even errors. */
  assert_ok(osft_set_log_callback(capture, c, OSFT_LOG_OFF));
  assert_status(osft_context_create(NULL, NULL), OSFT_STATUS_INVALID_ARGUMENT);
  assert_int_equal(c->count[OSFT_LOG_ERROR], 0);
}

static void test_null_callback_removes_the_sink(void **state) {
  log_capture *c = *state;
  assert_ok(osft_set_log_callback(capture, c, OSFT_LOG_DEBUG));
  assert_ok(osft_set_log_callback(NULL, NULL, OSFT_LOG_DEBUG));
  assert_status(osft_context_create(NULL, NULL), OSFT_STATUS_INVALID_ARGUMENT);
  assert_int_equal(c->count[OSFT_LOG_ERROR], 0);
}

static void test_bad_level_keeps_previous_sink(void **state) {
  log_capture *c = *state;
  assert_ok(osft_set_log_callback(capture, c, OSFT_LOG_ERROR));
  assert_status(osft_set_log_callback(capture, NULL, (osft_log_level_t)5),
                OSFT_STATUS_INVALID_ARGUMENT);
  assert_error_mentions("max_level");
  /* The rejected call was itself logged to the sink that stayed. */
  assert_int_equal(c->count[OSFT_LOG_ERROR], 1);
  assert_status(osft_set_log_callback(capture, NULL, (osft_log_level_t)-1),
                OSFT_STATUS_INVALID_ARGUMENT);
  assert_int_equal(c->count[OSFT_LOG_ERROR], 2);
}

static void *fail_many_times(void *p) {
  (void)p;
  for (int i = 0; i < 500; ++i) osft_context_create(NULL, NULL);
  return NULL;
}

static void test_callback_from_many_threads(void **state) {
  log_capture *c = *state;
  assert_ok(osft_set_log_callback(capture, c, OSFT_LOG_ERROR));
  pthread_t threads[4];
  for (int i = 0; i < 4; ++i)
    assert_int_equal(pthread_create(&threads[i], NULL, fail_many_times, NULL), 0);
  for (int i = 0; i < 4; ++i) pthread_join(threads[i], NULL);
  assert_int_equal(c->count[OSFT_LOG_ERROR], 2000);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_errors_reach_the_callback, setup, teardown),
      cmocka_unit_test_setup_teardown(test_level_filters_messages, setup, teardown),
      cmocka_unit_test_setup_teardown(test_null_callback_removes_the_sink, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_bad_level_keeps_previous_sink, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_callback_from_many_threads, setup, teardown),
  };
  return cmocka_run_group_tests_name("log", tests, NULL, NULL);
}
