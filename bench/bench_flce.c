/*
 * bench_flce — fused linear cross-entropy fwd+bwd (loss, grad_x, grad_W),
 * side by side in one run with
 *   gemms        : the three GEMMs alone over all M tokens (logits = x W^T,
 *                  grad_x = g W, grad_W = g^T x): the floor;
 *   materialized : the logits of all M tokens in one M x V buffer, a softmax
 *                  cross-entropy pass over it (gradient in place), then the
 *                  two backward GEMMs: what an unfused framework runs. On the
 *                  CPU plain C over OpenBLAS; on CUDA osft_flce_compute with
 *                  one chunk of M rows;
 * and osft_flce_compute with the default budget, with a tight one (the
 * call's fixed scratch plus 1/D of the M x V fp32 logits, D = 4 by default),
 * with the default budget and OSFT_FLCE_ACCUMULATOR_OUTPUT (grad_W summed
 * in bf16 over the chunks: Liger-Kernel's default), and with that
 * accumulator in Liger-Kernel's chunks ("liger": next_pow2(ceil(M /
 * ceil(V / H))) rows, so that a chunk's logits are about the size of x:
 * its memory, to compare speed at equal memory), and at Liger-Kernel's
 * memory ("mem": memory_budget = MEM MiB, default 64, of scratch beyond the
 * gradients; the fp32 accumulator where it fits, else
 * OSFT_FLCE_ACCUMULATOR_OUTPUT; the planner's choice between token chunks
 * and vocabulary slices, printed with its tiles), and the same budget with
 * token chunks forced ("mem-tok": the plan before the vocabulary plan),
 * and the default budget before 1.3 ("former": the fixed part + 1 GiB of
 * chunks, now an explicit budget) beside today's default (chunks that grow
 * no faster than x), as the ratio default / former.
 *
 *   bench_flce [--device cpu|cuda] [--scale S] [--reps R] [--budget-div D]
 *              [--mem-mib MEM] [--counts] [--dtype fp32|bf16] [--cpu-time]
 *              [--shape M,H,V]... [--csv FILE]
 *
 * --shape (up to 8 times) runs those shapes instead of the four below
 * (--scale does not apply to them).
 *
 * --cpu-time (CPU only) times in the process's CPU time instead of wall
 * time: on a machine shared with other jobs, with one BLAS thread
 * (OPENBLAS_NUM_THREADS=1 / MKL_NUM_THREADS=1), that is the work each
 * variant does, which other jobs do not stretch.
 *
 * --dtype bf16 on the CPU gives the op bf16 x, W, grad_x and grad_W (the
 * floor and the materialized baseline stay fp32 OpenBLAS): the path whose
 * plan CUDA shares (fp32 accumulator, W widened once). *
 * --counts prints, per shape and variant, the op's own count of what one
 * call did ("flce: counts:" at OSFT_LOG_DEBUG: chunks, backend calls,
 * conversions, passes over a V x H buffer, host waits, allocations) and
 * whether its plan holds the gradients for one grad_W GEMM.
 *
 * --defaults runs another table instead (issue 55): per shape the op with
 * today's default budget ("new"), with the default of 1.3.0 ("old": the
 * fixed part + min(1 GiB, max(16 M H bytes, 512 rows of logits)), as an
 * explicit budget) and as one chunk of all M rows ("whole": the whole
 * M x V logits block as scratch), interleaved, with their times as ratios
 * to the whole block and each plan's scratch (osft_flce_get_plan). Its
 * shapes: --shape, or --grid (GPT-2 50257 x 768 and SmolLM2 49152 x 576 at
 * 16..8192 tokens, Llama-3 128256 x 4096 at 16..256). --slice-cols N sets
 * the new default's slice_cols; --alt-x K adds a variant "alt" whose
 * budget is the fixed part + max(8 MiB, K x x's bytes) (the new rule with
 * another multiple); --fwd-only and --no-grad-w drop gradients (forward
 * only; grad_x without grad_W, a frozen head).
 *
 * CPU: fp32, OpenBLAS. CUDA (builds with OSFT_BENCH_CUDA): bf16 x, W, grad_x
 * and grad_W (fp32 accumulator), cuBLAS for the floor. Shapes: BT in {2048,
 * 8192} tokens, H = 4096, V in {32000, 128256}, divided by S (default 8 on
 * the CPU, 1 on CUDA). Prints times (median of R runs, default 5, the
 * variants interleaved), the ratios to the floor and to the materialized
 * baseline, the op's peak memory (osft_context_get_memory_stats: host_peak
 * on the CPU, device_peak on CUDA) and the baseline's M x V buffer.
 */
#include <cblas.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#ifdef OSFT_BENCH_CUDA
#include "bench_cuda.h"
#endif
#include "osftrt/osftrt.h"

static float *fill(size_t n, float scale, unsigned seed) {
  float *p = xmalloc(n * sizeof(float));
  fill_uniform(p, n, seed, scale);
  return p;
}

/* ------------------------------------------------------------- problems */

typedef struct {
  int cuda; /* 0: CPU, fp32; 1: CUDA, bf16 */
  int bf16; /* the op's x, W, grad_x, grad_W in bf16 (always on CUDA) */
  int m, h, v;
  /* CPU with bf16: the op's bf16 copies (the floor stays fp32) */
  uint16_t *xb, *wb, *dxb, *dwb;
  /* on the device: x, w (and dx, dw, g) in the compute dtype; logits fp32;
   * CUDA only: g, the floor's bf16 gradient, and dw32, its fp32 grad_W */
  void *x, *w, *logits, *g, *dx, *dw, *dw32;
  int64_t *y;
  float *loss;
  void *blas; /* cublasHandle_t */
} problem;

