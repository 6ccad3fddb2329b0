/*
 * osftrt_demo — the libosftrt demo trainer.
 *
 * Runs every capability built so far, on a GPU when one is present and on
 * the CPU otherwise, the way a trainer would use them:
 *   1. runtime: version check, diagnostics, device choice, a context whose
 *      memory comes from the trainer's own allocator, workspace, errors.
 * Later capabilities (factorized linear, projection, cross-entropy, tiled
 * MLP, batched QR) add their steps here.
 *
 * Exit status 0 when every step succeeded.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "osftrt/osftrt.h"

#define CHECK(call)                                                             \
  do {                                                                          \
    osft_status_t st_ = (call);                                                 \
    if (st_ != OSFT_STATUS_SUCCESS) {                                           \
      fprintf(stderr, "FAILED: %s -> %s: %s\n", #call, osft_status_string(st_), \
              osft_last_error());                                               \
      exit(1);                                                                  \
    }                                                                           \
  } while (0)

/* The trainer's own allocator: here a counting malloc, standing in for a
 * framework's caching allocator. */
typedef struct {
  long allocs, frees;
  size_t live, peak;
} trainer_heap;

static void *heap_alloc(void *user, size_t bytes, size_t alignment) {
  trainer_heap *h = user;
  void *p = aligned_alloc(alignment, (bytes + alignment - 1) / alignment * alignment);
  if (p != NULL) {
    h->allocs++;
    h->live += bytes;
    if (h->live > h->peak) h->peak = h->live;
  }
  return p;
}

static void heap_free(void *user, void *ptr, size_t bytes) {
  trainer_heap *h = user;
  free(ptr);
  h->frees++;
  h->live -= bytes;
}

static void log_to_stdout(void *user, osft_log_level_t level, const char *message) {
  (void)user;
  static const char *names[] = {"off", "error", "warn", "info", "debug"};
  printf("  [log %s] %s\n", names[level], message);
}

/* Refuse a library older than the headers or of another major version. */
static void check_library_version(void) {
  const unsigned lib = osft_version();
  printf("libosftrt %s (headers %d.%d.%d)\n  %s\n", osft_version_string(),
         OSFT_VERSION_MAJOR, OSFT_VERSION_MINOR, OSFT_VERSION_PATCH, osft_build_info());
  if (lib / 10000 != OSFT_VERSION_MAJOR || lib < OSFT_VERSION_NUMBER) {
    fprintf(stderr, "FAILED: library version %u does not match headers %d\n", lib,
            OSFT_VERSION_NUMBER);
    exit(1);
  }
}

static osft_context_t create_context(trainer_heap *heap, osft_device_type_t *device) {
  int gpus = 0;
  CHECK(osft_device_count(OSFT_DEVICE_CUDA, &gpus));
  *device = gpus > 0 ? OSFT_DEVICE_CUDA : OSFT_DEVICE_CPU;
  printf("devices: %d CUDA GPU(s) visible (CUDA backend %s) -> running on the %s\n", gpus,
         osft_has_feature(OSFT_FEATURE_CUDA) ? "compiled in" : "not compiled in",
         *device == OSFT_DEVICE_CUDA ? "GPU" : "CPU");

  osft_allocator_t allocator;
  CHECK(OSFT_ALLOCATOR_INIT(&allocator));
  allocator.user = heap;
  allocator.host_alloc = heap_alloc;
  allocator.host_free = heap_free;

  osft_context_options_t opts;
  CHECK(OSFT_CONTEXT_OPTIONS_INIT(&opts));
  opts.device_type = *device;
  opts.allocator = &allocator;
  opts.workspace_limit = (size_t)256 << 20;
  osft_context_t ctx = NULL;
  CHECK(osft_context_create(&ctx, &opts));
  return ctx;
}

static void print_memory(osft_context_t ctx, const char *when) {
  osft_memory_stats_t s;
  s.struct_size = sizeof s;
  CHECK(osft_context_get_memory_stats(ctx, &s));
  printf(
      "memory %s: host %llu B in use (peak %llu), device %llu B in use (peak %llu), "
      "workspace %llu B\n",
      when, (unsigned long long)s.host_in_use, (unsigned long long)s.host_peak,
      (unsigned long long)s.device_in_use, (unsigned long long)s.device_peak,
      (unsigned long long)s.workspace_bytes);
}

/* A bad call is reported with a status and a message naming the argument,
 * and changes nothing. */
static void show_error_reporting(osft_context_t ctx) {
  const osft_status_t st = osft_context_reserve_workspace(ctx, (size_t)1 << 40);
  printf("errors: reserving 1 TiB above the limit -> %s\n  \"%s\"\n",
         osft_status_string(st), osft_last_error());
  if (st != OSFT_STATUS_OUT_OF_MEMORY) exit(1);
}

static void demo_runtime(void) {
  printf("== 1. runtime ==\n");
  check_library_version();
  CHECK(osft_set_log_callback(log_to_stdout, NULL, OSFT_LOG_INFO));
  trainer_heap heap = {0};
  osft_device_type_t device;
  osft_context_t ctx = create_context(&heap, &device);
  CHECK(osft_context_reserve_workspace(ctx, (size_t)16 << 20));
  print_memory(ctx, "after reserving 16 MiB of workspace");
  show_error_reporting(ctx);
  CHECK(osft_context_synchronize(ctx));
  CHECK(osft_context_destroy(ctx));
  CHECK(osft_set_log_callback(NULL, NULL, OSFT_LOG_OFF));
  printf("trainer allocator: %ld allocations, %ld frees, %zu B still live, peak %zu B\n",
         heap.allocs, heap.frees, heap.live, heap.peak);
  if (heap.allocs != heap.frees || heap.live != 0) {
    fprintf(stderr, "FAILED: the context did not return all its memory\n");
    exit(1);
  }
}

int main(void) {
  demo_runtime();
  printf("osftrt_demo: all steps succeeded\n");
  return 0;
}
