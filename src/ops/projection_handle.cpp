/* OSFT projection: the projector's lifetime, target registration with
 * every check done before anything is stored, the fixed coefficient
 * offsets, and the one-time setup collectives (cross-rank consistency
 * check, the V_high all-gather of V_ROWS parts). */
#include <algorithm>
#include <cstdio>
#include <cstring>

#include "core/child_handle.h"
#include "core/error.h"
#include "core/handle.h"
#include "core/logging.h"
#include "core/options.h"
#include "core/tensor_args.h"
#include "ops/projection_ops.h"

namespace osft {
namespace {

constexpr size_t kOptionsV1 = OSFTI_V1_SIZE(osft_projector_options_t, check_consistency);
constexpr unsigned kDtypes = OSFTI_F32 | OSFTI_BF16;
constexpr int64_t kSliceAlign = 4;  /* floats: every slice 16-byte aligned */
constexpr size_t kCacheAlign = 256; /* bytes, per gathered V_high */

/* ---------------------------------------------------------------- operands */

Operand operand(Context &ctx, const DLTensor *t, const char *name, int64_t rows,
                int64_t cols) {
  Operand o;
  if (t == nullptr) return o;
  o.m = checked_matrix(ctx, t, name, kDtypes, rows, cols);
  o.set = true;
  o.device = t->device;
  return o;
}

Operand operand_of(const Context &ctx, const Mat &m) {
  Operand o;
  o.set = true;
  o.m = m;
  o.device = dl_device(ctx);
  return o;
}

/* A stored operand as a DLTensor again, for the overlap checks (shape and
 * strides are attached when it is used: the view gets copied). */
struct DlView {
  char name[64];
  bool writable;
  DLTensor t;
  int64_t shape[2], strides[2];
  DLTensor tensor() const {
    DLTensor out = t;
    out.shape = const_cast<int64_t *>(shape);
    out.strides = const_cast<int64_t *>(strides);
    return out;
  }
};

void add_view(ContextVector<DlView> &out, const Operand &o, bool writable,
              const char *fmt, const char *what, int64_t index) {
  if (!o.set) return;
  DlView v{};
  std::snprintf(v.name, sizeof v.name, fmt, what, static_cast<long long>(index));
  v.writable = writable;
  v.shape[0] = o.m.rows;
  v.shape[1] = o.m.cols;
  v.strides[0] = o.m.ld;
  v.strides[1] = 1;
  v.t.data = o.m.data;
  v.t.device = o.device;
  v.t.ndim = 2;
  v.t.dtype.code = o.m.dtype == OSFTI_BF16 ? kDLBfloat : kDLFloat;
  v.t.dtype.bits = static_cast<uint8_t>(8 * osfti_dtype_size(o.m.dtype));
  v.t.dtype.lanes = 1;
  out.push_back(v);
}

/* Every tensor of a target; `fmt` names them (e.g. "%s of target %lld"). */
void add_views(ContextVector<DlView> &out, const Target &t, const char *fmt,
               int64_t index) {
  add_view(out, t.u.high, false, fmt, "u_high", index);
  add_view(out, t.u.grad, true, fmt, "grad_u_low", index);
  add_view(out, t.u.low, true, fmt, "u_low", index);
  add_view(out, t.v.high, false, fmt, "v_high", index);
  add_view(out, t.v.grad, true, fmt, "grad_v_low", index);
  add_view(out, t.v.low, true, fmt, "v_low", index);
}

void check_pair(const DlView &a, const DlView &b) {
  if (!a.writable && !b.writable) return;
  const DLTensor ta = a.tensor(), tb = b.tensor();
  check_no_overlap(a.name, &ta, b.name, &tb);
}

/* The projector writes gradients and trainable factors: none may share
 * memory with any other tensor of this or any other target (`skip`: the
 * index of the target being replaced). */
void check_overlaps(const Projector &p, const Target &candidate, int64_t skip) {
  ContextVector<DlView> mine{ContextAllocator<DlView>(p.ctx)};
  ContextVector<DlView> theirs{ContextAllocator<DlView>(p.ctx)};
  add_views(mine, candidate, "target->%s", 0);
  for (size_t i = 0; i < mine.size(); ++i)
    for (size_t j = i + 1; j < mine.size(); ++j) check_pair(mine[i], mine[j]);
  for (size_t k = 0; k < p.targets.size(); ++k) {
    if (static_cast<int64_t>(k) == skip) continue;
    theirs.clear();
    add_views(theirs, p.targets[k], "%s of target %lld", static_cast<int64_t>(k));
    for (const DlView &a : mine)
      for (const DlView &b : theirs) check_pair(a, b);
  }
}

/* ---------------------------------------------------------------- parts */

/* The caller's description of one part, and the names of its fields. */
struct PartInput {
  const DLTensor *high, *grad, *low;
  int layout;
  const int64_t *shards;
  int64_t n_shards;
  char names[6][32]; /* high, grad, low, layout, shards, n_shards */
};

/* Checks a shard array; returns the sum (the global size). */
int64_t check_shards(const Projector &p, const PartInput &in, int64_t local,
                     const char *what) {
  const int P = ranks(p);
  if (in.shards == nullptr)
    raise(OSFT_STATUS_INVALID_ARGUMENT,
          "%s: NULL; a sharded part needs the shard size of every rank", in.names[4]);
  if (in.n_shards != P)
    raise(OSFT_STATUS_INVALID_ARGUMENT,
          "%s: %lld, but the communicator has %d ranks (one shard size per rank)",
          in.names[5], static_cast<long long>(in.n_shards), P);
  int64_t total = 0;
  for (int q = 0; q < P; ++q) {
    if (in.shards[q] < 0)
      raise(OSFT_STATUS_INVALID_ARGUMENT, "%s[%d]: %lld is negative", in.names[4], q,
            static_cast<long long>(in.shards[q]));
    if (__builtin_add_overflow(total, in.shards[q], &total))
      raise(OSFT_STATUS_INVALID_ARGUMENT, "%s: the sum overflows", in.names[4]);
  }
  const int me = my_rank(p);
  if (in.shards[me] != local)
    raise(OSFT_STATUS_SHAPE_MISMATCH,
          "%s[%d]: %lld, but this rank (%d) holds %lld %s of %s", in.names[4], me,
          static_cast<long long>(in.shards[me]), me, static_cast<long long>(local), what,
          in.names[0]);
  return total;
}

void require_no_shards(const PartInput &in) {
  if (in.shards != nullptr || in.n_shards != 0)
    raise(OSFT_STATUS_INVALID_ARGUMENT,
          "%s/%s: set for a REPLICATED part; leave them NULL and 0", in.names[4],
          in.names[5]);
}

/* The trainable operands: whichever of grad and low is given first sets
 * the shape the other must match. */
void check_trainable(Context &ctx, const PartInput &in, Part &part, int64_t rows,
                     int64_t cols) {
  const bool first_grad = in.grad != nullptr;
  Operand &a = first_grad ? part.grad : part.low;
  Operand &b = first_grad ? part.low : part.grad;
  const int ia = first_grad ? 1 : 2, ib = first_grad ? 2 : 1;
  a = operand(ctx, first_grad ? in.grad : in.low, in.names[ia], rows, cols);
  b = operand(ctx, first_grad ? in.low : in.grad, in.names[ib], a.m.rows, a.m.cols);
}

void check_presence(const PartInput &in) {
  if (in.high == nullptr && (in.grad != nullptr || in.low != nullptr))
    raise(OSFT_STATUS_INVALID_ARGUMENT, "%s: NULL, but %s is set", in.names[0],
          in.grad != nullptr ? in.names[1] : in.names[2]);
  if (in.high != nullptr && in.grad == nullptr && in.low == nullptr)
    raise(OSFT_STATUS_INVALID_ARGUMENT,
          "%s and %s: both NULL; a part needs a gradient, a trainable factor or both",
          in.names[1], in.names[2]);
}

void check_ranks(const PartInput &in, int64_t r, int64_t l, int64_t dim, bool l_local,
                 const char *dim_name) {
  if (r < 1)
    raise(OSFT_STATUS_SHAPE_MISMATCH, "%s: frozen rank r = %lld; must be >= 1",
          in.names[0], static_cast<long long>(r));
  if (l < (l_local ? 0 : 1))
    raise(OSFT_STATUS_SHAPE_MISMATCH, "%s: trainable rank l = %lld; must be >= 1",
          in.grad != nullptr ? in.names[1] : in.names[2], static_cast<long long>(l));
  if (r + l > dim)
    raise(OSFT_STATUS_SHAPE_MISMATCH,
          "%s: r = %lld frozen plus l = %lld trainable exceed %s = %lld", in.names[0],
          static_cast<long long>(r), static_cast<long long>(l), dim_name,
          static_cast<long long>(dim));
}

/* U: high N_p x r, grad/low N_p x l; REPLICATED or U_ROWS. */
Part check_u(const Projector &p, const PartInput &in) {
  Part part;
  check_presence(in);
  if (in.high == nullptr) return part;
  if (in.layout != OSFT_SHARD_REPLICATED && in.layout != OSFT_SHARD_U_ROWS)
    raise(OSFT_STATUS_INVALID_ARGUMENT,
          "%s: %d; a U part is OSFT_SHARD_REPLICATED or OSFT_SHARD_U_ROWS", in.names[3],
          in.layout);
  part.present = true;
  part.layout = in.layout;
  part.high = operand(*p.ctx, in.high, in.names[0], OSFTI_ANY, OSFTI_ANY);
  const int64_t rows = part.high.m.rows;
  check_trainable(*p.ctx, in, part, rows, OSFTI_ANY);
  part.r = part.high.m.cols;
  part.l = (part.grad.set ? part.grad : part.low).m.cols;
  if (in.layout == OSFT_SHARD_U_ROWS) {
    part.dim = check_shards(p, in, rows, "rows");
  } else {
    require_no_shards(in);
    part.dim = rows;
  }
  check_ranks(in, part.r, part.l, part.dim, false, "N");
  return part;
}

/* V: high r_p x K_p, grad/low l_p x K_p; REPLICATED, V_COLS or V_ROWS. */
Part check_v(const Projector &p, const PartInput &in) {
  Part part;
  check_presence(in);
  if (in.high == nullptr) return part;
  if (in.layout != OSFT_SHARD_REPLICATED && in.layout != OSFT_SHARD_V_ROWS &&
      in.layout != OSFT_SHARD_V_COLS)
    raise(OSFT_STATUS_INVALID_ARGUMENT,
          "%s: %d; a V part is OSFT_SHARD_REPLICATED, OSFT_SHARD_V_ROWS or "
          "OSFT_SHARD_V_COLS",
          in.names[3], in.layout);
  part.present = true;
  part.layout = in.layout;
  part.high = operand(*p.ctx, in.high, in.names[0], OSFTI_ANY, OSFTI_ANY);
  const int64_t r_local = part.high.m.rows, k_local = part.high.m.cols;
  check_trainable(*p.ctx, in, part, OSFTI_ANY, k_local);
  part.l = (part.grad.set ? part.grad : part.low).m.rows;
  part.r = r_local;
  part.dim = k_local;
  if (in.layout == OSFT_SHARD_V_COLS) {
    part.dim = check_shards(p, in, k_local, "columns");
  } else if (in.layout == OSFT_SHARD_V_ROWS) {
    part.r = check_shards(p, in, r_local, "rows");
  } else {
    require_no_shards(in);
  }
  check_ranks(in, part.r, part.l, part.dim, in.layout == OSFT_SHARD_V_ROWS, "K");
  return part;
}

/* ---------------------------------------------------------------- commit */

/* Stores a fully checked target: shard tables, coefficient offsets. The
 * vectors are grown first, so nothing after them can fail. */
int64_t commit(Projector &p, Target t, const PartInput *u_in, const PartInput *v_in) {
  const int P = ranks(p);
  Part *parts[2] = {&t.u, &t.v};
  const PartInput *inputs[2] = {u_in, v_in};
  size_t new_shards = 0;
  for (int i = 0; i < 2; ++i)
    if (parts[i]->present && parts[i]->layout != OSFT_SHARD_REPLICATED) new_shards += P;
  p.targets.reserve(p.targets.size() + 1);
  p.shard_table.reserve(p.shard_table.size() + new_shards);
  p.jobs.reserve(2 * p.targets.capacity()); /* a call's parts */
  for (int i = 0; i < 2; ++i) {
    Part &part = *parts[i];
    if (!part.present) continue;
    if (part.layout != OSFT_SHARD_REPLICATED) {
      part.shards = static_cast<int64_t>(p.shard_table.size());
      p.shard_table.insert(p.shard_table.end(), inputs[i]->shards, inputs[i]->shards + P);
    }
    if (part.reduced()) {
      part.coef = p.reduced;
      p.reduced += (part.r * part.l + kSliceAlign - 1) / kSliceAlign * kSliceAlign;
    }
  }
  p.targets.push_back(t);
  p.setup_pending = true;
  const int64_t index = static_cast<int64_t>(p.targets.size()) - 1;
  log_message(OSFT_LOG_DEBUG,
              "projector %p: target %lld (U layout %d, V layout %d), %lld coefficients "
              "all-reduced per call",
              static_cast<void *>(&p), static_cast<long long>(index), t.u.layout,
              t.v.layout, static_cast<long long>(p.reduced));
  return index;
}

/* The views of a layer's factors as the target's operands. */
void layer_operands(const Projector &p, Target &t) {
  const FactorViews f = factor_views(*t.layer);
  t.u.high = operand_of(*p.ctx, f.u_high);
  t.u.low = operand_of(*p.ctx, f.u_low);
  t.v.high = operand_of(*p.ctx, f.v_high);
  t.v.low = operand_of(*p.ctx, f.v_low);
}

/* ---------------------------------------------------------------- setup */

uint64_t mix(uint64_t h, int64_t v) {
  for (int b = 0; b < 8; ++b)
    h = (h ^ ((static_cast<uint64_t>(v) >> (8 * b)) & 0xffu)) * 1099511628211ull;
  return h;
}

/* What must agree between ranks: everything that fixes the coefficient
 * offsets and the gather counts. */
uint64_t target_hash(const Projector &p, const Target &t) {
  uint64_t h = mix(1469598103934665603ull, t.layer != nullptr);
  for (const Part *part : {&t.u, &t.v}) {
    h = mix(h, part->present);
    if (!part->present) continue;
    h = mix(mix(mix(h, part->layout), part->r), part->dim);
    if (part->layout != OSFT_SHARD_V_ROWS) h = mix(h, part->l);
    if (part->layout == OSFT_SHARD_V_ROWS) h = mix(h, part->high.m.dtype);
    if (part->shards >= 0)
      for (int q = 0; q < ranks(p); ++q) h = mix(h, shards_of(p, *part)[q]);
  }
  return h;
}

/* Every rank registered the same targets: one 16-byte exchange; a second
 * one, only on a mismatch, names the first differing target. */
void verify_consistency(Projector &p) {
  const int P = ranks(p);
  const int64_t n = static_cast<int64_t>(p.targets.size());
  ContextVector<uint64_t> hashes{ContextAllocator<uint64_t>(p.ctx)};
  uint64_t all_hash = 1469598103934665603ull;
  for (const Target &t : p.targets) {
    hashes.push_back(target_hash(p, t));
    all_hash = mix(all_hash, static_cast<int64_t>(hashes.back()));
  }
  const uint64_t header[2] = {static_cast<uint64_t>(n), all_hash};
  HostMemory all(*p.ctx, sizeof header * P, "projector check");
  comm_exchange_host(*p.comm, header, sizeof header, all.get());
  const auto *h = all.get<uint64_t>();
  bool same = true;
  for (int q = 1; q < P; ++q) {
    if (h[2 * q] != h[0])
      raise(OSFT_STATUS_INVALID_ARGUMENT,
            "projector: rank 0 registered %llu targets, rank %d %llu; every rank must "
            "register the same targets in the same order",
            static_cast<unsigned long long>(h[0]), q,
            static_cast<unsigned long long>(h[2 * q]));
    same = same && h[2 * q + 1] == h[1];
  }
  if (same) return;
  HostMemory per(*p.ctx, sizeof(uint64_t) * static_cast<size_t>(n * P),
                 "projector check");
  comm_exchange_host(*p.comm, hashes.data(), sizeof(uint64_t) * n, per.get());
  const auto *t = per.get<uint64_t>();
  for (int64_t i = 0; i < n; ++i)
    for (int q = 1; q < P; ++q)
      if (t[q * n + i] != t[i])
        raise(OSFT_STATUS_INVALID_ARGUMENT,
              "target %lld: registered differently on rank 0 and rank %d (layouts, r, l, "
              "shard sizes and the V_high dtype of V_ROWS parts must agree)",
              static_cast<long long>(i), q);
}

void free_cache(Projector &p) noexcept {
  memory_free(*p.ctx, p.cache, p.cache_bytes);
  p.cache = nullptr;
  p.cache_bytes = 0;
}

/* Gathers the V_high of every V_ROWS part of one dtype with one
 * all-gather: each rank sends its rows of all those parts packed in
 * target order; the blocks are then copied into each part's cache. */
void gather_dtype(Projector &p, const ContextVector<Part *> &parts, osfti_dtype_t dtype) {
  Context &ctx = *p.ctx;
  const int P = ranks(p), me = my_rank(p);
  const size_t e = osfti_dtype_size(dtype);
  ContextVector<int64_t> counts(static_cast<size_t>(P), 0,
                                ContextAllocator<int64_t>(&ctx));
  for (const Part *part : parts)
    for (int q = 0; q < P; ++q) counts[q] += shards_of(p, *part)[q] * part->dim;
  int64_t total = 0;
  for (int q = 0; q < P; ++q) total += counts[q];
  ContextMemory send(ctx, static_cast<size_t>(counts[me]) * e, "V_high gather (send)");
  ContextMemory recv(ctx, static_cast<size_t>(total) * e, "V_high gather (recv)");
  int64_t off = 0;
  for (const Part *part : parts) {
    const Mat dst{send.get<char>() + off * e, part->high.m.rows, part->dim, part->dim,
                  dtype};
    backend(ctx).scale_into(ctx, Axis::cols, part->high.m, nullptr, 0.0f, dst);
    off += part->high.m.rows * part->dim;
  }
  comm_allgather(*p.comm, send.get(), recv.get(), counts.data(), dtype);
  off = 0;
  for (int q = 0; q < P; ++q)
    for (const Part *part : parts) {
      const int64_t *s = shards_of(p, *part);
      int64_t first = 0;
      for (int j = 0; j < q; ++j) first += s[j];
      const size_t bytes = static_cast<size_t>(s[q] * part->dim) * e;
      copy_on_device(ctx,
                     static_cast<char *>(p.cache) + part->cache + first * part->dim * e,
                     recv.get<char>() + off * e, bytes);
      off += s[q] * part->dim;
    }
}

void gather_v_rows(Projector &p) {
  ContextVector<Part *> parts[2] = {
      ContextVector<Part *>(ContextAllocator<Part *>(p.ctx)),
      ContextVector<Part *>(ContextAllocator<Part *>(p.ctx))};
  size_t bytes = 0;
  for (Target &t : p.targets) {
    if (!t.v.present || t.v.layout != OSFT_SHARD_V_ROWS) continue;
    const osfti_dtype_t dt = t.v.high.m.dtype;
    t.v.cache = bytes;
    bytes +=
        (static_cast<size_t>(t.v.r * t.v.dim) * osfti_dtype_size(dt) + kCacheAlign - 1) /
        kCacheAlign * kCacheAlign;
    parts[dt == OSFTI_BF16 ? 1 : 0].push_back(&t.v);
  }
  free_cache(p);
  if (bytes == 0) return;
  p.cache = memory_alloc(*p.ctx, bytes, "gathered V_high");
  p.cache_bytes = bytes;
  if (!parts[0].empty()) gather_dtype(p, parts[0], OSFTI_F32);
  if (!parts[1].empty()) gather_dtype(p, parts[1], OSFTI_BF16);
  log_message(OSFT_LOG_DEBUG,
              "projector %p: gathered V_high of %zu V_ROWS parts (%zu bytes)",
              static_cast<void *>(&p), parts[0].size() + parts[1].size(), bytes);
}

/* The coefficient buffer: the reduced slices and 2 P orthogonality slots. */
void ensure_coefficients(Projector &p) {
  const size_t floats = static_cast<size_t>(p.reduced + 2 * ranks(p));
  if (p.coef_bytes >= floats * sizeof(float)) return;
  auto *grown = static_cast<float *>(
      memory_alloc(*p.ctx, floats * sizeof(float), "projection coefficients"));
  const Mat all{grown, 1, static_cast<int64_t>(floats), static_cast<int64_t>(floats),
                OSFTI_F32};
  try {
    backend(*p.ctx).fill_zero(*p.ctx, all);
  } catch (...) {
    memory_free(*p.ctx, grown, floats * sizeof(float));
    throw;
  }
  memory_free(*p.ctx, p.coef, p.coef_bytes);
  p.coef = grown;
  p.coef_bytes = floats * sizeof(float);
}

/* One part of the caller's target; `side` is "u" or "v" (for the names). */
PartInput part_input(const DLTensor *high, const DLTensor *grad, const DLTensor *low,
                     int layout, const int64_t *shards, int64_t n_shards,
                     const char *side) {
  PartInput in{high, grad, low, layout, shards, n_shards, {}};
  const char *const fmt[6] = {"target->%s_high",   "target->grad_%s_low",
                              "target->%s_low",    "target->%s_layout",
                              "target->%s_shards", "target->n_%s_shards"};
  for (int i = 0; i < 6; ++i)
    std::snprintf(in.names[i], sizeof in.names[i], fmt[i], side);
  return in;
}

}  // namespace

/* ---------------------------------------------------------------- lifetime */

osft_projector_options_t read_projector_options(const osft_projector_options_t *user) {
  osft_projector_options_t d{};
  d.struct_size = sizeof d;
  d.check_consistency = 1;
  if (user == nullptr) return d;
  const osft_projector_options_t o =
      read_struct(user, d, kOptionsV1, "opts", "osft_projector_options_t");
  if (o.check_consistency != 0 && o.check_consistency != 1)
    raise(OSFT_STATUS_INVALID_ARGUMENT, "opts->check_consistency: %d; must be 0 or 1",
          o.check_consistency);
  const int arithmetic = raw_enum(o.arithmetic); /* any int a caller stored */
  if (arithmetic < OSFT_PROJECTION_ARITHMETIC_AUTO ||
      arithmetic > OSFT_PROJECTION_ARITHMETIC_BF16)
    raise(OSFT_STATUS_INVALID_ARGUMENT,
          "opts->arithmetic: %d; must be an osft_projection_arithmetic_t (0 to 3)",
          arithmetic);
  return o;
}

Projector *create_projector(Context &ctx, Comm *comm, const osft_projector_options_t &o) {
  if (comm != nullptr && comm->ctx != &ctx)
    raise(OSFT_STATUS_INVALID_ARGUMENT,
          "comm: created on another context; the projector and its communicator share "
          "one context");
  Projector *p = ctx.allocator.make<Projector>("projector", ctx);
  p->comm = comm;
  p->check_consistency = o.check_consistency != 0;
  p->arithmetic = raw_enum(o.arithmetic);
  register_child(p, HandleKind::projector,
                 [&](Projector *doomed) { ctx.allocator.destroy(doomed); });
  if (comm != nullptr) comm->users++;
  return p;
}

void destroy_projector(Projector *p) noexcept {
  Context &ctx = *p->ctx;
  memory_free(ctx, p->coef, p->coef_bytes);
  free_cache(*p);
  if (p->comm != nullptr) p->comm->users--;
  uncount_child(p);
  ctx.allocator.destroy(p);
}

Projector &checked_projector(osft_projector_t p, const char *arg) {
  return checked_child(p, HandleKind::projector, arg);
}

int ranks(const Projector &p) noexcept {
  return p.comm != nullptr ? p.comm->size : 1;
}

int my_rank(const Projector &p) noexcept {
  return p.comm != nullptr ? p.comm->rank : 0;
}

const int64_t *shards_of(const Projector &p, const Part &part) noexcept {
  return p.shard_table.data() + part.shards;
}

/* ---------------------------------------------------------------- targets */

int64_t add_target(Projector &p, const osft_projection_target_t &in) {
  const PartInput u = part_input(in.u_high, in.grad_u_low, in.u_low,
                                 raw_enum(in.u_layout), in.u_shards, in.n_u_shards, "u");
  const PartInput v = part_input(in.v_high, in.grad_v_low, in.v_low,
                                 raw_enum(in.v_layout), in.v_shards, in.n_v_shards, "v");
  Target t;
  t.u = check_u(p, u);
  t.v = check_v(p, v);
  if (!t.u.present && !t.v.present)
    raise(OSFT_STATUS_INVALID_ARGUMENT,
          "target: neither u_high nor v_high is set; a target needs a U or a V part");
  check_overlaps(p, t, -1);
  return commit(p, t, &u, &v);
}

int64_t add_layer(Projector &p, Layer &layer, const DLTensor *grad_u,
                  const DLTensor *grad_v) {
  if (layer.ctx != p.ctx)
    raise(OSFT_STATUS_INVALID_ARGUMENT,
          "layer: created on another context than the projector's");
  Target t;
  t.layer = &layer;
  const int64_t dims[4] = {layer.n, layer.kin, layer.r, layer.l};
  std::memcpy(t.layer_dims, dims, sizeof dims);
  layer_operands(p, t);
  t.u.grad = operand(*p.ctx, grad_u, "grad_u_low", layer.n, layer.l);
  t.v.grad = operand(*p.ctx, grad_v, "grad_v_low", layer.l, layer.kin);
  Part *parts[2] = {&t.u, &t.v};
  for (int i = 0; i < 2; ++i) {
    parts[i]->present = true;
    parts[i]->r = layer.r;
    parts[i]->l = layer.l;
    parts[i]->dim = i == 0 ? layer.n : layer.kin;
  }
  check_overlaps(p, t, -1);
  return commit(p, t, nullptr, nullptr);
}

void refresh_layer_target(const Projector &p, Target &t, int64_t index) {
  if (!is_live_handle(t.layer, HandleKind::flinear))
    raise(OSFT_STATUS_INVALID_HANDLE,
          "target %lld: its flinear layer was destroyed while registered",
          static_cast<long long>(index));
  const Layer &l = *t.layer;
  const int64_t now[4] = {l.n, l.kin, l.r, l.l};
  if (std::memcmp(now, t.layer_dims, sizeof now) != 0)
    raise(OSFT_STATUS_SHAPE_MISMATCH,
          "target %lld: its flinear layer is now %lld x %lld with r = %lld, l = %lld, "
          "not the shape it was registered with",
          static_cast<long long>(index), static_cast<long long>(l.n),
          static_cast<long long>(l.kin), static_cast<long long>(l.r),
          static_cast<long long>(l.l));
  layer_operands(p, t);
}

void set_grads(Projector &p, int64_t index, const DLTensor *grad_u,
               const DLTensor *grad_v) {
  if (index < 0 || index >= static_cast<int64_t>(p.targets.size()))
    raise(OSFT_STATUS_INVALID_ARGUMENT, "index: %lld; the projector has %zu targets",
          static_cast<long long>(index), p.targets.size());
  Target t = p.targets[index];
  if (t.layer != nullptr) refresh_layer_target(p, t, index);
  const DLTensor *grads[2] = {grad_u, grad_v};
  const char *names[2] = {"grad_u_low", "grad_v_low"};
  Part *parts[2] = {&t.u, &t.v};
  for (int i = 0; i < 2; ++i) {
    Part &part = *parts[i];
    if (!part.present && grads[i] != nullptr)
      raise(OSFT_STATUS_INVALID_ARGUMENT, "%s: target %lld has no %s part", names[i],
            static_cast<long long>(index), i == 0 ? "U" : "V");
    if (!part.present) continue;
    const int64_t rows = i == 0 ? part.high.m.rows : part.l;
    const int64_t cols = i == 0 ? part.l : part.high.m.cols;
    part.grad = operand(*p.ctx, grads[i], names[i], rows, cols);
    if (!part.grad.set && !part.low.set)
      raise(OSFT_STATUS_INVALID_ARGUMENT,
            "%s: NULL would leave the %s part of target %lld with neither a gradient "
            "nor a trainable factor",
            names[i], i == 0 ? "U" : "V", static_cast<long long>(index));
  }
  check_overlaps(p, t, index);
  p.targets[index].u.grad = t.u.grad;
  p.targets[index].v.grad = t.v.grad;
}

void invalidate(Projector &p) noexcept {
  free_cache(p);
  p.setup_pending = true;
}

void prepare(Projector &p) {
  ensure_coefficients(p);
  if (!p.setup_pending) return;
  if (ranks(p) > 1) {
    if (p.check_consistency) verify_consistency(p);
    gather_v_rows(p);
  }
  p.setup_pending = false;
}

}  // namespace osft
