/* Which GPUs a build's CUDA architecture list can run on (the check that
 * makes context creation on an unsupported GPU fail at once, naming the
 * built architectures). Pure logic: runs without a GPU. */
#include "core/cuda_arch.h"
#include "test_util.h"

#define RUNS(archs, major, minor) \
  assert_int_equal(osfti_cuda_arch_supported(archs, major, minor), 1)
#define REFUSES(archs, major, minor) \
  assert_int_equal(osfti_cuda_arch_supported(archs, major, minor), 0)

static void test_device_code_runs_on_its_major_version(void **state) {
  (void)state;
  RUNS("90-real", 9, 0);
  RUNS("86-real", 8, 9);    /* sm_86 code on an sm_89 GPU */
  REFUSES("86-real", 8, 0); /* not below the built minor */
  REFUSES("80-real", 9, 0); /* nor on another major */
  REFUSES("90-real", 8, 6);
}

static void test_ptx_runs_on_any_later_gpu(void **state) {
  (void)state;
  RUNS("80-virtual", 9, 0);
  RUNS("80-virtual", 12, 0);
  REFUSES("90-virtual", 8, 9);
  RUNS("80", 9, 0); /* "80" is sm_80 code plus compute_80 PTX */
  RUNS("90", 10, 0);
  REFUSES("90", 8, 0);
}

static void test_arch_specific_builds_run_only_there(void **state) {
  (void)state;
  RUNS("90a", 9, 0);
  REFUSES("90a", 10, 0);
  REFUSES("90a-real", 8, 9);
  RUNS("100f", 10, 3); /* a family build: its major, minor at or above */
  REFUSES("100f", 12, 0);
}

static void test_lists_and_keywords(void **state) {
  (void)state;
  RUNS("80;90", 9, 0);
  RUNS("80,90", 8, 6); /* sm_80 code on sm_86 */
  REFUSES("80-real,90-real", 7, 5);
  RUNS("75-real 80-real", 7, 5);
  RUNS("native", 7, 0);
  RUNS("all", 5, 0);
  RUNS("all-major", 9, 0);
  REFUSES("", 9, 0);
  REFUSES(NULL, 9, 0);
  REFUSES("garbage,9", 9, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_device_code_runs_on_its_major_version),
      cmocka_unit_test(test_ptx_runs_on_any_later_gpu),
      cmocka_unit_test(test_arch_specific_builds_run_only_there),
      cmocka_unit_test(test_lists_and_keywords),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
