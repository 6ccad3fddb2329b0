/* Internal: the CPU GEMM engine, chosen at build time (CMake
 * OSFTRT_CPU_BLAS): the BLAS and LAPACK calls of the CPU kernels and what
 * osft_build_info() says about the engine. Built from
 * src/cpu/blas_openblas_cpu.cpp (OpenBLAS + LAPACK, the default) or
 * src/cpu/blas_mkl_cpu.cpp (oneMKL), so no other file tests a macro or
 * includes an engine's headers (src/cpu/blas_cblas_cpu.cpp holds the CBLAS
 * calls both share). Arguments arrive checked (32-bit dimensions); the
 * calls have the CBLAS/LAPACK semantics of their names. Also the vector
 * helpers and rows (osft::simd) of the kernels' element-wise passes. */
#ifndef OSFTRT_SRC_CORE_CPU_BLAS_H
#define OSFTRT_SRC_CORE_CPU_BLAS_H

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <type_traits>
#include <utility>

#include "core/bf16.h"
#include "core/matrix_view.h"

namespace osft::blas {

/* "OpenBLAS 0.3.21 (core SkylakeX, ...)" or "oneMKL 2026.2.0 (ISA ...)":
 * the engine, its version and the instruction set it dispatches to on
 * this CPU. Static storage. */
const char *describe() noexcept;

/* The engine's own thread count, and setting it process-wide (the engine
 * file's call: openblas_set_num_threads, mkl_set_num_threads). Kernels do
 * not call set_threads: the library's count below tells the engine. */
int threads() noexcept;
void set_threads(int n) noexcept;
/* The engine's own thread-count variable ("OPENBLAS_NUM_THREADS",
 * "MKL_NUM_THREADS"), which the library's count follows too. */
const char *threads_env() noexcept;

/* ------------------------------------------------ the library's threads */
/* src/cpu/parallel_cpu.cpp. One thread count for the whole process: the
 * explicit one (set_num_threads, osft_set_num_threads), else the
 * environment (OSFTRT_NUM_THREADS, OMP_NUM_THREADS, then the engine's own
 * variable: OPENBLAS_NUM_THREADS or MKL_NUM_THREADS), else the CPUs this
 * process may run on (sched_getaffinity), at most kMaxThreads. The
 * environment and the affinity are read once, when the count is first
 * needed. The engine is told the count then and at every change, so its
 * GEMMs and the library's own passes use the same threads. */
constexpr int kMaxThreads = 1024;

/* The count in effect (>= 1): an atomic load after the first call. */
int num_threads() noexcept;
/* n >= 1: the explicit count; 0: back to the environment / affinity.
 * Arrives checked (0 <= n <= kMaxThreads). Thread-safe. */
void set_num_threads(int n) noexcept;
/* Worker threads the pool has started (tests): count - 1 after a first
 * parallel call, fewer where the system refused a thread. */
int pool_workers() noexcept;

/* A callable borrowed for one call (no allocation, unlike std::function):
 * the callee must not keep it beyond the call. */
template <class Sig>
class FunctionRef;
template <class R, class... Args>
class FunctionRef<R(Args...)> {
 public:
  template <class F,
            class = std::enable_if_t<!std::is_same<std::decay_t<F>, FunctionRef>::value>>
  FunctionRef(F &&f) noexcept /* NOLINT: implicit on purpose */
      : obj_(const_cast<void *>(static_cast<const void *>(std::addressof(f)))),
        call_([](void *obj, Args... args) -> R {
          return (*static_cast<std::remove_reference_t<F> *>(obj))(
              std::forward<Args>(args)...);
        }) {}
  R operator()(Args... args) const { return call_(obj_, std::forward<Args>(args)...); }

