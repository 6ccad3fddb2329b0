/* CUDA contexts: device selection, streams, lazily created cuBLAS/cuSOLVER
 * handles, device workspace, device allocator callbacks. Exits with
 * OSFT_TEST_SKIP (reported by ctest as skipped, with the reason) where no
 * GPU is present. */
#include <stdio.h>
#include <string.h>

#include <cuda_runtime.h>

#include "core/context_impl.h"
#include "test_util.h"

typedef struct {
  long allocs, frees;
  size_t live;
  void *last_stream;
  int last_device;
} device_counts;

static void *dev_alloc(void *user, size_t bytes, int device_id, void *stream) {
  device_counts *c = user;
  void *p = NULL;
  if (cudaSetDevice(device_id) != cudaSuccess || cudaMalloc(&p, bytes) != cudaSuccess)
    return NULL;
  c->allocs++;
  c->live += bytes;
  c->last_stream = stream;
  c->last_device = device_id;
  return p;
}

static void dev_free(void *user, void *ptr, size_t bytes, int device_id, void *stream) {
  (void)device_id;
  (void)stream;
  device_counts *c = user;
  cudaFree(ptr);
  c->frees++;
  c->live -= bytes;
}

static osft_context_t make_cuda_context(const osft_allocator_t *a, void *stream) {
  osft_context_options_t o;
  assert_ok(OSFT_CONTEXT_OPTIONS_INIT(&o));
  o.device_type = OSFT_DEVICE_CUDA;
  o.device_id = 0;
  o.stream = stream;
  o.allocator = a;
  osft_context_t ctx = NULL;
  assert_ok(osft_context_create(&ctx, &o));
  return ctx;
}

static void test_cuda_context_device_and_stream(void **state) {
  (void)state;
  cudaStream_t s1, s2;
  assert_int_equal(cudaStreamCreate(&s1), cudaSuccess);
  assert_int_equal(cudaStreamCreate(&s2), cudaSuccess);
  osft_context_t ctx = make_cuda_context(NULL, s1);
  osft_device_type_t type;
  int id = -1;
  assert_ok(osft_context_get_device(ctx, &type, &id));
  assert_int_equal(type, OSFT_DEVICE_CUDA);
  assert_int_equal(id, 0);
  void *got = NULL;
  assert_ok(osft_context_get_stream(ctx, &got));
  assert_ptr_equal(got, s1);
  assert_ok(osft_context_set_stream(ctx, s2));
  assert_ok(osft_context_get_stream(ctx, &got));
  assert_ptr_equal(got, s2);
  assert_ok(osft_context_synchronize(ctx));
  assert_ok(osft_context_destroy(ctx));
  cudaStreamDestroy(s1);
  cudaStreamDestroy(s2);
}

static void test_library_handles_are_lazy_and_follow_the_stream(void **state) {
  (void)state;
  cudaStream_t s1;
  assert_int_equal(cudaStreamCreate(&s1), cudaSuccess);
  osft_context_t ctx = make_cuda_context(NULL, NULL);
  void *blas = &ctx, *blas2 = NULL, *solver = &ctx;
  assert_ok(osfti_context_peek_handles(ctx, &blas, &solver));
  assert_null(blas); /* nothing is created before it is needed */
  assert_null(solver);
  assert_ok(osfti_context_blas_handle(ctx, &blas));
  assert_non_null(blas);
  assert_ok(osfti_context_blas_handle(ctx, &blas2));
  assert_ptr_equal(blas, blas2);
  assert_ok(osfti_context_solver_handle(ctx, &solver));
  assert_non_null(solver);
  assert_ok(osft_context_set_stream(ctx, s1));
  assert_ok(osfti_context_blas_handle(ctx, &blas2));
  assert_ptr_equal(blas, blas2); /* rebound, not recreated */
  assert_ok(osft_context_destroy(ctx));
  cudaStreamDestroy(s1);
}

static void test_workspace_lives_on_the_device(void **state) {
  (void)state;
  osft_context_t ctx = make_cuda_context(NULL, NULL);
  void *ws = NULL;
  assert_ok(osfti_context_workspace(ctx, 1 << 20, &ws));
  struct cudaPointerAttributes attr;
  assert_int_equal(cudaPointerGetAttributes(&attr, ws), cudaSuccess);
  assert_int_equal(attr.type, cudaMemoryTypeDevice);
  assert_int_equal(attr.device, 0);
  assert_int_equal(cudaMemset(ws, 0x3f, 1 << 20), cudaSuccess);
  osft_memory_stats_t s;
  s.struct_size = sizeof s;
  assert_ok(osft_context_get_memory_stats(ctx, &s));
  assert_int_equal(s.device_in_use, 1 << 20);
  assert_int_equal(s.workspace_bytes, 1 << 20);
  assert_ok(osft_context_release_workspace(ctx));
  assert_ok(osft_context_get_memory_stats(ctx, &s));
  assert_int_equal(s.device_in_use, 0);
  assert_ok(osft_context_destroy(ctx));
}

static void test_device_allocator_callbacks(void **state) {
  (void)state;
  device_counts c = {0};
  osft_allocator_t a;
  assert_ok(OSFT_ALLOCATOR_INIT(&a));
  a.user = &c;
  a.device_alloc = dev_alloc;
  a.device_free = dev_free;
  cudaStream_t s1;
  assert_int_equal(cudaStreamCreate(&s1), cudaSuccess);
  osft_context_t ctx = make_cuda_context(&a, s1);
  assert_ok(osft_context_reserve_workspace(ctx, 4096));
  assert_ok(osft_context_reserve_workspace(ctx, 65536));
  assert_int_equal(c.allocs, 2);
  assert_int_equal(c.frees, 1);
  assert_ptr_equal(c.last_stream, s1);
  assert_int_equal(c.last_device, 0);
  assert_ok(osft_context_destroy(ctx));
  assert_int_equal(c.allocs, c.frees);
  assert_int_equal(c.live, 0);
  cudaStreamDestroy(s1);
}

static void test_missing_ordinal(void **state) {
  (void)state;
  int n = 0;
  assert_ok(osft_device_count(OSFT_DEVICE_CUDA, &n));
  osft_context_options_t o;
  assert_ok(OSFT_CONTEXT_OPTIONS_INIT(&o));
  o.device_type = OSFT_DEVICE_CUDA;
  o.device_id = n;
  osft_context_t ctx = NULL;
  assert_status(osft_context_create(&ctx, &o), OSFT_STATUS_NO_DEVICE);
  assert_error_mentions("does not exist");
  assert_null(ctx);
}

int main(void) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    printf("SKIPPED: no CUDA device (%s); the CUDA context tests need a GPU\n",
           e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    return OSFT_TEST_SKIP;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cuda_context_device_and_stream),
      cmocka_unit_test(test_library_handles_are_lazy_and_follow_the_stream),
      cmocka_unit_test(test_workspace_lives_on_the_device),
      cmocka_unit_test(test_device_allocator_callbacks),
      cmocka_unit_test(test_missing_ordinal),
  };
  return cmocka_run_group_tests_name("context_cuda", tests, NULL, NULL);
}
