/* Host callbacks: a framework's own collectives (e.g. a PyTorch process
 * group) behind the communicator interface. The library hands them compact
 * 1-D DLTensors in the context's memory, after the context's stream has
 * finished writing them. */
#include "comm/communicator.h"
#include "core/cuda_runtime.h"
#include "core/error.h"

namespace osft {
namespace {

DLTensor flat_tensor(const Context &ctx, const void *data, int64_t *shape,
                     osfti_dtype_t dtype) {
  DLTensor t{};
  t.data = const_cast<void *>(data);
  t.device = dl_device(ctx);
  t.ndim = 1;
  t.dtype.code = dtype == OSFTI_BF16 ? kDLBfloat : kDLFloat;
  t.dtype.bits = static_cast<uint8_t>(8 * osfti_dtype_size(dtype));
  t.dtype.lanes = 1;
  t.shape = shape;
  return t;
}

/* A callback's status as the library's: TIMEOUT passes, the rest is a
 * communication error. */
void check_callback(osft_status_t status, const char *which) {
  if (status == OSFT_STATUS_SUCCESS) return;
  if (status == OSFT_STATUS_TIMEOUT)
    raise(OSFT_STATUS_TIMEOUT, "the %s callback reported a timeout", which);
  raise(OSFT_STATUS_COMM_ERROR, "the %s callback returned %d (%s)", which,
        static_cast<int>(status), status_name(status));
}

class CallbacksEngine final : public Engine {
 public:
  CallbacksEngine(Context &ctx, const osft_comm_callbacks_t &cb) : ctx_(ctx), cb_(cb) {}
  void release(Context &ctx, bool) noexcept override {
    if (cb_.release != nullptr) cb_.release(cb_.user);
    memory_free(ctx, one_, sizeof(float));
    ctx.allocator.destroy(this);
  }
  /* The one float the barrier stand-in all-reduces. */
  void make_barrier_buffer() {
    if (cb_.barrier != nullptr) return;
    one_ = memory_alloc(ctx_, sizeof(float), "callbacks barrier");
    const float zero = 0.0f;
    copy_from_host(ctx_, one_, &zero, sizeof zero);
  }

  void allreduce_sum(void *buf, size_t count, osfti_dtype_t dtype,
                     const Deadline &) override {
    ready();
    int64_t shape[1] = {static_cast<int64_t>(count)};
    DLTensor t = flat_tensor(ctx_, buf, shape, dtype);
    check_callback(cb_.allreduce_sum(cb_.user, &t), "allreduce_sum");
  }

  void allgather(const void *send, void *recv, const int64_t *counts, osfti_dtype_t dtype,
                 const Deadline &) override {
    ready();
    int64_t total = 0;
    for (int p = 0; p < cb_.size; ++p) total += counts[p];
    int64_t send_shape[1] = {counts[cb_.rank]}, recv_shape[1] = {total};
    const DLTensor s = flat_tensor(ctx_, send, send_shape, dtype);
    DLTensor r = flat_tensor(ctx_, recv, recv_shape, dtype);
    check_callback(cb_.allgather(cb_.user, &s, &r, counts, cb_.size), "allgather");
  }

  void barrier(const Deadline &d) override {
    if (cb_.barrier == nullptr) return allreduce_sum(one_, 1, OSFTI_F32, d);
    ready();
    check_callback(cb_.barrier(cb_.user), "barrier");
  }

 private:
  /* The callback runs on the host: the data must be written first. */
  void ready() {
    if (on_cuda(ctx_)) cuda::synchronize(ctx_.device_id, ctx_.stream);
  }

  Context &ctx_;
  osft_comm_callbacks_t cb_;
  void *one_ = nullptr;
};

}  // namespace

Engine *make_callbacks_engine(Context &ctx, const osft_comm_callbacks_t &cb,
                              EngineInfo *info) {
  if (cb.allreduce_sum == nullptr)
    raise(OSFT_STATUS_INVALID_ARGUMENT, "callbacks->allreduce_sum: NULL (required)");
  if (cb.allgather == nullptr)
    raise(OSFT_STATUS_INVALID_ARGUMENT, "callbacks->allgather: NULL (required)");
  if (cb.size < 1)
    raise(OSFT_STATUS_INVALID_ARGUMENT, "callbacks->size: %d; must be >= 1", cb.size);
  if (cb.rank < 0 || cb.rank >= cb.size)
    raise(OSFT_STATUS_INVALID_ARGUMENT, "callbacks->rank: %d is outside [0, %d)", cb.rank,
          cb.size);
  auto *engine = ctx.allocator.make<CallbacksEngine>("callbacks communicator", ctx, cb);
  try {
    engine->make_barrier_buffer();
  } catch (...) {
    ctx.allocator.destroy(engine); /* not release(): the caller keeps `user` */
    throw;
  }
  info->rank = cb.rank;
  info->size = cb.size;
  return engine;
}

}  // namespace osft