 private:
  void *obj_;
  R (*call_)(void *, Args...);
};

/* Runs part(p) for every p in [0, parts) exactly once and returns when all
 * are done: on the process's pool of persistent worker threads (started on
 * the first call that needs them, num_threads() - 1 of them; no thread is
 * created per call), the calling thread taking parts too. Parts run on
 * whichever thread is free first, several possibly on one thread, so a
 * part must not wait for another. When the pool is taken (a call from
 * another thread, or a nested call from a part) every part runs here, one
 * after another. part must not throw. */
void run_parts(int parts, FunctionRef<void(int)> part);

/* parallel_for on run_parts: at most num_threads() parts of at least
 * `grain` items, one part inline. */
void parallel_for_pool(int64_t n, int64_t grain,
                       FunctionRef<void(int64_t, int64_t)> body);

/* True in a process forked (after the count was first resolved) from the
 * one that ran the library: engines that cannot use their threads there
 * (GNU OpenMP) run on one. */
bool forked_child() noexcept;

/* Holds the engine's GEMMs at one thread while any SerialBlas is alive (the
 * batched QR's lanes, which are threads themselves), then gives it back
 * the library's count, even if that changed meanwhile. */
class SerialBlas {
 public:
  SerialBlas();
  ~SerialBlas();
  SerialBlas(const SerialBlas &) = delete;
  SerialBlas &operator=(const SerialBlas &) = delete;
};

/* Runs body(begin, end) over [0, n) split into at most num_threads()
 * parts of at least `grain` items, the calling thread taking a part: the
 * element-wise passes between the GEMMs. One part runs here, with no
 * synchronization at all. Each engine file picks the threads (why: the
 * comment at each definition); body must not throw. */
void parallel_for(int64_t n, int64_t grain, FunctionRef<void(int64_t, int64_t)> body);

/* The rows of an element-wise pass over a rows x cols matrix through
 * parallel_for, at least 64K elements (and one row) a part; a pass under
 * two parts' worth runs here, without touching the pool. */
template <class Body>
void parallel_rows(int64_t rows, int64_t cols, const Body &body) {
  constexpr int64_t kGrain = 1 << 16;
  if (rows * cols < 2 * kGrain) return body(int64_t{0}, rows);
  parallel_for(rows, kGrain / cols > 1 ? kGrain / cols : 1, body);
}

enum class Layout { row, col };

/* C = alpha op(A) op(B) + beta C. */
void gemm(Layout layout, Op op_a, Op op_b, int m, int n, int k, float alpha,
          const float *a, int lda, const float *b, int ldb, float beta, float *c,
          int ldc) noexcept;
void gemm(Layout layout, Op op_a, Op op_b, int m, int n, int k, double alpha,
          const double *a, int lda, const double *b, int ldb, double beta, double *c,
          int ldc) noexcept;

/* True when the engine multiplies bf16 operands itself (fp32 accumulation,
 * fp32 C); gemm_bf16 may be called only then. Otherwise the caller widens
 * bf16 to fp32 and calls gemm. */
bool has_bf16_gemm() noexcept;
void gemm_bf16(Layout layout, Op op_a, Op op_b, int m, int n, int k, float alpha,
               const bf16 *a, int lda, const bf16 *b, int ldb, float beta, float *c,
               int ldc) noexcept;

/* B packed once into the engine's own layout for many gemm_bf16 calls with
 * the same layout, op(B) (k x n) and m (a weight reused over the tiles of
 * an MLP or the chunks of FLCE): oneMKL's gemm_bf16 otherwise re-packs B on
 * every call. gemm_bf16_pack_bytes is 0 where the engine does not pack
 * (OpenBLAS: no bf16 GEMM); the caller then calls gemm_bf16 as usual. Only
 * bf16: oneMKL's fp32 packing saved 3-8% at the MLP's shapes and nothing at
 * FLCE's (Emerald Rapids, 2 cores), its bf16 packing 15-44%. */
size_t gemm_bf16_pack_bytes(int m, int n, int k) noexcept;
/* Packs op(B) into dst, gemm_bf16_pack_bytes(m, n, k) bytes. */
void gemm_bf16_pack(Layout layout, Op op_b, int m, int n, int k, const bf16 *b, int ldb,
                    void *dst) noexcept;
/* gemm_bf16 with B from gemm_bf16_pack (the same layout, m, n and k). */
void gemm_bf16_packed(Layout layout, Op op_a, int m, int n, int k, float alpha,
                      const bf16 *a, int lda, const void *packed_b, float beta, float *c,
                      int ldc) noexcept;

/* Column-major: c (n x n, upper) = a^T a, a m x n. */
void syrk_upper_t(int n, int m, const double *a, int lda, double *c, int ldc) noexcept;
void syrk_upper_t(int n, int m, const float *a, int lda, float *c, int ldc) noexcept;
/* Column-major: b (m x n) = b r^-1, r upper n x n. */
void trsm_right_upper(int m, int n, const double *r, int ldr, double *b,
                      int ldb) noexcept;
void trsm_right_upper(int m, int n, const float *r, int ldr, float *b, int ldb) noexcept;
/* Column-major fp64: b (n x n) = r b, r upper n x n. */
void trmm_left_upper(int n, const double *r, int ldr, double *b, int ldb) noexcept;

/* Row-major b (cols x rows) = a^T, a rows x cols. */
void transpose(int rows, int cols, const float *a, int lda, float *b, int ldb) noexcept;
void transpose(int rows, int cols, const double *a, int lda, double *b, int ldb) noexcept;

/* LAPACK (column-major); lwork == -1 is a workspace query. */
void geqrfp(int m, int n, float *a, int lda, float *tau, float *work, int lwork,
            int *info) noexcept;
void geqrfp(int m, int n, double *a, int lda, double *tau, double *work, int lwork,
            int *info) noexcept;
void orgqr(int m, int n, int k, float *a, int lda, const float *tau, float *work,
           int lwork, int *info) noexcept;
void orgqr(int m, int n, int k, double *a, int lda, const double *tau, double *work,
           int lwork, int *info) noexcept;
void potrf_upper(int n, double *a, int lda, int *info) noexcept;
/* dgesdd with jobz "S". iwork holds 8 min(m, n) ints. */
void gesdd_thin(int m, int n, double *a, int lda, double *s, double *u, int ldu,
                double *vt, int ldvt, double *work, int lwork, int *iwork,
                int *info) noexcept;

}  // namespace osft::blas