/* Host buffers, moved to the GPU for CUDA problems. */
static uint16_t *bf16_copy(const float *f, size_t n) {
  uint16_t *b = xmalloc(n * sizeof(uint16_t));
  for (size_t i = 0; i < n; ++i) b[i] = to_bf16(f[i]);
  return b;
}

static void problem_init(problem *p, int cuda, int bf16, int m, int h, int v) {
  memset(p, 0, sizeof *p);
  p->cuda = cuda;
  p->bf16 = cuda || bf16;
  p->m = m;
  p->h = h;
  p->v = v;
  float *x = fill((size_t)m * h, 2.0f, 1u), *w = fill((size_t)v * h, 0.2f, 2u);
  float *g = fill((size_t)m * v, 1e-3f, 3u);
  float *dx = fill((size_t)m * h, 1.0f, 4u), *dw = fill((size_t)v * h, 1.0f, 5u);
  int64_t *y = xmalloc(sizeof(int64_t) * (size_t)m);
  for (int i = 0; i < m; ++i) y[i] = (int64_t)((i * 7919u) % (unsigned)v);
  if (!cuda) {
    p->x = x;
    p->w = w;
    p->logits = g;
    p->dx = dx;
    p->dw = dw;
    p->y = y;
    p->loss = xmalloc(sizeof(float));
    if (p->bf16) {
      p->xb = bf16_copy(x, (size_t)m * h);
      p->wb = bf16_copy(w, (size_t)v * h);
      p->dxb = bf16_copy(dx, (size_t)m * h);
      p->dwb = bf16_copy(dw, (size_t)v * h);
    }
    return;
  }
#ifdef OSFT_BENCH_CUDA
  p->x = upload(x, (size_t)m * h, 1);
  p->w = upload(w, (size_t)v * h, 1);
  p->g = upload(g, (size_t)m * v, 1);
  p->logits = upload(g, (size_t)m * v, 0);
  p->dx = upload(dx, (size_t)m * h, 1);
  p->dw = upload(dw, (size_t)v * h, 1);
  p->dw32 = upload(dw, (size_t)v * h, 0);
  cuda_check(cudaMalloc((void **)&p->y, sizeof(int64_t) * (size_t)m), "cudaMalloc");
  cuda_check(cudaMemcpy(p->y, y, sizeof(int64_t) * (size_t)m, cudaMemcpyHostToDevice),
             "cudaMemcpy");
  cuda_check(cudaMalloc((void **)&p->loss, sizeof(float)), "cudaMalloc");
  cublasHandle_t handle;
  if (cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS) {
    fprintf(stderr, "cublasCreate failed\n");
    exit(1);
  }
  p->blas = handle;
  float *host[5] = {x, w, g, dx, dw};
  for (int i = 0; i < 5; ++i) free(host[i]);
  free(y);
#endif
}

static void problem_free(problem *p) {
  void *bufs[9] = {p->x, p->w, p->logits, p->g, p->dx, p->dw, p->dw32, p->y, p->loss};
  if (!p->cuda) {
    for (int i = 0; i < 9; ++i) free(bufs[i]);
    free(p->xb);
    free(p->wb);
    free(p->dxb);
    free(p->dwb);
    return;
  }
#ifdef OSFT_BENCH_CUDA
  for (int i = 0; i < 9; ++i) cudaFree(bufs[i]);
  cublasDestroy((cublasHandle_t)p->blas);
#endif
}

/* Loss as a float on the host. */
static float loss_of(const problem *p) {
  float l = 0.0f;
  if (!p->cuda) return *p->loss;
#ifdef OSFT_BENCH_CUDA
  cuda_check(cudaMemcpy(&l, p->loss, 4, cudaMemcpyDeviceToHost), "cudaMemcpy");
#endif
  return l;
}

/* --------------------------------------------------------------- floor */

/* C (m x n) = op(A) op(B), row-major, fp32 (CPU). */
static void sgemm(int ta, int tb, int m, int n, int k, const float *a, int lda,
                  const float *b, int ldb, float *c, int ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans,
              tb ? CblasTrans : CblasNoTrans, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c,
              ldc);
}

static void three_gemms(problem *p) {
  if (!p->cuda) {
    float *lg = p->logits;
    sgemm(0, 1, p->m, p->v, p->h, p->x, p->h, p->w, p->h, lg, p->v);
    sgemm(0, 0, p->m, p->h, p->v, lg, p->v, p->w, p->h, p->dx, p->h);
    sgemm(1, 0, p->v, p->h, p->m, lg, p->v, p->x, p->h, p->dw, p->h);
    return;
  }
#ifdef OSFT_BENCH_CUDA
  cublasHandle_t h = (cublasHandle_t)p->blas;
  gemm_bf16(h, 0, 1, p->m, p->v, p->h, p->x, p->h, p->w, p->h, p->logits, p->v,
            CUDA_R_32F);
  gemm_bf16(h, 0, 0, p->m, p->h, p->v, p->g, p->v, p->w, p->h, p->dx, p->h, CUDA_R_16BF);
  gemm_bf16(h, 1, 0, p->v, p->h, p->m, p->g, p->v, p->x, p->h, p->dw32, p->h, CUDA_R_32F);
  cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
#endif
}

/* ---------------------------------------------------- materialized (CPU) */

