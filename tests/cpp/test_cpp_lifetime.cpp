/* Ownership in the C++ API (osftrt/osftrt.hpp): handle classes are move-only
 * with noexcept moves and destructors; a moved-from object is empty and safe;
 * objects keep what they were made from alive, so any destruction order
 * frees every block exactly once (a counting allocator checks it) and no C
 * destroy ever fails (a log sink checks that none reports an error). */
#include <cstdlib>
#include <type_traits>

#include "cpp_test.h"

using osftrt::TensorView;

namespace {

template <class T>
constexpr bool move_only() {
  return !std::is_copy_constructible<T>::value && !std::is_copy_assignable<T>::value &&
         std::is_nothrow_move_constructible<T>::value &&
         std::is_nothrow_move_assignable<T>::value &&
         std::is_nothrow_destructible<T>::value;
}
static_assert(move_only<osftrt::Context>(), "Context");
static_assert(move_only<osftrt::Comm>(), "Comm");
static_assert(move_only<osftrt::Flinear>(), "Flinear");
static_assert(move_only<osftrt::Mlp>(), "Mlp");
static_assert(move_only<osftrt::Flce>(), "Flce");
static_assert(move_only<osftrt::Projector>(), "Projector");
static_assert(move_only<osftrt::ManagedTensor>(), "ManagedTensor");
static_assert(move_only<osftrt::LogSink>(), "LogSink");
static_assert(std::is_nothrow_destructible<osftrt::Qr>::value, "Qr");

/* Counts the host blocks the library takes and returns. */
struct Counter {
  long allocs = 0, frees = 0, live_bytes = 0;
  static void *alloc(void *user, size_t bytes, size_t alignment) {
    auto *c = static_cast<Counter *>(user);
    ++c->allocs;
    c->live_bytes += static_cast<long>(bytes);
    return std::aligned_alloc(alignment, (bytes + alignment - 1) / alignment * alignment);
  }
  static void free(void *user, void *ptr, size_t bytes) {
    auto *c = static_cast<Counter *>(user);
    ++c->frees;
    c->live_bytes -= static_cast<long>(bytes);
    std::free(ptr);
  }
};

/* A context whose every host block goes through `c`. */
osftrt::Context counted_context(Counter &c) {
  osftrt::Allocator a;
  a.user = &c;
  a.host_alloc = &Counter::alloc;
  a.host_free = &Counter::free;
  osftrt::ContextOptions o;
  o.allocator = &a;  // copied at creation
  return osftrt::Context(o);
}

/* Fails the test when the library logs an error (a refused destroy would). */
struct NoErrors {
  std::vector<std::string> errors;
  osftrt::LogSink sink{
      [this](osft_log_level_t, const char *m) { errors.emplace_back(m); },
      OSFT_LOG_ERROR};
  ~NoErrors() {
    for (const std::string &e : errors)
      cpp_test::fail(__FILE__, __LINE__, "library error during the test: " + e);
  }
};

std::vector<float> random_matrix(int64_t rows, int64_t cols, uint64_t seed) {
  std::mt19937_64 rng(seed);
  return cpp_test::to_float(cpp_test::uniform(static_cast<size_t>(rows * cols), rng));
}

}  // namespace

OSFT_CPP_TEST(moved_from_objects_are_empty_and_safe) {
  osftrt::Context a;
  OSFT_CHECK(static_cast<bool>(a));
  osft_context_t raw = a.get();
  osftrt::Context b = std::move(a);
  OSFT_CHECK(!a && a.get() == nullptr && b.get() == raw);
  OSFT_EXPECT_THROWS(a.workspace_size(), OSFT_STATUS_INVALID_HANDLE, "ctx");
  osftrt::Context &alias = b;
  b = std::move(alias);  // self-move keeps the handle
  OSFT_CHECK(b.get() == raw);
  osftrt::Context c;
  c = std::move(b);  // c's old context is destroyed, raw moves in
  OSFT_CHECK(c.get() == raw && !b);
  osftrt::Flce ce(c), ce2;
  OSFT_CHECK(!ce2);
  ce2 = std::move(ce);
  OSFT_CHECK(!ce && ce2);
  OSFT_EXPECT_THROWS(ce.options(), OSFT_STATUS_INVALID_HANDLE, "flce");
  osftrt::Projector p(c), p2;
  p2 = std::move(p);
  OSFT_EXPECT_THROWS(p.project(), OSFT_STATUS_INVALID_HANDLE, "projector");
  p2.project();  // no targets: nothing to do
  osftrt::Comm comm = osftrt::Comm::self(c), comm2 = std::move(comm);
  OSFT_EXPECT_THROWS(comm.barrier(), OSFT_STATUS_INVALID_HANDLE, "comm");
  comm2.barrier();
}

