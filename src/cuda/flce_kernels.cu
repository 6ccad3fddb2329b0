/* The CUDA kernels of fused linear cross-entropy; see
 * src/cuda/flce_kernels.cuh.
 *
 * The row kernel runs one block per row of a logits chunk. Pass 1 reads the
 * row once with 16-byte loads and keeps, per thread, an online max and sum
 * of exponentials, the smoothing sum and the argmax in fp32; a block
 * reduction combines them. Pass 2 reads the row again (from L2: a row is
 * 4 V bytes) and writes the gradient over it: fp32 in place, or bf16 into the
 * first half of the row, tile by tile behind a barrier, so that no thread
 * writes bytes another thread has yet to read. The prepare and finalize
 * kernels are single blocks with a fixed reduction order (deterministic). */
#include "cuda/flce_kernels.cuh"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "core/error.h"

namespace osft::cuda {
namespace {

using bf16_t = __nv_bfloat16;

constexpr int kWarp = 32;
constexpr int kMaxWarps = 32;             /* 1024 threads */
constexpr int kSingleBlockThreads = 1024; /* prepare and finalize */
constexpr unsigned kFull = 0xffffffffu;
constexpr int kMaxRowThreads = 512; /* see row_threads() */

void check_launch(const char *kernel) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    raise(OSFT_STATUS_BACKEND_ERROR, "%s kernel launch: %s", kernel,
          cudaGetErrorString(e));
}

__device__ __forceinline__ int64_t target_at(const void *t, bool is64, int64_t i) {
  return is64 ? static_cast<const int64_t *>(t)[i] : static_cast<const int32_t *>(t)[i];
}

/* Sum (or min) over the block of one value per thread; every thread gets
 * the result. `shared` holds kMaxWarps values. */
template <class T, class Op>
__device__ T block_reduce(T v, Op op, T *shared) {
  for (int o = kWarp / 2; o > 0; o /= 2) v = op(v, __shfl_xor_sync(kFull, v, o));
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int warps = blockDim.x / kWarp;
  __syncthreads(); /* `shared` may still be read from an earlier call */
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = shared[0];
  for (int w = 1; w < warps; ++w) v = op(v, shared[w]);
  return v;
}

struct Add {
  template <class T>
  __device__ T operator()(T a, T b) const {
    return a + b;
  }
};

struct Min {
  template <class T>
  __device__ T operator()(T a, T b) const {
    return b < a ? b : a;
  }
};

/* ------------------------------------------------------------ prepare */

template <class T>
__global__ void __launch_bounds__(kSingleBlockThreads)
    prepare_kernel(const T *targets, int64_t n, const float *weights, int64_t vocab,
                   int64_t offset, int64_t global, int64_t ignore, FlceTotals *out,
                   int64_t *record, int64_t call) {
  __shared__ double dshared[kMaxWarps];
  __shared__ long long lshared[kMaxWarps];
  double wsum = 0.0, denom = 0.0;
  long long valid = 0, bad = LLONG_MAX;
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x)
    wsum += weights != nullptr ? weights[j] : 1.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const int64_t y = targets[i];
    if (y == ignore) continue;
    if (y < 0 || y >= global) {
      bad = bad < i ? bad : i;
      continue;
    }
    valid++;
    const int64_t yl = y - offset; /* in this rank's shard? */
    if (yl >= 0 && yl < vocab) denom += weights != nullptr ? weights[yl] : 1.0;
  }
  wsum = block_reduce(wsum, Add{}, dshared);
  denom = block_reduce(denom, Add{}, dshared);
  valid = block_reduce(valid, Add{}, lshared);
  bad = block_reduce(bad, Min{}, lshared);
  if (threadIdx.x != 0) return;
  out->weight_sum = wsum;
  out->denominator = denom;
  out->valid = valid;
  out->first_bad = bad == LLONG_MAX ? -1 : bad;
  out->bad_value = bad == LLONG_MAX ? 0 : static_cast<int64_t>(targets[bad]);
  /* device_target_check: the handle's sticky record keeps the first one */
  if (record != nullptr && bad != LLONG_MAX && record[0] == 0) {
    record[0] = call;
    record[1] = bad;
    record[2] = static_cast<int64_t>(targets[bad]);
  }
}

