/* The CUDA backend is a module loaded on first use (issue 42, ABI.md
 * "Optional modules"), and so is the MPI engine: a CPU program linked
 * against a CUDA- and MPI-enabled libosftrt maps no CUDA or MPI library, at
 * start or after CPU work; counting the CUDA devices maps the CUDA driver
 * (libcuda.so.1) at most, no module, runtime, cuBLAS, cuSOLVER or NCCL, and
 * where it finds none grows the resident set by at most 10 MiB (issue 55);
 * the count is the driver's own; a CUDA context where the
 * module or a CUDA library is missing fails with OSFT_STATUS_NO_DEVICE and a
 * message naming what was not found; the module hands its table only to a
 * core of its own version.
 *
 * One program, three ctest entries (tests/CMakeLists.txt), told apart by
 * OSFT_TEST_MODULE_MODE:
 *   (unset)   the build as it is: the module and the CUDA runtime are there
 *             (a CUDA context then succeeds on a GPU, else NO_DEVICE);
 *   env       OSFTRT_CUDA_MODULE and OSFTRT_MPI_MODULE name a folder
 *             without the modules;
 *   hidden    run by the dynamic loader with its cache and the module's run
 *             path ignored, as on a machine without the CUDA runtime. */
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

#ifndef OSFT_TEST_MODULE_PATH
#define OSFT_TEST_MODULE_PATH "" /* a build without CUDA has no module */
#endif

static const char *mode(void) {
  const char *m = getenv("OSFT_TEST_MODULE_MODE");
  return m != NULL ? m : "";
}

/* The CUDA-side libraries, by file name, that a CPU program must not map. */
static const char *const cuda_names[] = {
    "libosftrt_cuda.so", "libcudart.so",   "libcublas.so",
    "libcublasLt.so",    "libcusolver.so", "libnccl.so",
    "libnvJitLink.so",   "libcusparse.so", "libcuda.so"};

/* The CUDA driver, the one CUDA library a device count may map. */
static const char kDriver[] = "libcuda.so";

/* The first CUDA library mapped into this process, or NULL; with
 * `but_driver`, the driver does not count. */
static const char *mapped_cuda_library(char *line, size_t n, int but_driver) {
  FILE *f = fopen("/proc/self/maps", "r");
  assert_non_null(f);
  const char *found = NULL;
  while (found == NULL && fgets(line, (int)n, f) != NULL) {
    const char *slash = strrchr(line, '/');
    for (size_t i = 0; slash != NULL && i < sizeof cuda_names / sizeof *cuda_names; ++i)
      if (strncmp(slash + 1, cuda_names[i], strlen(cuda_names[i])) == 0 &&
          !(but_driver && strcmp(cuda_names[i], kDriver) == 0))
        found = slash + 1;
  }
  fclose(f);
  return found;
}

static void assert_no_cuda_mapped(const char *when) {
  char line[1024];
  const char *lib = mapped_cuda_library(line, sizeof line, 0);
  if (lib != NULL) fail_msg("%s: a CUDA library is mapped: %s", when, lib);
}

/* Whether a library whose file name starts with `name` is mapped. */
static int is_mapped(const char *name) {
  FILE *f = fopen("/proc/self/maps", "r");
  assert_non_null(f);
  char line[1024];
  int found = 0;
  while (!found && fgets(line, (int)sizeof line, f) != NULL) {
    const char *slash = strrchr(line, '/');
    found = slash != NULL && strncmp(slash + 1, name, strlen(name)) == 0;
  }
  fclose(f);
  return found;
}

/* Only the driver, if anything: no module, runtime or CUDA library. */
static void assert_only_the_driver_mapped(const char *when) {
  char line[1024];
  const char *lib = mapped_cuda_library(line, sizeof line, 1);
  if (lib != NULL)
    fail_msg("%s: a CUDA library beyond the driver is mapped: %s", when, lib);
}

static long vm_rss_kib(void) {
  FILE *f = fopen("/proc/self/status", "r");
  assert_non_null(f);
  char line[256];
  long kib = -1;
  while (fgets(line, sizeof line, f) != NULL)
    if (sscanf(line, "VmRSS: %ld kB", &kib) == 1) break;
  fclose(f);
  return kib;
}

/* The visible GPUs as the CUDA driver itself counts them (cuInit,
 * cuDeviceGetCount through libcuda.so.1), 0 without a driver, with one
 * older than this build's CUDA major version (the module's runtime refuses
 * it), or without CUDA in the build. Maps the driver. */