OSFT_CPP_TEST(context_outlives_its_objects_in_any_order) {
  Counter count;
  {
    NoErrors guard;
    const int64_t n = 8, k = 6;
    std::vector<float> w = random_matrix(n, k, 1), x = random_matrix(2, k, 2);
    std::vector<float> y(2 * n, std::nanf(""));
    osftrt::Flinear layer;
    osftrt::Projector proj;
    std::vector<float> gu(n * 3, 0.5f), gv(3 * k, 0.5f);
    {
      osftrt::Context ctx = counted_context(count);
      layer = osftrt::Flinear::from_weight(ctx, TensorView(w.data(), {n, k}));
      proj = osftrt::Projector(ctx);
    }  // the C++ Context is gone; the layer and projector keep the C one
    OSFT_CHECK(count.allocs > count.frees);
    layer.forward(TensorView(x.data(), {2, k}), TensorView(y.data(), {2, n}));
    OSFT_CHECK(!std::isnan(y[0]));
    const osftrt::FlinearDims d = layer.dims();
    OSFT_CHECK(d.trainable_rank == 3);
    proj.add_layer(layer, TensorView(gu.data(), {n, d.trainable_rank}),
                   TensorView(gv.data(), {d.trainable_rank, k}));
    layer = osftrt::Flinear();  // the projector keeps the layer
    proj.project();
    OSFT_CHECK(proj.orthogonality().max() < 1e-5);
  }
  OSFT_CHECK(count.allocs > 0 && count.allocs == count.frees && count.live_bytes == 0);
}

OSFT_CPP_TEST(mlp_and_comm_keep_their_dependencies) {
  Counter count;
  {
    NoErrors guard;
    const int64_t h = 4, i = 6;
    std::vector<float> gate = random_matrix(i, h, 3), down = random_matrix(h, i, 4);
    std::vector<float> up = random_matrix(i, h, 5), x = random_matrix(3, h, 6);
    std::vector<float> y(3 * h, std::nanf(""));
    osftrt::Mlp mlp;
    osftrt::Flce ce;
    {
      osftrt::Context ctx = counted_context(count);
      osftrt::Flinear up_layer =
          osftrt::Flinear::from_weight(ctx, TensorView(up.data(), {i, h}));
      osftrt::MlpWeights mw;
      mw.gate = TensorView(gate.data(), {i, h});
      mw.up_layer = &up_layer;
      mw.down = TensorView(down.data(), {h, i});
      mlp = osftrt::Mlp(ctx, OSFT_MLP_SWIGLU, h, i, mw);
      osftrt::Comm comm = osftrt::Comm::self(ctx);
      osftrt::FlceOptions fo;
      fo.vocab_parallel(comm, 0, 0);
      ce = osftrt::Flce(ctx, fo);
    }  // context, layer and communicator objects gone, their handles kept
    mlp.forward(TensorView(x.data(), {3, h}), TensorView(y.data(), {3, h}));
    OSFT_CHECK(!std::isnan(y[0]) && !std::isnan(y[3 * h - 1]));
    OSFT_CHECK(mlp.tile_count(3).num_tiles >= 1);
    OSFT_CHECK(ce.options().comm != nullptr);
  }
  OSFT_CHECK(count.allocs > 0 && count.allocs == count.frees && count.live_bytes == 0);
}

