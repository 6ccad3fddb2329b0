/* No thread is created per call (issue 55): after a first round of calls
 * of every capability (FLCE, the OSFT layer's forward and backward, the
 * projection, the tiled MLP, the batched QR) at shapes that use the
 * library's threads, later rounds create none. The process runs under
 * `strace -f -e trace=clone,clone3` (tests/c/check_threads_created.sh),
 * which counts the threads created between two markers this program leaves
 * in the trace (failed opens of /osftrt-threads-test-marker/...). Run
 * alone it checks only that every round gives the same outputs, bit for
 * bit. */
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

#include "test_fixture.h"
#include "threads_testlib.h"

enum { ROUNDS = 20 };

/* A line in the trace: an open that fails (the path never exists). */
static void trace_marker(const char *name) {
  char path[96];
  snprintf(path, sizeof path, "/osftrt-threads-test-marker/%s", name);
  const int fd = open(path, O_RDONLY);
  if (fd >= 0) close(fd);
}

static void test_rounds_create_no_thread(void **state) {
  threads_work w;
  threads_work_init(&w, CTX, 1);
  threads_round(&w); /* the first call of each: pools and scratch start here */
  const uint64_t first = threads_checksum(&w);
  trace_marker("steady");
  for (int r = 0; r < ROUNDS; ++r) {
    threads_round(&w);
    if (threads_checksum(&w) != first)
      fail_msg("round %d: the outputs differ from the first round's", r + 1);
  }
  trace_marker("end");
  threads_work_free(&w);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_rounds_create_no_thread, tt_setup,
                                      tt_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
