/*
 * bench_mlp — the tiled SwiGLU MLP, forward + backward, side by side in one
 * run with its untiled references:
 *   baseline : untiled, the forward saving G = x Wg^T, U = x Wu^T and
 *              H = silu(G) U for the backward (what a framework does without
 *              tiling); plain OpenBLAS GEMMs and loops. CPU only.
 *   untiled  : libosftrt with one tile (its backward recomputes G and U).
 *   tiled    : libosftrt with its tiling rule (tiles of H tokens, ALST's
 *              rule) or --tile-tokens.
 * For each, the median time of each pass and the peak bytes the library
 * allocated during the pass (osft_context_get_memory_stats, from an empty
 * workspace): the intermediates. The baseline's intermediates are its
 * buffers (G, U, H, dH: 4 M I elements). Weight gradients are fp32.
 *
 * The goals (issue 6): tiled fwd+bwd time <= 1.4x untiled (the recompute
 * floor: gated MLPs recompute 2 of the 3 forward GEMMs, 11 GEMMs instead of
 * 9, about 1.22x), and tiled intermediates <= one tile's worth. On CUDA,
 * where no baseline runs, "untiled, no recompute" is estimated from the
 * one-tile run as fwd + bwd - (2/3) fwd (the recomputed GEMMs).
 *
 *   bench_mlp [--device cpu|cuda] [--dtype f32|bf16] [--hidden H] [--inter I]
 *             [--tokens M,M,...] [--tile-tokens T] [--reps R] [--csv FILE]
 *
 * Defaults: CPU fp32, H = 512, I = 1792 (Llama-3-8B / 8), M = 1K..16K;
 * CUDA bf16, H = 4096, I = 14336, M = 4K..64K.
 */
#include <cblas.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef OSFT_BENCH_CUDA
#include <cuda_runtime_api.h>
#endif

#include "bench_util.h"
#include "osftrt/osftrt.h"

/* ------------------------------------------------------------ tensors */

typedef struct {
  int cuda, bf16;
} setup;

typedef struct {
  DLTensor t;
  int64_t shape[2];
  size_t bytes;
} tensor;

/* A rows x cols tensor on the device, uniform in [-scale, scale). */
static void make(tensor *out, const setup *s, int bf16, int64_t rows, int64_t cols,
                 float scale) {
  tensor x;
  memset(&x, 0, sizeof x);
  x.shape[0] = rows;
  x.shape[1] = cols;
  x.t.ndim = 2;
  x.t.shape = x.shape;
  x.t.dtype.code = bf16 ? kDLBfloat : kDLFloat;
  x.t.dtype.bits = bf16 ? 16 : 32;
  x.t.dtype.lanes = 1;
  x.t.device.device_type = s->cuda ? kDLCUDA : kDLCPU;
  const size_t n = (size_t)(rows * cols), e = bf16 ? 2 : 4;
  x.bytes = n * e;
  void *host = xmalloc(x.bytes);
  unsigned r = 12345u + (unsigned)rows * 7u + (unsigned)cols;
  for (size_t i = 0; i < n; ++i) {
    r = r * 1664525u + 1013904223u;
    const float v = scale * (float)((r >> 8) * (2.0 / 16777216.0) - 1.0);
    if (bf16)
      ((uint16_t *)host)[i] = to_bf16(v);
    else
      ((float *)host)[i] = v;
  }
#ifdef OSFT_BENCH_CUDA
  if (s->cuda) {
    if (cudaMalloc(&x.t.data, x.bytes) != cudaSuccess ||
        cudaMemcpy(x.t.data, host, x.bytes, cudaMemcpyHostToDevice) != cudaSuccess) {
      fprintf(stderr, "cudaMalloc/cudaMemcpy of %zu bytes failed\n", x.bytes);
      exit(1);
    }
    free(host);
    *out = x;
    out->t.shape = out->shape;
    return;
  }
#endif
  x.t.data = host;
  *out = x;
  out->t.shape = out->shape; /* its own array, not the local's */
}

static void release(const setup *s, tensor *x) {
#ifdef OSFT_BENCH_CUDA
  if (s->cuda) {
    cudaFree(x->t.data);
    return;
  }
#endif
  (void)s;
  free(x->t.data);
}

