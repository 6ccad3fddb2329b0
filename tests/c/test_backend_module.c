/* The CUDA backend is a module loaded on first use (issue 42, ABI.md
 * "Optional modules"), and so is the MPI engine: a CPU program linked
 * against a CUDA- and MPI-enabled libosftrt maps no CUDA or MPI library, at
 * start or after CPU work; a CUDA context where the
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

/* The first CUDA library mapped into this process, or NULL. */
static const char *mapped_cuda_library(char *line, size_t n) {
  FILE *f = fopen("/proc/self/maps", "r");
  assert_non_null(f);
  const char *found = NULL;
  while (found == NULL && fgets(line, (int)n, f) != NULL) {
    const char *slash = strrchr(line, '/');
    for (size_t i = 0; slash != NULL && i < sizeof cuda_names / sizeof *cuda_names; ++i)
      if (strncmp(slash + 1, cuda_names[i], strlen(cuda_names[i])) == 0)
        found = slash + 1;
  }
  fclose(f);
  return found;
}

static void assert_no_cuda_mapped(const char *when) {
  char line[1024];
  const char *lib = mapped_cuda_library(line, sizeof line);
  if (lib != NULL) fail_msg("%s: a CUDA library is mapped: %s", when, lib);
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
    assert_no_cuda_mapped("after the refused CUDA context");
  } else if (st == OSFT_STATUS_SUCCESS) {
    assert_ok(osft_context_destroy(ctx));
    return;
  } else {
    assert_int_equal(st, OSFT_STATUS_NO_DEVICE); /* no GPU here */
  }
  assert_true(ctx == (osft_context_t)(uintptr_t)0x1234);
  int n = -1;
  assert_ok(osft_device_count(OSFT_DEVICE_CUDA, &n));
  if (strcmp(mode(), "") != 0) assert_int_equal(n, 0);
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
  assert_no_cuda_mapped("after the refused MPI communicator");
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
      cmocka_unit_test(test_cuda_context_where_cuda_is_missing),
      cmocka_unit_test(test_module_refuses_another_version),
      cmocka_unit_test(test_mpi_communicator_where_the_module_is_missing),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
