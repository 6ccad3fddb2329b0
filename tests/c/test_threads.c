/* The library's CPU thread count and pool (osft_set_num_threads,
 * osft_get_num_threads; issue 55):
 *   - the count follows the environment or the CPUs of the process's
 *     affinity (what ctest sets for each run: OSFT_TEST_EXPECT_THREADS, or
 *     unset for the affinity's count), and the BLAS engine is told it;
 *   - an explicit count is followed by the count, the BLAS engine and the
 *     pool (count - 1 workers, grown when the count grows), and 0 goes back
 *     to the automatic count; results stay those of one thread;
 *   - bad input is refused with a message naming the argument, nothing
 *     changed;
 *   - a forked child gets a fresh pool and computes what the parent did,
 *     even when the parent forked while another thread was in a call;
 *   - contexts on several threads at once give each thread's serial results.
 * Linked against the static library to read the pool's size and the
 * engine's count (osfti_cpu_threads). */
#define _GNU_SOURCE
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/context_impl.h"
#include "test_fixture.h"
#include "threads_testlib.h"

/* The count the environment of this run should give. */
static int expected_count(void) {
  const char *e = getenv("OSFT_TEST_EXPECT_THREADS");
  if (e && *e) return atoi(e);
  cpu_set_t set;
  CPU_ZERO(&set);
  assert_int_equal(sched_getaffinity(0, sizeof set, &set), 0);
  const int n = CPU_COUNT(&set);
  return n < 1024 ? n : 1024;
}

typedef struct {
  int count, workers, blas;
} threads_state;

static threads_state state_now(void) {
  threads_state s;
  osfti_cpu_threads(&s.count, &s.workers, &s.blas);
  int n = 0;
  assert_ok(osft_get_num_threads(&n));
  assert_int_equal(n, s.count);
  return s;
}

/* Runs one round and checks the pool and the engine against `count`. */
static void expect_threads(threads_work *w, int count) {
  threads_round(w);
  const threads_state s = state_now();
  if (s.count != count || s.blas != count || s.workers < count - 1)
    fail_msg("expected %d threads: count %d, BLAS %d, pool workers %d", count, s.count,
             s.blas, s.workers);
}

/* ------------------------------------------------------- the count */

static void test_count_follows_environment(void **state) {
  const int want = expected_count();
  threads_work w;
  threads_work_init(&w, CTX, 1);
  const threads_state before = state_now();
  assert_int_equal(before.count, want);
  assert_int_equal(before.blas, want);
  expect_threads(&w, want);
  /* exactly count - 1 workers, and no more with more calls */
  assert_int_equal(state_now().workers, want - 1);
  threads_round(&w);
  assert_int_equal(state_now().workers, want - 1);
  threads_work_free(&w);
}

static void test_explicit_count_is_followed(void **state) {
  const int automatic = expected_count();
  threads_work w;
  threads_work_init(&w, CTX, 2);
  assert_ok(osft_set_num_threads(1));
  expect_threads(&w, 1);
  const double loss = threads_loss(&w);
  assert_ok(osft_set_num_threads(automatic + 2));
  expect_threads(&w, automatic + 2);
  assert_int_equal(state_now().workers, automatic + 1);
  /* The row passes split rows, never sums: the same loss bit for bit; the
   * GEMMs may split their work otherwise (rounding only). */
  if (!(fabs(threads_loss(&w) - loss) <= 1e-5 * fabs(loss)))
    fail_msg("loss %.9g with %d threads, %.9g with one", threads_loss(&w), automatic + 2,
             loss);
  /* Fewer threads: the count and the engine follow, the workers stay. */
  assert_ok(osft_set_num_threads(2));
  expect_threads(&w, 2);
  assert_int_equal(state_now().workers, automatic + 1);
  assert_ok(osft_set_num_threads(0));
  expect_threads(&w, automatic);
  threads_work_free(&w);
}

static void test_bad_counts_are_refused(void **state) {
  (void)state;
  assert_ok(osft_set_num_threads(3));
  assert_status(osft_set_num_threads(-1), OSFT_STATUS_INVALID_ARGUMENT);
  assert_error_mentions("osft_set_num_threads");
  assert_error_mentions("n: -1 is negative");
  assert_status(osft_set_num_threads(1025), OSFT_STATUS_INVALID_ARGUMENT);
  assert_error_mentions("n: 1025 is above the limit of 1024");
  assert_status(osft_set_num_threads(INT32_MIN), OSFT_STATUS_INVALID_ARGUMENT);
  assert_status(osft_get_num_threads(NULL), OSFT_STATUS_INVALID_ARGUMENT);
  assert_error_mentions("n");
  const threads_state s = state_now();
  assert_int_equal(s.count, 3);
  assert_int_equal(s.blas, 3);
  assert_ok(osft_set_num_threads(0));
  assert_int_equal(state_now().count, expected_count());
}

/* ------------------------------------------------------- fork */

/* A pool job whose parts wait (each holding the BLAS at one thread) until
 * told to go: the fork below happens while another thread holds the pool,
 * its workers are inside parts and the engine's count is held. */
typedef struct {
  atomic_int inside, go;
} held_job;

static void held_part(void *user, int p) {
  (void)p;
  held_job *h = user;
  atomic_fetch_add(&h->inside, 1);
  while (!atomic_load(&h->go)) usleep(200);
}

static void *held_main(void *arg) {
  osfti_cpu_run_parts(3, 1, held_part, arg);
  return NULL;
}

