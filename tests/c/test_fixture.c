#include "test_fixture.h"

#include <stdio.h>

#include "test_tensors.h"

int tt_setup(void **state) {
  *state = tt_context(NULL);
  return 0;
}

int tt_teardown(void **state) {
  assert_ok(osft_context_destroy((osft_context_t)*state));
  return 0;
}

/* Warnings logged since tt_setup_quiet(), and the last one's text. */
static int g_warnings;
static char g_last_warning[512];

static void count_warnings(void *user, osft_log_level_t level, const char *message) {
  (void)user;
  if (level != OSFT_LOG_WARN) return;
  ++g_warnings;
  snprintf(g_last_warning, sizeof g_last_warning, "%s", message);
}

int tt_setup_quiet(void **state) {
  assert_ok(osft_set_log_callback(count_warnings, NULL, OSFT_LOG_WARN));
  g_warnings = 0;
  return tt_setup(state);
}

int tt_teardown_quiet(void **state) {
  tt_teardown(state);
  assert_ok(osft_set_log_callback(NULL, NULL, OSFT_LOG_OFF));
  if (g_warnings != 0)
    fail_msg("%d warning(s), the last: %s", g_warnings, g_last_warning);
  return 0;
}