/* ------------------------------------------------------------ row pass */

struct RowParams {
  float *logits;
  void *grad; /* nullptr: the gradient goes in place over the logits */
  int64_t ld, grad_ld, vocab, first_token, offset, global;
  FlceRowPhase phase;
  float *records;
  const float *gathered;
  int ranks;
  int64_t rows;
  const void *targets;
  bool targets64;
  int64_t ignore;
  const float *bias32;
  const bf16_t *bias16;
  const float *weights;
  const float *grad_loss;
  bool per_token, mean, want_grad;
  const FlceTotals *totals;
  float smoothing, eps, z_scale, cap, inv_cap;
  float *tok_loss, *tok_z;
  int64_t *tok_argmax;
};

/* The final logit of column j from the GEMM's value: + bias, softcap. */
__device__ __forceinline__ float logit(const RowParams &p, float raw, int64_t j) {
  float v = raw;
  if (p.bias32 != nullptr)
    v += p.bias32[j];
  else if (p.bias16 != nullptr)
    v += __bfloat162float(p.bias16[j]);
  if (p.cap != 0.0f) {
    /* cap * tanh(v / cap), tanh(u) = 1 - 2 / (e^(2u) + 1); the clamp keeps
     * e^(2u) finite */
    const float e = __expf(fminf(2.0f * v * p.inv_cap, 88.0f));
    v = p.cap - 2.0f * p.cap / (e + 1.0f);
  }
  return v;
}

__device__ __forceinline__ float class_weight(const RowParams &p, int64_t j) {
  return p.weights != nullptr ? p.weights[j] : 1.0f;
}

/* Online statistics of part of a row. */
struct Stats {
  float max, sum, wz, best;
  long long best_j;

  static __device__ Stats empty() {
    return Stats{-INFINITY, 0.0f, 0.0f, -INFINITY, LLONG_MAX};
  }

  __device__ void push(const RowParams &p, float v, int64_t j) {
    if (v > max) {
      sum = sum * __expf(max - v) + 1.0f;
      max = v;
    } else {
      sum += __expf(v - max);
    }
    if (v > best) {
      best = v;
      best_j = j;
    }
    if (p.eps != 0.0f) wz += class_weight(p, j) * v;
  }

  __device__ Stats shuffled(int o) const {
    return Stats{__shfl_xor_sync(kFull, max, o), __shfl_xor_sync(kFull, sum, o),
                 __shfl_xor_sync(kFull, wz, o), __shfl_xor_sync(kFull, best, o),
                 __shfl_xor_sync(kFull, best_j, o)};
  }
};

__device__ __forceinline__ Stats combine(const Stats &a, const Stats &b) {
  Stats r;
  r.max = fmaxf(a.max, b.max);
  /* a part without elements (sum 0) contributes nothing, not NaN */
  r.sum = (a.sum != 0.0f ? a.sum * __expf(a.max - r.max) : 0.0f) +
          (b.sum != 0.0f ? b.sum * __expf(b.max - r.max) : 0.0f);
  r.wz = a.wz + b.wz;
  const bool take_b = b.best > a.best || (b.best == a.best && b.best_j < a.best_j);
  r.best = take_b ? b.best : a.best;
  r.best_j = take_b ? b.best_j : a.best_j;
  return r;
}

__device__ Stats block_stats(Stats s, Stats *shared) {
  for (int o = kWarp / 2; o > 0; o /= 2) s = combine(s, s.shuffled(o));
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  if (lane == 0) shared[warp] = s;
  __syncthreads();
  s = shared[0];
  for (int w = 1; w < static_cast<int>(blockDim.x / kWarp); ++w)
    s = combine(s, shared[w]);
  return s;
}

/* The gradient of one element: (ca p - ce w_j - cy [j == y]) times the
 * softcap chain factor; 0 for rows without a gradient. */