/* Mean cross-entropy over the materialized logits; the gradient in place. */
static void softmax_ce(problem *p) {
  double total = 0.0;
  const float inv_m = 1.0f / (float)p->m;
  for (int i = 0; i < p->m; ++i) {
    float *z = (float *)p->logits + (size_t)i * p->v;
    float mx = z[0];
    for (int j = 1; j < p->v; ++j) mx = z[j] > mx ? z[j] : mx;
    double s = 0.0;
    for (int j = 0; j < p->v; ++j) s += expf(z[j] - mx);
    const float lse = mx + (float)log(s);
    total += lse - z[p->y[i]];
    for (int j = 0; j < p->v; ++j) z[j] = expf(z[j] - lse) * inv_m;
    z[p->y[i]] -= inv_m;
  }
  *p->loss = (float)(total / p->m);
}

static void materialized_cpu(problem *p) {
  float *lg = p->logits;
  sgemm(0, 1, p->m, p->v, p->h, p->x, p->h, p->w, p->h, lg, p->v);
  softmax_ce(p);
  sgemm(0, 0, p->m, p->h, p->v, lg, p->v, p->w, p->h, p->dx, p->h);
  sgemm(1, 0, p->v, p->h, p->m, lg, p->v, p->x, p->h, p->dw, p->h);
}

/* ------------------------------------------------------------- the op */

typedef struct {
  osft_context_t ctx;
  osft_flce_t flce;
  osft_flce_accumulator_t accumulator;
  int held; /* the plan holds every chunk's gradient for one grad_W GEMM */
  osft_flce_chunking_t chunking; /* asked for (the plan says what it took) */
  osft_flce_inputs_t in;
  osft_flce_outputs_t out;
  DLTensor x, w, y, loss, dx, dw;
  int64_t xs[2], ws[2], ys[1];
  osft_flce_plan_t plan;
} fused_setup;

static DLTensor tensor(const problem *p, void *data, DLDataTypeCode code, int bits,
                       int ndim, int64_t *shape) {
  DLTensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.device.device_type = p->cuda ? kDLCUDA : kDLCPU;
  t.ndim = ndim;
  t.dtype.code = (uint8_t)code;
  t.dtype.bits = (uint8_t)bits;
  t.dtype.lanes = 1;
  t.shape = shape;
  return t;
}

/* The op's debug lines ("flce: M = ..." from planning, "flce: counts: ..."
 * after a call), caught while a bench_flce_catch() is active. */
static char flce_plan_line[512], flce_counts_line[512];

static void flce_log_sink(void *user, osft_log_level_t level, const char *message) {
  (void)user;
  (void)level;
  if (!strncmp(message, "flce: M = ", 10))
    snprintf(flce_plan_line, sizeof flce_plan_line, "%s", message);
  else if (!strncmp(message, "flce: counts: ", 14))
    snprintf(flce_counts_line, sizeof flce_counts_line, "%s", message);
}

static void flce_catch(int on) {
  flce_plan_line[0] = flce_counts_line[0] = '\0';
  CHECK(osft_set_log_callback(on ? flce_log_sink : NULL, NULL,
                              on ? OSFT_LOG_DEBUG : OSFT_LOG_OFF));
}

/* --defaults: the new default's slice_cols, set while it is created;
 * which gradients the op computes (--fwd-only, --no-grad-w). */
static int64_t g_slice_cols;
static int g_no_grad_x, g_no_grad_w;

/* The op on its own context, with a budget (0: default) and chunk rows (0:
 * from the budget); returns the status of planning the call. */
static osft_status_t try_setup_fused(fused_setup *f, problem *p, size_t budget,
                                     int64_t chunk_rows,
                                     osft_flce_accumulator_t accumulator,
                                     osft_flce_chunking_t chunking) {
  osft_context_options_t co;
  CHECK(OSFT_CONTEXT_OPTIONS_INIT(&co));
  co.device_type = p->cuda ? OSFT_DEVICE_CUDA : OSFT_DEVICE_CPU;
  CHECK(osft_context_create(&f->ctx, &co));
  osft_flce_options_t o;
  CHECK(OSFT_FLCE_OPTIONS_INIT(&o));
  o.memory_budget = budget;
  o.chunk_rows = chunk_rows;
  o.accumulator = accumulator;
  o.chunking = chunking;
  o.slice_cols = g_slice_cols;
  CHECK(osft_flce_create(f->ctx, &o, &f->flce));
  f->xs[0] = f->ys[0] = p->m;
  f->xs[1] = f->ws[1] = p->h;
  f->ws[0] = p->v;
  const DLDataTypeCode fc = p->bf16 ? kDLBfloat : kDLFloat;
  const int fb = p->bf16 ? 16 : 32;
  const int host16 = p->bf16 && !p->cuda;
  f->x = tensor(p, host16 ? (void *)p->xb : p->x, fc, fb, 2, f->xs);
  f->w = tensor(p, host16 ? (void *)p->wb : p->w, fc, fb, 2, f->ws);
  f->y = tensor(p, p->y, kDLInt, 64, 1, f->ys);
  f->loss = tensor(p, p->loss, kDLFloat, 32, 0, NULL);
  f->dx = tensor(p, host16 ? (void *)p->dxb : p->dx, fc, fb, 2, f->xs);
  f->dw = tensor(p, host16 ? (void *)p->dwb : p->dw, fc, fb, 2, f->ws);
  CHECK(OSFT_FLCE_INPUTS_INIT(&f->in));
  CHECK(OSFT_FLCE_OUTPUTS_INIT(&f->out));
  f->in.x = &f->x;
  f->in.weight = &f->w;
  f->in.targets = &f->y;
  f->out.loss = &f->loss;
  f->out.grad_x = g_no_grad_x ? NULL : &f->dx;
  f->out.grad_weight = g_no_grad_w ? NULL : &f->dw;
  f->plan.struct_size = sizeof f->plan;
  f->accumulator = accumulator;
  flce_catch(1);
  const osft_status_t st = osft_flce_get_plan(f->flce, &f->in, &f->out, &f->plan);
  f->held = strstr(flce_plan_line, "held") != NULL;
  flce_catch(0);
  if (st != OSFT_STATUS_SUCCESS) {
    CHECK(osft_flce_destroy(f->flce));
    CHECK(osft_context_destroy(f->ctx));
  }
  return st;
}

