/* The initializers of the structs the library fills in (added in 1.3.0):
 * osft_memory_stats_init, osft_flce_plan_init, osft_comm_stats_init,
 * osft_projector_info_init, osft_flinear_info_init and osft_mlp_plan_init,
 * and their OSFT_*_INIT macros. Each zeroes the
 * struct and sets struct_size (a newer caller's larger struct included),
 * refuses NULL and a struct_size below the 1.0 layout without writing, and
 * gives a struct the matching query accepts. */
#include <string.h>

#include "test_util.h"

static osft_status_t init_memory_stats(void *p, size_t n) {
  return osft_memory_stats_init(p, n);
}
static osft_status_t init_flce_plan(void *p, size_t n) {
  return osft_flce_plan_init(p, n);
}
static osft_status_t init_comm_stats(void *p, size_t n) {
  return osft_comm_stats_init(p, n);
}
static osft_status_t init_projector_info(void *p, size_t n) {
  return osft_projector_info_init(p, n);
}
static osft_status_t init_flinear_info(void *p, size_t n) {
  return osft_flinear_info_init(p, n);
}
static osft_status_t init_mlp_plan(void *p, size_t n) {
  return osft_mlp_plan_init(p, n);
}

typedef struct {
  osft_status_t (*init)(void *, size_t);
  size_t size;
  const char *arg;
} struct_init_case;

static const struct_init_case kCases[] = {
    {init_memory_stats, sizeof(osft_memory_stats_t), "stats"},
    {init_flce_plan, sizeof(osft_flce_plan_t), "plan"},
    {init_comm_stats, sizeof(osft_comm_stats_t), "stats"},
    {init_projector_info, sizeof(osft_projector_info_t), "info"},
    {init_flinear_info, sizeof(osft_flinear_info_t), "info"},
    {init_mlp_plan, sizeof(osft_mlp_plan_t), "plan"},
};

static void test_zeroes_and_sets_struct_size(void **state) {
  (void)state;
  for (size_t c = 0; c < sizeof kCases / sizeof kCases[0]; ++c) {
    unsigned char buf[512];
    const size_t n = kCases[c].size + 24; /* a newer caller's struct */
    memset(buf, 0xA7, sizeof buf);
    assert_ok(kCases[c].init(buf, n));
    size_t struct_size;
    memcpy(&struct_size, buf, sizeof struct_size);
    assert_int_equal(struct_size, n);
    for (size_t i = sizeof(size_t); i < n; ++i) assert_int_equal(buf[i], 0);
    assert_int_equal(buf[n], 0xA7); /* nothing beyond struct_size */
  }
}

static void test_refusals_write_nothing(void **state) {
  (void)state;
  for (size_t c = 0; c < sizeof kCases / sizeof kCases[0]; ++c) {
    assert_status(kCases[c].init(NULL, kCases[c].size), OSFT_STATUS_INVALID_ARGUMENT);
    assert_error_mentions(kCases[c].arg);
    unsigned char buf[512], before[512];
    memset(buf, 0x3C, sizeof buf);
    memcpy(before, buf, sizeof buf);
    assert_status(kCases[c].init(buf, sizeof(size_t)), OSFT_STATUS_INVALID_STRUCT_SIZE);
    assert_error_mentions("struct_size");
    assert_memory_equal(buf, before, sizeof buf);
  }
}

/* The macros' structs go straight into the queries. */
static void test_macros_feed_the_queries(void **state) {
  (void)state;
  osft_context_t ctx = NULL;
  assert_ok(osft_context_create(&ctx, NULL));
  osft_memory_stats_t ms;
  memset(&ms, 0xFF, sizeof ms);
  assert_ok(OSFT_MEMORY_STATS_INIT(&ms));
  assert_ok(osft_context_get_memory_stats(ctx, &ms));
  assert_true(ms.host_in_use > 0);
  osft_comm_t comm = NULL;
  assert_ok(osft_comm_create_self(ctx, NULL, &comm));
  osft_comm_stats_t cs;
  memset(&cs, 0xFF, sizeof cs);
  assert_ok(OSFT_COMM_STATS_INIT(&cs));
  assert_ok(osft_comm_get_stats(comm, &cs));
  assert_int_equal(cs.allreduce_calls, 0);
  osft_projector_t proj = NULL;
  assert_ok(osft_projector_create(ctx, comm, NULL, &proj));
  osft_projector_info_t pi;
  memset(&pi, 0xFF, sizeof pi);
  assert_ok(OSFT_PROJECTOR_INFO_INIT(&pi));
  assert_ok(osft_projector_get_info(proj, &pi));
  assert_int_equal(pi.targets, 0);
  osft_flce_t ce = NULL;
  assert_ok(osft_flce_create(ctx, NULL, &ce));
  float x[6] = {0.5f, -1, 2, 0.25f, 1, -0.5f}, w[9] = {1, 0, 0, 0, 1, 0, 0, 0, 1}, loss;
  int64_t tgt[2] = {0, 2}, xs[2] = {2, 3}, ws[2] = {3, 3}, ts[1] = {2};
  DLTensor tx = {x, {kDLCPU, 0}, 2, {kDLFloat, 32, 1}, xs, NULL, 0};
  DLTensor tw = {w, {kDLCPU, 0}, 2, {kDLFloat, 32, 1}, ws, NULL, 0};
  DLTensor tt = {tgt, {kDLCPU, 0}, 1, {kDLInt, 64, 1}, ts, NULL, 0};
  DLTensor tl = {&loss, {kDLCPU, 0}, 0, {kDLFloat, 32, 1}, NULL, NULL, 0};
  osft_flce_inputs_t in;
  assert_ok(OSFT_FLCE_INPUTS_INIT(&in));
  in.x = &tx;
  in.weight = &tw;
  in.targets = &tt;
  osft_flce_outputs_t out;
  assert_ok(OSFT_FLCE_OUTPUTS_INIT(&out));
  out.loss = &tl;
  osft_flce_plan_t plan;
  memset(&plan, 0xFF, sizeof plan);
  assert_ok(OSFT_FLCE_PLAN_INIT(&plan));
  assert_ok(osft_flce_get_plan(ce, &in, &out, &plan));
  assert_int_equal(plan.tokens, 2);
  assert_ok(osft_flce_destroy(ce));
  assert_ok(osft_projector_destroy(proj));
  assert_ok(osft_comm_destroy(comm));
  assert_ok(osft_context_destroy(ctx));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_zeroes_and_sets_struct_size),
      cmocka_unit_test(test_refusals_write_nothing),
      cmocka_unit_test(test_macros_feed_the_queries),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