struct GradCoef {
  float lse, ca, ce, cy;
  int64_t y;
  bool zero;
};

__device__ __forceinline__ float grad_at(const RowParams &p, const GradCoef &c, float raw,
                                         int64_t j) {
  if (c.zero) return 0.0f;
  const float v = logit(p, raw, j);
  float g = c.ca * __expf(v - c.lse) - c.ce * class_weight(p, j);
  if (j == c.y) g -= c.cy;
  if (p.cap != 0.0f) {
    const float t = v * p.inv_cap;
    g *= 1.0f - t * t;
  }
  return g;
}

__device__ __forceinline__ void store4(float *row, int64_t q, float a, float b, float c,
                                       float d) {
  reinterpret_cast<float4 *>(row)[q] = make_float4(a, b, c, d);
}

__device__ __forceinline__ void store4(bf16_t *row, int64_t q, float a, float b, float c,
                                       float d) {
  __nv_bfloat162 *pairs = reinterpret_cast<__nv_bfloat162 *>(row);
  pairs[2 * q] = __floats2bfloat162_rn(a, b);
  pairs[2 * q + 1] = __floats2bfloat162_rn(c, d);
}

__device__ __forceinline__ void store1(float *row, int64_t j, float g) {
  row[j] = g;
}

__device__ __forceinline__ void store1(bf16_t *row, int64_t j, float g) {
  row[j] = __float2bfloat16_rn(g);
}

/* Pass 2: the gradient over the row, or into `out` elsewhere. A bf16
 * gradient in place is narrower than the fp32 logits it overwrites, so
 * element j lands on bytes that an element < j occupied: every tile is
 * read into registers, then a barrier, then written. An fp32 gradient
 * replaces each element in place (no barrier); one written elsewhere
 * needs none either. */
template <class G>
__device__ void write_gradient(const RowParams &p, const GradCoef &c, const float *z,
                               G *out) {
  const bool narrow_in_place =
      sizeof(G) < sizeof(float) &&
      static_cast<const void *>(out) == static_cast<const void *>(z);
  const int64_t nvec = p.vocab / 4;
  const float4 *z4 = reinterpret_cast<const float4 *>(z);
  for (int64_t base = 0; base < nvec; base += blockDim.x) {
    const int64_t q = base + threadIdx.x;
    float4 r = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (q < nvec) r = z4[q];
    if (narrow_in_place) __syncthreads();
    if (q < nvec) {
      const int64_t j = 4 * q;
      store4(out, q, grad_at(p, c, r.x, j), grad_at(p, c, r.y, j + 1),
             grad_at(p, c, r.z, j + 2), grad_at(p, c, r.w, j + 3));
    }
  }
  /* the tail: fewer than 4 elements */
  const int64_t j = 4 * nvec + threadIdx.x;
  float raw = 0.0f;
  if (j < p.vocab) raw = z[j];
  if (narrow_in_place) __syncthreads();
  if (j < p.vocab) store1(out, j, grad_at(p, c, raw, j));
}

/* The statistics of a row over this rank's columns (every thread gets
 * them). */
__device__ Stats row_stats(const RowParams &p, const float *z, Stats *shared) {
  Stats st = Stats::empty();
  const int64_t nvec = p.vocab / 4;
  const float4 *z4 = reinterpret_cast<const float4 *>(z);
  for (int64_t q = threadIdx.x; q < nvec; q += blockDim.x) {
    const float4 r = z4[q];
    const int64_t j = 4 * q;
    st.push(p, logit(p, r.x, j), j);
    st.push(p, logit(p, r.y, j + 1), j + 1);
    st.push(p, logit(p, r.z, j + 2), j + 2);
    st.push(p, logit(p, r.w, j + 3), j + 3);
  }
  for (int64_t j = 4 * nvec + threadIdx.x; j < p.vocab; j += blockDim.x)
    st.push(p, logit(p, z[j], j), j);
  return block_stats(st, shared);
}