static void setup_fused(fused_setup *f, problem *p, size_t budget, int64_t chunk_rows,
                        osft_flce_accumulator_t accumulator) {
  CHECK(try_setup_fused(f, p, budget, chunk_rows, accumulator, OSFT_FLCE_CHUNKING_AUTO));
}

/* Liger-Kernel's memory: `bytes` of scratch; the exact fp32 accumulator
 * where a plan fits, else grad_W summed in its own dtype. */
static void setup_mem(fused_setup *f, problem *p, size_t bytes,
                      osft_flce_chunking_t chunking) {
  if (try_setup_fused(f, p, bytes, 0, OSFT_FLCE_ACCUMULATOR_FP32, chunking) ==
      OSFT_STATUS_SUCCESS)
    return;
  CHECK(try_setup_fused(f, p, bytes, 0, OSFT_FLCE_ACCUMULATOR_OUTPUT, chunking));
}

/* The plan's tiles: "C x R" token chunks, or "C x R rows x S x W classes". */
static const char *plan_tiles(const fused_setup *f, char *buf, size_t size) {
  if (f->plan.chunking == OSFT_FLCE_CHUNKING_VOCAB)
    snprintf(buf, size, "%lld x %lld rows x %lld x %lld classes (vocab)",
             (long long)f->plan.chunks, (long long)f->plan.chunk_rows,
             (long long)f->plan.slices, (long long)f->plan.slice_cols);
  else
    snprintf(buf, size, "%lld x %lld rows (tokens)", (long long)f->plan.chunks,
             (long long)f->plan.chunk_rows);
  return buf;
}

static void fused(fused_setup *f) {
  CHECK(osft_flce_compute(f->flce, &f->in, &f->out));
  CHECK(osft_context_synchronize(f->ctx));
}

/* One call with the op's counts printed. */
static void print_counts(fused_setup *f, const problem *p, const char *name) {
  flce_catch(1);
  fused(f);
  printf("# counts %d x %d x %d %-8s %s acc, %s\n", p->m, p->h, p->v, name,
         f->accumulator == OSFT_FLCE_ACCUMULATOR_FP32 ? "fp32" : "output",
         flce_counts_line[0] ? flce_counts_line + 6 : "(no counts line)");
  flce_catch(0);
}

/* Peak memory of the op's context, in MiB. */
static double peak_mib(const fused_setup *f, int cuda) {
  osft_memory_stats_t st;
  st.struct_size = sizeof st;
  CHECK(osft_context_get_memory_stats(f->ctx, &st));
  return (double)(cuda ? st.device_peak : st.host_peak) / (1 << 20);
}

static void teardown_fused(fused_setup *f) {
  CHECK(osft_flce_destroy(f->flce));
  CHECK(osft_context_destroy(f->ctx));
}

/* The call's fixed scratch (e.g. the fp32 grad_W accumulator of a call in
 * several chunks), read off two plans of several chunks each. */
static size_t fixed_scratch(problem *p) {
  fused_setup all, half;
  setup_fused(&all, p, SIZE_MAX / 2, p->m / 2, OSFT_FLCE_ACCUMULATOR_FP32);
  setup_fused(&half, p, SIZE_MAX / 2, p->m / 4, OSFT_FLCE_ACCUMULATOR_FP32);
  const size_t rows = (size_t)(all.plan.chunk_rows - half.plan.chunk_rows);
  const size_t per_row =
      (size_t)(all.plan.scratch_bytes - half.plan.scratch_bytes) / rows;
  const size_t fixed =
      (size_t)all.plan.scratch_bytes - per_row * (size_t)all.plan.chunk_rows;
  teardown_fused(&all);
  teardown_fused(&half);
  return fixed;
}

/* The tight budget: the fixed scratch plus 1/div of the M x V fp32 logits. */
static size_t tight_budget(problem *p, int div) {
  return fixed_scratch(p) + (size_t)p->m * (size_t)p->v * sizeof(float) / (size_t)div;
}

/* -------------------------------------------------------------- timing */

enum {
  GEMMS,
  MATERIALIZED,
  FUSED,
  TIGHT,
  OUT_ACC,
  LIGER,
  MEM,
  MEM_TOK,
  FORMER,
  VARIANTS
};

typedef struct {
  problem *p;
  fused_setup *one_chunk, *def, *tight, *out_acc, *liger, *mem, *mem_tok, *former;
} bench_case;

/* Liger-Kernel's chunk rows for M tokens: next_pow2(ceil(M / ceil(V / H))). */
static int64_t liger_chunk_rows(const problem *p) {
  const int64_t inc = (p->v + p->h - 1) / p->h;
  const int64_t want = (p->m + inc - 1) / inc;
  int64_t rows = 1;
  while (rows < want) rows *= 2;
  return rows < p->m ? rows : p->m;
}

static void run_variant(bench_case *b, int variant) {
  switch (variant) {
    case GEMMS: three_gemms(b->p); break;
    case MATERIALIZED:
      if (b->p->cuda)
        fused(b->one_chunk);
      else
        materialized_cpu(b->p);
      break;
    case FUSED: fused(b->def); break;
    case TIGHT: fused(b->tight); break;
    case OUT_ACC: fused(b->out_acc); break;
    case LIGER: fused(b->liger); break;
    case MEM: fused(b->mem); break;
    case FORMER: fused(b->former); break;
    default: fused(b->mem_tok); break;
  }
}

