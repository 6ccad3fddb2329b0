/*
 * A downstream program built against an *installed* libosftrt (through
 * pkg-config and through find_package(osftrt)), by tests/packaging/run.sh.
 * It uses only the public header and the C ABI. Exits non-zero on the
 * first failure; prints one "OK" line otherwise.
 */
#include <osftrt/osftrt.h>

#include <stdio.h>
#include <string.h>

#define CHECK(cond)                                                                     \
  do {                                                                                  \
    if (!(cond)) {                                                                      \
      fprintf(stderr, "consumer: %s:%d: check failed: %s (last error: %s)\n", __FILE__, \
              __LINE__, #cond, osft_last_error());                                      \
      return 1;                                                                         \
    }                                                                                   \
  } while (0)

#define CHECK_OK(call)                                                                  \
  do {                                                                                  \
    osft_status_t st_ = (call);                                                         \
    if (st_ != OSFT_STATUS_SUCCESS) {                                                   \
      fprintf(stderr, "consumer: %s:%d: %s returned %d (%s): %s\n", __FILE__, __LINE__, \
              #call, (int)st_, osft_status_string(st_), osft_last_error());             \
      return 1;                                                                         \
    }                                                                                   \
  } while (0)

int main(void) {
  /* The loaded library must have the major version of the headers, and a
   * minor version at least as new. */
  const unsigned lib_version = osft_version();
  CHECK(lib_version / 10000 == OSFT_VERSION_MAJOR);
  CHECK(lib_version >= OSFT_VERSION_NUMBER - OSFT_VERSION_PATCH);
  CHECK(osft_version_string() != NULL && osft_version_string()[0] != '\0');
  CHECK(osft_build_info() != NULL && osft_build_info()[0] != '\0');

  int cpus = 0;
  CHECK_OK(osft_device_count(OSFT_DEVICE_CPU, &cpus));
  CHECK(cpus == 1);

  /* A CPU context with default options, a workspace, memory statistics. */
  osft_context_options_t opts;
  memset(&opts, 0xA5, sizeof opts);
  CHECK_OK(OSFT_CONTEXT_OPTIONS_INIT(&opts));
  CHECK(opts.struct_size == sizeof opts);
  CHECK(opts.device_type == OSFT_DEVICE_CPU);
  CHECK(opts.device_id == 0 && opts.stream == NULL && opts.allocator == NULL);

  osft_context_t ctx = NULL;
  CHECK_OK(osft_context_create(&ctx, &opts));
  CHECK(ctx != NULL);

  osft_device_type_t type = OSFT_DEVICE_CUDA;
  int device_id = -1;
  CHECK_OK(osft_context_get_device(ctx, &type, &device_id));
  CHECK(type == OSFT_DEVICE_CPU && device_id == 0);

  const size_t want = (size_t)1 << 20;
  CHECK_OK(osft_context_reserve_workspace(ctx, want));
  size_t have = 0;
  CHECK_OK(osft_context_get_workspace_size(ctx, &have));
  CHECK(have >= want);

  osft_memory_stats_t stats;
  memset(&stats, 0, sizeof stats);
  stats.struct_size = sizeof stats;
  CHECK_OK(osft_context_get_memory_stats(ctx, &stats));
  CHECK(stats.workspace_bytes >= want);
  CHECK(stats.host_in_use >= stats.workspace_bytes);
  CHECK(stats.host_peak >= stats.host_in_use);
  CHECK(stats.host_allocs >= 1);
  CHECK(stats.device_in_use == 0);

  CHECK_OK(osft_context_release_workspace(ctx));
  CHECK_OK(osft_context_get_workspace_size(ctx, &have));
  CHECK(have == 0);
  CHECK_OK(osft_context_destroy(ctx));
  CHECK_OK(osft_context_destroy(NULL)); /* NULL is accepted */

  /* An error path: a NULL out-pointer is rejected with a message. */
  osft_clear_last_error();
  CHECK(osft_last_error()[0] == '\0');
  const osft_status_t st = osft_context_create(NULL, NULL);
  CHECK(st == OSFT_STATUS_INVALID_ARGUMENT);
  CHECK(osft_last_error() != NULL && osft_last_error()[0] != '\0');
  CHECK(strcmp(osft_status_string(st), osft_status_string(OSFT_STATUS_SUCCESS)) != 0);

  printf(
      "consumer OK: libosftrt %s (%u), headers %d.%d.%d, workspace %zu bytes, "
      "error path: %s\n",
      osft_version_string(), lib_version, OSFT_VERSION_MAJOR, OSFT_VERSION_MINOR,
      OSFT_VERSION_PATCH, want, osft_status_string(st));
  return 0;
}