OSFT_CPP_TEST(exported_factor_keeps_the_layer) {
  Counter count;
  {
    NoErrors guard;
    const int64_t n = 5, k = 4;
    std::vector<float> w = random_matrix(n, k, 8);
    osftrt::ManagedTensor exported;
    TensorView direct;
    {
      osftrt::Context ctx = counted_context(count);
      osftrt::Flinear layer =
          osftrt::Flinear::from_weight(ctx, TensorView(w.data(), {n, k}));
      direct = layer.factor(OSFT_FACTOR_U_LOW);
      exported = osftrt::ManagedTensor(layer.factor_dlpack(OSFT_FACTOR_U_LOW));
    }
    const TensorView v = exported.view();
    OSFT_CHECK(v.data() == direct.data());  // zero-copy
    OSFT_CHECK(v.ndim() == 2 && v.size(0) == n);
    // Readable after the layer object is gone (ASan would flag a freed block).
    const float *u = v.data_as<float>();
    double s = 0;
    for (int64_t r = 0; r < n; ++r) s += u[r * v.stride(0)];
    OSFT_CHECK(std::isfinite(s));
    OSFT_CHECK(count.allocs > count.frees);
  }  // the deleter drops the last reference: layer, then context
  OSFT_CHECK(count.allocs > 0 && count.allocs == count.frees && count.live_bytes == 0);
}

namespace {
int deleter_calls = 0;
void count_deleter(DLManagedTensor *) {
  ++deleter_calls;
}
}  // namespace

OSFT_CPP_TEST(managed_tensor_deleter_runs_once) {
  float data[6] = {1, 2, 3, 4, 5, 6};
  int64_t shape[2] = {2, 3};
  DLManagedTensor m{};
  m.dl_tensor.data = data;
  m.dl_tensor.device = osftrt::cpu_device();
  m.dl_tensor.ndim = 2;
  m.dl_tensor.dtype = osftrt::dtype_of<float>();
  m.dl_tensor.shape = shape;
  m.deleter = &count_deleter;
  deleter_calls = 0;
  {
    osftrt::ManagedTensor a(&m);
    osftrt::ManagedTensor b = std::move(a);
    OSFT_CHECK(a.get() == nullptr && b.get() == &m);
    OSFT_CHECK(b.view().data() == data && TensorView(m).size(1) == 3);
    osftrt::ManagedTensor c;
    c = std::move(b);
  }
  OSFT_CHECK(deleter_calls == 1);
  osftrt::ManagedTensor d(&m);
  DLManagedTensor *back = d.release();
  OSFT_CHECK(back == &m && d.get() == nullptr);
  OSFT_CHECK(deleter_calls == 1);
  DLManagedTensor *e = osftrt::to_dlpack(TensorView(data, {6}));
  OSFT_CHECK(e->dl_tensor.data == data && e->dl_tensor.shape[0] == 6);
  osftrt::ManagedTensor owner(e);  // frees the exported descriptor (ASan/LSan)
}

OSFT_CPP_TEST(view_copies_own_their_shape) {
  float f[12] = {};
  TensorView a(f, {3, 4});
  TensorView b = a;
  a = TensorView(f, {12});
  OSFT_CHECK(b.ndim() == 2 && b.get()->shape[0] == 3 && b.get()->shape[1] == 4);
  OSFT_CHECK(b.get()->shape != a.get()->shape);
  const TensorView r = b.rows(1, 3);
  OSFT_CHECK(r.data() == f + 4 && r.size(0) == 2 && r.get()->strides == nullptr);
  TensorView s(f, {3, 2}, {4, 1});
  const TensorView sr = s.rows(2, 3);
  OSFT_CHECK(sr.data() == f + 8 && sr.stride(0) == 4 && sr.get()->strides != nullptr);
  OSFT_CHECK(TensorView().get() == nullptr && TensorView().empty());
  OSFT_CHECK(TensorView::scalar(f).ndim() == 0 && TensorView::scalar(f).numel() == 1);
}