static double median(double *t, int n) {
  for (int i = 1; i < n; ++i)
    for (int j = i; j > 0 && t[j] < t[j - 1]; --j) {
      const double s = t[j];
      t[j] = t[j - 1];
      t[j - 1] = s;
    }
  return t[n / 2];
}

/* The clock of the timings (clock_ms): wall time, or with --cpu-time the
 * process's CPU time. */
static int g_cpu_time;

/* Every variant round-robin, so that a drifting machine affects all alike;
 * medians of `reps` runs after one warm-up each. */
static void time_all(bench_case *b, int reps, double *out) {
  double t[VARIANTS][32];
  for (int v = 0; v < VARIANTS; ++v) run_variant(b, v);
  for (int r = 0; r < reps; ++r)
    for (int v = 0; v < VARIANTS; ++v) {
      const double t0 = clock_ms(g_cpu_time);
      run_variant(b, v);
      t[v][r] = clock_ms(g_cpu_time) - t0;
    }
  for (int v = 0; v < VARIANTS; ++v) out[v] = median(t[v], reps);
}

/* One shape: every variant timed, the losses compared, a table row. */
static void bench_shape(problem *p, int reps, int budget_div, size_t mem_bytes,
                        int counts, FILE *csv) {
  const int cuda = p->cuda;
  const double mxv_mib = (double)p->m * p->v * sizeof(float) / (1 << 20);
  const size_t tight = tight_budget(p, budget_div);
  fused_setup one, def, tgt, out, lig, mem, mtok, fmr;
  if (cuda) setup_fused(&one, p, SIZE_MAX / 2, p->m, OSFT_FLCE_ACCUMULATOR_FP32);
  setup_fused(&def, p, 0, 0, OSFT_FLCE_ACCUMULATOR_FP32);
  setup_fused(&tgt, p, tight, 0, OSFT_FLCE_ACCUMULATOR_FP32);
  setup_fused(&out, p, 0, 0, OSFT_FLCE_ACCUMULATOR_OUTPUT);
  setup_fused(&lig, p, SIZE_MAX / 2, liger_chunk_rows(p), OSFT_FLCE_ACCUMULATOR_OUTPUT);
  setup_mem(&mem, p, mem_bytes, OSFT_FLCE_CHUNKING_AUTO);
  setup_mem(&mtok, p, mem_bytes, OSFT_FLCE_CHUNKING_TOKENS);
  setup_fused(&fmr, p, fixed_scratch(p) + ((size_t)1 << 30), 0,
              OSFT_FLCE_ACCUMULATOR_FP32);
  bench_case b = {p, cuda ? &one : NULL, &def, &tgt, &out, &lig, &mem, &mtok, &fmr};
  double t[VARIANTS];
  time_all(&b, reps, t);
  if (counts) {
    fused_setup *const all[7] = {&def, &tgt, &out, &lig, &mem, &mtok, &fmr};
    const char *names[7] = {"default", "tight",   "acc.out", "liger",
                            "mem",     "mem-tok", "former"};
    for (int i = 0; i < 7; ++i) print_counts(all[i], p, names[i]);
  }
  run_variant(&b, MATERIALIZED);
  const float loss_mat = loss_of(p);
  fused(&def);
  const float loss = loss_of(p);
  if (fabsf(loss - loss_mat) > 1e-3f * fabsf(loss_mat))
    fprintf(stderr, "warning: loss %g (flce) vs %g (materialized)\n", loss, loss_mat);
  const double def_mib = peak_mib(&def, cuda), tgt_mib = peak_mib(&tgt, cuda);
  const double out_mib = peak_mib(&out, cuda), lig_mib = peak_mib(&lig, cuda);
  const double mem_mib = peak_mib(&mem, cuda), mtok_mib = peak_mib(&mtok, cuda);
  const double fmr_mib = peak_mib(&fmr, cuda);
  printf(
      "%5d %5d %6d | %8.1f %8.1f %8.1f %8.1f %8.1f %8.1f | %6.3f %6.3f %6.3f %6.3f %6.2f "
      "| %8.1f %8.1f %8.1f %8.1f %8.1f | %lld x %lld; %lld x %lld; %lld x %lld\n",
      p->m, p->h, p->v, t[GEMMS], t[MATERIALIZED], t[FUSED], t[TIGHT], t[OUT_ACC],
      t[LIGER], t[FUSED] / t[GEMMS], t[TIGHT] / t[GEMMS], t[OUT_ACC] / t[GEMMS],
      t[LIGER] / t[GEMMS], t[MATERIALIZED] / t[FUSED], mxv_mib, def_mib, tgt_mib, out_mib,
      lig_mib, (long long)def.plan.chunks, (long long)def.plan.chunk_rows,
      (long long)tgt.plan.chunks, (long long)tgt.plan.chunk_rows,
      (long long)lig.plan.chunks, (long long)lig.plan.chunk_rows);
  char tiles[3][96];
  printf(
      "%18s mem (%.0f MiB, %s acc.): %.1f ms, %.3f x gemms, peak %.1f MiB, %s%s\n"
      "%18s mem-tok (token chunks forced): %.1f ms, %.3f x gemms, peak %.1f MiB, %s\n"
      "%18s former default (fixed + 1 GiB): %.1f ms, peak %.1f MiB, %s; default / "
      "former: time %.3f, peak %.3f\n",
      "", (double)mem_bytes / (1 << 20),
      mem.accumulator == OSFT_FLCE_ACCUMULATOR_FP32 ? "fp32" : "output", t[MEM],
      t[MEM] / t[GEMMS], mem_mib, plan_tiles(&mem, tiles[0], sizeof tiles[0]),
      def.held ? "; default plan holds g" : "", "", t[MEM_TOK], t[MEM_TOK] / t[GEMMS],
      mtok_mib, plan_tiles(&mtok, tiles[1], sizeof tiles[1]), "", t[FORMER], fmr_mib,
      plan_tiles(&fmr, tiles[2], sizeof tiles[2]), t[FUSED] / t[FORMER],
      def_mib / fmr_mib);
  fflush(stdout);
  if (csv)
    fprintf(csv,
            "%s,%d,%d,%d,%.3f,%.3f,%.3f,%.3f,%.4f,%.4f,%.4f,%.2f,%.2f,%.2f,%.2f,%lld,"
            "%lld,%lld,%lld,%.3f,%.4f,%.2f,%.3f,%.4f,%.2f,%lld,%.3f,%.4f,%.2f,%.2f,%lld,"
            "%lld,%s,%d,%s,%lld,%lld,%.3f,%.4f,%.2f,%lld,%lld,%.3f,%.4f,%.2f,%lld\n",
            cuda ? "cuda" : "cpu", p->m, p->h, p->v, t[GEMMS], t[MATERIALIZED], t[FUSED],
            t[TIGHT], t[FUSED] / t[GEMMS], t[TIGHT] / t[GEMMS],
            t[MATERIALIZED] / t[FUSED], mxv_mib, def_mib, tgt_mib,
            (double)tight / (1 << 20), (long long)def.plan.chunks,
            (long long)def.plan.chunk_rows, (long long)tgt.plan.chunks,
            (long long)tgt.plan.chunk_rows, t[OUT_ACC], t[OUT_ACC] / t[GEMMS], out_mib,
            t[LIGER], t[LIGER] / t[GEMMS], lig_mib, (long long)lig.plan.chunk_rows,
            t[MEM], t[MEM] / t[GEMMS], mem_mib, (double)mem_bytes / (1 << 20),
            (long long)mem.plan.chunks, (long long)mem.plan.chunk_rows,
            mem.accumulator == OSFT_FLCE_ACCUMULATOR_FP32 ? "fp32" : "output", def.held,
            mem.plan.chunking == OSFT_FLCE_CHUNKING_VOCAB ? "vocab" : "tokens",
            (long long)mem.plan.slices, (long long)mem.plan.slice_cols, t[MEM_TOK],
            t[MEM_TOK] / t[GEMMS], mtok_mib, (long long)mtok.plan.chunks,
            (long long)mtok.plan.chunk_rows, t[FORMER], t[FUSED] / t[FORMER], fmr_mib,
            (long long)fmr.plan.chunks);
  if (csv) fflush(csv); /* a line cut short by a timeout keeps the rows so far */
  if (cuda) teardown_fused(&one);
  teardown_fused(&def);
  teardown_fused(&tgt);
  teardown_fused(&out);
  teardown_fused(&lig);
  teardown_fused(&mem);
  teardown_fused(&mtok);
  teardown_fused(&fmr);
}

