/*
 * A dead or stuck peer makes the other ranks' collectives fail within the
 * communicator's timeout instead of hanging:
 *   test_mpi_peer_death exit    the last rank exits (no MPI_Finalize) in
 *                               the middle of a run of project calls;
 *   test_mpi_peer_death stuck   the last rank stops calling collectives.
 * Every other rank must get OSFT_STATUS_TIMEOUT or OSFT_STATUS_COMM_ERROR
 * within the timeout (+ slack), then OSFT_STATUS_COMM_ERROR at once on the
 * next call (the communicator is broken), and must be able to destroy
 * everything. Each survivor prints "rank R: PASS ..."; run_mpi_test.sh
 * counts them (Open MPI needs `mpirun --enable-recovery` to keep the
 * survivors alive after a process exits). Survivors leave with _exit(0):
 * MPI_Finalize would wait for the dead peer.
 */
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "osftrt/osftrt.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

#define N_LOCAL 16
#define R 4
#define L 4

static void fail(int rank, const char *what) {
  printf("rank %d: FAIL %s (%s)\n", rank, what, osft_last_error());
  fflush(stdout);
  _exit(1);
}

static DLTensor matrix(float *data, int64_t *shape) {
  DLTensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.device.device_type = kDLCPU;
  t.ndim = 2;
  t.dtype.code = kDLFloat;
  t.dtype.bits = 32;
  t.dtype.lanes = 1;
  t.shape = shape;
  return t;
}

int main(int argc, char **argv) {
  const int stuck = argc > 1 && strcmp(argv[1], "stuck") == 0;
  const double timeout = 2.0;
  MPI_Init(&argc, &argv);
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  osft_context_t ctx = NULL;
  osft_comm_t comm = NULL;
  osft_projector_t proj = NULL;
  if (osft_context_create(&ctx, NULL) != OSFT_STATUS_SUCCESS) fail(rank, "context");
  osft_comm_options_t o;
  osft_comm_options_init(&o, sizeof o);
  o.timeout_seconds = timeout;
  if (osft_comm_create_mpi(ctx, (int64_t)MPI_Comm_c2f(MPI_COMM_WORLD), &o, &comm) !=
      OSFT_STATUS_SUCCESS)
    fail(rank, "communicator");
  if (osft_projector_create(ctx, comm, NULL, &proj) != OSFT_STATUS_SUCCESS)
    fail(rank, "projector");
  /* One U_ROWS target: N_LOCAL rows per rank; U_high = the first R unit
   * vectors of this rank's rows (only column structure matters here). */
  static float uh[N_LOCAL * R], gu[N_LOCAL * L];
  for (int i = 0; i < N_LOCAL * R; ++i) uh[i] = (i % (R + 1) == 0) ? 0.5f : 0.0f;
  int64_t sh_uh[2] = {N_LOCAL, R}, sh_gu[2] = {N_LOCAL, L}, shards[64];
  for (int q = 0; q < size && q < 64; ++q) shards[q] = N_LOCAL;
  DLTensor t_uh = matrix(uh, sh_uh), t_gu = matrix(gu, sh_gu);
  osft_projection_target_t t;
  osft_projection_target_init(&t, sizeof t);
  t.u_high = &t_uh;
  t.grad_u_low = &t_gu;
  t.u_layout = OSFT_SHARD_U_ROWS;
  t.u_shards = shards;
  t.n_u_shards = size;
  if (osft_projector_add_target(proj, &t, NULL) != OSFT_STATUS_SUCCESS)
    fail(rank, "target");
  const int victim = size - 1;
  for (int step = 0; step < 50; ++step) {
    if (rank == victim && step == 3) {
      if (!stuck) _exit(0);               /* dies without MPI_Finalize */
      sleep((unsigned)(2 * timeout + 1)); /* stops taking part, then leaves */
      _exit(0);
    }
    for (int i = 0; i < N_LOCAL * L; ++i) gu[i] = (float)(i % 7) - 3.0f;
    const double t0 = now_s();
    const osft_status_t st = osft_projector_project(proj);
    const double took = now_s() - t0;
    if (st == OSFT_STATUS_SUCCESS) continue;
    if (step < 3) fail(rank, "a collective failed before the peer left");
    if (st != OSFT_STATUS_TIMEOUT && st != OSFT_STATUS_COMM_ERROR)
      fail(rank, "unexpected status");
    if (took > timeout + 3.0) fail(rank, "the error came too late");
    const double t1 = now_s();
    const osft_status_t again = osft_projector_project(proj);
    if (again != OSFT_STATUS_COMM_ERROR || now_s() - t1 > 0.5)
      fail(rank, "a broken communicator must refuse at once");
    if (osft_projector_destroy(proj) != OSFT_STATUS_SUCCESS ||
        osft_comm_destroy(comm) != OSFT_STATUS_SUCCESS ||
        osft_context_destroy(ctx) != OSFT_STATUS_SUCCESS)
      fail(rank, "cleanup after the failure");
    printf("rank %d: PASS peer-%s: %s after %.2f s (timeout %.1f s), then refused\n",
           rank, stuck ? "stuck" : "exit", osft_status_string(st), took, timeout);
    fflush(stdout);
    _exit(0);
  }
  fail(rank, "no error although a peer left");
  return 1;
}
