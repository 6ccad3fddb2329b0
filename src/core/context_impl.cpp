#include "core/context_impl.h"

#include <new>

#include "core/cpu_blas.h"
#include "core/cuda_runtime.h"
#include "core/error.h"
#include "core/handle.h"
#include "core/logging.h"
#include "core/options.h"

namespace osft {
namespace {

constexpr size_t kOptionsV1Size = OSFTI_V1_SIZE(osft_context_options_t, workspace_limit);

osft_context_options_t default_options() {
  osft_context_options_t o{};
  o.struct_size = sizeof o;
  o.device_type = OSFT_DEVICE_CPU;
  return o;
}

osft_context_options_t read_options(const osft_context_options_t *user) {
  if (user == nullptr) return default_options();
  osft_context_options_t o = read_struct(user, default_options(), kOptionsV1Size, "opts",
                                         "osft_context_options_t");
  switch (raw_enum(o.device_type)) {
    case OSFT_DEVICE_CPU:
      if (o.device_id != 0)
        raise(OSFT_STATUS_INVALID_ARGUMENT,
              "opts->device_id: %d for a CPU context; must be 0", o.device_id);
      if (o.stream != nullptr)
        raise(OSFT_STATUS_INVALID_ARGUMENT,
              "opts->stream: a CPU context has no stream; must be NULL");
      break;
    case OSFT_DEVICE_CUDA:
      if (o.device_id < 0)
        raise(OSFT_STATUS_INVALID_ARGUMENT, "opts->device_id: %d is negative",
              o.device_id);
      cuda::check_device(o.device_id, "opts->device_id");
      break;
    default:
      raise(OSFT_STATUS_INVALID_ARGUMENT,
            "opts->device_type: %d is not an osft_device_type_t",
            raw_enum(o.device_type));
  }
  return o;
}

const char *device_name(const Context &ctx) {
  return on_cuda(ctx) ? "CUDA" : "CPU";
}

}  // namespace

Context *create_context(const osft_context_options_t *user_opts) {
  const osft_context_options_t opts = read_options(user_opts);
  /* The thread count resolved and the BLAS told it before the first GEMM
   * (which may come before any pass that asks for the count). */
  if (opts.device_type == OSFT_DEVICE_CPU) blas::num_threads();
  Allocator alloc(opts.allocator, "opts->allocator");
  void *mem = alloc.host_alloc(sizeof(Context), "context");
  Context *ctx = new (mem) Context(opts, alloc);
  try {
    register_handle(ctx, HandleKind::context);
  } catch (...) {
    ctx->~Context();
    alloc.host_free(mem, sizeof(Context));
    throw;
  }
  log_message(OSFT_LOG_INFO, "created %s context %p (device %d)", device_name(*ctx),
              static_cast<void *>(ctx), ctx->device_id);
  return ctx;
}

void destroy_context(Context *ctx) {
  osft_status_t drain = OSFT_STATUS_SUCCESS;
  std::string why;
  if (on_cuda(*ctx)) {
    try {
      cuda::synchronize(ctx->device_id, ctx->stream);
    } catch (const Error &e) {
      drain = e.status();
      why = e.what();
    }
  }
  release_workspace(*ctx);
  cuda::destroy_blas(ctx->device_id, ctx->blas);
  cuda::destroy_solver(ctx->device_id, ctx->solver);
  /* The context's own block goes back through a copy of its allocator. */
  Allocator alloc = ctx->allocator;
  ctx->~Context();
  alloc.host_free(ctx, sizeof(Context));
  if (drain != OSFT_STATUS_SUCCESS)
    raise(drain, "ctx: destroyed, but draining its stream failed: %s", why.c_str());
}

Context &checked_context(osft_context_t ctx, const char *arg) {
  check_handle(ctx, HandleKind::context, arg);
  return *ctx;
}

void *memory_alloc(Context &ctx, size_t bytes, const char *what) {
  return on_cuda(ctx) ? device_alloc(ctx, bytes, what)
                      : ctx.allocator.host_alloc(bytes, what);
}

void memory_free(Context &ctx, void *ptr, size_t bytes) noexcept {
  if (on_cuda(ctx))
    device_free(ctx, ptr, bytes);
  else
    ctx.allocator.host_free(ptr, bytes);
}

DLDevice dl_device(const Context &ctx) noexcept {
  DLDevice d;
  d.device_type = on_cuda(ctx) ? kDLCUDA : kDLCPU;
  d.device_id = ctx.device_id;
  return d;
}

void *workspace(Context &ctx, size_t bytes) {
  if (bytes <= ctx.workspace_bytes) return ctx.workspace;
  if (ctx.workspace_limit != 0 && bytes > ctx.workspace_limit)
    raise(OSFT_STATUS_OUT_OF_MEMORY,
          "workspace: %zu bytes needed, above the context's workspace_limit "
          "of %zu bytes",
          bytes, ctx.workspace_limit);
  /* Free first, so the peak is the larger block and not both: memory
   * budgets then bound what is really held. If the larger block cannot be
   * had, the old size is taken back where possible. */
  const size_t old_bytes = ctx.workspace_bytes;
  release_workspace(ctx);
  void *grown = nullptr;
  try {
    grown = memory_alloc(ctx, bytes, "workspace");
  } catch (...) {
    if (old_bytes > 0) {
      try {
        ctx.workspace = memory_alloc(ctx, old_bytes, "workspace");
        ctx.workspace_bytes = old_bytes;
      } catch (...) {
        /* left empty; the next call grows it again */
      }
    }
    throw;
  }
  ctx.workspace = grown;
  ctx.workspace_bytes = bytes;
  log_message(OSFT_LOG_DEBUG, "context %p: workspace grown to %zu bytes",
              static_cast<void *>(&ctx), bytes);
  return grown;
}

void release_workspace(Context &ctx) {
  if (ctx.workspace != nullptr) memory_free(ctx, ctx.workspace, ctx.workspace_bytes);
  ctx.workspace = nullptr;
  ctx.workspace_bytes = 0;
  if (ctx.kernel_block != nullptr)
    memory_free(ctx, ctx.kernel_block, ctx.kernel_block_bytes);
  ctx.kernel_block = nullptr;
  ctx.kernel_block_bytes = 0;
  if (ctx.outer_block != nullptr)
    memory_free(ctx, ctx.outer_block, ctx.outer_block_bytes);
  ctx.outer_block = nullptr;
  ctx.outer_block_bytes = 0;
  if (ctx.host_block != nullptr && ctx.host_block_used == 0) {
    ctx.allocator.host_free(ctx.host_block, ctx.host_block_bytes);
    ctx.host_block = nullptr;
    ctx.host_block_bytes = 0;
    ctx.host_block_want = 0;
  }
}

namespace {

/* A block of the context's memory of at least `bytes`, kept between calls.
 * The old block is freed first, in stream order on the context's stream:
 * work enqueued on it finishes before its memory is reused. */
void *grown_block(Context &ctx, void *&block, size_t &have, size_t bytes,
                  const char *what) {
  if (bytes <= have) return block;
  if (block != nullptr) memory_free(ctx, block, have);
  block = nullptr;
  have = 0;
  block = memory_alloc(ctx, bytes, what);
  have = bytes;
  return block;
}

}  // namespace

void *kernel_scratch(Context &ctx, size_t bytes, const char *what) {
  return grown_block(ctx, ctx.kernel_block, ctx.kernel_block_bytes, bytes, what);
}

void *kernel_scratch_if_available(Context &ctx, size_t bytes, const char *what) {
  try {
    return kernel_scratch(ctx, bytes, what);
  } catch (const Error &e) {
    if (e.status() != OSFT_STATUS_OUT_OF_MEMORY) throw;
    return nullptr;
  }
}

void *outer_workspace(Context &ctx, size_t bytes, const char *what) {
  return grown_block(ctx, ctx.outer_block, ctx.outer_block_bytes, bytes, what);
}

namespace {

constexpr size_t host_scratch_round(size_t bytes) noexcept {
  return (bytes + Allocator::host_alignment - 1) / Allocator::host_alignment *
         Allocator::host_alignment;
}

}  // namespace

void *host_scratch_take(Context &ctx, size_t bytes, const char *what) {
  const size_t need = host_scratch_round(bytes);
  void *p = nullptr;
  if (ctx.host_block_top + need <= ctx.host_block_bytes) {
    p = ctx.host_block + ctx.host_block_top;
    ctx.host_block_top += need;
  } else {
    /* Does not fit: a block of its own this time, and a larger stack later. */
    p = ctx.allocator.host_alloc(need, what);
  }
  ctx.host_block_used += need;
  if (ctx.host_block_used > ctx.host_block_want)
    ctx.host_block_want = ctx.host_block_used;
  return p;
}

void host_scratch_give(Context &ctx, void *ptr, size_t bytes) noexcept {
  if (ptr == nullptr) return;
  const size_t need = host_scratch_round(bytes);
  char *p = static_cast<char *>(ptr);
  if (ctx.host_block != nullptr && p >= ctx.host_block &&
      p < ctx.host_block + ctx.host_block_bytes) {
    ctx.host_block_top = static_cast<size_t>(p - ctx.host_block); /* stack order */
  } else {
    ctx.allocator.host_free(ptr, need);
  }
  ctx.host_block_used -= need;
  if (ctx.host_block_used != 0 || ctx.host_block_want <= ctx.host_block_bytes) return;
  /* Nothing held: grow to what the largest call needed. */
  if (ctx.host_block != nullptr)
    ctx.allocator.host_free(ctx.host_block, ctx.host_block_bytes);
  ctx.host_block = nullptr;
  ctx.host_block_bytes = 0;
  try {
    ctx.host_block = static_cast<char *>(
        ctx.allocator.host_alloc(ctx.host_block_want, "host scratch"));
    ctx.host_block_bytes = ctx.host_block_want;
  } catch (...) {
    ctx.host_block_want = 0; /* calls allocate their own until a later growth */
  }
}

void *device_alloc(Context &ctx, size_t bytes, const char *what) {
  return ctx.allocator.device_alloc(bytes, ctx.device_id, ctx.stream, what);
}

void device_free(Context &ctx, void *ptr, size_t bytes) noexcept {
  ctx.allocator.device_free(ptr, bytes, ctx.device_id, ctx.stream);
}

void set_stream(Context &ctx, void *stream) {
  if (!on_cuda(ctx)) {
    if (stream != nullptr)
      raise(OSFT_STATUS_INVALID_ARGUMENT,
            "stream: a CPU context has no stream; must be NULL");
    return;
  }
  /* Blocks the old stream may still be using (the workspace) are freed or
   * reused in stream order on the new one: order the new stream after the
   * old stream's work (on the device; the host does not wait). */
  if (stream != ctx.stream) cuda::stream_wait(ctx.device_id, stream, ctx.stream);
  if (ctx.blas != nullptr) cuda::set_blas_stream(ctx.blas, stream);
  if (ctx.solver != nullptr) {
    try {
      cuda::set_solver_stream(ctx.solver, stream);
    } catch (...) {
      if (ctx.blas != nullptr) cuda::set_blas_stream(ctx.blas, ctx.stream);
      throw;
    }
  }
  ctx.stream = stream;
}

void synchronize(Context &ctx) {
  if (on_cuda(ctx)) cuda::synchronize(ctx.device_id, ctx.stream);
}

void *blas_handle(Context &ctx) {
  if (!on_cuda(ctx)) raise(OSFT_STATUS_NOT_SUPPORTED, "ctx: cuBLAS needs a CUDA context");
  if (ctx.blas == nullptr) {
    ctx.blas = cuda::create_blas(ctx.device_id, ctx.stream);
    log_message(OSFT_LOG_DEBUG, "context %p: cuBLAS handle created",
                static_cast<void *>(&ctx));
  }
  return ctx.blas;
}

void *solver_handle(Context &ctx) {
  if (!on_cuda(ctx))
    raise(OSFT_STATUS_NOT_SUPPORTED, "ctx: cuSOLVER needs a CUDA context");
  if (ctx.solver == nullptr) {
    ctx.solver = cuda::create_solver(ctx.device_id, ctx.stream);
    log_message(OSFT_LOG_DEBUG, "context %p: cuSOLVER handle created",
                static_cast<void *>(&ctx));
  }
  return ctx.solver;
}

}  // namespace osft