/* ------------------------------------------------- --defaults (issue 55) */

enum { D_WHOLE, D_OLD, D_NEW, D_ALT, D_VARIANTS };

/* The 1.3.0 default as an explicit budget: the fixed part + min(1 GiB,
 * max(16 M H bytes, 512 rows of fp32 logits)). */
static size_t old_default_budget(problem *p, size_t fixed) {
  const size_t vp = ((size_t)p->v + 15) / 16 * 16;
  size_t chunk = (size_t)16 * (size_t)p->m * (size_t)p->h;
  if (chunk < 512 * 4 * vp) chunk = 512 * 4 * vp;
  if (chunk > ((size_t)1 << 30)) chunk = (size_t)1 << 30;
  return fixed + chunk + 4096; /* fixed_scratch() leaves out alignment slack */
}

static const char *plan_short(const fused_setup *f, char *buf, size_t size) {
  if (f->plan.chunking == OSFT_FLCE_CHUNKING_VOCAB)
    snprintf(buf, size, "%lldx%lld r; %lldx%lld cls", (long long)f->plan.chunks,
             (long long)f->plan.chunk_rows, (long long)f->plan.slices,
             (long long)f->plan.slice_cols);
  else
    snprintf(buf, size, "%lldx%lld r", (long long)f->plan.chunks,
             (long long)f->plan.chunk_rows);
  return buf;
}

