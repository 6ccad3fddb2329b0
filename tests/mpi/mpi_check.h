/* Checks shared by the MPI test programs: failures are counted per rank
 * (never abort: the other ranks would hang), and report() makes every rank
 * agree on the verdict of a named check. One per test program. */
#ifndef OSFTRT_TESTS_MPI_MPI_CHECK_H
#define OSFTRT_TESTS_MPI_MPI_CHECK_H

#include <mpi.h>
#include <stdio.h>

#include "osftrt/osftrt.h"

static int g_rank, g_size, g_failures;

#define CHECK(cond, ...)                                                    \
  do {                                                                      \
    if (!(cond)) {                                                          \
      fprintf(stderr, "rank %d: FAIL %s:%d: ", g_rank, __FILE__, __LINE__); \
      fprintf(stderr, __VA_ARGS__);                                         \
      fprintf(stderr, "\n");                                                \
      g_failures++;                                                         \
    }                                                                       \
  } while (0)

#define EXPECT(call, status)                                                       \
  do {                                                                             \
    osft_status_t st_ = (call);                                                    \
    CHECK(st_ == (status), "%s returned %s, expected %s: %s", #call,               \
          osft_status_string(st_), osft_status_string(status), osft_last_error()); \
  } while (0)

#define OK(call) EXPECT(call, OSFT_STATUS_SUCCESS)

/* Every rank reports the check; all must pass. */
static void report(const char *name, int failures_before) {
  int mine = g_failures - failures_before, all = 0;
  MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (mine == 0 && all == 0) printf("rank %d: PASS %s\n", g_rank, name);
  if (mine == 0 && all != 0) printf("rank %d: peer failed %s\n", g_rank, name);
  fflush(stdout);
}

#endif