template <class G>
__global__ void __launch_bounds__(kMaxRowThreads) rows_kernel(RowParams p) {
  __shared__ Stats shared[kMaxWarps];
  __shared__ float target_logit;
  __shared__ FlceCombined combined;
  const int64_t row = blockIdx.x, tok = p.first_token + row;
  const int64_t y = target_at(p.targets, p.targets64, tok);
  const bool ignored = y == p.ignore;
  /* targets were checked, or are checked on the device (device_target_check):
   * the range test keeps a bad one harmless, and its loss is NaN */
  const bool bad = !ignored && (y < 0 || y >= p.global);
  /* the target's local column; an ignored or bad y is never offset (the
   * subtraction could overflow) */
  const int64_t yl = ignored || bad ? -1 : y - p.offset;
  const bool mine = !ignored && yl >= 0 && yl < p.vocab;
  float *z = p.logits + row * p.ld;
  float wy = mine ? class_weight(p, yl) : 0.0f;
  Stats st = Stats::empty();
  if (p.phase != FlceRowPhase::finish) {
    if (threadIdx.x == 0) target_logit = mine ? logit(p, z[yl], yl) : 0.0f;
    st = row_stats(p, z, shared); /* its barrier also publishes target_logit */
  }
  if (p.phase == FlceRowPhase::records) {
    if (threadIdx.x == 0)
      flce_pack_record(p.records + row * kFlceRecordWords, st.max, st.sum, target_logit,
                       wy, st.wz, st.best, p.offset + st.best_j);
    return;
  }
  if (p.phase == FlceRowPhase::finish) {
    if (threadIdx.x == 0) combined = flce_combine(p.gathered, p.ranks, p.rows, row);
    __syncthreads();
    st.max = combined.max;
    st.sum = combined.sum;
    st.wz = combined.smooth;
    st.best_j = combined.best_j;
    wy = ignored ? 0.0f : combined.weight;
    if (threadIdx.x == 0) target_logit = combined.target;
  }
  /* counted: the token is not ignored (its target may lie in another shard
   * or slice); a bad target (device_target_check) counts as ignored, as on
   * the CPU */
  const bool counted = p.phase == FlceRowPhase::finish ? !ignored && !bad : mine;
  const float lse = st.max + logf(st.sum);
  const double wsum = p.totals->weight_sum;
  if (threadIdx.x == 0) {
    const float zl = counted ? p.z_scale * lse * lse : 0.0f;
    const float ce = (1.0f - p.smoothing) * wy * (lse - target_logit) +
                     p.eps * static_cast<float>(lse * wsum - st.wz);
    p.tok_loss[tok] = bad ? __int_as_float(0x7fc00000) : counted ? ce + zl : 0.0f;
    p.tok_z[tok] = zl;
    p.tok_argmax[tok] = st.best_j;
  }
  if (!p.want_grad) return;

  /* scale: the cross-entropy part's gradient scale, zscale the z-loss
   * part's: MEAN grad_loss / D and grad_loss / N (N the tokens not
   * ignored), SUM and NONE grad_loss */
  const float upstream =
      p.grad_loss != nullptr ? p.grad_loss[p.per_token ? tok : 0] : 1.0f;
  float scale = upstream, zscale = upstream;
  if (p.mean) {
    const double d = p.totals->denominator;
    const double count = static_cast<double>(p.totals->valid);
    scale = d > 0.0 ? static_cast<float>(upstream / d) : 0.0f;
    zscale = count > 0.0 ? static_cast<float>(upstream / count) : 0.0f;
  }
  GradCoef c;
  c.lse = lse;
  c.ca = scale * ((1.0f - p.smoothing) * wy + p.eps * static_cast<float>(wsum)) +
         zscale * 2.0f * p.z_scale * lse;
  c.ce = scale * p.eps;
  c.cy = scale * (1.0f - p.smoothing) * wy;
  c.y = mine ? yl : -1;
  c.zero = !counted || (scale == 0.0f && (zscale == 0.0f || p.z_scale == 0.0f));
  G *out = p.grad != nullptr ? static_cast<G *>(p.grad) + row * p.grad_ld
                             : reinterpret_cast<G *>(z);
  write_gradient<G>(p, c, z, out);
}

