/* The CPU kernels of fused linear cross-entropy (src/backend/flce_backend.h).
 * The row pass is the hot loop next to the GEMMs: it runs on threads over
 * the rows of a chunk, each row in blocks that stay in L1 (one read of the
 * logits for the statistics, one read and one write for the gradient),
 * with 16-lane vector code (osft::simd: GCC vector extensions compiled for
 * AVX-512, AVX2+FMA and the baseline, picked at load time) and a polynomial
 * exp accurate to about 1 ulp. */
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/bf16.h"
#include "core/cpu_blas.h"
#include "core/error.h"
#include "backend/flce_backend.h"

namespace osft {
namespace {

/* ------------------------------------------------------------ vector math */

/* 16 fp32 lanes (osft::simd of src/core/cpu_blas.h): one AVX-512 register
 * where the CPU has it, two AVX2 or four SSE ones elsewhere. */
using simd::f32v;
using simd::kLanes;
using simd::load;
using simd::load_partial;
using simd::splat;
using simd::store_partial;
typedef int32_t i32v __attribute__((vector_size(64)));

#define OSFT_INLINE OSFT_SIMD_INLINE

OSFT_INLINE float hsum(const f32v &v) {
  float s = 0.0f;
  for (int l = 0; l < kLanes; ++l) s += v[l];
  return s;
}

OSFT_INLINE float hmax(const f32v &v) {
  float m = v[0];
  for (int l = 1; l < kLanes; ++l) m = v[l] > m ? v[l] : m;
  return m;
}

/* ----------------------------------------------------------- row settings */

/* What every row of a chunk shares. */
struct RowSetup {
  const FlceRowPass *a;
  const float *bias32 = nullptr;
  const bf16 *bias16 = nullptr;
  const float *weights = nullptr; /* class weights, or nullptr */
  float cap = 0.0f, inv_cap = 0.0f;
  double weight_sum = 0.0;
  /* The gradient scales of the cross-entropy part and of the z-loss part:
   * MEAN grad_loss / D and grad_loss / N (N the tokens not ignored), SUM
   * grad_loss both; NONE: unused (grad_loss per token). */
  double scale = 1.0, z_scale = 1.0;
};

constexpr int kBlock = 512; /* floats per block: 2 KiB, in L1 */

/* v[0, n) = softcap(raw + bias) for columns [j0, j0 + n). */
OSFT_INLINE void transform(const RowSetup &s, const float *raw, int64_t j0, int n,
                           float *v) {
  for (int j = 0; j < n; j += kLanes) {
    const int k = std::min(kLanes, n - j);
    f32v x;
    load_partial(x, raw + j, k, 0.0f);
    if (s.bias32 != nullptr) {
      f32v b;
      load_partial(b, s.bias32 + j0 + j, k, 0.0f);
      x += b;
    } else if (s.bias16 != nullptr) {
      f32v b;
      load_partial(b, s.bias16 + j0 + j, k, 0.0f);
      x += b;
    }
    if (s.cap != 0.0f) {
      /* cap * tanh(x / cap), tanh(u) = 1 - 2 / (e^(2u) + 1) */
      f32v e = x * (2.0f * s.inv_cap);
      simd::exp(e);
      x = s.cap - (2.0f * s.cap) / (e + 1.0f);
    }
    store_partial(v + j, x, k);
  }
}

OSFT_INLINE int block_len(int64_t v, int64_t j0) {
  return static_cast<int>(std::min<int64_t>(kBlock, v - j0));
}

/* The final logits of columns [j0, j0 + n): the GEMM's values themselves,
 * or, with a bias or softcap, transformed into buf. */
OSFT_INLINE const float *block_values(const RowSetup &s, const float *z, int64_t j0,
                                      int n, float *buf) {
  if (s.bias32 == nullptr && s.bias16 == nullptr && s.cap == 0.0f) return z + j0;
  transform(s, z + j0, j0, n, buf);
  return buf;
}

/* Online statistics of one row. */
struct RowStats {
  float max = -INFINITY;
  float sum = 0.0f;      /* sum_j e^(z_j - max) */
  double weighted = 0.0; /* sum_j w_j z_j (only with label smoothing) */
  float best = -INFINITY;
  int64_t best_j = 0;
  float target = 0.0f; /* z_y */
};

OSFT_INLINE void add_block(const RowSetup &s, const float *v, int64_t j0, int n,
                           int64_t y, RowStats &st) {
  f32v m;
  splat(m, -INFINITY);
  for (int j = 0; j < n; j += kLanes) {
    f32v x;
    load_partial(x, v + j, std::min(kLanes, n - j), -INFINITY);
    m = x > m ? x : m;
  }
  const float bm = hmax(m);
  if (bm > st.best) {
    st.best = bm;
    st.best_j = j0 + (std::find(v, v + n, bm) - v);
  }
  const float new_max = std::max(st.max, bm);
  f32v acc = {};
  for (int j = 0; j < n; j += kLanes) {
    const int k = std::min(kLanes, n - j);
    f32v e;
    load_partial(e, v + j, k, -INFINITY);
    e -= new_max;
    simd::exp(e);
    const i32v lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    acc = lane < k ? acc + e : acc;
  }
  st.sum = st.sum * std::exp(st.max - new_max) + hsum(acc);
  st.max = new_max;
  if (s.a->loss.eps != 0.0f) {
    f32v dot = {};
    for (int j = 0; j < n; j += kLanes) {
      const int k = std::min(kLanes, n - j);
      f32v x, w;
      load_partial(x, v + j, k, 0.0f);
      if (s.weights != nullptr)
        load_partial(w, s.weights + j0 + j, k, 0.0f);
      else
        splat(w, 1.0f);
      dot += x * w;
    }
    st.weighted += hsum(dot);
  }
  if (y >= j0 && y < j0 + n) st.target = v[y - j0];
}

/* The gradient coefficients of a row: g_j = (ca p_j - ce w_j - cy [j == y])
 * times the softcap chain factor. */
struct RowGrad {
  float lse, ca, ce, cy;
};

OSFT_INLINE void grad_block(const RowSetup &s, const RowGrad &gr, const float *v,
                            int64_t j0, int n, int64_t y, float *out) {
  /* out may be v itself: read the target's logit first. */
  const bool has_y = y >= j0 && y < j0 + n;
  const float ty = has_y && s.cap != 0.0f ? v[y - j0] * s.inv_cap : 0.0f;
  for (int j = 0; j < n; j += kLanes) {
    const int k = std::min(kLanes, n - j);
    f32v x, p, w;
    load_partial(x, v + j, k, 0.0f);
    p = x - gr.lse;
    simd::exp(p);
    if (s.weights != nullptr)
      load_partial(w, s.weights + j0 + j, k, 0.0f);
    else
      splat(w, 1.0f);
    f32v g = gr.ca * p - gr.ce * w;
    if (s.cap != 0.0f) {
      const f32v t = x * s.inv_cap;
      g *= 1.0f - t * t;
    }
    store_partial(out + j, g, k);
  }
  if (has_y) out[y - j0] -= gr.cy * (1.0f - ty * ty);
}

int64_t target_of(const FlceTargets &t, int64_t i) {
  return t.dtype == OSFTI_I32 ? static_cast<const int32_t *>(t.data)[i]
                              : static_cast<const int64_t *>(t.data)[i];
}

/* The local statistics of a row over this rank's columns; `y` is the
 * target's local column (outside [0, V) when another rank holds it). */
OSFT_INLINE RowStats local_stats(const RowSetup &s, float *z, int64_t y, float *buf) {
  RowStats st;
  const int64_t v = s.a->loss.vocab;
  for (int64_t j0 = 0; j0 < v; j0 += kBlock) {
    const int n = block_len(v, j0);
    add_block(s, block_values(s, z, j0, n, buf), j0, n, y, st);
  }
  return st;
}

/* Statistics, per-token results and (with want_grad) the gradient of one
 * row, in place over its logits; with vocab parallelism one phase of it. */
OSFT_SIMD_CLONES
void one_row(const RowSetup &s, int64_t i) {
  const FlceRowPass &a = *s.a;
  const FlceLoss &L = a.loss;
  const int64_t tok = a.first_token + i, v = L.vocab;
  const int64_t y = target_of(a.targets, tok);
  /* A target outside [0, V) reaches here only with device_target_check: the
   * token then counts as ignored, except that its loss is NaN (so that the
   * reduced loss is too). */
  const bool bad = y != L.ignore_index && (y < 0 || y >= L.vocab_global);
  const bool ignored = y == L.ignore_index || bad;
  /* the target's local column; an ignored or bad y (INT64_MIN, say) is
   * never offset: the subtraction could overflow */
  const int64_t yl = ignored ? -1 : y - L.vocab_offset;
  const bool mine = !ignored && yl >= 0 && yl < v;
  float *z = static_cast<float *>(a.logits.data) + i * a.logits.ld;
  /* A bf16 gradient (engines with bf16 GEMMs) overwrites the row from its
   * start, at half the pace at which the row's logits are read. */
  const bool g16 = a.grad_dtype == OSFTI_BF16;
  float *out =
      a.grad.data != nullptr ? static_cast<float *>(a.grad.data) + i * a.grad.ld : z;
  bf16 *out16 = a.grad.data != nullptr ? static_cast<bf16 *>(a.grad.data) + i * a.grad.ld
                                       : reinterpret_cast<bf16 *>(z);
  float buf[kBlock];
  RowStats st;
  double wy = mine ? (s.weights != nullptr ? s.weights[yl] : 1.0) : 0.0;
  if (a.phase != FlceRowPhase::finish) st = local_stats(s, z, yl, buf);
  if (a.phase == FlceRowPhase::records) {
    flce_pack_record(a.records + i * kFlceRecordWords, st.max, st.sum,
                     mine ? st.target : 0.0f, static_cast<float>(wy),
                     static_cast<float>(st.weighted), st.best,
                     L.vocab_offset + st.best_j);
    return;
  }
  if (a.phase == FlceRowPhase::finish) {
    const FlceCombined c = flce_combine(a.gathered, a.ranks, a.logits.rows, i);
    st.max = c.max;
    st.sum = c.sum;
    st.target = c.target;
    st.weighted = c.smooth;
    st.best_j = c.best_j;
    wy = ignored ? 0.0 : c.weight;
  }
  const double lse = st.max + std::log(static_cast<double>(st.sum));
  const double zl = ignored ? 0.0 : L.z_scale * lse * lse;
  const double ce = (1.0 - L.smoothing) * wy * (lse - st.target) +
                    L.eps * (lse * s.weight_sum - st.weighted);
  a.tokens.loss[tok] = bad       ? std::numeric_limits<float>::quiet_NaN()
                       : ignored ? 0.0f
                                 : static_cast<float>(ce + zl);
  a.tokens.z[tok] = static_cast<float>(zl);
  a.tokens.argmax[tok] = st.best_j;
  if (!a.want_grad) return;
  /* c scales the cross-entropy part, cz the z-loss part */
  double c = ignored ? 0.0 : s.scale, cz = ignored ? 0.0 : s.z_scale;
  if (!ignored && L.per_token && a.grad_loss != nullptr) c = cz = a.grad_loss[tok];
  if (c == 0.0 && (cz == 0.0 || L.z_scale == 0.0f)) {
    if (g16)
      std::fill(out16, out16 + v, bf16{0});
    else
      std::fill(out, out + v, 0.0f);
    return;
  }
  const double big_a =
      c * ((1.0 - L.smoothing) * wy + L.eps * s.weight_sum) + cz * 2.0 * L.z_scale * lse;
  const RowGrad gr{static_cast<float>(lse), static_cast<float>(big_a),
                   static_cast<float>(c * L.eps),
                   static_cast<float>(c * (1.0 - L.smoothing) * wy)};
  for (int64_t j0 = 0; j0 < v; j0 += kBlock) {
    const int n = block_len(v, j0);
    if (g16) {
      /* the block's gradient in fp32 first: its logits are read by then */
      float gbuf[kBlock];
      grad_block(s, gr, block_values(s, z, j0, n, buf), j0, n, yl, gbuf);
      simd::narrow(gbuf, out16 + j0, n);
    } else {
      grad_block(s, gr, block_values(s, z, j0, n, buf), j0, n, yl, out + j0);
    }
  }
}

/* FlceRowPhase::merge: one record per row from the blocks of `gathered`
 * (row i of the first block may be records[i] itself: read, then written). */
void merge_records(const FlceRowPass &a) {
  const int64_t rows = a.logits.rows;
  for (int64_t i = 0; i < rows; ++i) {
    const FlceCombined c = flce_combine(a.gathered, a.ranks, rows, i);
    flce_pack_record(a.records + i * kFlceRecordWords, c.max, c.sum, c.target, c.weight,
                     c.smooth, c.best, c.best_j);
  }
}

void cpu_rows(Context &, const FlceRowPass &a) {
  if (a.phase == FlceRowPhase::merge) return merge_records(a);
  const FlceTotals &t = *a.totals;
  RowSetup s{&a};
  if (a.bias.data != nullptr) {
    if (a.bias.dtype == OSFTI_BF16)
      s.bias16 = static_cast<const bf16 *>(a.bias.data);
    else
      s.bias32 = static_cast<const float *>(a.bias.data);
  }
  s.weights = static_cast<const float *>(a.class_weight.data);
  s.cap = a.loss.softcap;
  s.inv_cap = s.cap != 0.0f ? 1.0f / s.cap : 0.0f;
  s.weight_sum = t.weight_sum;
  const double upstream =
      a.grad_loss != nullptr && !a.loss.per_token ? *a.grad_loss : 1.0;
  const double count = static_cast<double>(t.valid);
  s.scale = !a.loss.mean          ? upstream
            : t.denominator > 0.0 ? upstream / t.denominator
                                  : 0.0;
  s.z_scale = !a.loss.mean ? upstream : count > 0.0 ? upstream / count : 0.0;
  if (a.want_grad && a.phase != FlceRowPhase::records && a.grad_dtype != OSFTI_F32 &&
      (a.grad_dtype != OSFTI_BF16 || !blas::has_bf16_gemm()))
    raise(OSFT_STATUS_INTERNAL_ERROR, "flce CPU row pass: fp32 gradients only");
  /* Rows cost ~V each: split by elements (a small block, e.g. TREC's 6
   * classes, runs here; waking the pool would cost more than the rows). */
  blas::parallel_rows(a.logits.rows, a.logits.cols, [&s](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) one_row(s, i);
  });
}

/* ------------------------------------------------------- prepare, finalize */

FlceTotals cpu_prepare(Context &, const FlcePrepare &a) {
  FlceTotals t;
  const auto *w = static_cast<const float *>(a.class_weight.data);
  t.weight_sum = static_cast<double>(a.loss.vocab);
  if (w != nullptr) {
    t.weight_sum = 0.0;
    for (int64_t j = 0; j < a.loss.vocab; ++j) t.weight_sum += w[j];
  }
  for (int64_t i = 0; i < a.targets.n; ++i) {
    const int64_t y = target_of(a.targets, i);
    if (y == a.loss.ignore_index) continue;
    if (y < 0 || y >= a.loss.vocab_global) {
      if (t.first_bad < 0) {
        t.first_bad = i;
        t.bad_value = y;
      }
      continue; /* the totals stay those of the valid tokens */
    }
    t.valid++;
    const int64_t yl = y - a.loss.vocab_offset; /* in this rank's shard? */
    if (yl >= 0 && yl < a.loss.vocab) t.denominator += w != nullptr ? w[yl] : 1.0;
  }
  *a.totals = t;
  if (a.record != nullptr && t.first_bad >= 0 && a.record[0] == 0) {
    a.record[0] = a.call;
    a.record[1] = t.first_bad;
    a.record[2] = t.bad_value;
  }
  return t;
}

/* The loss and z-loss outputs: per token (NONE), or reduced into one
 * element each: SUM plain sums, MEAN the cross-entropy part (loss_i minus
 * its z-loss) over D and the z-loss part over N, the tokens not ignored. */
void reduce_losses(const FlceFinalize &a) {
  const int64_t n = a.targets.n;
  auto *loss = static_cast<float *>(a.out_loss.data);
  auto *z = static_cast<float *>(a.out_z.data);
  if (a.loss.per_token) {
    if (loss != nullptr) std::copy(a.tokens.loss, a.tokens.loss + n, loss);
    if (z != nullptr) std::copy(a.tokens.z, a.tokens.z + n, z);
    return;
  }
  double sum_loss = 0.0, sum_z = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    sum_loss += a.tokens.loss[i];
    sum_z += a.tokens.z[i];
  }
  const double d = a.totals->denominator, count = static_cast<double>(a.totals->valid);
  const double ce_scale = !a.loss.mean ? 1.0 : d > 0.0 ? 1.0 / d : 0.0;
  const double z_scale = !a.loss.mean ? 1.0 : count > 0.0 ? 1.0 / count : 0.0;
  if (loss != nullptr)
    *loss = static_cast<float>((sum_loss - sum_z) * ce_scale + sum_z * z_scale);
  if (z != nullptr) *z = static_cast<float>(sum_z * z_scale);
}

