/* Internal: the dense linear-algebra primitives every operation is written
 * in, once, for both backends. An operation plans and validates in
 * src/ops/, then calls backend(ctx).X(...); src/cpu/ and src/cuda/ each
 * implement the table. Kernels never validate: arguments arrive checked. */
#ifndef OSFTRT_SRC_BACKEND_LINALG_BACKEND_H
#define OSFTRT_SRC_BACKEND_LINALG_BACKEND_H

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "core/context_impl.h"
#include "core/error.h"
#include "core/matrix_view.h"

namespace osft {

/* The kernels take OSFTI_F32 and OSFTI_BF16 views (svd: f32 or f64).
 * Work is enqueued on the context's stream (CUDA) or done before return
 * (CPU). Scratch comes from the context's allocator. */
struct Backend {
  /* C = alpha * op(A) * op(B) + beta * C, accumulated in fp32. A and B share
   * a dtype (f32 or bf16); C is f32 or bf16. beta == 0 never reads C. */
  void (*gemm)(Context &ctx, Op op_a, const Mat &a, Op op_b, const Mat &b, float alpha,
               float beta, const Mat &c);

  /* dst = beta * dst + src * diag(s)   (axis cols: s runs along columns), or
   * dst = beta * dst + diag(s) * src   (axis rows). s == nullptr: no scaling.
   * dst may be src (then beta must be 0). Any float dtypes; fp32 math. */
  void (*scale_into)(Context &ctx, Axis axis, const Mat &src, const Vec *s, float beta,
                     const Mat &dst);

  /* Sums along an axis, optionally of a product (b == nullptr: of a alone):
   * axis cols: y[j] = beta * y[j] + sum_i a[i,j] * b[i,j]
   * axis rows: y[i] = beta * y[i] + sum_j a[i,j] * b[i,j]
   * Accumulated in fp32 (CUDA) or fp64 (CPU). */
  void (*reduce)(Context &ctx, Axis axis, const Mat &a, const Mat *b, float beta,
                 const Vec &y);

  /* Every row of dst = v (dtype converted). */
  void (*broadcast_rows)(Context &ctx, const Vec &v, const Mat &dst);

  /* Thin SVD a = u * diag(s) * vt with u (m x k), s (k), vt (k x n),
   * k = min(m, n), singular values descending, computed in fp64. Throws
   * OSFT_STATUS_NUMERICAL_ERROR if it does not converge. */
  void (*svd)(Context &ctx, const Mat &a, const Mat &u, const Vec &s, const Mat &vt);

  /* dst = 0 (every element of the view). */
  void (*fill_zero)(Context &ctx, const Mat &dst);

  /* True if no element of a is NaN or infinite (waits for the result). */
  bool (*all_finite)(Context &ctx, const Mat &a);

  /* A 64-bit hash of the bytes of a's elements, for detecting in-place
   * updates; nullptr where it cannot be had without a device sync. */
  uint64_t (*fingerprint)(Context &ctx, const Mat &a);

  /* True when a bf16 x bf16 GEMM runs on bf16 hardware (tensor cores, AMX)
   * rather than on widened fp32 copies: worth splitting an fp32 operand
   * into two bf16 ones (src/ops/projection_compute.cpp). nullptr: false. */
  bool (*native_bf16_gemm)(Context &ctx);

  /* B packed once in the backend's own layout for many GEMMs of m rows with
   * the same op(B) (a weight over the tiles of an MLP or the chunks of
   * FLCE), used through PackedB below. packed_b_bytes: the bytes of the
   * packed copy, 0 where the backend does not pack (then plain gemm);
   * nullptr: never (CUDA). pack_b writes it to dst; gemm_packed_b is gemm
   * with that copy as B (c.rows == m; b gives its shape and dtype). The
   * same math as gemm: packing changes the layout only. */
  size_t (*packed_b_bytes)(Context &ctx, Op op_b, const Mat &b, int64_t m);
  void (*pack_b)(Context &ctx, Op op_b, const Mat &b, int64_t m, void *dst);
  void (*gemm_packed_b)(Context &ctx, Op op_a, const Mat &a, Op op_b, const Mat &b,
                        const void *packed, float alpha, float beta, const Mat &c);