/* ------------------------------------------------------------ baseline */

/* C (m x n) = op(A) op(B), row-major, beta 0 or 1 */
static void gemm(int ta, int tb, int m, int n, int k, const float *a, int lda,
                 const float *b, int ldb, float beta, float *c, int ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans,
              tb ? CblasTrans : CblasNoTrans, m, n, k, 1.0f, a, lda, b, ldb, beta, c,
              ldc);
}

typedef struct {
  int m, h, i;
  const float *x, *gy, *wg, *wu, *wd;
  float *y, *dx, *dwg, *dwu, *dwd;
  float *g, *u, *hh, *dh; /* saved / backward intermediates, m x i */
} baseline;

static void baseline_forward(baseline *b) {
  const int m = b->m, h = b->h, ni = b->i;
  gemm(0, 1, m, ni, h, b->x, h, b->wg, h, 0, b->g, ni);
  gemm(0, 1, m, ni, h, b->x, h, b->wu, h, 0, b->u, ni);
  for (size_t e = 0; e < (size_t)m * ni; ++e) {
    const float z = b->g[e], s = 1.0f / (1.0f + expf(-z));
    b->hh[e] = z * s * b->u[e];
  }
  gemm(0, 1, m, h, ni, b->hh, ni, b->wd, ni, 0, b->y, h);
}

static void baseline_backward(baseline *b) {
  const int m = b->m, h = b->h, ni = b->i;
  gemm(0, 0, m, ni, h, b->gy, h, b->wd, ni, 0, b->dh, ni); /* dH = gy Wd */
  for (size_t e = 0; e < (size_t)m * ni; ++e) {            /* dG over G, dU over U */
    const float z = b->g[e], s = 1.0f / (1.0f + expf(-z)), d = b->dh[e];
    const float u = b->u[e];
    b->g[e] = d * u * s * (1.0f + z * (1.0f - s));
    b->u[e] = d * z * s;
  }
  gemm(1, 0, h, ni, m, b->gy, h, b->hh, ni, 0, b->dwd, ni);
  gemm(1, 0, ni, h, m, b->g, ni, b->x, h, 0, b->dwg, h);
  gemm(1, 0, ni, h, m, b->u, ni, b->x, h, 0, b->dwu, h);
  gemm(0, 0, m, h, ni, b->g, ni, b->wg, h, 0, b->dx, h);
  gemm(0, 0, m, h, ni, b->u, ni, b->wu, h, 1, b->dx, h);
}

/* ------------------------------------------------------------ library */

typedef struct {
  osft_context_t ctx;
  osft_mlp_t mlp;
  DLTensor *x, *y, *gy;
  osft_mlp_grads_t grads;
  int64_t tiles;
} run;

static void lib_forward(run *r) {
  CHECK(osft_mlp_forward(r->mlp, r->x, r->y, r->tiles));
  CHECK(osft_context_synchronize(r->ctx));
}

static void lib_backward(run *r) {
  CHECK(osft_mlp_backward(r->mlp, r->x, r->gy, &r->grads, r->tiles));
  CHECK(osft_context_synchronize(r->ctx));
}

