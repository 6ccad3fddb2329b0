/* LD_PRELOAD helper for .ci/stage_memcheck.sh: lets the environment pick
 * which tests of a CMocka program run, without changing the tests.
 *   CMOCKA_TEST_FILTER=pattern   run only the tests matching (* and ?)
 *   CMOCKA_SKIP_FILTER=pattern   skip the tests matching
 * (cmocka >= 1.1.6 has the functions but reads no environment variable.) */
#include <stdlib.h>

void cmocka_set_test_filter(const char *pattern);
void cmocka_set_skip_filter(const char *pattern);

__attribute__((constructor)) static void osft_cmocka_filter_from_env(void) {
  const char *run = getenv("CMOCKA_TEST_FILTER");
  const char *skip = getenv("CMOCKA_SKIP_FILTER");
  if (run != NULL && run[0] != '\0') cmocka_set_test_filter(run);
  if (skip != NULL && skip[0] != '\0') cmocka_set_skip_filter(skip);
}
