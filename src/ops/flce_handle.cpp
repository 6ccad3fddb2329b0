/* Fused linear cross-entropy: options and the handle's lifetime. */
#include <cmath>

#include "core/child_handle.h"
#include "core/error.h"
#include "core/handle.h"
#include "core/options.h"
#include "comm/communicator.h"
#include "ops/flce_ops.h"

namespace osft {
namespace {

constexpr size_t kOptionsV1Size = OSFTI_V1_SIZE(osft_flce_options_t, chunk_rows);

osft_flce_options_t default_options() {
  osft_flce_options_t d{};
  d.struct_size = sizeof d;
  d.ignore_index = -100;
  d.reduction = OSFT_FLCE_MEAN;
  d.accumulator = OSFT_FLCE_ACCUMULATOR_FP32;
  return d;
}

void check_options(const osft_flce_options_t &o) {
  if (!(o.label_smoothing >= 0.0 && o.label_smoothing <= 1.0))
    raise(OSFT_STATUS_INVALID_ARGUMENT, "opts->label_smoothing: %g is outside [0, 1]",
          o.label_smoothing);
  if (!(o.z_loss_scale >= 0.0 && std::isfinite(o.z_loss_scale)))
    raise(OSFT_STATUS_INVALID_ARGUMENT,
          "opts->z_loss_scale: %g; must be finite and non-negative", o.z_loss_scale);
  if (!(o.softcap >= 0.0 && std::isfinite(o.softcap)))
    raise(OSFT_STATUS_INVALID_ARGUMENT,
          "opts->softcap: %g; must be positive and finite (or 0: off)", o.softcap);
  const int reduction = raw_enum(o.reduction);
  if (reduction < OSFT_FLCE_MEAN || reduction > OSFT_FLCE_NONE)
    raise(OSFT_STATUS_INVALID_ARGUMENT,
          "opts->reduction: %d is not an osft_flce_reduction_t", reduction);
  const int accumulator = raw_enum(o.accumulator);
  if (accumulator < OSFT_FLCE_ACCUMULATOR_FP32 ||
      accumulator > OSFT_FLCE_ACCUMULATOR_OUTPUT)
    raise(OSFT_STATUS_INVALID_ARGUMENT,
          "opts->accumulator: %d is not an osft_flce_accumulator_t", accumulator);
  if (o.chunk_rows < 0)
    raise(OSFT_STATUS_INVALID_ARGUMENT, "opts->chunk_rows: %lld is negative",
          static_cast<long long>(o.chunk_rows));
  const int chunking = raw_enum(o.chunking);
  if (chunking < OSFT_FLCE_CHUNKING_AUTO || chunking > OSFT_FLCE_CHUNKING_VOCAB)
    raise(OSFT_STATUS_INVALID_ARGUMENT,
          "opts->chunking: %d is not an osft_flce_chunking_t", chunking);
  if (o.slice_cols < 0)
    raise(OSFT_STATUS_INVALID_ARGUMENT, "opts->slice_cols: %lld is negative",
          static_cast<long long>(o.slice_cols));
}

/* The vocab-parallel fields: the comm is checked at creation (its context). */
void check_vocab(Context &ctx, const osft_flce_options_t &o) {
  if (o.comm == nullptr) {
    if (o.vocab_offset != 0 || o.vocab_size_global != 0)
      raise(OSFT_STATUS_INVALID_ARGUMENT,
            "opts->vocab_offset, opts->vocab_size_global: %lld, %lld; must be 0 "
            "without opts->comm",
            static_cast<long long>(o.vocab_offset),
            static_cast<long long>(o.vocab_size_global));
    return;
  }
  const Comm &c = checked_comm(o.comm, "opts->comm");
  if (c.ctx != &ctx)
    raise(OSFT_STATUS_INVALID_ARGUMENT, "opts->comm: belongs to another context");
  if (o.vocab_offset < 0)
    raise(OSFT_STATUS_INVALID_ARGUMENT, "opts->vocab_offset: %lld is negative",
          static_cast<long long>(o.vocab_offset));
  if (c.size > 1 && o.vocab_size_global <= o.vocab_offset)
    raise(OSFT_STATUS_INVALID_ARGUMENT,
          "opts->vocab_size_global: %lld; must exceed opts->vocab_offset (%lld)",
          static_cast<long long>(o.vocab_size_global),
          static_cast<long long>(o.vocab_offset));
  if (c.size == 1 && o.vocab_offset != 0)
    raise(OSFT_STATUS_INVALID_ARGUMENT,
          "opts->vocab_offset: %lld; a one-rank opts->comm holds the whole vocabulary "
          "(offset 0)",
          static_cast<long long>(o.vocab_offset));
  if (c.size == 1 && o.vocab_size_global < 0)
    raise(OSFT_STATUS_INVALID_ARGUMENT,
          "opts->vocab_size_global: %lld is negative (0: in->weight's rows)",
          static_cast<long long>(o.vocab_size_global));
}

}  // namespace

osft_flce_options_t read_flce_options(const osft_flce_options_t *user) {
  if (user == nullptr) return default_options();
  const osft_flce_options_t o =
      read_struct(user, default_options(), kOptionsV1Size, "opts", "osft_flce_options_t");
  check_options(o);
  return o;
}

namespace {

constexpr size_t kRecordBytes = kFlceTargetRecordWords * sizeof(int64_t);

/* Zeroes the sticky record (in stream order on CUDA). */
void clear_record(Context &ctx, int64_t *record) {
  backend(ctx).fill_zero(ctx, Mat{record, 1, 2 * kFlceTargetRecordWords,
                                  2 * kFlceTargetRecordWords, OSFTI_F32});
}

}  // namespace

Flce *create_flce(Context &ctx, const osft_flce_options_t &opts) {
  check_vocab(ctx, opts);
  Flce *f = ctx.allocator.make<Flce>("flce handle");
  f->ctx = &ctx;
  f->opts = opts;
  if (opts.device_target_check != 0) {
    try {
      f->target_record =
          static_cast<int64_t *>(memory_alloc(ctx, kRecordBytes, "flce target record"));
      clear_record(ctx, f->target_record);
    } catch (...) {
      memory_free(ctx, f->target_record, kRecordBytes);
      ctx.allocator.destroy(f);
      throw;
    }
  }
  f = register_child(f, HandleKind::flce, destroy_flce);
  if (opts.comm != nullptr) opts.comm->users++;
  return f;
}

void destroy_flce(Flce *f) noexcept {
  if (f->opts.comm != nullptr && f->counted) f->opts.comm->users--;
  uncount_child(f);
  memory_free(*f->ctx, f->target_record, kRecordBytes);
  f->ctx->allocator.destroy(f);
}

void check_targets_record(Flce &f) {
  if (f.target_record == nullptr) return;
  Context &ctx = *f.ctx;
  int64_t r[kFlceTargetRecordWords] = {0, 0, 0};
  copy_to_host(ctx, r, f.target_record, kRecordBytes); /* waits on CUDA */
  const int64_t calls = f.calls;
  f.calls = 0;
  if (r[0] == 0) return;
  clear_record(ctx, f.target_record);
  raise(
      OSFT_STATUS_INDEX_OUT_OF_RANGE,
      "flce: call %lld of %lld since the last check: in->targets: token %lld has target "
      "%lld, outside [0, V) and not the ignore_index %lld (its loss was NaN)",
      static_cast<long long>(r[0]), static_cast<long long>(calls),
      static_cast<long long>(r[1]), static_cast<long long>(r[2]),
      static_cast<long long>(f.opts.ignore_index));
}

Flce &checked_flce(osft_flce_t flce, const char *arg) {
  return checked_child(flce, HandleKind::flce, arg);
}

}  // namespace osft