static int driver_device_count(void) {
  int major = 0, minor = 0;
  const char *cuda = strstr(osft_build_info(), "; CUDA ");
  if (!osft_has_feature(OSFT_FEATURE_CUDA) || cuda == NULL ||
      sscanf(cuda, "; CUDA %d.%d", &major, &minor) != 2)
    return 0;
  void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (h == NULL) {
    print_message("CUDA driver: absent (libcuda.so.1); this build's CUDA %d.%d\n", major,
                  minor);
    return 0;
  }
  typedef int (*int_fn)(int *);
  typedef int (*init_fn)(unsigned);
  init_fn init = (init_fn)(uintptr_t)dlsym(h, "cuInit");
  int_fn version = (int_fn)(uintptr_t)dlsym(h, "cuDriverGetVersion");
  int_fn count = (int_fn)(uintptr_t)dlsym(h, "cuDeviceGetCount");
  int v = 0, n = 0;
  if (init == NULL || version == NULL || count == NULL || version(&v) != 0 ||
      v / 1000 < major || init(0) != 0 || count(&n) != 0)
    n = 0;
  print_message("CUDA driver: %s, version %d, %d device(s); this build's CUDA %d.%d\n",
                init != NULL ? "present" : "absent", v, n, major, minor);
  return n; /* the driver stays mapped, as the library's probe leaves it */
}

/* One fused cross-entropy call on a CPU context (M tokens, H hidden, V
 * classes), its mean loss against a float64 reference. */
static void cpu_flce_matches_reference(void) {
  enum { M = 8, H = 16, V = 40 };
  float x[M * H], w[V * H], loss = NAN;
  int64_t y[M];
  test_seed("cpu_flce_matches_reference");
  for (int i = 0; i < M * H; ++i) x[i] = (float)test_uniform(-1, 1);
  for (int i = 0; i < V * H; ++i) w[i] = (float)test_uniform(-1, 1);
  for (int i = 0; i < M; ++i) y[i] = (int64_t)(test_uniform(0, V - 1e-9));
  double ref = 0;
  for (int i = 0; i < M; ++i) {
    double z[V], zmax = -INFINITY, s = 0;
    for (int v = 0; v < V; ++v) {
      z[v] = 0;
      for (int h = 0; h < H; ++h) z[v] += (double)x[i * H + h] * w[v * H + h];
      zmax = fmax(zmax, z[v]);
    }
    for (int v = 0; v < V; ++v) s += exp(z[v] - zmax);
    ref += (zmax + log(s) - z[y[i]]) / M;
  }

  osft_context_t ctx = NULL;
  assert_ok(osft_context_create(&ctx, NULL));
  osft_flce_t ce = NULL;
  assert_ok(osft_flce_create(ctx, NULL, &ce));
  test_tensor tx, tw, ty, tl;
  test_tensor_make(&tx, x, kDLFloat, 32, kDLCPU, 0, 2, (int64_t)M, (int64_t)H);
  test_tensor_make(&tw, w, kDLFloat, 32, kDLCPU, 0, 2, (int64_t)V, (int64_t)H);
  test_tensor_make(&ty, y, kDLInt, 64, kDLCPU, 0, 1, (int64_t)M);
  test_tensor_make(&tl, &loss, kDLFloat, 32, kDLCPU, 0, 0);
  osft_flce_inputs_t in;
  osft_flce_outputs_t out;
  assert_ok(OSFT_FLCE_INPUTS_INIT(&in));
  assert_ok(OSFT_FLCE_OUTPUTS_INIT(&out));
  in.x = &tx.t;
  in.weight = &tw.t;
  in.targets = &ty.t;
  out.loss = &tl.t;
  assert_ok(osft_flce_compute(ce, &in, &out));
  assert_true(fabs(loss - ref) <= 1e-5 * fmax(1.0, fabs(ref)));
  assert_ok(osft_flce_destroy(ce));
  assert_ok(osft_context_destroy(ctx));
}

/* At main (before any call) and after CPU work: no CUDA library mapped, and
 * the resident set is that of a CPU library (a core that links CUDA maps
 * ~190 MiB of it at start). */
static void test_cpu_program_maps_no_cuda(void **state) {
  (void)state;
  assert_no_cuda_mapped("at start");
  cpu_flce_matches_reference();
  int gpus = -1;
  assert_ok(osft_device_count(OSFT_DEVICE_CPU, &gpus));
  assert_no_cuda_mapped("after CPU work");
  const long rss = vm_rss_kib();
  print_message("VmRSS after CPU work: %ld KiB\n", rss);
  assert_true(rss > 0 && rss < 64 * 1024);
}

/* Counting the CUDA devices (a trainer's "GPU if present") maps the CUDA
 * driver at most: no libosftrt_cuda, CUDA runtime, cuBLAS, cuSOLVER or
 * NCCL (they load with the first CUDA context); where it finds no device
 * the process grows by at most 10 MiB (the module took ~180 MiB); the count
 * is the driver's. Runs before anything loads the module (the test below). */
static void test_device_count_maps_only_the_driver(void **state) {
  (void)state;
  assert_no_cuda_mapped("before counting");
  const long before = vm_rss_kib();
  int n = -1;
  assert_ok(osft_device_count(OSFT_DEVICE_CUDA, &n));
  const long after = vm_rss_kib();
  print_message("osft_device_count(CUDA) = %d; VmRSS %ld -> %ld KiB\n", n, before, after);
  assert_only_the_driver_mapped("after osft_device_count(OSFT_DEVICE_CUDA)");
  if (n == 0) assert_true(after - before <= 10 * 1024);
  int again = -1;
  assert_ok(osft_device_count(OSFT_DEVICE_CUDA, &again));
  assert_int_equal(again, n);
  assert_only_the_driver_mapped("after a second count");
  if (!osft_has_feature(OSFT_FEATURE_CUDA)) assert_int_equal(n, 0);
  assert_int_equal(n, driver_device_count());
  assert_only_the_driver_mapped("after the driver's own count");
  /* CPU work still maps nothing more */
  cpu_flce_matches_reference();
  assert_only_the_driver_mapped("after CPU work");
}