static void bench_defaults(problem *p, int reps, int alt_x, FILE *csv) {
  fused_setup v[D_VARIANTS];
  const int n = alt_x > 0 ? D_VARIANTS : D_ALT;
  /* the fixed part, as the old default counted it (two token plans) */
  const int64_t keep = g_slice_cols;
  g_slice_cols = 0;
  const size_t fixed = p->m >= 4 ? fixed_scratch(p) : 0;
  setup_fused(&v[D_WHOLE], p, SIZE_MAX / 2, 0, OSFT_FLCE_ACCUMULATOR_FP32);
  setup_fused(&v[D_OLD], p, old_default_budget(p, fixed), 0, OSFT_FLCE_ACCUMULATOR_FP32);
  if (alt_x > 0) {
    size_t chunk = (size_t)alt_x * (size_t)p->m * (size_t)p->h * sizeof(float);
    if (chunk < ((size_t)8 << 20)) chunk = (size_t)8 << 20;
    setup_fused(&v[D_ALT], p, fixed + chunk, 0, OSFT_FLCE_ACCUMULATOR_FP32);
  }
  g_slice_cols = keep;
  setup_fused(&v[D_NEW], p, 0, 0, OSFT_FLCE_ACCUMULATOR_FP32);
  double t[D_VARIANTS][32];
  for (int k = 0; k < n; ++k) fused(&v[k]);
  for (int r = 0; r < reps; ++r)
    for (int k = 0; k < n; ++k) {
      const double t0 = clock_ms(g_cpu_time);
      fused(&v[k]);
      t[k][r] = clock_ms(g_cpu_time) - t0;
    }
  double med[D_VARIANTS];
  for (int k = 0; k < n; ++k) med[k] = median(t[k], reps);
  const double mib = 1.0 / (1 << 20);
  char plans[D_VARIANTS][64];
  for (int k = 0; k < n; ++k) plan_short(&v[k], plans[k], sizeof plans[k]);
  printf("%5d %5d %6d | %9.1f %9.1f %9.1f | %6.3f %6.3f | %8.1f %8.1f %8.1f | %s", p->m,
         p->h, p->v, med[D_WHOLE], med[D_OLD], med[D_NEW], med[D_OLD] / med[D_WHOLE],
         med[D_NEW] / med[D_WHOLE], v[D_WHOLE].plan.scratch_bytes * mib,
         v[D_OLD].plan.scratch_bytes * mib, v[D_NEW].plan.scratch_bytes * mib,
         plans[D_NEW]);
  if (alt_x > 0)
    printf(" | alt %.1f ms %.3f, %.1f MiB, %s", med[D_ALT], med[D_ALT] / med[D_WHOLE],
           v[D_ALT].plan.scratch_bytes * mib, plans[D_ALT]);
  printf("\n");
  fflush(stdout);
  if (csv) {
    fprintf(csv, "%d,%d,%d,%.3f,%.3f,%.3f,%.4f,%.4f,%.3f,%.3f,%.3f,%s,%s,%lld", p->m,
            p->h, p->v, med[D_WHOLE], med[D_OLD], med[D_NEW], med[D_OLD] / med[D_WHOLE],
            med[D_NEW] / med[D_WHOLE], v[D_WHOLE].plan.scratch_bytes * mib,
            v[D_OLD].plan.scratch_bytes * mib, v[D_NEW].plan.scratch_bytes * mib,
            plans[D_OLD], plans[D_NEW], (long long)g_slice_cols);
    if (alt_x > 0)
      fprintf(csv, ",%d,%.3f,%.4f,%.3f,%s", alt_x, med[D_ALT], med[D_ALT] / med[D_WHOLE],
              v[D_ALT].plan.scratch_bytes * mib, plans[D_ALT]);
    fprintf(csv, "\n");
    fflush(csv);
  }
  for (int k = 0; k < n; ++k) teardown_fused(&v[k]);
}

static int run_defaults(int reps, int alt_x, int grid, int shapes[][3], int n_shapes,
                        const char *csv_path) {
  static int all[24][3];
  int n = 0;
  if (grid) {
    const int ms[8] = {16, 64, 256, 512, 1024, 2048, 4096, 8192};
    const int models[2][2] = {{768, 50257}, {576, 49152}};
    for (int mi = 0; mi < 2; ++mi)
      for (int i = 0; i < 8; ++i) {
        all[n][0] = ms[i];
        all[n][1] = models[mi][0];
        all[n++][2] = models[mi][1];
      }
    const int llama[3] = {16, 64, 256};
    for (int i = 0; i < 3; ++i) {
      all[n][0] = llama[i];
      all[n][1] = 4096;
      all[n++][2] = 128256;
    }
  }
  for (int i = 0; i < n_shapes && n < 24; ++i, ++n)
    memcpy(all[n], shapes[i], sizeof all[n]);
  FILE *csv = csv_path ? fopen(csv_path, "w") : NULL;
  if (csv) {
    fprintf(
        csv,
        "m,h,v,whole_ms,old_ms,new_ms,old_over_whole,new_over_whole,whole_scratch_mib,"
        "old_scratch_mib,new_scratch_mib,old_plan,new_plan,slice_cols");
    fprintf(csv,
            alt_x > 0 ? ",alt_x,alt_ms,alt_over_whole,alt_scratch_mib,alt_plan\n" : "\n");
  }
  printf(
      "# %s\n# CPU, fp32; loss%s%s; median of %d, interleaved%s; whole = one chunk of "
      "M rows, old = the 1.3.0 default, new = today's default\n",
      osft_build_info(), g_no_grad_x ? "" : ", grad_x", g_no_grad_w ? "" : ", grad_W",
      reps, g_cpu_time ? " (process CPU time)" : "");
  printf("%5s %5s %6s | %9s %9s %9s | %6s %6s | %8s %8s %8s | %s\n", "M", "H", "V",
         "whole ms", "old ms", "new ms", "o/w", "n/w", "whole MiB", "old MiB", "new MiB",
         "new plan");
  for (int i = 0; i < n; ++i) {
    problem p;
    problem_init(&p, 0, 0, all[i][0], all[i][1], all[i][2]);
    bench_defaults(&p, reps, alt_x, csv);
    problem_free(&p);
  }
  if (csv) fclose(csv);
  return 0;
}