typedef void (*step_fn)(void *);
static void do_lib_forward(void *r) {
  lib_forward(r);
}
static void do_lib_backward(void *r) {
  lib_backward(r);
}
static void do_base_forward(void *b) {
  baseline_forward(b);
}
static void do_base_backward(void *b) {
  baseline_backward(b);
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

/* One variant to time: f(arg), after an untimed prepare(arg) if given. */
typedef struct {
  step_fn prepare, f;
  void *arg;
  double t[32];
} timed;

/* Times every variant once per round, round after round, so that a change
 * of load on the machine hits all of them alike; one warm-up round first
 * (caches, workspace, thread pool, cuBLAS heuristics). */
static void time_rounds(timed *v, int n, int reps) {
  for (int r = -1; r < reps; ++r)
    for (int i = 0; i < n; ++i) {
      if (v[i].prepare) v[i].prepare(v[i].arg);
      const double t0 = now_ms();
      v[i].f(v[i].arg);
      if (r >= 0) v[i].t[r] = now_ms() - t0;
    }
}

static double median_of(const double *t, int n) {
  double c[32];
  memcpy(c, t, sizeof(double) * (size_t)n);
  return median(c, n);
}

/* Peak bytes the library allocates during one call, from an empty workspace. */
static uint64_t peak_bytes(run *r, step_fn f, int on_cuda) {
  CHECK(osft_context_release_workspace(r->ctx));
  CHECK(osft_context_reset_peak_memory(r->ctx));
  osft_memory_stats_t before, after;
  before.struct_size = after.struct_size = sizeof before;
  CHECK(osft_context_get_memory_stats(r->ctx, &before));
  f(r);
  CHECK(osft_context_get_memory_stats(r->ctx, &after));
  return on_cuda ? after.device_peak - before.device_in_use
                 : after.host_peak - before.host_in_use;
}

/* ------------------------------------------------------------ main */

static int parse_list(char *arg, int *out, int max) {
  int n = 0;
  for (char *tok = strtok(arg, ","); tok && n < max; tok = strtok(NULL, ","))
    out[n++] = atoi(tok);
  return n;
}

static double mib(uint64_t bytes) {
  return (double)bytes / (1024.0 * 1024.0);
}

int main(int argc, char **argv) {
  setup s = {0, 0};
  int hidden = 0, inter = 0, reps = 3, tile_tokens = 0, n_tokens = 0, tokens[16];
  const char *csv_path = NULL, *dtype = NULL;
  for (int a = 1; a < argc; ++a) {
    if (!strcmp(argv[a], "--device") && a + 1 < argc)
      s.cuda = !strcmp(argv[++a], "cuda");
    else if (!strcmp(argv[a], "--dtype") && a + 1 < argc)
      dtype = argv[++a];
    else if (!strcmp(argv[a], "--hidden") && a + 1 < argc)
      hidden = atoi(argv[++a]);
    else if (!strcmp(argv[a], "--inter") && a + 1 < argc)
      inter = atoi(argv[++a]);
    else if (!strcmp(argv[a], "--tokens") && a + 1 < argc)
      n_tokens = parse_list(argv[++a], tokens, 16);
    else if (!strcmp(argv[a], "--tile-tokens") && a + 1 < argc)
      tile_tokens = atoi(argv[++a]);
    else if (!strcmp(argv[a], "--reps") && a + 1 < argc)
      reps = atoi(argv[++a]);
    else if (!strcmp(argv[a], "--csv") && a + 1 < argc)
      csv_path = argv[++a];
    else {
      fprintf(
          stderr,
          "usage: %s [--device cpu|cuda] [--dtype f32|bf16] [--hidden H] [--inter I]\n"
          "          [--tokens M,..] [--tile-tokens T] [--reps R] [--csv FILE]\n",
          argv[0]);
      return 2;
    }
  }
#ifndef OSFT_BENCH_CUDA
  if (s.cuda) {
    fprintf(stderr, "this bench_mlp was built without CUDA\n");
    return 2;
  }
#endif
  s.bf16 = dtype ? !strcmp(dtype, "bf16") : s.cuda;
  if (!hidden) hidden = s.cuda ? 4096 : 512;
  if (!inter) inter = s.cuda ? 14336 : 1792;
  if (!n_tokens) {
    const int cpu[5] = {1024, 2048, 4096, 8192, 16384};
    const int gpu[5] = {4096, 8192, 16384, 32768, 65536};
    n_tokens = 5;
    memcpy(tokens, s.cuda ? gpu : cpu, sizeof cpu);
  }
  if (reps < 1 || reps > 31) reps = 3;
  const int base_on = !s.cuda && !s.bf16; /* the baseline is fp32 OpenBLAS */

  osft_context_options_t co;
  CHECK(OSFT_CONTEXT_OPTIONS_INIT(&co));
  co.device_type = s.cuda ? OSFT_DEVICE_CUDA : OSFT_DEVICE_CPU;
  osft_context_t ctx;
  CHECK(osft_context_create(&ctx, &co));
  const float wscale = 1.0f / sqrtf((float)hidden);
  tensor wg, wu, wd, dwg, dwu, dwd;
  make(&wg, &s, s.bf16, inter, hidden, wscale);
  make(&wu, &s, s.bf16, inter, hidden, wscale);
  make(&wd, &s, s.bf16, hidden, inter, 1.0f / sqrtf((float)inter));
  make(&dwg, &s, 0, inter, hidden, 1);
  make(&dwu, &s, 0, inter, hidden, 1);
  make(&dwd, &s, 0, hidden, inter, 1);
  osft_mlp_weights_t w;
  CHECK(OSFT_MLP_WEIGHTS_INIT(&w));
  w.gate = &wg.t;
  w.up = &wu.t;
  w.down = &wd.t;
  osft_mlp_options_t mo;
  CHECK(OSFT_MLP_OPTIONS_INIT(&mo));
  if (tile_tokens > 0) {
    mo.tiling = OSFT_MLP_TILING_TOKENS;
    mo.tile_tokens = tile_tokens;
  }
  osft_mlp_t mlp;
  CHECK(osft_mlp_create(ctx, OSFT_MLP_SWIGLU, hidden, inter, &w, &mo, &mlp));

  FILE *csv = csv_path ? fopen(csv_path, "w") : NULL;
  if (csv)
    fprintf(csv,
            "device,dtype,hidden,inter,tokens,tile_tokens,tiles,base_fwd_ms,base_bwd_ms,"
            "untiled_fwd_ms,untiled_bwd_ms,tiled_fwd_ms,tiled_bwd_ms,untiled_ref_ms,"
            "ratio_tiled_over_untiled,base_bytes,untiled_peak_bwd,tiled_peak_fwd,"
            "tiled_peak_bwd,one_tile_bytes\n");
  printf(
      "# %s\n# %s %s, SwiGLU H=%d I=%d, fp32 weight grads, medians of %d interleaved "
      "rounds\n",
      osft_build_info(), s.cuda ? "CUDA" : "CPU", s.bf16 ? "bf16" : "fp32", hidden, inter,
      reps);
  printf("# untiled ref: %s\n",
         base_on ? "measured baseline (saves G, U, H; no recompute)"
                 : "1-tile run minus its recompute (fwd + bwd - 2/3 fwd)");
  printf("%6s %6s %5s | %8s %8s | %8s %8s | %8s %8s | %6s | %9s %9s %9s %9s\n", "M",
         "tile", "tiles", "base f", "base b", "1tile f", "1tile b", "tiled f", "tiled b",
         "ratio", "base MiB", "1tile MiB", "tiled MiB", "1 tile");
  for (int ti = 0; ti < n_tokens; ++ti) {
    const int m = tokens[ti];
    tensor x, gy, y, dx;
    make(&x, &s, s.bf16, m, hidden, 1);
    make(&gy, &s, s.bf16, m, hidden, 1);
    make(&y, &s, s.bf16, m, hidden, 1);
    make(&dx, &s, s.bf16, m, hidden, 1);
    run r1;
    memset(&r1, 0, sizeof r1);
    r1.ctx = ctx;
    r1.mlp = mlp;
    r1.x = &x.t;
    r1.y = &y.t;
    r1.gy = &gy.t;
    CHECK(OSFT_MLP_GRADS_INIT(&r1.grads));
    r1.grads.grad_x = &dx.t;
    r1.grads.grad_gate = &dwg.t;
    r1.grads.grad_up = &dwu.t;
    r1.grads.grad_down = &dwd.t;
    r1.tiles = 1;
    run rt = r1;
    rt.tiles = 0;
    int64_t tiles, per_tile;
    CHECK(osft_mlp_get_tile_count(mlp, m, &tiles, &per_tile));
    const uint64_t untiled_peak = peak_bytes(&r1, do_lib_backward, s.cuda);
    const uint64_t tiled_peak_f = peak_bytes(&rt, do_lib_forward, s.cuda);
    const uint64_t tiled_peak_b = peak_bytes(&rt, do_lib_backward, s.cuda);
    const int e = s.bf16 ? 2 : 4;
    uint64_t one_tile = (uint64_t)per_tile * 3u * (uint64_t)inter * (uint64_t)e;
    if (s.bf16) one_tile += (uint64_t)per_tile * (uint64_t)hidden * 4u; /* fp32 dx sum */
    const uint64_t base_bytes = 4ull * (uint64_t)m * (uint64_t)inter * (uint64_t)e;

    baseline b;
    memset(&b, 0, sizeof b);
    const size_t mi = (size_t)m * (size_t)inter * sizeof(float);
    if (base_on) {
      b.m = m;
      b.h = hidden;
      b.i = inter;
      b.x = x.t.data;
      b.gy = gy.t.data;
      b.wg = wg.t.data;
      b.wu = wu.t.data;
      b.wd = wd.t.data;
      b.y = y.t.data;
      b.dx = dx.t.data;
      b.dwg = dwg.t.data;
      b.dwu = dwu.t.data;
      b.dwd = dwd.t.data;
      b.g = xmalloc(mi);
      b.u = xmalloc(mi);
      b.hh = xmalloc(mi);
      b.dh = xmalloc(mi);
    }
    /* base forward, base backward (after a forward: it consumes G and U),
     * one tile, tiled */
    timed v[6] = {
        {NULL, do_base_forward, &b, {0}}, {do_base_forward, do_base_backward, &b, {0}},
        {NULL, do_lib_forward, &r1, {0}}, {NULL, do_lib_backward, &r1, {0}},
        {NULL, do_lib_forward, &rt, {0}}, {NULL, do_lib_backward, &rt, {0}}};
    const int first = base_on ? 0 : 2;
    time_rounds(v + first, 6 - first, reps);
    double ratios[32];
    for (int k = 0; k < reps; ++k) {
      const double ref_k =
          base_on ? v[0].t[k] + v[1].t[k] : v[2].t[k] + v[3].t[k] - v[2].t[k] * 2.0 / 3.0;
      ratios[k] = (v[4].t[k] + v[5].t[k]) / ref_k;
    }
    const double b_f = base_on ? median_of(v[0].t, reps) : NAN;
    const double b_b = base_on ? median_of(v[1].t, reps) : NAN;
    const double u_f = median_of(v[2].t, reps), u_b = median_of(v[3].t, reps);
    const double t_f = median_of(v[4].t, reps), t_b = median_of(v[5].t, reps);
    const double ref = base_on ? b_f + b_b : u_f + u_b - u_f * 2.0 / 3.0;
    if (base_on) {
      free(b.g);
      free(b.u);
      free(b.hh);
      free(b.dh);
    }
    const double ratio = median_of(ratios, reps); /* of the per-round ratios */
    printf(
        "%6d %6lld %5lld | %8.1f %8.1f | %8.1f %8.1f | %8.1f %8.1f | %6.3f | %9.1f "
        "%9.1f %9.1f %9.1f\n",
        m, (long long)per_tile, (long long)tiles, b_f, b_b, u_f, u_b, t_f, t_b, ratio,
        mib(base_bytes), mib(untiled_peak), mib(tiled_peak_b), mib(one_tile));
    fflush(stdout);
    if (tiled_peak_b > one_tile + 4096 || tiled_peak_f > one_tile + 4096)
      printf("# WARNING: tiled intermediates exceed one tile's worth\n");
    if (csv)
      fprintf(
          csv,
          "%s,%s,%d,%d,%d,%lld,%lld,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.4f,%llu,%llu,"
          "%llu,%llu,%llu\n",
          s.cuda ? "cuda" : "cpu", s.bf16 ? "bf16" : "f32", hidden, inter, m,
          (long long)per_tile, (long long)tiles, b_f, b_b, u_f, u_b, t_f, t_b, ref, ratio,
          (unsigned long long)base_bytes, (unsigned long long)untiled_peak,
          (unsigned long long)tiled_peak_f, (unsigned long long)tiled_peak_b,
          (unsigned long long)one_tile);
    release(&s, &x);
    release(&s, &gy);
    release(&s, &y);
    release(&s, &dx);
  }
  CHECK(osft_mlp_destroy(mlp));
  CHECK(osft_context_destroy(ctx));
  tensor *all[6] = {&wg, &wu, &wd, &dwg, &dwu, &dwd};
  for (int i = 0; i < 6; ++i) release(&s, all[i]);
  if (csv) fclose(csv);
  return 0;
}