void cpu_finalize(Context &, const FlceFinalize &a) {
  const int64_t n = a.targets.n;
  reduce_losses(a);
  if (a.out_token_loss.data != nullptr)
    std::copy(a.tokens.loss, a.tokens.loss + n,
              static_cast<float *>(a.out_token_loss.data));
  if (a.out_argmax.data != nullptr) {
    for (int64_t i = 0; i < n; ++i) {
      if (a.out_argmax.dtype == OSFTI_I32)
        static_cast<int32_t *>(a.out_argmax.data)[i] =
            static_cast<int32_t>(a.tokens.argmax[i]);
      else
        static_cast<int64_t *>(a.out_argmax.data)[i] = a.tokens.argmax[i];
    }
  }
  if (a.out_accuracy.data != nullptr) {
    int64_t correct = 0;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t y = target_of(a.targets, i);
      correct += y != a.loss.ignore_index && a.tokens.argmax[i] == y;
    }
    const int64_t valid = a.totals->valid;
    *static_cast<float *>(a.out_accuracy.data) =
        valid > 0 ? static_cast<float>(static_cast<double>(correct) / valid) : 0.0f;
  }
}

}  // namespace

const FlceKernels &cpu_flce_kernels() noexcept {
  /* bf16 x and W go to the GEMMs as they are where the engine multiplies
   * bf16 (oneMKL); otherwise the operation widens them to fp32 first. */
  /* flops per byte: OpenBLAS's sgemm runs at ~100 GFLOP/s a core (Zen 4,
   * measured) against a memory bus shared by every core; 8 ranks the plans
   * as measured at bench_flce's CPU shapes (bench/results/
   * flce_vocab_chunk_cpu.md). A bf16 engine (oneMKL) doubles the flops. */
  static const FlceKernels table = {blas::has_bf16_gemm(),
                                    blas::has_bf16_gemm() ? 16.0 : 8.0, cpu_prepare,
                                    cpu_rows, cpu_finalize};
  return table;
}

}  // namespace osft