namespace {

/* For the C-callable internal accessors: a void body, a recorded status. */
template <class Body>
osft_status_t internal_call(Body &&body) noexcept {
  return osft::run_catching([&] {
    body();
    return OSFT_STATUS_SUCCESS;
  });
}

}  // namespace

extern "C" osft_status_t osfti_context_workspace(osft_context_t ctx, size_t bytes,
                                                 void **ptr) {
  return internal_call(
      [&] { *ptr = osft::workspace(osft::checked_context(ctx, "ctx"), bytes); });
}

extern "C" osft_status_t osfti_context_blas_handle(osft_context_t ctx, void **handle) {
  return internal_call(
      [&] { *handle = osft::blas_handle(osft::checked_context(ctx, "ctx")); });
}

extern "C" osft_status_t osfti_context_solver_handle(osft_context_t ctx, void **handle) {
  return internal_call(
      [&] { *handle = osft::solver_handle(osft::checked_context(ctx, "ctx")); });
}

extern "C" osft_status_t osfti_context_peek_handles(osft_context_t ctx, void **blas,
                                                    void **solver) {
  return internal_call([&] {
    const osft::Context &c = osft::checked_context(ctx, "ctx");
    *blas = c.blas;
    *solver = c.solver;
  });
}

extern "C" void osfti_cpu_threads(int *count, int *pool_workers, int *blas_threads) {
  *count = osft::blas::num_threads();
  *pool_workers = osft::blas::pool_workers();
  *blas_threads = osft::blas::threads();
}

extern "C" void osfti_cpu_run_parts(int parts, int serial_blas, void (*part)(void *, int),
                                    void *user) {
  osft::blas::run_parts(parts, [&](int p) {
    if (serial_blas) {
      osft::blas::SerialBlas single;
      part(user, p);
    } else {
      part(user, p);
    }
  });
}
