/* Version macros, osft_version*, osft_build_info, osft_has_feature. */
#include <stdio.h>
#include <string.h>

#include "test_util.h"

static void test_runtime_version_matches_headers(void **state) {
  (void)state;
  assert_int_equal(osft_version(), OSFT_VERSION_NUMBER);
  assert_int_equal(
      OSFT_VERSION_NUMBER,
      OSFT_VERSION_MAJOR * 10000 + OSFT_VERSION_MINOR * 100 + OSFT_VERSION_PATCH);
  char expected[32];
  snprintf(expected, sizeof expected, "%d.%d.%d", OSFT_VERSION_MAJOR, OSFT_VERSION_MINOR,
           OSFT_VERSION_PATCH);
  assert_string_equal(osft_version_string(), expected);
}

static void test_build_info_describes_the_build(void **state) {
  (void)state;
  const char *info = osft_build_info();
  assert_non_null(info);
  assert_non_null(strstr(info, osft_version_string()));
  assert_non_null(strstr(info, "BLAS"));
  assert_non_null(strstr(info, "CUDA"));
  assert_ptr_equal(info, osft_build_info()); /* static, stable */
  if (!osft_has_feature(OSFT_FEATURE_CUDA)) assert_non_null(strstr(info, "CUDA off"));
}

static void test_features_are_boolean_and_consistent(void **state) {
  (void)state;
  const int cuda = osft_has_feature(OSFT_FEATURE_CUDA);
  const int nccl = osft_has_feature(OSFT_FEATURE_NCCL);
  const int mpi = osft_has_feature(OSFT_FEATURE_MPI);
  assert_true(cuda == 0 || cuda == 1);
  assert_true(nccl == 0 || nccl == 1);
  assert_true(mpi == 0 || mpi == 1);
  assert_true(!nccl || cuda); /* NCCL needs the CUDA backend */
  assert_int_equal(osft_has_feature((osft_feature_t)0), 0);
  assert_int_equal(osft_has_feature((osft_feature_t)1000), 0);
  int gpus = -1;
  assert_ok(osft_device_count(OSFT_DEVICE_CUDA, &gpus));
  assert_true(gpus >= 0);
  if (!cuda) assert_int_equal(gpus, 0);
}

static void test_device_count(void **state) {
  (void)state;
  int n = -1;
  assert_ok(osft_device_count(OSFT_DEVICE_CPU, &n));
  assert_int_equal(n, 1);
  n = -7;
  assert_status(osft_device_count(OSFT_DEVICE_CPU, NULL), OSFT_STATUS_INVALID_ARGUMENT);
  assert_error_mentions("count");
  assert_status(osft_device_count((osft_device_type_t)7, &n),
                OSFT_STATUS_INVALID_ARGUMENT);
  assert_error_mentions("type");
  assert_int_equal(n, -7); /* untouched on failure */
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_runtime_version_matches_headers),
      cmocka_unit_test(test_build_info_describes_the_build),
      cmocka_unit_test(test_features_are_boolean_and_consistent),
      cmocka_unit_test(test_device_count),
  };
  return cmocka_run_group_tests_name("version", tests, NULL, NULL);
}
