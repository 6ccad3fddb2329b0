/* Internal: the OSFT gradient projector behind osft_projector_t —
 * registration and validation, the fixed coefficient layout and the
 * one-time setup collectives (projection_plan.cpp), and the batched
 * projection and orthogonality query (projection_compute.cpp), written once
 * on the backend primitives and the communicator interface. */
#ifndef OSFTRT_SRC_OPS_PROJECTION_OPS_H
#define OSFTRT_SRC_OPS_PROJECTION_OPS_H

#include <cstddef>
#include <vector>

#include "comm/communicator.h"
#include "backend/linalg_backend.h"
#include "ops/flinear_ops.h"
#include "osftrt/projection.h"

namespace osft {

/* std::allocator over the context's host allocator, so the projector's
 * tables are served by the caller's allocator too. */
template <class T>
struct ContextAllocator {
  using value_type = T;
  Context *ctx;
  explicit ContextAllocator(Context *c) noexcept : ctx(c) {}
  template <class U>
  ContextAllocator(const ContextAllocator<U> &o) noexcept : ctx(o.ctx) {}
  T *allocate(size_t n) {
    return static_cast<T *>(ctx->allocator.host_alloc(n * sizeof(T), "projector tables"));
  }
  void deallocate(T *p, size_t n) noexcept { ctx->allocator.host_free(p, n * sizeof(T)); }
  template <class U>
  bool operator==(const ContextAllocator<U> &o) const noexcept {
    return ctx == o.ctx;
  }
  template <class U>
  bool operator!=(const ContextAllocator<U> &o) const noexcept {
    return ctx != o.ctx;
  }
};

template <class T>
using ContextVector = std::vector<T, ContextAllocator<T>>;

/* A registered matrix: its view (rows, cols, row stride) and device. Views
 * are stored rather than DLTensors, whose shape pointers would dangle when
 * the table grows. */
struct Operand {
  bool set = false;
  Mat m;
  DLDevice device{};
};

/* One part of a target: the U side (high N x r, x N x l) or the V side
 * (high r x K, x l x K), as this rank holds it. */
struct Part {
  bool present = false;
  int layout = OSFT_SHARD_REPLICATED;
  Operand high, grad, low;
  int64_t r = 0;       /* global frozen rank */
  int64_t l = 0;       /* trainable rank (V_ROWS: this rank's rows) */
  int64_t dim = 0;     /* global N (U) or K (V) */
  int64_t shards = -1; /* first entry in the projector's shard table */
  int64_t coef = -1;   /* reduced parts: offset (floats) in the coefficients */
  size_t cache = 0;    /* V_ROWS, P > 1: byte offset of V_high in the cache */
  bool reduced() const noexcept {
    return layout == OSFT_SHARD_U_ROWS || layout == OSFT_SHARD_V_COLS;
  }
};

struct Target {
  Layer *layer = nullptr;               /* a registered flinear layer, or NULL */
  int64_t layer_dims[4] = {0, 0, 0, 0}; /* n, kin, r, l at registration */
  Part u, v;
};

/* Which tensors a call projects. */
enum class Operands { grads, params };

/* How C enters a part's update (osft_projection_arithmetic_t resolved per
 * part by projection_compute.cpp): fp32 GEMM, C's two bf16 halves, or C
 * rounded to bf16. */
enum class Arith { fp32, split, bf16 };

/* One part as a call sees it: full (the high factor to project against:
 * the gathered V_high for V_ROWS), x (what is projected), coef (reduced
 * parts: their slice of the coefficient buffer; else NULL, in scratch). */
struct ProjectionJob {
  bool u = false;
  Arith arith = Arith::fp32;
  Mat full, x;
  float *coef = nullptr;
};

/* What the last project call did (osft_projector_info_t's last_*). */
struct ProjectionCounts {
  int64_t gemms = 0, gemm_calls = 0, elementwise = 0, collectives = 0, host_waits = 0;
};

}  // namespace osft

struct osft_projector_s {
  explicit osft_projector_s(osft::Context &c)
      : ctx(&c),
        targets(osft::ContextAllocator<osft::Target>(&c)),
        shard_table(osft::ContextAllocator<int64_t>(&c)),
        jobs(osft::ContextAllocator<osft::ProjectionJob>(&c)) {}
  osft::Context *ctx;
  osft::Comm *comm = nullptr; /* NULL: one rank */
  bool check_consistency = true;
  int arithmetic = OSFT_PROJECTION_ARITHMETIC_AUTO; /* as in the options */
  osft::ContextVector<osft::Target> targets;
  osft::ContextVector<int64_t> shard_table; /* every sharded part's P entries */
  int64_t reduced = 0;                      /* floats all-reduced per project call */
  float *coef = nullptr; /* reduced + 2 P floats (orthogonality slots) */
  size_t coef_bytes = 0;
  void *cache = nullptr; /* gathered V_high of the V_ROWS parts */
  size_t cache_bytes = 0;
  bool setup_pending = true;
  bool counted = false;
  /* A call's parts, in batching order: kept between calls so that a
   * steady state allocates nothing. */
  osft::ContextVector<osft::ProjectionJob> jobs;
  osft::ProjectionCounts last;
};

namespace osft {

using Projector = osft_projector_s;

/* ---- lifetime and registration (projection_plan.cpp) */
osft_projector_options_t read_projector_options(const osft_projector_options_t *user);
Projector *create_projector(Context &ctx, Comm *comm, const osft_projector_options_t &o);
void destroy_projector(Projector *p) noexcept;
Projector &checked_projector(osft_projector_t p, const char *arg);
int64_t add_target(Projector &p, const osft_projection_target_t &t);
int64_t add_layer(Projector &p, Layer &layer, const DLTensor *grad_u,
                  const DLTensor *grad_v);
void set_grads(Projector &p, int64_t index, const DLTensor *grad_u,
               const DLTensor *grad_v);
void invalidate(Projector &p) noexcept;
/* Allocates the coefficients and runs the pending setup collectives. */
void prepare(Projector &p);
int ranks(const Projector &p) noexcept;
int my_rank(const Projector &p) noexcept;
/* The shard sizes of a sharded part (ranks(p) entries). */
const int64_t *shards_of(const Projector &p, const Part &part) noexcept;
/* A registered layer, checked alive and unchanged, with fresh factor
 * views written into the target's U and V high/low operands. */
void refresh_layer_target(const Projector &p, Target &t, int64_t index);

/* ---- computation (projection_compute.cpp) */
void project(Projector &p, Operands which);
void orthogonality(Projector &p, double *max_u, double *max_v);

}  // namespace osft

#endif
