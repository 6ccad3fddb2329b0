/* Communicators: what every engine shares — options, the handle, deadlines,
 * the broken state after a failure, statistics, host<->device staging and
 * the small host exchange the projector's setup uses. */
#include "comm/communicator.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <thread>

#include "core/child_handle.h"
#include "core/cuda_runtime.h"
#include "core/error.h"
#include "core/handle.h"
#include "core/logging.h"
#include "core/options.h"
#include "core/tensor_args.h"

namespace osft {
namespace {

constexpr size_t kOptionsV1Size = OSFTI_V1_SIZE(osft_comm_options_t, timeout_seconds);

const char *engine_name(osft_comm_engine_t kind) {
  switch (kind) {
    case OSFT_COMM_ENGINE_SELF: return "self";
    case OSFT_COMM_ENGINE_MPI: return "MPI";
    case OSFT_COMM_ENGINE_NCCL: return "NCCL";
    case OSFT_COMM_ENGINE_CALLBACKS: return "callbacks";
  }
  return "unknown";
}

/* Runs one engine collective: refuses a broken communicator, counts the
 * launch, and marks the communicator broken if the engine fails (the ranks
 * are out of step from then on). */
template <class Body>
void run_collective(Comm &comm, const char *what, Body &&body) {
  if (comm.broken)
    raise(OSFT_STATUS_COMM_ERROR,
          "communicator: broken by an earlier failure (%s); destroy it",
          comm.broken_reason);
  try {
    body(Deadline(comm.timeout_seconds));
  } catch (const Error &e) {
    comm.broken = true;
    comm.stats.failures++;
    std::snprintf(comm.broken_reason, sizeof comm.broken_reason, "%s", e.what());
    log_message(OSFT_LOG_ERROR, "%s communicator %p: %s failed: %s",
                engine_name(comm.kind), static_cast<void *>(&comm), what, e.what());
    throw;
  }
}

/* A collective's buffer: fp32 or bf16, compact, any shape, on the
 * context's device. Returns its element count. */
size_t checked_buffer(Comm &comm, const DLTensor *t, const char *name) {
  osfti_tensor_spec spec{};
  spec.name = name;
  spec.dtypes = OSFTI_F32 | OSFTI_BF16;
  spec.min_rank = 0;
  spec.max_rank = OSFTI_MAX_RANK;
  spec.layout = OSFTI_LAYOUT_CONTIGUOUS;
  throw_if_error(osfti_check_tensor(comm.ctx, t, &spec));
  return static_cast<size_t>(osfti_numel(t));
}

void *data_of(const DLTensor *t) {
  /* NULL data (an empty tensor) stays NULL: no arithmetic on a null pointer. */
  return t->data != nullptr ? static_cast<char *>(t->data) + t->byte_offset : nullptr;
}

}  // namespace

Deadline::Deadline(double seconds) : infinite_(std::isinf(seconds)), seconds_(seconds) {
  /* A finite timeout beyond ~30 years is clamped: converting it to the
   * clock's int64 nanoseconds would overflow (UB, and a deadline in the
   * past). */
  if (!infinite_)
    at_ = std::chrono::steady_clock::now() +
          std::chrono::duration_cast<std::chrono::steady_clock::duration>(
              std::chrono::duration<double>(std::min(seconds, 1e9)));
}

bool Deadline::passed() const noexcept {
  return !infinite_ && std::chrono::steady_clock::now() >= at_;
}

void Backoff::pause() {
  /* Nonblocking collectives progress only inside the engine's test calls:
   * poll flat out while a wait is short (as MPI's blocking calls do), yield
   * the CPU to ranks that share the core once it lasts, and sleep between
   * polls only once it has become long. */
  const auto waited = std::chrono::steady_clock::now() - start_;
  if (waited < std::chrono::milliseconds(2)) return;
  if (waited < std::chrono::milliseconds(100)) {
    std::this_thread::yield();
    return;
  }
  std::this_thread::sleep_for(std::chrono::microseconds(100));
}

ScopedMemory::ScopedMemory(Context &ctx, size_t bytes, Where where, const char *what)
    : ctx_(ctx), bytes_(bytes), where_(where) {
  if (bytes_ == 0) return;
  ptr_ = where_ == Where::host ? ctx_.allocator.host_alloc(bytes_, what)
                               : memory_alloc(ctx_, bytes_, what);
}

ScopedMemory::~ScopedMemory() {
  if (where_ == Where::host)
    ctx_.allocator.host_free(ptr_, bytes_);
  else
    memory_free(ctx_, ptr_, bytes_);
}

osft_comm_options_t read_comm_options(const osft_comm_options_t *user) {
  osft_comm_options_t d{};
  d.struct_size = sizeof d;
  d.timeout_seconds = 300.0;
  if (user == nullptr) return d;
  const osft_comm_options_t o =
      read_struct(user, d, kOptionsV1Size, "opts", "osft_comm_options_t");
  if (!(o.timeout_seconds > 0.0))
    raise(OSFT_STATUS_INVALID_ARGUMENT,
          "opts->timeout_seconds: %g; must be > 0 (INFINITY: no limit)",
          o.timeout_seconds);
  return o;
}

Comm *register_comm(Context &ctx, Engine *engine, osft_comm_engine_t kind,
                    const EngineInfo &info, const osft_comm_options_t &opts) {
  Comm *comm = nullptr;
  try {
    comm = ctx.allocator.make<Comm>("communicator");
    comm->ctx = &ctx;
    comm->engine = engine;
    comm->kind = kind;
    comm->rank = info.rank;
    comm->size = info.size;
    comm->timeout_seconds = opts.timeout_seconds;
    comm->stats.struct_size = sizeof comm->stats;
  } catch (...) {
    engine->release(ctx, false);
    ctx.allocator.destroy(comm);
    throw;
  }
  register_child(comm, HandleKind::comm, [&](Comm *doomed) {
    engine->release(ctx, false);
    ctx.allocator.destroy(doomed);
  });
  log_message(OSFT_LOG_INFO, "created %s communicator %p: rank %d of %d",
              engine_name(kind), static_cast<void *>(comm), comm->rank, comm->size);
  return comm;
}

void destroy_comm(Comm *comm) {
  Context &ctx = *comm->ctx;
  comm->engine->release(ctx, comm->broken);
  uncount_child(comm);
  ctx.allocator.destroy(comm);
}

Comm &checked_comm(osft_comm_t comm, const char *arg) {
  return checked_child(comm, HandleKind::comm, arg);
}

void comm_allreduce_sum(Comm &comm, void *buf, size_t count, osfti_dtype_t dtype) {
  run_collective(comm, "all-reduce", [&](const Deadline &d) {
    comm.stats.allreduce_calls++;
    comm.stats.allreduce_bytes += count * osfti_dtype_size(dtype);
    comm.engine->allreduce_sum(buf, count, dtype, d);
  });
}

bool comm_waits_on_host(const Comm &comm) noexcept {
  if (!on_cuda(*comm.ctx) || comm.kind == OSFT_COMM_ENGINE_SELF) return false;
  if (comm.kind == OSFT_COMM_ENGINE_NCCL) return !std::isinf(comm.timeout_seconds);
  return true;
}

void comm_allgather(Comm &comm, const void *send, void *recv, const int64_t *counts,
                    osfti_dtype_t dtype) {
  run_collective(comm, "all-gather", [&](const Deadline &d) {
    comm.stats.allgather_calls++;
    comm.stats.allgather_bytes +=
        static_cast<uint64_t>(counts[comm.rank]) * osfti_dtype_size(dtype);
    comm.engine->allgather(send, recv, counts, dtype, d);
  });
}

void comm_barrier(Comm &comm) {
  run_collective(comm, "barrier", [&](const Deadline &d) {
    comm.stats.barrier_calls++;
    comm.engine->barrier(d);
  });
}

void checked_allreduce(Comm &comm, DLTensor *buf) {
  const size_t n = checked_buffer(comm, buf, "buf");
  comm_allreduce_sum(comm, data_of(buf), n, osfti_dtype_from_dl(buf->dtype));
}

void checked_allgather(Comm &comm, const DLTensor *send, DLTensor *recv,
                       const int64_t *counts, int64_t n_counts) {
  if (counts == nullptr) raise(OSFT_STATUS_INVALID_ARGUMENT, "counts: NULL");
  if (n_counts != comm.size)
    raise(OSFT_STATUS_INVALID_ARGUMENT,
          "n_counts: %lld, but the communicator has %d ranks (one count per rank)",
          static_cast<long long>(n_counts), comm.size);
  int64_t total = 0;
  for (int p = 0; p < comm.size; ++p) {
    if (counts[p] < 0)
      raise(OSFT_STATUS_INVALID_ARGUMENT, "counts[%d]: %lld is negative", p,
            static_cast<long long>(counts[p]));
    if (__builtin_add_overflow(total, counts[p], &total))
      raise(OSFT_STATUS_INVALID_ARGUMENT, "counts: the sum overflows");
  }
  const size_t n_send = checked_buffer(comm, send, "send");
  const size_t n_recv = checked_buffer(comm, recv, "recv");
  throw_if_error(osfti_check_same_dtype("send", send, "recv", recv));
  if (static_cast<int64_t>(n_send) != counts[comm.rank])
    raise(OSFT_STATUS_SHAPE_MISMATCH, "send: %zu elements, but counts[%d] = %lld", n_send,
          comm.rank, static_cast<long long>(counts[comm.rank]));
  if (static_cast<int64_t>(n_recv) != total)
    raise(OSFT_STATUS_SHAPE_MISMATCH, "recv: %zu elements, but the counts add up to %lld",
          n_recv, static_cast<long long>(total));
  check_no_overlap("send", send, "recv", recv);
  comm_allgather(comm, data_of(send), data_of(recv), counts,
                 osfti_dtype_from_dl(send->dtype));
}

void comm_exchange_host(Comm &comm, const void *mine, size_t bytes, void *all) {
  Context &ctx = *comm.ctx;
  const size_t words = (bytes + 1) / 2; /* 16-bit words, each exact in fp32 */
  const size_t ranks = static_cast<size_t>(comm.size);
  HostMemory host(ctx, (words * (ranks + 1)) * sizeof(float), "comm exchange");
  float *send_h = host.get<float>();
  float *recv_h = send_h + words;
  const auto *in = static_cast<const unsigned char *>(mine);
  for (size_t w = 0; w < words; ++w) {
    const unsigned lo = in[2 * w];
    const unsigned hi = 2 * w + 1 < bytes ? in[2 * w + 1] : 0u;
    send_h[w] = static_cast<float>(lo | (hi << 8));
  }
  HostMemory counts_mem(ctx, ranks * sizeof(int64_t), "comm exchange counts");
  auto *counts = counts_mem.get<int64_t>();
  for (size_t p = 0; p < ranks; ++p) counts[p] = static_cast<int64_t>(words);
  if (on_cuda(ctx)) {
    ContextMemory dev(ctx, words * (ranks + 1) * sizeof(float), "comm exchange");
    float *send_d = dev.get<float>();
    copy_from_host(ctx, send_d, send_h, words * sizeof(float));
    comm_allgather(comm, send_d, send_d + words, counts, OSFTI_F32);
    copy_to_host(ctx, recv_h, send_d + words, words * ranks * sizeof(float));
  } else {
    comm_allgather(comm, send_h, recv_h, counts, OSFTI_F32);
  }
  auto *out = static_cast<unsigned char *>(all);
  for (size_t p = 0; p < ranks; ++p)
    for (size_t b = 0; b < bytes; ++b) {
      const float f = recv_h[p * words + b / 2];
      const auto v = f >= 0.0f && f < 65536.0f ? static_cast<unsigned>(f) : 0u;
      out[p * bytes + b] = static_cast<unsigned char>(b % 2 == 0 ? v & 0xffu : v >> 8);
    }
}

void copy_to_host(Context &ctx, void *dst, const void *src, size_t bytes) {
  if (bytes == 0) return;
  if (on_cuda(ctx))
    return cuda::copy(ctx.device_id, ctx.stream, dst, src, bytes,
                      cuda::CopyKind::to_host);
  std::memcpy(dst, src, bytes);
}

void copy_from_host(Context &ctx, void *dst, const void *src, size_t bytes) {
  if (bytes == 0) return;
  if (on_cuda(ctx))
    return cuda::copy(ctx.device_id, ctx.stream, dst, src, bytes,
                      cuda::CopyKind::from_host);
  std::memcpy(dst, src, bytes);
}

void copy_on_device(Context &ctx, void *dst, const void *src, size_t bytes) {
  if (bytes == 0 || dst == src) return;
  if (on_cuda(ctx))
    return cuda::copy(ctx.device_id, ctx.stream, dst, src, bytes,
                      cuda::CopyKind::on_device);
  std::memmove(dst, src, bytes);
}

}  // namespace osft