int main(int argc, char **argv) {
  int scale = 0, reps = 5, budget_div = 4, cuda = 0, counts = 0, bf16 = 0;
  int defaults = 0, grid = 0, alt_x = 0;
  double mem_mib = 64.0;
  const char *csv_path = NULL;
  int shapes[8][3], n_shapes = 0;
  for (int i = 1; i < argc; ++i) {
    if (!strcmp(argv[i], "--scale") && i + 1 < argc)
      scale = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
      reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--budget-div") && i + 1 < argc)
      budget_div = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--csv") && i + 1 < argc)
      csv_path = argv[++i];
    else if (!strcmp(argv[i], "--mem-mib") && i + 1 < argc)
      mem_mib = atof(argv[++i]);
    else if (!strcmp(argv[i], "--counts"))
      counts = 1;
    else if (!strcmp(argv[i], "--defaults"))
      defaults = 1;
    else if (!strcmp(argv[i], "--grid"))
      grid = 1;
    else if (!strcmp(argv[i], "--fwd-only"))
      g_no_grad_x = g_no_grad_w = 1;
    else if (!strcmp(argv[i], "--no-grad-w"))
      g_no_grad_w = 1;
    else if (!strcmp(argv[i], "--slice-cols") && i + 1 < argc)
      g_slice_cols = atoll(argv[++i]);
    else if (!strcmp(argv[i], "--alt-x") && i + 1 < argc)
      alt_x = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--cpu-time"))
      g_cpu_time = 1;
    else if (!strcmp(argv[i], "--dtype") && i + 1 < argc)
      bf16 = !strcmp(argv[++i], "bf16");
    else if (!strcmp(argv[i], "--device") && i + 1 < argc)
      cuda = !strcmp(argv[++i], "cuda");
    else if (!strcmp(argv[i], "--shape") && i + 1 < argc && n_shapes < 8 &&
             sscanf(argv[i + 1], "%d,%d,%d", &shapes[n_shapes][0], &shapes[n_shapes][1],
                    &shapes[n_shapes][2]) == 3 &&
             shapes[n_shapes][0] > 0 && shapes[n_shapes][1] > 0 &&
             shapes[n_shapes][2] > 0) {
      ++n_shapes;
      ++i;
    } else {
      fprintf(stderr,
              "usage: %s [--device cpu|cuda] [--scale S] [--reps R] [--budget-div D] "
              "[--mem-mib MEM] [--counts] [--dtype fp32|bf16] [--cpu-time] [--shape "
              "M,H,V]... "
              "[--csv FILE]\n"
              "       %s --defaults [--grid] [--shape M,H,V]... [--slice-cols N] "
              "[--alt-x K] [--fwd-only | --no-grad-w] [--reps R] [--cpu-time] [--csv "
              "FILE]\n",
              argv[0], argv[0]);
      return 2;
    }
  }
#ifndef OSFT_BENCH_CUDA
  if (cuda) {
    fprintf(stderr, "this bench_flce was built without CUDA\n");
    return 2;
  }
#endif
  if (cuda) g_cpu_time = 0; /* the GPU's work is not the process's CPU time */
  if (scale < 1) scale = cuda ? 1 : 8;
  if (reps < 1 || reps > 31) reps = 5;
  if (defaults) {
    if (cuda || bf16) {
      fprintf(stderr, "--defaults measures the CPU's fp32 default\n");
      return 2;
    }
    return run_defaults(reps, alt_x, grid, shapes, n_shapes, csv_path);
  }
  if (budget_div < 1) budget_div = 4;
  const int bts[2] = {2048, 8192}, vs[2] = {32000, 128256}, h_full = 4096;
  FILE *csv = csv_path ? fopen(csv_path, "w") : NULL;
  if (csv)
    fprintf(
        csv,
        "device,bt,h,v,gemms_ms,materialized_ms,flce_ms,flce_tight_ms,flce_over_gemms,"
        "tight_over_gemms,materialized_over_flce,mxv_mib,flce_peak_mib,"
        "tight_peak_mib,tight_budget_mib,chunks,chunk_rows,tight_chunks,"
        "tight_chunk_rows,outacc_ms,outacc_over_gemms,outacc_peak_mib,liger_ms,"
        "liger_over_gemms,liger_peak_mib,liger_chunk_rows,mem_ms,mem_over_gemms,"
        "mem_peak_mib,mem_budget_mib,mem_chunks,mem_chunk_rows,mem_accumulator,"
        "flce_held,mem_chunking,mem_slices,mem_slice_cols,memtok_ms,memtok_over_gemms,"
        "memtok_peak_mib,memtok_chunks,memtok_chunk_rows,former_ms,default_over_former,"
        "former_peak_mib,former_chunks\n");
  printf(
      "# %s\n# %s, shapes / %d, median of %d%s; tight budget = fixed + M x V x 4 / %d; "
      "acc.out = grad_W summed in its own dtype; liger = acc.out in Liger-Kernel's "
      "chunks\n",
      osft_build_info(),
      cuda   ? "CUDA, bf16"
      : bf16 ? "CPU, bf16 op (fp32 floor)"
             : "CPU, fp32",
      scale, reps, g_cpu_time ? " (process CPU time)" : "", budget_div);
  printf(
      "%5s %5s %6s | %8s %8s %8s %8s %8s %8s | %6s %6s %6s %6s %6s | %8s %8s %8s %8s %8s "
      "| "
      "%s\n",
      "BT", "H", "V", "gemms", "mater.", "flce", "tight", "acc.out", "liger", "f/gem",
      "t/gem", "o/gem", "l/gem", "mat/f", "MxV MiB", "peak MiB", "tgt MiB", "out MiB",
      "lig MiB", "chunks (default; tight; liger)");
  if (n_shapes == 0)
    for (int bi = 0; bi < 2; ++bi)
      for (int vi = 0; vi < 2; ++vi) {
        shapes[n_shapes][0] = bts[bi] / scale;
        shapes[n_shapes][1] = h_full / scale;
        shapes[n_shapes++][2] = vs[vi] / scale;
      }
  for (int s = 0; s < n_shapes; ++s) {
    problem p;
    problem_init(&p, cuda, bf16, shapes[s][0], shapes[s][1], shapes[s][2]);
    bench_shape(&p, reps, budget_div, (size_t)(mem_mib * (1 << 20)), counts, csv);
    problem_free(&p);
  }
  if (csv) fclose(csv);
  return 0;
}