/* Vector helpers of the CPU kernels' element-wise passes: 16 fp32 lanes in
 * GCC vector extensions (one AVX-512 register, two AVX2 ones, four SSE
 * ones), written once and compiled per instruction set by the kernels'
 * OSFT_SIMD_CLONES functions, which pick the widest the CPU has at load
 * time (the library itself is built for baseline x86-64). Helpers take
 * vectors by reference (no vector ABI at a call) and are always inlined
 * into the cloned loops, so each clone gets its own code. */
namespace osft::simd {

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define OSFT_SIMD_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define OSFT_SIMD_CLONES
#endif
#define OSFT_SIMD_INLINE inline __attribute__((always_inline))

constexpr int kLanes = 16;
typedef float f32v __attribute__((vector_size(64)));
typedef int32_t i32v __attribute__((vector_size(64)));
typedef uint32_t u32v __attribute__((vector_size(64)));
typedef uint16_t u16v __attribute__((vector_size(32)));

OSFT_SIMD_INLINE void splat(f32v &v, float x) {
  v = f32v{} + x;
}

OSFT_SIMD_INLINE void load(f32v &v, const float *p) {
  std::memcpy(&v, p, sizeof v);
}
OSFT_SIMD_INLINE void load(f32v &v, const bf16 *p) {
  u16v h;
  std::memcpy(&h, p, sizeof h);
  const u32v bits = __builtin_convertvector(h, u32v) << 16;
  std::memcpy(&v, &bits, sizeof v);
}
OSFT_SIMD_INLINE void store(float *p, const f32v &v) {
  std::memcpy(p, &v, sizeof v);
}
/* to_bf16 of every lane: round to nearest even, NaNs kept (quiet) NaNs, in
 * integer arithmetic so that the bits are those of to_bf16 (the AVX512-BF16
 * conversion would flush subnormals). */
OSFT_SIMD_INLINE void store(bf16 *p, const f32v &v) {
  u32v u;
  std::memcpy(&u, &v, sizeof u);
  const u32v rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const u32v nan = (u >> 16) | 0x40u;
  const u32v r = (u & 0x7fffffffu) > 0x7f800000u ? nan : rounded;
  const u16v h = __builtin_convertvector(r, u16v);
  std::memcpy(p, &h, sizeof h);
}

/* The first k lanes from p, the others `fill`; and their store. */
template <class T>
OSFT_SIMD_INLINE void load_partial(f32v &v, const T *p, int k, float fill) {
  if (k == kLanes) return load(v, p);
  splat(v, fill);
  for (int l = 0; l < k; ++l) v[l] = to_float(p[l]);
}
OSFT_SIMD_INLINE void store_partial(float *p, const f32v &v, int k) {
  if (k == kLanes) return store(p, v);
  for (int l = 0; l < k; ++l) p[l] = v[l];
}
OSFT_SIMD_INLINE void store_partial(bf16 *p, const f32v &v, int k) {
  if (k == kLanes) return store(p, v);
  for (int l = 0; l < k; ++l) p[l] = to_bf16(v[l]);
}

/* e^x (Cephes' expf): x = n ln2 + r, |r| <= ln2 / 2, e^r by a degree-6
 * polynomial (about 1 ulp), 2^n built in the exponent bits. Inputs are
 * clamped to [-87, 88]: e^x never overflows, tiny results are ~1e-38, not
 * 0; NaN stays NaN. */
OSFT_SIMD_INLINE void exp(f32v &x) {
  f32v lo, hi;
  splat(lo, -87.0f);
  splat(hi, 88.0f);
  x = x < lo ? lo : x;
  x = x > hi ? hi : x;
  const float magic = 12582912.0f; /* 1.5 * 2^23: rounds to an integer */
  const f32v n = (x * 1.44269504088896341f + magic) - magic;
  f32v r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  f32v p = r * 1.9875691500e-4f + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  const i32v bits = (__builtin_convertvector(n, i32v) + 127) << 23;
  f32v scale;
  std::memcpy(&scale, &bits, sizeof scale);
  x = p * scale;
}

/* Whole rows (src/cpu/simd_cpu.cpp, cloned per instruction set). Hidden
 * by name: GCC gives the clones' dispatchers default visibility. */
#pragma GCC visibility push(hidden)
/* dst[0, n) = src widened to fp32 (exact). */
void widen(const bf16 *src, float *dst, int64_t n) noexcept;
/* dst[0, n) = to_bf16(src) (round to nearest even, NaN stays NaN). */
void narrow(const float *src, bf16 *dst, int64_t n) noexcept;
/* y[j] = a[j] * (s != nullptr ? s[j] : s0) + beta * y[j] for j in [0, n);
 * y is not read when beta == 0; a may be y. */
void scale(int64_t n, const float *a, const float *s, float s0, float beta,
           float *y) noexcept;
/* sums[j] += a[j] * b[j] (b == nullptr: a[j]) in fp64, for j in [0, n). */
void accumulate(int64_t n, const float *a, const float *b, double *sums) noexcept;
/* sum_j a[j] * b[j] (b == nullptr: a[j]), accumulated in fp64. */
double dot(int64_t n, const float *a, const float *b) noexcept;
#pragma GCC visibility pop

}  // namespace osft::simd

#endif