/* FlceRowPhase::merge: a thread per row reads its row of every block, then
 * writes its record (which may be the row of the first block). */
__global__ void merge_kernel(const float *gathered, int ranks, int64_t rows,
                             float *records) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows) return;
  const FlceCombined c = flce_combine(gathered, ranks, rows, i);
  flce_pack_record(records + i * kFlceRecordWords, c.max, c.sum, c.target, c.weight,
                   c.smooth, c.best, c.best_j);
}

/* ------------------------------------------------------------ finalize */

struct FinalParams {
  int64_t n;
  const void *targets;
  bool targets64;
  int64_t ignore;
  bool per_token, mean;
  const FlceTotals *totals;
  const float *tok_loss, *tok_z;
  const int64_t *tok_argmax;
  float *loss, *z, *accuracy, *token_loss;
  void *argmax;
  bool argmax64;
};

__global__ void __launch_bounds__(kSingleBlockThreads) finalize_kernel(FinalParams p) {
  __shared__ double dshared[kMaxWarps];
  __shared__ long long lshared[kMaxWarps];
  double loss = 0.0, z = 0.0;
  long long correct = 0;
  for (int64_t i = threadIdx.x; i < p.n; i += blockDim.x) {
    loss += p.tok_loss[i];
    z += p.tok_z[i];
    const int64_t am = p.tok_argmax[i];
    if (p.accuracy != nullptr) {
      const int64_t y = target_at(p.targets, p.targets64, i);
      correct += y != p.ignore && am == y;
    }
    if (p.per_token && p.loss != nullptr) p.loss[i] = p.tok_loss[i];
    if (p.per_token && p.z != nullptr) p.z[i] = p.tok_z[i];
    if (p.token_loss != nullptr) p.token_loss[i] = p.tok_loss[i];
    if (p.argmax != nullptr) {
      if (p.argmax64)
        static_cast<int64_t *>(p.argmax)[i] = am;
      else
        static_cast<int32_t *>(p.argmax)[i] = static_cast<int32_t>(am);
    }
  }
  loss = block_reduce(loss, Add{}, dshared);
  z = block_reduce(z, Add{}, dshared);
  correct = block_reduce(correct, Add{}, lshared);
  if (threadIdx.x != 0) return;
  const double d = p.totals->denominator;
  const long long valid = p.totals->valid;
  if (!p.per_token) {
    /* MEAN: the cross-entropy part (loss_i minus its z-loss) over D, the
     * z-loss part over the tokens not ignored; SUM: plain sums */
    const double ce_scale = !p.mean ? 1.0 : d > 0.0 ? 1.0 / d : 0.0;
    const double z_scale = !p.mean     ? 1.0
                           : valid > 0 ? 1.0 / static_cast<double>(valid)
                                       : 0.0;
    if (p.loss != nullptr)
      *p.loss = static_cast<float>((loss - z) * ce_scale + z * z_scale);
    if (p.z != nullptr) *p.z = static_cast<float>(z * z_scale);
  }
  if (p.accuracy != nullptr)
    *p.accuracy =
        valid > 0 ? static_cast<float>(static_cast<double>(correct) / valid) : 0.0f;
}

/* Threads per row block: enough 16-byte loads in flight for long rows,
 * few idle threads for short ones. */
unsigned row_threads(int64_t vocab) {
  if (vocab <= 2048) return 128;
  if (vocab <= 16384) return 256;
  return kMaxRowThreads;
}

}  // namespace

void launch_flce_prepare(cudaStream_t stream, const FlcePrepare &a) {
  const auto *w = static_cast<const float *>(a.class_weight.data);
  if (a.targets.dtype == OSFTI_I64)
    prepare_kernel<int64_t><<<1, kSingleBlockThreads, 0, stream>>>(
        static_cast<const int64_t *>(a.targets.data), a.targets.n, w, a.loss.vocab,
        a.loss.vocab_offset, a.loss.vocab_global, a.loss.ignore_index, a.totals, a.record,
        a.call);
  else
    prepare_kernel<int32_t><<<1, kSingleBlockThreads, 0, stream>>>(
        static_cast<const int32_t *>(a.targets.data), a.targets.n, w, a.loss.vocab,
        a.loss.vocab_offset, a.loss.vocab_global, a.loss.ignore_index, a.totals, a.record,
        a.call);
  check_launch("flce prepare");
}