/* A CUDA context: created on a GPU with the module at hand, else refused
 * with OSFT_STATUS_NO_DEVICE (NOT_SUPPORTED without CUDA in the build) and
 * a message naming what is missing; nothing is written to the handle. */
static void test_cuda_context_where_cuda_is_missing(void **state) {
  (void)state;
  osft_context_options_t o;
  assert_ok(OSFT_CONTEXT_OPTIONS_INIT(&o));
  o.device_type = OSFT_DEVICE_CUDA;
  osft_context_t ctx = (osft_context_t)(uintptr_t)0x1234;
  const osft_status_t st = osft_context_create(&ctx, &o);
  if (!osft_has_feature(OSFT_FEATURE_CUDA)) {
    assert_int_equal(st, OSFT_STATUS_NOT_SUPPORTED);
    assert_error_mentions("not compiled");
    return;
  }
  if (strcmp(mode(), "env") == 0) {
    assert_int_equal(st, OSFT_STATUS_NO_DEVICE);
    assert_error_mentions("OSFTRT_CUDA_MODULE");
    assert_error_mentions("/nonexistent-osftrt-module/libosftrt_cuda.so.1");
  } else if (strcmp(mode(), "hidden") == 0) {
    assert_int_equal(st, OSFT_STATUS_NO_DEVICE);
    assert_error_mentions("libosftrt_cuda.so.1");
    assert_error_mentions("libcudart.so");
    assert_only_the_driver_mapped("after the refused CUDA context");
  } else if (st == OSFT_STATUS_SUCCESS) {
    /* a GPU: the context, not the count before it, loaded the module */
    assert_true(is_mapped("libosftrt_cuda.so"));
    int n = -1;
    assert_ok(osft_device_count(OSFT_DEVICE_CUDA, &n));
    assert_true(n >= 1);
    assert_ok(osft_context_destroy(ctx));
    return;
  } else {
    assert_int_equal(st, OSFT_STATUS_NO_DEVICE); /* no GPU here */
  }
  assert_true(ctx == (osft_context_t)(uintptr_t)0x1234);
  /* the count is the driver's: with the module missing too (a context then
   * fails, naming what is missing) */
  int n = -1;
  assert_ok(osft_device_count(OSFT_DEVICE_CUDA, &n));
  assert_int_equal(n, driver_device_count());
  /* CPU work still works after the refusal. */
  cpu_flce_matches_reference();
}

/* An MPI communicator where the MPI module cannot be found (env mode):
 * OSFT_STATUS_NOT_SUPPORTED naming where it was looked for; nothing written
 * to the handle. */
static void test_mpi_communicator_where_the_module_is_missing(void **state) {
  (void)state;
  if (!osft_has_feature(OSFT_FEATURE_MPI) || strcmp(mode(), "env") != 0) skip();
  osft_context_t ctx = NULL;
  assert_ok(osft_context_create(&ctx, NULL));
  osft_comm_t comm = (osft_comm_t)(uintptr_t)0x1234;
  assert_status(osft_comm_create_mpi(ctx, 0, NULL, &comm), OSFT_STATUS_NOT_SUPPORTED);
  assert_error_mentions("OSFTRT_MPI_MODULE");
  assert_error_mentions("cannot load /nonexistent-osftrt-module:"); /* a file, no slash */
  assert_true(comm == (osft_comm_t)(uintptr_t)0x1234);
  assert_only_the_driver_mapped("after the refused MPI communicator");
  assert_ok(osft_context_destroy(ctx));
}

/* The module gives its table only to a core of its own version, and says
 * which versions met. */
static void test_module_refuses_another_version(void **state) {
  (void)state;
  if (OSFT_TEST_MODULE_PATH[0] == '\0' || strcmp(mode(), "") != 0) skip();
  void *h = dlopen(OSFT_TEST_MODULE_PATH, RTLD_NOW | RTLD_LOCAL);
  assert_non_null(h);
  typedef const void *(*entry_fn)(unsigned, char *, size_t);
  entry_fn entry = (entry_fn)(uintptr_t)dlsym(h, "osftrt_cuda_module_entry");
  assert_non_null(entry);
  char why[256] = "";
  assert_null(entry(OSFT_VERSION_NUMBER + 1, why, sizeof why));
  assert_non_null(strstr(why, "install both from one build"));
  assert_non_null(entry(OSFT_VERSION_NUMBER, why, sizeof why));
  dlclose(h);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cpu_program_maps_no_cuda),
      cmocka_unit_test(test_device_count_maps_only_the_driver),
      cmocka_unit_test(test_cuda_context_where_cuda_is_missing),
      cmocka_unit_test(test_module_refuses_another_version),
      cmocka_unit_test(test_mpi_communicator_where_the_module_is_missing),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