  /* count independent GEMMs c[i] = alpha op(a[i]) op(b[i]) + beta c[i] of
   * one shape: every a[i] has a[0]'s rows, cols, ld and dtype, likewise b
   * and c; no c[i] overlaps another operand. One launch where the backend
   * batches (CUDA: cublasGemmBatchedEx); nullptr: gemm per problem (use
   * gemm_batch() below). */
  void (*gemm_batched)(Context &ctx, Op op_a, Op op_b, int64_t count, const Mat *a,
                       const Mat *b, float alpha, float beta, const Mat *c);
};

const Backend &cpu_backend() noexcept;
/* Throws OSFT_STATUS_NOT_SUPPORTED in builds without CUDA. */
const Backend &cuda_backend();

inline const Backend &backend(Context &ctx) {
  return on_cuda(ctx) ? cuda_backend() : cpu_backend();
}

/* B of the GEMMs of one operation that all take it with the same op(B)
 * (a weight over tiles or chunks), packed once where the backend packs it
 * (the CPU engines: a CUDA context never packs) and the packed copy fits
 * within workspace_limit beside the workspace and within `room` bytes (an
 * operation's own memory budget). The copy lives on the context's host
 * scratch stack (host_scratch_take: kept between calls, so a steady state
 * allocates nothing; a refusal: no packing) and goes back to it when the
 * PackedB goes, before the operation returns; PackedBs go in stack order.
 * Each gemm() with m rows uses it, any other plain gemm (the same result
 * either way). */
class PackedB {
 public:
  PackedB(Context &ctx, Op op_b, const Mat &b, int64_t m, size_t room = SIZE_MAX)
      : ctx_(ctx), op_(op_b), b_(b), m_(m) {
    const Backend &be = backend(ctx);
    if (on_cuda(ctx) || be.packed_b_bytes == nullptr) return;
    const size_t bytes = be.packed_b_bytes(ctx, op_b, b, m);
    const size_t limit = ctx.workspace_limit;
    if (bytes == 0 || bytes > room ||
        (limit != 0 && bytes > limit - std::min(limit, ctx.workspace_bytes)))
      return;
    try {
      data_ = host_scratch_take(ctx, bytes, "packed GEMM operand");
    } catch (const Error &e) {
      if (e.status() != OSFT_STATUS_OUT_OF_MEMORY) throw;
      return;
    }
    bytes_ = bytes;
    be.pack_b(ctx, op_b, b, m, data_);
  }
  ~PackedB() { host_scratch_give(ctx_, data_, bytes_); }
  PackedB(const PackedB &) = delete;
  PackedB &operator=(const PackedB &) = delete;

  /* C = alpha op(A) op(B) + beta C, as backend(ctx).gemm. */
  void gemm(Op op_a, const Mat &a, float alpha, float beta, const Mat &c) const {
    const Backend &be = backend(ctx_);
    if (data_ != nullptr && c.rows == m_)
      return be.gemm_packed_b(ctx_, op_a, a, op_, b_, data_, alpha, beta, c);
    be.gemm(ctx_, op_a, a, op_, b_, alpha, beta, c);
  }
  /* Whether B was packed (otherwise gemm() is the plain one). */
  bool packed() const noexcept { return data_ != nullptr; }

 private:
  Context &ctx_;
  Op op_;
  Mat b_;
  int64_t m_;
  void *data_ = nullptr;
  size_t bytes_ = 0;
};

/* C = alpha op(A) op(B) + beta C through `packed` (B as packed, or plain
 * where it was not) when given, else the plain gemm. */
inline void gemm_with_packed(Context &ctx, const PackedB *packed, Op op_a, const Mat &a,
                             Op op_b, const Mat &b, float alpha, float beta,
                             const Mat &c) {
  if (packed != nullptr) return packed->gemm(op_a, a, alpha, beta, c);
  backend(ctx).gemm(ctx, op_a, a, op_b, b, alpha, beta, c);
}

/* Backend::gemm_batched where the backend has it, else one gemm each. */
inline void gemm_batch(Context &ctx, Op op_a, Op op_b, int64_t count, const Mat *a,
                       const Mat *b, float alpha, float beta, const Mat *c) {
  const Backend &be = backend(ctx);
  if (be.gemm_batched != nullptr && count > 1)
    return be.gemm_batched(ctx, op_a, op_b, count, a, b, alpha, beta, c);
  for (int64_t i = 0; i < count; ++i)
    be.gemm(ctx, op_a, a[i], op_b, b[i], alpha, beta, c[i]);
}

/* Splits fp32 c into two bf16 halves, hi = bf16(c) and lo = bf16(hi - c),
 * so that two bf16 GEMMs with fp32 accumulation (one on hi, one subtracting
 * lo) carry 16 bits of c's mantissa. c is overwritten with hi - c (exact). */
inline void split_bf16(Context &ctx, const Mat &c, const Mat &hi, const Mat &lo) {
  const Backend &be = backend(ctx);
  be.scale_into(ctx, Axis::cols, c, nullptr, 0.0f, hi);
  be.scale_into(ctx, Axis::cols, hi, nullptr, -1.0f, c);
  be.scale_into(ctx, Axis::cols, c, nullptr, 0.0f, lo);
}

}  // namespace osft

#endif