void launch_flce_rows(cudaStream_t stream, const FlceRowPass &a) {
  if (a.logits.rows == 0) return;
  if (a.phase == FlceRowPhase::merge) {
    constexpr unsigned threads = 128;
    const auto blocks = static_cast<unsigned>((a.logits.rows + threads - 1) / threads);
    merge_kernel<<<blocks, threads, 0, stream>>>(a.gathered, a.ranks, a.logits.rows,
                                                 a.records);
    check_launch("flce merge");
    return;
  }
  RowParams p;
  p.logits = static_cast<float *>(a.logits.data);
  p.ld = a.logits.ld;
  p.grad = a.grad.data;
  p.grad_ld = a.grad.ld;
  p.vocab = a.loss.vocab;
  p.first_token = a.first_token;
  p.offset = a.loss.vocab_offset;
  p.global = a.loss.vocab_global;
  p.phase = a.phase;
  p.records = a.records;
  p.gathered = a.gathered;
  p.ranks = a.ranks;
  p.rows = a.logits.rows;
  p.targets = a.targets.data;
  p.targets64 = a.targets.dtype == OSFTI_I64;
  p.ignore = a.loss.ignore_index;
  const bool bias16 = a.bias.dtype == OSFTI_BF16;
  p.bias32 = bias16 ? nullptr : static_cast<const float *>(a.bias.data);
  p.bias16 = bias16 ? static_cast<const bf16_t *>(a.bias.data) : nullptr;
  p.weights = static_cast<const float *>(a.class_weight.data);
  p.grad_loss = a.grad_loss;
  p.per_token = a.loss.per_token;
  p.mean = a.loss.mean;
  p.want_grad = a.want_grad;
  p.totals = a.totals;
  p.smoothing = a.loss.smoothing;
  p.eps = a.loss.eps;
  p.z_scale = a.loss.z_scale;
  p.cap = a.loss.softcap;
  p.inv_cap = p.cap != 0.0f ? 1.0f / p.cap : 0.0f;
  p.tok_loss = a.tokens.loss;
  p.tok_z = a.tokens.z;
  p.tok_argmax = a.tokens.argmax;
  const dim3 grid(static_cast<unsigned>(a.logits.rows));
  const unsigned threads = row_threads(a.loss.vocab);
  if (a.grad_dtype == OSFTI_BF16 && a.phase != FlceRowPhase::records)
    rows_kernel<bf16_t><<<grid, threads, 0, stream>>>(p);
  else
    rows_kernel<float><<<grid, threads, 0, stream>>>(p);
  check_launch("flce rows");
}

void launch_flce_finalize(cudaStream_t stream, const FlceFinalize &a) {
  FinalParams p;
  p.n = a.targets.n;
  p.targets = a.targets.data;
  p.targets64 = a.targets.dtype == OSFTI_I64;
  p.ignore = a.loss.ignore_index;
  p.per_token = a.loss.per_token;
  p.mean = a.loss.mean;
  p.totals = a.totals;
  p.tok_loss = a.tokens.loss;
  p.tok_z = a.tokens.z;
  p.tok_argmax = a.tokens.argmax;
  p.loss = static_cast<float *>(a.out_loss.data);
  p.z = static_cast<float *>(a.out_z.data);
  p.accuracy = static_cast<float *>(a.out_accuracy.data);
  p.token_loss = static_cast<float *>(a.out_token_loss.data);
  p.argmax = a.out_argmax.data;
  p.argmax64 = a.out_argmax.dtype == OSFTI_I64;
  finalize_kernel<<<1, kSingleBlockThreads, 0, stream>>>(p);
  check_launch("flce finalize");
}

}  // namespace osft::cuda