/* The BLAS engine's count in a forked child: oneMKL runs on one there
 * (GNU OpenMP cannot start a team in the child of a process that had one). */
static int child_blas_count(int count) {
  return strstr(osft_build_info(), "BLAS MKL") != NULL ? 1 : count;
}

/* In the child: a fresh pool, the parent's results, within 60 s. */
static int child_checks(uint64_t parent_sum, int count) {
  alarm(60); /* a deadlock fails the test instead of hanging it */
  int c = 0, workers = 0, blas = 0;
  osfti_cpu_threads(&c, &workers, &blas);
  if (workers != 0 || c != count || blas != child_blas_count(count)) return 2;
  osft_context_t ctx = NULL;
  if (osft_context_create(&ctx, NULL) != OSFT_STATUS_SUCCESS) return 3;
  threads_work w;
  threads_work_init(&w, ctx, 4);
  threads_round(&w);
  threads_round(&w);
  const uint64_t sum = threads_checksum(&w);
  osfti_cpu_threads(&c, &workers, &blas);
  threads_work_free(&w);
  osft_context_destroy(ctx);
  if (workers != count - 1 || blas != child_blas_count(count)) return 4;
  return sum == parent_sum ? 0 : 5;
}

static void fork_and_check(uint64_t parent_sum, int count, const char *what) {
  const pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) _exit(child_checks(parent_sum, count));
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    fail_msg(
        "%s: the child %s %d (2: pool or count not fresh, 3: no context, 4: pool "
        "not restarted, 5: other results)",
        what, WIFEXITED(status) ? "exited with" : "died of signal",
        WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
}

static void test_fork_gets_a_fresh_pool(void **state) {
  const int count = 3;
  assert_ok(osft_set_num_threads(count));
  threads_work w;
  threads_work_init(&w, CTX, 4);
  threads_round(&w);
  threads_round(&w);
  assert_true(state_now().workers >= count - 1); /* earlier tests may have grown it */
  const uint64_t sum = threads_checksum(&w);
  fork_and_check(sum, count, "fork while idle");
  /* Again while another thread holds the pool inside a job, its parts on
   * the workers and holding the engine at one thread. (Not while another
   * thread is inside an OpenBLAS call: OpenBLAS 0.3.21's own fork handler
   * waits for its threads and deadlocks there, library or not.) */
  static held_job h;
  atomic_store(&h.inside, 0);
  atomic_store(&h.go, 0);
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, held_main, &h), 0);
  while (atomic_load(&h.inside) < 3) usleep(1000);
  int c = 0, workers = 0, blas = 0;
  osfti_cpu_threads(&c, &workers, &blas);
  assert_int_equal(blas, 1); /* held */
  fork_and_check(sum, count, "fork while another thread holds the pool");
  atomic_store(&h.go, 1);
  pthread_join(t, NULL);
  osfti_cpu_threads(&c, &workers, &blas);
  assert_int_equal(blas, count); /* given back */
  /* the parent's pool still works */
  threads_round(&w);
  assert_true(threads_checksum(&w) == sum);
  threads_work_free(&w);
  assert_ok(osft_set_num_threads(0));
}

/* ------------------------------------------------------- concurrency */

enum { CONCURRENT = 3 };

typedef struct {
  threads_work w;
  uint64_t sum;
  int ok;
} concurrent_result;

/* Rounds only: the inputs were made on the main thread (the tests' random
 * numbers are not thread-safe). */
static void *concurrent_main(void *arg) {
  concurrent_result *r = arg;
  r->ok = 1;
  for (int i = 0; i < 5; ++i) {
    threads_round(&r->w);
    if (i == 0) r->sum = threads_checksum(&r->w);
    if (threads_checksum(&r->w) != r->sum) r->ok = 0;
  }
  return NULL;
}

static void test_contexts_on_threads_at_once(void **state) {
  assert_ok(osft_set_num_threads(3));
  threads_work w;
  threads_work_init(&w, CTX, 5);
  threads_round(&w);
  const uint64_t serial = threads_checksum(&w);
  threads_work_free(&w);
  pthread_t t[CONCURRENT];
  static concurrent_result r[CONCURRENT];
  osft_context_t ctx[CONCURRENT];
  for (int i = 0; i < CONCURRENT; ++i) {
    assert_ok(osft_context_create(&ctx[i], NULL));
    threads_work_init(&r[i].w, ctx[i], 5);
  }
  for (int i = 0; i < CONCURRENT; ++i)
    assert_int_equal(pthread_create(&t[i], NULL, concurrent_main, &r[i]), 0);
  for (int i = 0; i < CONCURRENT; ++i) pthread_join(t[i], NULL);
  for (int i = 0; i < CONCURRENT; ++i) {
    assert_true(r[i].ok);
    if (r[i].sum != serial) fail_msg("thread %d: results differ from the serial run", i);
    threads_work_free(&r[i].w);
    assert_ok(osft_context_destroy(ctx[i]));
  }
  assert_ok(osft_set_num_threads(0));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      /* first: it sees the pool before any other test started it */
      cmocka_unit_test_setup_teardown(test_count_follows_environment, tt_setup,
                                      tt_teardown),
      cmocka_unit_test_setup_teardown(test_explicit_count_is_followed, tt_setup,
                                      tt_teardown),
      cmocka_unit_test(test_bad_counts_are_refused),
      cmocka_unit_test_setup_teardown(test_fork_gets_a_fresh_pool, tt_setup, tt_teardown),
      cmocka_unit_test_setup_teardown(test_contexts_on_threads_at_once, tt_setup,
                                      tt_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
