/**
 * @file
 * @brief libosftrt — the C++ API: a header-only layer over the C ABI.
 *
 * Include this one header from C++17 or later. It depends on nothing but the
 * C headers (osftrt/osftrt.h) and the standard library, and nothing of it is
 * compiled into libosftrt: the C ABI stays the only binary contract (as ONNX
 * Runtime's onnxruntime_cxx_api.h does over its C API).
 *
 * @code{.unparsed}
 *   C                                    C++ (namespace osftrt)
 *   osft_status_t + osft_last_error()    an osftrt::Error exception carrying both
 *   osft_<thing>_create / _destroy       one move-only class per handle (Context,
 *                                        Comm, Flinear, Mlp, Flce, Projector);
 *                                        the destructor destroys, never throws
 *   OSFT_*_OPTIONS_INIT(&o)              ContextOptions o;  (defaults from the
 *                                        library's *_init functions)
 *   DLTensor filled field by field       TensorView(ptr, {rows, cols}): dtype
 *                                        from the element type; or from a
 *                                        DLTensor / DLManagedTensor
 *   out-parameters                       return values (dims(), memory_stats())
 * @endcode
 *
 * @par Lifetimes
 * A handle object owns its C handle; get() lends it to C code. Objects made
 * from a Context (and a Projector from its Comm, an Mlp from its Flinear
 * layers, an Flce from its vocab-parallel Comm) share ownership of what they
 * were made from, so destroying the C++ objects in any order is safe: the C
 * context is destroyed after the last object made from it. A moved-from
 * object is empty (get() is NULL, operator bool false); its destructor does
 * nothing and any call on it throws Error with OSFT_STATUS_INVALID_HANDLE.
 * Tensor memory is never owned: TensorView borrows, like the C API.
 *
 * @par Errors
 * Every wrapper whose C call fails throws osftrt::Error: status() is the C
 * status, what() the thread's osft_last_error() text at the failure (it
 * names the function and the argument). Nothing the caller passed is
 * modified, as in C. Checks this header makes itself (a view's shape, an
 * output made from a const pointer, a padded vocabulary larger than the
 * weight) throw Error with the status the C side would give, before any
 * call.
 *
 * @par Thread safety
 * As in C: an object made from a context is used by one thread at a time,
 * like its context; distinct contexts are independent.
 *
 * @code
 *   #include <osftrt/osftrt.hpp>
 *
 *   osftrt::Context ctx;                          // CPU, default options
 *   osftrt::FlinearOptions o;
 *   o.rank_ratio = 0.75;
 *   auto layer = osftrt::Flinear::from_weight(ctx, {w.data(), {N, K}}, o);
 *   layer.forward({x.data(), {M, K}}, {y.data(), {M, N}});
 *   try {
 *     layer.forward({x.data(), {M, K + 1}}, {y.data(), {M, N}});
 *   } catch (const osftrt::Error &e) {          // e.status(): shape mismatch
 *     std::cerr << e.what() << '\n';            // names x and its shape
 *   }
 * @endcode
 */
#ifndef OSFTRT_OSFTRT_HPP
#define OSFTRT_OSFTRT_HPP

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "osftrt/osftrt.h"

#if __cplusplus < 201703L && !(defined(_MSVC_LANG) && _MSVC_LANG >= 201703L)
#error "osftrt/osftrt.hpp needs C++17 or later"
#endif

/**
 * @defgroup osftrt_cpp C++ API
 * @brief Header-only C++17 classes over the C ABI: RAII handles, exceptions,
 * typed tensor views (osftrt/osftrt.hpp).
 */

/** @brief The C++ API of libosftrt (osftrt/osftrt.hpp). @ingroup osftrt_cpp */
namespace osftrt {

// ===================================================================== errors

/**
 * @brief What every failing wrapper throws: the C status and the library's
 * message.
 */
class Error : public std::runtime_error {
 public:
  /**
   * @brief An error with a status and a message.
   * @param status   The C status (never OSFT_STATUS_SUCCESS).
   * @param message  The message, e.g. osft_last_error() after the failure.
   */
  Error(osft_status_t status, const std::string &message)
      : std::runtime_error(message), status_(status) {}
  /**
   * @brief The C status of the failure.
   * @return The status, e.g. OSFT_STATUS_SHAPE_MISMATCH.
   */
  osft_status_t status() const noexcept { return status_; }
  /**
   * @brief The status's short English name (osft_status_string()).
   * @return A static string, never NULL.
   */
  const char *status_name() const noexcept { return osft_status_string(status_); }

 private:
  osft_status_t status_;
};

/// @cond internal
namespace detail {

#if defined(__GNUC__) || defined(__clang__)
#define OSFTRT_CPP_COLD __attribute__((noinline, cold))
#else
#define OSFTRT_CPP_COLD
#endif

[[noreturn]] OSFTRT_CPP_COLD inline void throw_error(osft_status_t status,
                                                     const std::string &message) {
  throw Error(status, message);
}

[[noreturn]] OSFTRT_CPP_COLD inline void throw_last_error(osft_status_t status) {
  throw Error(status, osft_last_error());
}

/* Every C call goes through here: success costs one compare. */
inline void check(osft_status_t status) {
  if (status != OSFT_STATUS_SUCCESS) throw_last_error(status);
}

/* Keeps what a handle depends on alive until the handle is destroyed: the
 * deleter object is freed right after it runs, and with it these owners. */
template <class Handle>
struct Deleter {
  osft_status_t (*destroy)(Handle);
  std::shared_ptr<void> keep[4];
  void operator()(Handle h) const noexcept {
    if (h != nullptr) (void)destroy(h);
  }
};

template <class Handle>
std::shared_ptr<std::remove_pointer_t<Handle>> own(Handle raw,
                                                   osft_status_t (*destroy)(Handle),
                                                   std::shared_ptr<void> k0 = {},
                                                   std::shared_ptr<void> k1 = {},
                                                   std::shared_ptr<void> k2 = {},
                                                   std::shared_ptr<void> k3 = {}) {
  Deleter<Handle> d{destroy,
                    {std::move(k0), std::move(k1), std::move(k2), std::move(k3)}};
  // On bad_alloc the shared_ptr constructor runs the deleter: no leak.
  return std::shared_ptr<std::remove_pointer_t<Handle>>(raw, std::move(d));
}

}  // namespace detail
/// @endcond

// ============================================== status, version and logging

/**
 * @brief A short English name for a status (osft_status_string()).
 * @param status  Any value.
 * @return A static string, never NULL.
 */
inline const char *status_string(osft_status_t status) noexcept {
  return osft_status_string(status);
}

/**
 * @brief The calling thread's last error message (osft_last_error()).
 * @return A copy of the message; "" when there is none.
 */
inline std::string last_error() {
  return osft_last_error();
}

/** @brief Forgets the calling thread's last error (osft_clear_last_error()). */
inline void clear_last_error() noexcept {
  osft_clear_last_error();
}

/**
 * @brief The loaded library's version as MAJOR * 10000 + MINOR * 100 + PATCH.
 * @return osft_version().
 */
inline unsigned version() noexcept {
  return osft_version();
}

/**
 * @brief The loaded library's version as "MAJOR.MINOR.PATCH".
 * @return osft_version_string(): a static string.
 */
inline const char *version_string() noexcept {
  return osft_version_string();
}

/**
 * @brief One line saying how the loaded library was built.
 * @return osft_build_info(): a static string.
 */
inline const char *build_info() noexcept {
  return osft_build_info();
}

/**
 * @brief Whether an optional component was compiled into the library.
 * @param feature  The component.
 * @return true if it was compiled in (osft_has_feature()).
 */
inline bool has_feature(osft_feature_t feature) noexcept {
  return osft_has_feature(feature) != 0;
}

/**
 * @brief Throws unless the loaded library can serve these headers: the same
 * major version and a minor version at least the headers'.
 * @throws Error OSFT_STATUS_NOT_SUPPORTED, naming both versions.
 */
inline void check_version() {
  const unsigned v = osft_version();
  if (v / 10000 != OSFT_VERSION_MAJOR || v / 100 % 100 < OSFT_VERSION_MINOR)
    detail::throw_error(OSFT_STATUS_NOT_SUPPORTED,
                        std::string("osftrt::check_version: the loaded libosftrt is ") +
                            osft_version_string() + ", the headers are " +
                            std::to_string(OSFT_VERSION_MAJOR) + "." +
                            std::to_string(OSFT_VERSION_MINOR) + "." +
                            std::to_string(OSFT_VERSION_PATCH));
}

/**
 * @brief How many devices of a type this process can use.
 * @param type  The device type.
 * @return The count (0 for CUDA without a driver, a GPU or CUDA support).
 * @throws Error as osft_device_count().
 */
inline int device_count(osft_device_type_t type) {
  int count = 0;
  detail::check(osft_device_count(type, &count));
  return count;
}

/**
 * @brief Sets the library's CPU thread count, process-wide (its worker
 * threads and its BLAS engine's; osft_set_num_threads()). A libtorch host
 * passes at::get_num_threads() at start and after each change of its own.
 * @param n  Threads (1 to 1024), or 0 for the automatic count
 *           (environment, then the process's CPUs).
 * @throws Error OSFT_STATUS_INVALID_ARGUMENT for n < 0 or n > 1024.
 */
inline void set_num_threads(int n) {
  detail::check(osft_set_num_threads(n));
}

/**
 * @brief The CPU thread count in effect (osft_get_num_threads()).
 * @return The count (>= 1).
 */
inline int num_threads() {
  int n = 0;
  detail::check(osft_get_num_threads(&n));
  return n;
}

/**
 * @brief Installs a C log callback process-wide (osft_set_log_callback()).
 * @param callback   The sink, or NULL to remove it.
 * @param user       Passed back to the sink.
 * @param max_level  The least severe level delivered.
 * @throws Error OSFT_STATUS_INVALID_ARGUMENT for an unknown level.
 */
inline void set_log_callback(osft_log_callback_t callback, void *user,
                             osft_log_level_t max_level) {
  detail::check(osft_set_log_callback(callback, user, max_level));
}

/**
 * @brief A process-wide log sink calling a C++ function for every message,
 * installed for the object's lifetime.
 *
 * The function may run on any thread that is inside the library; exceptions
 * it throws are swallowed. The destructor removes the process-wide sink (the
 * last one installed, whoever installed it). Move-only.
 */
class LogSink {
 public:
  /** @brief The function type: (level, message valid during the call). */
  using Function = std::function<void(osft_log_level_t, const char *)>;
  /** @brief An empty sink that installs nothing. */
  LogSink() noexcept = default;
  /**
   * @brief Installs `fn` as the process-wide sink.
   * @param fn         The function.
   * @param max_level  The least severe level delivered.
   * @throws Error OSFT_STATUS_INVALID_ARGUMENT for an unknown level.
   */
  LogSink(Function fn, osft_log_level_t max_level)
      : fn_(std::make_unique<Function>(std::move(fn))) {
    detail::check(osft_set_log_callback(&LogSink::deliver, fn_.get(), max_level));
  }
  /** @brief Removes the sink (if this object installed one). */
  ~LogSink() {
    if (fn_) (void)osft_set_log_callback(nullptr, nullptr, OSFT_LOG_OFF);
  }
  /** @brief Moves the installation; the source becomes empty. @param o The source. */
  LogSink(LogSink &&o) noexcept = default;
  /**
   * @brief Replaces this sink by another.
   * @param o  The source, left empty.
   * @return *this.
   */
  LogSink &operator=(LogSink &&o) noexcept {
    if (this != &o) {
      if (fn_ && !o.fn_) (void)osft_set_log_callback(nullptr, nullptr, OSFT_LOG_OFF);
      fn_ = std::move(o.fn_);
    }
    return *this;
  }
  /** @brief Not copyable. */
  LogSink(const LogSink &) = delete;
  /** @brief Not copyable. @return never. */
  LogSink &operator=(const LogSink &) = delete;

 private:
  static void deliver(void *user, osft_log_level_t level, const char *message) {
    try {
      (*static_cast<Function *>(user))(level, message);
    } catch (...) {
    }
  }
  std::unique_ptr<Function> fn_;
};

// ===================================================================== dtypes

/**
 * @brief A bfloat16 value (the top 16 bits of an IEEE fp32), for views of
 * bf16 memory; any 2-byte type with a dtype_traits specialization works too.
 */
struct bfloat16 {
  uint16_t bits; /**< the raw bits */
  /**
   * @brief Rounds a float to the nearest bfloat16 (ties to even; NaN stays NaN).
   * @param f  The value.
   * @return The bfloat16.
   */
  static bfloat16 from_float(float f) noexcept {
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u)
      return {static_cast<uint16_t>((u >> 16) | 0x40u)};
    u += 0x7fffu + ((u >> 16) & 1u);
    return {static_cast<uint16_t>(u >> 16)};
  }
  /**
   * @brief The value as a float (exact).
   * @return The float.
   */
  float to_float() const noexcept {
    const uint32_t u = static_cast<uint32_t>(bits) << 16;
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
  }
};

/**
 * @brief The DLPack dtype of an element type. Specialized for float, double,
 * bfloat16, int32_t and int64_t; specialize it for another bf16 type
 * (c10::BFloat16, __nv_bfloat16) to build views from its pointers.
 * @tparam T  The element type (without const).
 */
template <class T>
struct dtype_traits {
  static_assert(sizeof(T) == 0,
                "osftrt::dtype_traits: no DLPack dtype for this element type");
};
/** @brief float: kDLFloat, 32 bits. */
template <>
struct dtype_traits<float> {
  static constexpr uint8_t code = kDLFloat; /**< DLDataTypeCode */
  static constexpr uint8_t bits = 32;       /**< bits per element */
};
/** @brief double: kDLFloat, 64 bits. */
template <>
struct dtype_traits<double> {
  static constexpr uint8_t code = kDLFloat; /**< DLDataTypeCode */
  static constexpr uint8_t bits = 64;       /**< bits per element */
};
/** @brief bfloat16: kDLBfloat, 16 bits. */
template <>
struct dtype_traits<bfloat16> {
  static constexpr uint8_t code = kDLBfloat; /**< DLDataTypeCode */
  static constexpr uint8_t bits = 16;        /**< bits per element */
};
/** @brief int32_t: kDLInt, 32 bits (targets, argmax). */
template <>
struct dtype_traits<int32_t> {
  static constexpr uint8_t code = kDLInt; /**< DLDataTypeCode */
  static constexpr uint8_t bits = 32;     /**< bits per element */
};
/** @brief int64_t: kDLInt, 64 bits (targets, argmax). */
template <>
struct dtype_traits<int64_t> {
  static constexpr uint8_t code = kDLInt; /**< DLDataTypeCode */
  static constexpr uint8_t bits = 64;     /**< bits per element */
};

/**
 * @brief The DLDataType of an element type (lanes 1).
 * @tparam T  The element type; const is ignored.
 * @return {code, bits, 1}.
 */
template <class T>
constexpr DLDataType dtype_of() noexcept {
  using U = std::remove_cv_t<T>;
  return DLDataType{dtype_traits<U>::code, dtype_traits<U>::bits, 1};
}

/**
 * @brief The host CPU as a DLPack device.
 * @return {kDLCPU, 0}.
 */
constexpr DLDevice cpu_device() noexcept {
  return DLDevice{kDLCPU, 0};
}

/**
 * @brief A CUDA GPU as a DLPack device.
 * @param id  The device ordinal.
 * @return {kDLCUDA, id}.
 */
constexpr DLDevice cuda_device(int id = 0) noexcept {
  return DLDevice{kDLCUDA, id};
}

// =============================================================== tensor views

/**
 * @brief A borrowed tensor: data pointer, dtype, device, shape and strides, as
 * the C API's DLTensor, with the shape and strides held inside the view.
 *
 * The memory is not owned and must outlive every call the view is passed
 * to. Copying a view copies the descriptor, never the data. A
 * default-constructed view is empty: passed as an optional argument it
 * means "no tensor" (NULL in C). A view made from a const pointer is
 * read-only: passing it as an output throws OSFT_STATUS_INVALID_ARGUMENT.
 * At most max_dims dimensions.
 */
class TensorView {
 public:
  /** @brief The most dimensions a view holds. */
  static constexpr int max_dims = 8;

  /** @brief An empty view ("no tensor"). */
  TensorView() noexcept : t_(), present_(false), read_only_(false) {}

  /**
   * @brief A view of `data` with the given shape and strides, the dtype taken
   * from T.
   * @tparam T        float, double, bfloat16, int32_t, int64_t (or any type
   *                  with a dtype_traits specialization), possibly const.
   * @param data      The first element (may be NULL only for 0 elements).
   * @param shape     Sizes in elements, outermost first; {} for a 0-d tensor.
   * @param strides   Strides in elements, one per dimension; {} for compact
   *                  row-major.
   * @param device    Where the memory lives (default: the host).
   * @throws Error OSFT_STATUS_SHAPE_MISMATCH (a negative size),
   *   OSFT_STATUS_INVALID_ARGUMENT (strides of another count, NULL data with
   *   elements), OSFT_STATUS_NOT_SUPPORTED (more than max_dims dimensions).
   */
  template <class T>
  TensorView(T *data, std::initializer_list<int64_t> shape,
             std::initializer_list<int64_t> strides = {}, DLDevice device = cpu_device())
      : TensorView() {
    assign(const_cast<std::remove_cv_t<T> *>(data), dtype_of<T>(), shape.begin(),
           shape.size(), strides.begin(), strides.size(), device,
           std::is_const<T>::value);
  }

  /**
   * @brief As the initializer-list constructor, with vectors.
   * @tparam T        The element type (see above).
   * @param data      The first element.
   * @param shape     Sizes in elements.
   * @param strides   Strides in elements, or empty for compact row-major.
   * @param device    Where the memory lives.
   * @throws Error as the initializer-list constructor.
   */
  template <class T>
  TensorView(T *data, const std::vector<int64_t> &shape,
             const std::vector<int64_t> &strides = {}, DLDevice device = cpu_device())
      : TensorView() {
    assign(const_cast<std::remove_cv_t<T> *>(data), dtype_of<T>(), shape.data(),
           shape.size(), strides.data(), strides.size(), device, std::is_const<T>::value);
  }

  /**
   * @brief A view of an existing DLTensor (the descriptor is copied, the data
   * is shared: e.g. at::toDLPack(t)->dl_tensor).
   * @param t  The tensor.
   * @throws Error OSFT_STATUS_DTYPE_MISMATCH (lanes other than 1),
   *   OSFT_STATUS_SHAPE_MISMATCH (a negative size), OSFT_STATUS_NOT_SUPPORTED
   *   (more than max_dims dimensions).
   */
  explicit TensorView(const DLTensor &t) : TensorView() {
    if (t.dtype.lanes != 1)
      detail::throw_error(OSFT_STATUS_DTYPE_MISMATCH, "osftrt::TensorView: dtype lanes " +
                                                          std::to_string(t.dtype.lanes) +
                                                          "; must be 1");
    const size_t n =
        t.ndim < 0 ? static_cast<size_t>(max_dims) + 1 : static_cast<size_t>(t.ndim);
    if (n != 0 && t.shape == nullptr)
      detail::throw_error(OSFT_STATUS_INVALID_ARGUMENT,
                          "osftrt::TensorView: a DLTensor with ndim " +
                              std::to_string(t.ndim) + " and a NULL shape");
    assign(t.data, t.dtype, t.shape, n, t.strides, t.strides ? n : 0, t.device, false);
    t_.byte_offset = t.byte_offset;
  }

  /**
   * @brief A view of a DLManagedTensor's tensor (ownership stays with the
   * caller: see ManagedTensor for an owner).
   * @param m  The managed tensor.
   * @throws Error as TensorView(const DLTensor &).
   */
  explicit TensorView(const DLManagedTensor &m) : TensorView(m.dl_tensor) {}

  /** @brief Copies the descriptor. @param o The source. */
  TensorView(const TensorView &o) noexcept { copy_from(o); }
  /**
   * @brief Copies the descriptor.
   * @param o  The source.
   * @return *this.
   */
  TensorView &operator=(const TensorView &o) noexcept {
    if (this != &o) copy_from(o);
    return *this;
  }

  /**
   * @brief A 0-d view of one element (a scalar loss, a grad_loss).
   * @tparam T     The element type.
   * @param data   The element.
   * @param device Where it lives.
   * @return The view.
   */
  template <class T>
  static TensorView scalar(T *data, DLDevice device = cpu_device()) {
    return TensorView(data, std::initializer_list<int64_t>{},
                      std::initializer_list<int64_t>{}, device);
  }

  /**
   * @brief Whether the view is empty (no tensor).
   * @return true for a default-constructed view.
   */
  bool empty() const noexcept { return !present_; }
  /**
   * @brief Whether the view describes a tensor.
   * @return !empty().
   */
  explicit operator bool() const noexcept { return present_; }
  /**
   * @brief The DLTensor the C API takes, or NULL for an empty view. Valid as
   * long as the view is (and not moved or reassigned).
   * @return The descriptor.
   */
  const DLTensor *get() const noexcept { return present_ ? &t_ : nullptr; }
  /**
   * @brief Whether the view was made from a const pointer.
   * @return true if it may not be an output.
   */
  bool read_only() const noexcept { return read_only_; }
  /**
   * @brief The data pointer (without byte_offset).
   * @return The pointer.
   */
  void *data() const noexcept { return t_.data; }
  /**
   * @brief The data pointer as T*, checked against the dtype.
   * @tparam T  The element type.
   * @return data() plus byte_offset, as T*.
   * @throws Error OSFT_STATUS_DTYPE_MISMATCH if T is not the view's dtype.
   */
  template <class T>
  T *data_as() const {
    const DLDataType d = dtype_of<T>();
    if (d.code != t_.dtype.code || d.bits != t_.dtype.bits)
      detail::throw_error(OSFT_STATUS_DTYPE_MISMATCH,
                          "osftrt::TensorView::data_as: the element type is not the "
                          "view's dtype");
    return reinterpret_cast<T *>(static_cast<char *>(t_.data) + t_.byte_offset);
  }
  /**
   * @brief The number of dimensions.
   * @return ndim (0 for an empty view).
   */
  int ndim() const noexcept { return t_.ndim; }
  /**
   * @brief One dimension's size.
   * @param dim  The dimension, 0 <= dim < ndim().
   * @return Its size in elements.
   */
  int64_t size(int dim) const noexcept { return shape_[dim]; }
  /**
   * @brief One dimension's stride (computed for compact views).
   * @param dim  The dimension, 0 <= dim < ndim().
   * @return Its stride in elements.
   */
  int64_t stride(int dim) const noexcept {
    if (t_.strides != nullptr) return strides_[dim];
    int64_t s = 1;
    for (int i = t_.ndim - 1; i > dim; --i) s *= shape_[i];
    return s;
  }
  /**
   * @brief The number of elements.
   * @return The product of the sizes (1 for 0-d, 0 for an empty view).
   */
  int64_t numel() const noexcept {
    if (!present_) return 0;
    int64_t n = 1;
    for (int i = 0; i < t_.ndim; ++i) n *= shape_[i];
    return n;
  }
  /**
   * @brief The dtype.
   * @return The DLDataType.
   */
  DLDataType dtype() const noexcept { return t_.dtype; }
  /**
   * @brief The device.
   * @return The DLDevice.
   */
  DLDevice device() const noexcept { return t_.device; }

  /**
   * @brief The rows [begin, end) of dimension 0 (e.g. the real classes of a
   * padded vocabulary): same memory, same strides.
   * @param begin  The first row, >= 0.
   * @param end    One past the last row, begin <= end <= size(0).
   * @return The sub-view (read-only if this one is).
   * @throws Error OSFT_STATUS_SHAPE_MISMATCH for a 0-d or empty view or a range
   *   outside [0, size(0)].
   */
  TensorView rows(int64_t begin, int64_t end) const {
    if (!present_ || t_.ndim < 1 || begin < 0 || end < begin || end > shape_[0])
      detail::throw_error(
          OSFT_STATUS_SHAPE_MISMATCH,
          "osftrt::TensorView::rows: [" + std::to_string(begin) + ", " +
              std::to_string(end) + ") is not a range of dimension 0" +
              (present_ && t_.ndim >= 1 ? " (size " + std::to_string(shape_[0]) + ")"
                                        : std::string(" (no dimension 0)")));
    // Leading rows of a compact tensor are compact: only the pointer moves.
    TensorView v(*this);
    const int64_t bytes = (t_.dtype.bits + 7) / 8;
    if (v.t_.data != nullptr)
      v.t_.data = static_cast<char *>(v.t_.data) + begin * stride(0) * bytes;
    v.shape_[0] = end - begin;
    return v;
  }

 private:
  void assign(void *data, DLDataType dtype, const int64_t *shape, size_t ndim,
              const int64_t *strides, size_t nstrides, DLDevice device, bool ro) {
    if (ndim > static_cast<size_t>(max_dims))
      detail::throw_error(
          OSFT_STATUS_NOT_SUPPORTED,
          "osftrt::TensorView: more than " + std::to_string(max_dims) + " dimensions");
    if (nstrides != 0 && nstrides != ndim)
      detail::throw_error(OSFT_STATUS_INVALID_ARGUMENT,
                          "osftrt::TensorView: " + std::to_string(nstrides) +
                              " strides for " + std::to_string(ndim) + " dimensions");
    int64_t n = 1;
    for (size_t i = 0; i < ndim; ++i) {
      if (shape[i] < 0)
        detail::throw_error(OSFT_STATUS_SHAPE_MISMATCH,
                            "osftrt::TensorView: shape[" + std::to_string(i) +
                                "] = " + std::to_string(shape[i]) + " is negative");
      shape_[i] = shape[i];
      n *= shape[i];
      if (nstrides != 0) strides_[i] = strides[i];
    }
    if (data == nullptr && n != 0)
      detail::throw_error(
          OSFT_STATUS_INVALID_ARGUMENT,
          "osftrt::TensorView: NULL data for " + std::to_string(n) + " elements");
    t_.data = data;
    t_.device = device;
    t_.ndim = static_cast<int32_t>(ndim);
    t_.dtype = dtype;
    t_.shape = shape_;
    t_.strides = nstrides != 0 ? strides_ : nullptr;
    t_.byte_offset = 0;
    present_ = true;
    read_only_ = ro;
  }
  void copy_from(const TensorView &o) noexcept {
    t_ = o.t_;
    present_ = o.present_;
    read_only_ = o.read_only_;
    for (int i = 0; i < o.t_.ndim; ++i) {
      shape_[i] = o.shape_[i];
      strides_[i] = o.strides_[i];
    }
    t_.shape = shape_;
    t_.strides = o.t_.strides != nullptr ? strides_ : nullptr;
  }

  DLTensor t_;
  int64_t shape_[max_dims] = {};
  int64_t strides_[max_dims] = {};
  bool present_;
  bool read_only_;
};

/// @cond internal
namespace detail {
/* An input argument: NULL for an empty view. */
inline const DLTensor *in(const TensorView &v) noexcept {
  return v.get();
}

OSFTRT_CPP_COLD inline void refuse_read_only(const char *name) {
  throw_error(OSFT_STATUS_INVALID_ARGUMENT,
              std::string(name) +
                  ": a read-only view (made from a const pointer) passed as an output");
}

/* An output argument: the C API reads the descriptor and writes the data. */
inline DLTensor *out(const TensorView &v, const char *name) {
  if (v.read_only()) refuse_read_only(name);
  return const_cast<DLTensor *>(v.get());
}

/* A DLManagedTensor that owns a copy of a view's descriptor and, optionally,
 * a reference to whatever owns the memory. */
struct Exported {
  DLManagedTensor managed;
  TensorView view;
  std::shared_ptr<void> owner;
  static void destroy(DLManagedTensor *self) noexcept {
    delete static_cast<Exported *>(self->manager_ctx);
  }
};
}  // namespace detail
/// @endcond

/**
 * @brief Exports a view as a new DLManagedTensor (zero-copy: the data is
 * shared), e.g. for at::fromDLPack(). The consumer calls its deleter, which
 * frees the descriptor and drops `owner`.
 * @param view   The view (not empty).
 * @param owner  What keeps the memory alive while the consumer holds it
 *               (e.g. Flinear::owner() for a factor), or empty.
 * @return The managed tensor, owned by the caller until handed over.
 * @throws Error OSFT_STATUS_INVALID_ARGUMENT for an empty view.
 */
inline DLManagedTensor *to_dlpack(const TensorView &view,
                                  std::shared_ptr<void> owner = {}) {
  if (view.empty())
    detail::throw_error(OSFT_STATUS_INVALID_ARGUMENT, "osftrt::to_dlpack: an empty view");
  auto *e = new detail::Exported{DLManagedTensor{}, view, std::move(owner)};
  e->managed.dl_tensor = *e->view.get();
  e->managed.manager_ctx = e;
  e->managed.deleter = &detail::Exported::destroy;
  return &e->managed;
}

/**
 * @brief Owns a DLManagedTensor (e.g. from at::toDLPack()) and calls its
 * deleter once, in the destructor. Move-only.
 */
class ManagedTensor {
 public:
  /** @brief Owns nothing. */
  ManagedTensor() noexcept = default;
  /**
   * @brief Takes ownership of `m` (may be NULL).
   * @param m  The managed tensor.
   */
  explicit ManagedTensor(DLManagedTensor *m) noexcept : m_(m) {}
  /** @brief Calls the deleter (if any). */
  ~ManagedTensor() { reset(); }
  /** @brief Takes the source's tensor; the source owns nothing. @param o The source. */
  ManagedTensor(ManagedTensor &&o) noexcept : m_(o.release()) {}
  /**
   * @brief Takes the source's tensor, releasing this one's first.
   * @param o  The source.
   * @return *this.
   */
  ManagedTensor &operator=(ManagedTensor &&o) noexcept {
    if (this != &o) {
      reset();
      m_ = o.release();
    }
    return *this;
  }
  /** @brief Not copyable. */
  ManagedTensor(const ManagedTensor &) = delete;
  /** @brief Not copyable. @return never. */
  ManagedTensor &operator=(const ManagedTensor &) = delete;
  /**
   * @brief The managed tensor.
   * @return It, or NULL.
   */
  DLManagedTensor *get() const noexcept { return m_; }
  /**
   * @brief A view of it (sharing the data).
   * @return The view; empty when nothing is owned.
   * @throws Error as TensorView(const DLTensor &).
   */
  TensorView view() const { return m_ ? TensorView(m_->dl_tensor) : TensorView(); }
  /**
   * @brief Gives up ownership without calling the deleter.
   * @return The managed tensor.
   */
  DLManagedTensor *release() noexcept { return std::exchange(m_, nullptr); }
  /** @brief Calls the deleter now and owns nothing. */
  void reset() noexcept {
    DLManagedTensor *m = release();
    if (m != nullptr && m->deleter != nullptr) m->deleter(m);
  }

 private:
  DLManagedTensor *m_ = nullptr;
};

// =================================================================== contexts

/** @brief The caller's memory callbacks, defaults from osft_allocator_init(). */
struct Allocator : osft_allocator_t {
  /** @brief All callbacks NULL (built-in allocation). */
  Allocator() : osft_allocator_t() {
    detail::check(osft_allocator_init(this, sizeof(osft_allocator_t)));
  }
};

/** @brief Options of a Context, defaults from osft_context_options_init(). */
struct ContextOptions : osft_context_options_t {
  /** @brief The defaults: a CPU context, no limit, built-in allocator. */
  ContextOptions() : osft_context_options_t() {
    detail::check(osft_context_options_init(this, sizeof(osft_context_options_t)));
  }
};

/** @brief Memory a context holds (osft_context_get_memory_stats()). */
struct MemoryStats : osft_memory_stats_t {
  /** @brief All counters 0, struct_size set (osft_memory_stats_init()). */
  MemoryStats() : osft_memory_stats_t() {
    detail::check(osft_memory_stats_init(this, sizeof(osft_memory_stats_t)));
  }
};

/** @brief A context's device. */
struct Device {
  osft_device_type_t type; /**< CPU or CUDA */
  int id;                  /**< the ordinal (0 for the CPU) */
};

/**
 * @brief A context (osft_context_t): a device, a stream, memory. Move-only.
 *
 * Objects made from it keep the C context alive: it is destroyed with the
 * last of them. Raw C handles made from get() by hand are not counted:
 * destroy them before the last C++ owner goes, or the C context stays.
 */
class Context {
 public:
  /**
   * @brief Creates a context (osft_context_create()).
   * @param opts  The options (default: a CPU context).
   * @throws Error as osft_context_create().
   */
  explicit Context(const ContextOptions &opts = ContextOptions()) {
    osft_context_t raw = nullptr;
    detail::check(osft_context_create(&raw, &opts));
    h_ = detail::own(raw, &osft_context_destroy);
  }
  /** @brief Moves the handle; the source becomes empty. @param o The source. */
  Context(Context &&o) noexcept = default;
  /**
   * @brief Moves the handle, releasing this one's first.
   * @param o  The source, left empty.
   * @return *this.
   */
  Context &operator=(Context &&o) noexcept = default;
  /** @brief Not copyable: one owner per handle. */
  Context(const Context &) = delete;
  /** @brief Not copyable. @return never. */
  Context &operator=(const Context &) = delete;
  /** @brief Releases this owner's reference (see the class description). */
  ~Context() = default;

  /**
   * @brief The C handle, for C calls.
   * @return It, or NULL for an empty object.
   */
  osft_context_t get() const noexcept { return h_.get(); }
  /**
   * @brief The shared ownership of the C handle (what dependent objects hold).
   * @return The owner.
   */
  const std::shared_ptr<osft_context_s> &owner() const noexcept { return h_; }
  /**
   * @brief Whether the object holds a context.
   * @return get() != NULL.
   */
  explicit operator bool() const noexcept { return h_ != nullptr; }

  /**
   * @brief The context's device (osft_context_get_device()).
   * @return Its type and ordinal.
   * @throws Error as osft_context_get_device().
   */
  Device device() const {
    Device d{OSFT_DEVICE_CPU, 0};
    detail::check(osft_context_get_device(get(), &d.type, &d.id));
    return d;
  }
  /**
   * @brief Sets the CUDA stream for later work (osft_context_set_stream()).
   * @param stream  A cudaStream_t as void *, or NULL.
   * @throws Error as osft_context_set_stream().
   */
  void set_stream(void *stream) { detail::check(osft_context_set_stream(get(), stream)); }
  /**
   * @brief The context's stream (osft_context_get_stream()).
   * @return The stream, NULL on the CPU.
   * @throws Error as osft_context_get_stream().
   */
  void *stream() const {
    void *s = nullptr;
    detail::check(osft_context_get_stream(get(), &s));
    return s;
  }
  /**
   * @brief Waits for the context's work (osft_context_synchronize()).
   * @throws Error as osft_context_synchronize().
   */
  void synchronize() const { detail::check(osft_context_synchronize(get())); }
  /**
   * @brief Grows the workspace now (osft_context_reserve_workspace()).
   * @param bytes  The least size in bytes.
   * @throws Error as osft_context_reserve_workspace().
   */
  void reserve_workspace(size_t bytes) {
    detail::check(osft_context_reserve_workspace(get(), bytes));
  }
  /**
   * @brief Frees the scratch memory (osft_context_release_workspace()).
   * @throws Error as osft_context_release_workspace().
   */
  void release_workspace() { detail::check(osft_context_release_workspace(get())); }
  /**
   * @brief The workspace size (osft_context_get_workspace_size()).
   * @return Bytes.
   * @throws Error as osft_context_get_workspace_size().
   */
  size_t workspace_size() const {
    size_t bytes = 0;
    detail::check(osft_context_get_workspace_size(get(), &bytes));
    return bytes;
  }
  /**
   * @brief The memory statistics (osft_context_get_memory_stats()).
   * @return The statistics.
   * @throws Error as osft_context_get_memory_stats().
   */
  MemoryStats memory_stats() const {
    MemoryStats s;
    detail::check(osft_context_get_memory_stats(get(), &s));
    return s;
  }
  /**
   * @brief Resets the peaks to the current use (osft_context_reset_peak_memory()).
   * @throws Error as osft_context_reset_peak_memory().
   */
  void reset_peak_memory() { detail::check(osft_context_reset_peak_memory(get())); }

 private:
  std::shared_ptr<osft_context_s> h_;
};

// ============================================================== communicators

/** @brief Options of every communicator, defaults from osft_comm_options_init(). */
struct CommOptions : osft_comm_options_t {
  /** @brief The defaults (a 300 s timeout). */
  CommOptions() : osft_comm_options_t() {
    detail::check(osft_comm_options_init(this, sizeof(osft_comm_options_t)));
  }
};

/** @brief Host callbacks, defaults from osft_comm_callbacks_init(). */
struct CommCallbacks : osft_comm_callbacks_t {
  /** @brief NULL callbacks, rank 0 of 1. */
  CommCallbacks() : osft_comm_callbacks_t() {
    detail::check(osft_comm_callbacks_init(this, sizeof(osft_comm_callbacks_t)));
  }
};

/** @brief What a communicator has done (osft_comm_get_stats()). */
struct CommStats : osft_comm_stats_t {
  /** @brief All counters 0, struct_size set (osft_comm_stats_init()). */
  CommStats() : osft_comm_stats_t() {
    detail::check(osft_comm_stats_init(this, sizeof(osft_comm_stats_t)));
  }
};

/** @brief A communicator's place (osft_comm_get_info()). */
struct CommInfo {
  int rank;                  /**< this rank */
  int size;                  /**< the number of ranks */
  osft_comm_engine_t engine; /**< the engine */
};

/** @brief An NCCL unique id (osft_nccl_unique_id_t). */
using NcclUniqueId = osft_nccl_unique_id_t;

/**
 * @brief Makes a new NCCL unique id, on one rank (osft_comm_nccl_unique_id()).
 * @return The id, to be sent to every rank.
 * @throws Error as osft_comm_nccl_unique_id().
 */
inline NcclUniqueId nccl_unique_id() {
  NcclUniqueId id{};
  detail::check(osft_comm_nccl_unique_id(&id));
  return id;
}

/**
 * @brief A framework's collectives in C++, for Comm::callbacks(). A method
 * that throws fails the collective: an Error with its status, anything else
 * with OSFT_STATUS_COMM_ERROR.
 */
class Collectives {
 public:
  /** @brief Destroyed after the communicator. */
  virtual ~Collectives() = default;
  /**
   * @brief Sums `buf` over the ranks, in place.
   * @param buf  A compact 1-D fp32 or bf16 tensor in the context's memory.
   */
  virtual void allreduce_sum(DLTensor &buf) = 0;
  /**
   * @brief Gathers counts[p] elements of every rank p into recv, in rank order.
   * @param send      This rank's counts[rank] elements.
   * @param recv      Receives the sum of counts elements.
   * @param counts    The count of every rank.
   * @param n_counts  The number of ranks.
   */
  virtual void allgather(const DLTensor &send, DLTensor &recv, const int64_t *counts,
                         int64_t n_counts) = 0;
  /**
   * @brief Whether barrier() is a real barrier (else the library stands in a
   * one-element all-reduce).
   * @return false unless overridden.
   */
  virtual bool has_barrier() const { return false; }
  /** @brief Returns when every rank has entered it (if has_barrier()). */
  virtual void barrier() {}
};

/// @cond internal
namespace detail {
template <class F>
osft_status_t collective_call(F &&f) noexcept {
  try {
    f();
    return OSFT_STATUS_SUCCESS;
  } catch (const Error &e) {
    return e.status();
  } catch (...) {
    return OSFT_STATUS_COMM_ERROR;
  }
}
struct CollectivesTrampoline {
  static osft_status_t allreduce_sum(void *user, DLTensor *buf) {
    return collective_call(
        [&] { static_cast<Collectives *>(user)->allreduce_sum(*buf); });
  }
  static osft_status_t allgather(void *user, const DLTensor *send, DLTensor *recv,
                                 const int64_t *counts, int64_t n_counts) {
    return collective_call([&] {
      static_cast<Collectives *>(user)->allgather(*send, *recv, counts, n_counts);
    });
  }
  static osft_status_t barrier(void *user) {
    return collective_call([&] { static_cast<Collectives *>(user)->barrier(); });
  }
};
}  // namespace detail
/// @endcond

/**
 * @brief A communicator (osft_comm_t). Move-only; keeps its context alive.
 */
class Comm {
 public:
  /** @brief An empty object. */
  Comm() noexcept = default;
  /** @brief Moves the handle; the source becomes empty. @param o The source. */
  Comm(Comm &&o) noexcept = default;
  /**
   * @brief Moves the handle, releasing this one's first.
   * @param o  The source, left empty.
   * @return *this.
   */
  Comm &operator=(Comm &&o) noexcept = default;
  /** @brief Not copyable. */
  Comm(const Comm &) = delete;
  /** @brief Not copyable. @return never. */
  Comm &operator=(const Comm &) = delete;
  /** @brief Releases this owner's reference (destroyed with the last). */
  ~Comm() = default;

  /**
   * @brief The one-rank communicator (osft_comm_create_self()).
   * @param ctx   The context.
   * @param opts  The options.
   * @return The communicator.
   * @throws Error as osft_comm_create_self().
   */
  static Comm self(const Context &ctx, const CommOptions &opts = CommOptions()) {
    osft_comm_t raw = nullptr;
    detail::check(osft_comm_create_self(ctx.get(), &opts, &raw));
    return Comm(detail::own(raw, &osft_comm_destroy, ctx.owner()));
  }
  /**
   * @brief Wraps an MPI communicator, collectively (osft_comm_create_mpi()).
   * @param ctx         A CPU context.
   * @param mpi_comm_f  MPI_Comm_c2f(comm), widened to int64_t.
   * @param opts        The options.
   * @return The communicator.
   * @throws Error as osft_comm_create_mpi().
   */
  static Comm mpi(const Context &ctx, int64_t mpi_comm_f,
                  const CommOptions &opts = CommOptions()) {
    osft_comm_t raw = nullptr;
    detail::check(osft_comm_create_mpi(ctx.get(), mpi_comm_f, &opts, &raw));
    return Comm(detail::own(raw, &osft_comm_destroy, ctx.owner()));
  }
  /**
   * @brief Wraps the caller's ncclComm_t (osft_comm_create_nccl()).
   * @param ctx        A CUDA context on the communicator's device.
   * @param nccl_comm  The ncclComm_t as void * (still the caller's).
   * @param opts       The options.
   * @return The communicator.
   * @throws Error as osft_comm_create_nccl().
   */
  static Comm nccl(const Context &ctx, void *nccl_comm,
                   const CommOptions &opts = CommOptions()) {
    osft_comm_t raw = nullptr;
    detail::check(osft_comm_create_nccl(ctx.get(), nccl_comm, &opts, &raw));
    return Comm(detail::own(raw, &osft_comm_destroy, ctx.owner()));
  }
  /**
   * @brief Creates an NCCL communicator from a unique id, collectively
   * (osft_comm_create_nccl_from_id()).
   * @param ctx     A CUDA context.
   * @param id      The id, the same on every rank.
   * @param nranks  The number of ranks.
   * @param rank    This rank.
   * @param opts    The options.
   * @return The communicator.
   * @throws Error as osft_comm_create_nccl_from_id().
   */
  static Comm nccl(const Context &ctx, const NcclUniqueId &id, int nranks, int rank,
                   const CommOptions &opts = CommOptions()) {
    osft_comm_t raw = nullptr;
    detail::check(
        osft_comm_create_nccl_from_id(ctx.get(), &id, nranks, rank, &opts, &raw));
    return Comm(detail::own(raw, &osft_comm_destroy, ctx.owner()));
  }
  /**
   * @brief A communicator over C host callbacks (osft_comm_create_callbacks()).
   * @param ctx        The context.
   * @param callbacks  The callbacks (their `user` must outlive the object).
   * @param opts       The options.
   * @return The communicator.
   * @throws Error as osft_comm_create_callbacks().
   */
  static Comm callbacks(const Context &ctx, const osft_comm_callbacks_t &callbacks,
                        const CommOptions &opts = CommOptions()) {
    osft_comm_t raw = nullptr;
    detail::check(osft_comm_create_callbacks(ctx.get(), &callbacks, &opts, &raw));
    return Comm(detail::own(raw, &osft_comm_destroy, ctx.owner()));
  }
  /**
   * @brief A communicator over a C++ Collectives object, which the
   * communicator keeps alive.
   * @param ctx          The context.
   * @param collectives  The collectives (not NULL).
   * @param rank         This rank, in [0, size).
   * @param size         The number of ranks, >= 1.
   * @param opts         The options.
   * @return The communicator.
   * @throws Error as osft_comm_create_callbacks().
   */
  static Comm callbacks(const Context &ctx, std::shared_ptr<Collectives> collectives,
                        int rank, int size, const CommOptions &opts = CommOptions()) {
    CommCallbacks cb;
    cb.user = collectives.get();
    cb.rank = rank;
    cb.size = size;
    cb.allreduce_sum = &detail::CollectivesTrampoline::allreduce_sum;
    cb.allgather = &detail::CollectivesTrampoline::allgather;
    if (collectives && collectives->has_barrier())
      cb.barrier = &detail::CollectivesTrampoline::barrier;
    if (!collectives)
      detail::throw_error(OSFT_STATUS_INVALID_ARGUMENT,
                          "osftrt::Comm::callbacks: collectives is NULL");
    osft_comm_t raw = nullptr;
    detail::check(osft_comm_create_callbacks(ctx.get(), &cb, &opts, &raw));
    return Comm(
        detail::own(raw, &osft_comm_destroy, ctx.owner(), std::move(collectives)));
  }

  /**
   * @brief The C handle.
   * @return It, or NULL for an empty object.
   */
  osft_comm_t get() const noexcept { return h_.get(); }
  /**
   * @brief The shared ownership of the C handle.
   * @return The owner.
   */
  const std::shared_ptr<osft_comm_s> &owner() const noexcept { return h_; }
  /**
   * @brief Whether the object holds a communicator.
   * @return get() != NULL.
   */
  explicit operator bool() const noexcept { return h_ != nullptr; }

  /**
   * @brief Rank, size and engine (osft_comm_get_info()).
   * @return The information.
   * @throws Error as osft_comm_get_info().
   */
  CommInfo info() const {
    CommInfo i{0, 1, OSFT_COMM_ENGINE_SELF};
    detail::check(osft_comm_get_info(get(), &i.rank, &i.size, &i.engine));
    return i;
  }
  /**
   * @brief Sums `buf` over the ranks, in place (osft_comm_allreduce_sum()).
   * @param buf  A compact fp32 or bf16 tensor on the context's device.
   * @throws Error as osft_comm_allreduce_sum().
   */
  void allreduce_sum(const TensorView &buf) {
    detail::check(osft_comm_allreduce_sum(get(), detail::out(buf, "buf")));
  }
  /**
   * @brief All-gather with per-rank counts (osft_comm_allgather()).
   * @param send    This rank's counts[rank] elements.
   * @param recv    Receives every rank's elements in rank order.
   * @param counts  One count per rank.
   * @throws Error as osft_comm_allgather().
   */
  void allgather(const TensorView &send, const TensorView &recv,
                 const std::vector<int64_t> &counts) {
    detail::check(osft_comm_allgather(get(), detail::in(send), detail::out(recv, "recv"),
                                      counts.data(),
                                      static_cast<int64_t>(counts.size())));
  }
  /**
   * @brief Waits for every rank (osft_comm_barrier()).
   * @throws Error as osft_comm_barrier().
   */
  void barrier() { detail::check(osft_comm_barrier(get())); }
  /**
   * @brief The statistics (osft_comm_get_stats()).
   * @return The statistics.
   * @throws Error as osft_comm_get_stats().
   */
  CommStats stats() const {
    CommStats s;
    detail::check(osft_comm_get_stats(get(), &s));
    return s;
  }
  /**
   * @brief Zeroes the statistics (osft_comm_reset_stats()).
   * @throws Error as osft_comm_reset_stats().
   */
  void reset_stats() { detail::check(osft_comm_reset_stats(get())); }

 private:
  explicit Comm(std::shared_ptr<osft_comm_s> h) noexcept : h_(std::move(h)) {}
  std::shared_ptr<osft_comm_s> h_;
};

// ========================================================= factorized linear

/** @brief Options of a Flinear layer, defaults from osft_flinear_options_init(). */
struct FlinearOptions : osft_flinear_options_t {
  /** @brief The defaults (rank_ratio 0.5, AUTO strategy, the weight's dtype). */
  FlinearOptions() : osft_flinear_options_t() {
    detail::check(osft_flinear_options_init(this, sizeof(osft_flinear_options_t)));
  }
};

/** @brief Caller-owned factors for Flinear::from_factors() (all six required). */
struct FlinearFactors {
  TensorView u_high; /**< N x r (frozen) */
  TensorView s_high; /**< r (frozen) */
  TensorView v_high; /**< r x K (frozen) */
  TensorView u_low;  /**< N x l (trainable) */
  TensorView s_low;  /**< l (trainable) */
  TensorView v_low;  /**< l x K (trainable) */
};

/** @brief A layer's sizes (osft_flinear_get_dims()). */
struct FlinearDims {
  int64_t out_features;   /**< N */
  int64_t in_features;    /**< K */
  int64_t frozen_rank;    /**< r */
  int64_t trainable_rank; /**< l */
};

/** @brief The gradients of Flinear::backward(); an empty view is not computed. */
struct FlinearGrads {
  TensorView grad_x;       /**< (..., K), x's dtype */
  TensorView grad_u_low;   /**< N x l */
  TensorView grad_s_low;   /**< l */
  TensorView grad_v_low;   /**< l x K */
  TensorView grad_bias;    /**< N */
  uint32_t accumulate = 0; /**< OR of OSFT_FLINEAR_ACCUMULATE_* */
};

/// @cond internal
namespace detail {
inline osft_flinear_grads_t c_grads(const FlinearGrads &g) {
  osft_flinear_grads_t c;
  check(osft_flinear_grads_init(&c, sizeof c));
  c.grad_x = out(g.grad_x, "grad_x");
  c.grad_u_low = out(g.grad_u_low, "grad_u_low");
  c.grad_s_low = out(g.grad_s_low, "grad_s_low");
  c.grad_v_low = out(g.grad_v_low, "grad_v_low");
  c.grad_bias = out(g.grad_bias, "grad_bias");
  c.accumulate = g.accumulate;
  return c;
}
}  // namespace detail
/// @endcond

/** @brief A layer's counters (osft_flinear_get_info()). */
struct FlinearInfo : osft_flinear_info_t {
  /** @brief All fields 0, struct_size set (osft_flinear_info_init()). */
  FlinearInfo() : osft_flinear_info_t() {
    detail::check(osft_flinear_info_init(this, sizeof(osft_flinear_info_t)));
  }
};

/**
 * @brief A factorized-linear (OSFT) layer (osft_flinear_t). Move-only; keeps
 * its context alive.
 */
class Flinear {
 public:
  /** @brief An empty object. */
  Flinear() noexcept = default;
  /** @brief Moves the handle; the source becomes empty. @param o The source. */
  Flinear(Flinear &&o) noexcept = default;
  /**
   * @brief Moves the handle, releasing this one's first.
   * @param o  The source, left empty.
   * @return *this.
   */
  Flinear &operator=(Flinear &&o) noexcept = default;
  /** @brief Not copyable. */
  Flinear(const Flinear &) = delete;
  /** @brief Not copyable. @return never. */
  Flinear &operator=(const Flinear &) = delete;
  /** @brief Releases this owner's reference (destroyed with the last). */
  ~Flinear() = default;

  /**
   * @brief Decomposes a dense weight into runtime-owned factors
   * (osft_flinear_create_from_weight()).
   * @param ctx     The context.
   * @param weight  W, N x K; only read.
   * @param opts    The options.
   * @return The layer.
   * @throws Error as osft_flinear_create_from_weight().
   */
  static Flinear from_weight(const Context &ctx, const TensorView &weight,
                             const FlinearOptions &opts = FlinearOptions()) {
    osft_flinear_t raw = nullptr;
    detail::check(
        osft_flinear_create_from_weight(ctx.get(), detail::in(weight), &opts, &raw));
    return Flinear(detail::own(raw, &osft_flinear_destroy, ctx.owner()));
  }
  /**
   * @brief A layer over caller-owned factors (osft_flinear_create_from_factors()):
   * their memory must stay valid, at the same address, for the layer's life.
   * @param ctx      The context.
   * @param factors  The six factors.
   * @param opts     The options (only strategy is used).
   * @return The layer.
   * @throws Error as osft_flinear_create_from_factors().
   */
  static Flinear from_factors(const Context &ctx, const FlinearFactors &factors,
                              const FlinearOptions &opts = FlinearOptions()) {
    osft_flinear_factors_t f;
    detail::check(osft_flinear_factors_init(&f, sizeof f));
    f.u_high = detail::in(factors.u_high);
    f.s_high = detail::in(factors.s_high);
    f.v_high = detail::in(factors.v_high);
    f.u_low = detail::in(factors.u_low);
    f.s_low = detail::in(factors.s_low);
    f.v_low = detail::in(factors.v_low);
    osft_flinear_t raw = nullptr;
    detail::check(osft_flinear_create_from_factors(ctx.get(), &f, &opts, &raw));
    return Flinear(detail::own(raw, &osft_flinear_destroy, ctx.owner()));
  }

  /**
   * @brief The C handle.
   * @return It, or NULL for an empty object.
   */
  osft_flinear_t get() const noexcept { return h_.get(); }
  /**
   * @brief The shared ownership of the C handle (e.g. for to_dlpack()).
   * @return The owner.
   */
  const std::shared_ptr<osft_flinear_s> &owner() const noexcept { return h_; }
  /**
   * @brief Whether the object holds a layer.
   * @return get() != NULL.
   */
  explicit operator bool() const noexcept { return h_ != nullptr; }

  /**
   * @brief N, K, r and l (osft_flinear_get_dims()).
   * @return The sizes.
   * @throws Error as osft_flinear_get_dims().
   */
  FlinearDims dims() const {
    FlinearDims d{0, 0, 0, 0};
    detail::check(osft_flinear_get_dims(get(), &d.out_features, &d.in_features,
                                        &d.frozen_rank, &d.trainable_rank));
    return d;
  }
  /**
   * @brief A view of one factor (osft_flinear_get_factor()); writing through it
   * updates the layer (frozen factors: call refresh() afterwards). Valid while
   * the layer lives.
   * @param which  The factor.
   * @return The view.
   * @throws Error as osft_flinear_get_factor().
   */
  TensorView factor(osft_flinear_factor_t which) const {
    DLTensor t{};
    detail::check(osft_flinear_get_factor(get(), which, &t));
    return TensorView(t);
  }
  /**
   * @brief One factor as a DLManagedTensor that keeps the layer alive until
   * its deleter runs (zero-copy: e.g. at::fromDLPack(layer.factor_dlpack(...))).
   * @param which  The factor.
   * @return The managed tensor (the caller owns it).
   * @throws Error as osft_flinear_get_factor().
   */
  DLManagedTensor *factor_dlpack(osft_flinear_factor_t which) const {
    return to_dlpack(factor(which), h_);
  }
  /**
   * @brief Sets the strategy for later calls (osft_flinear_set_strategy()).
   * @param strategy  The strategy (AUTO: the cost model).
   * @throws Error as osft_flinear_set_strategy().
   */
  void set_strategy(osft_flinear_strategy_t strategy) {
    detail::check(osft_flinear_set_strategy(get(), strategy));
  }
  /**
   * @brief The strategy a call would use (osft_flinear_choose_strategy()).
   * @param tokens  M, the call's rows.
   * @param pass    Forward or backward.
   * @return FACTORIZED or DENSE.
   * @throws Error as osft_flinear_choose_strategy().
   */
  osft_flinear_strategy_t choose_strategy(int64_t tokens,
                                          osft_flinear_pass_t pass) const {
    osft_flinear_strategy_t s = OSFT_FLINEAR_AUTO;
    detail::check(osft_flinear_choose_strategy(get(), tokens, pass, &s));
    return s;
  }
  /**
   * @brief y = x W^T (osft_flinear_forward()).
   * @param x  (..., K).
   * @param y  (..., N), overwritten.
   * @throws Error as osft_flinear_forward().
   */
  void forward(const TensorView &x, const TensorView &y) {
    detail::check(
        osft_flinear_forward(get(), detail::in(x), nullptr, detail::out(y, "y")));
  }
  /**
   * @brief y = x W^T + bias (osft_flinear_forward()).
   * @param x     (..., K).
   * @param bias  (N), or an empty view.
   * @param y     (..., N), overwritten.
   * @throws Error as osft_flinear_forward().
   */
  void forward(const TensorView &x, const TensorView &bias, const TensorView &y) {
    detail::check(osft_flinear_forward(get(), detail::in(x), detail::in(bias),
                                       detail::out(y, "y")));
  }
  /**
   * @brief The backward of one forward (osft_flinear_backward()).
   * @param x       The forward's input.
   * @param grad_y  dL/dy.
   * @param grads   The gradients to write (empty views are skipped).
   * @throws Error as osft_flinear_backward().
   */
  void backward(const TensorView &x, const TensorView &grad_y,
                const FlinearGrads &grads) {
    const osft_flinear_grads_t g = detail::c_grads(grads);
    detail::check(osft_flinear_backward(get(), detail::in(x), detail::in(grad_y), &g));
  }
  /**
   * @brief Writes the dense weight (osft_flinear_merge()).
   * @param weight  N x K, overwritten.
   * @throws Error as osft_flinear_merge().
   */
  void merge(const TensorView &weight) const {
    detail::check(osft_flinear_merge(get(), detail::out(weight, "weight")));
  }
  /**
   * @brief Re-decomposes the layer's own merged weight (osft_flinear_redecompose()).
   * @throws Error as osft_flinear_redecompose().
   */
  void redecompose() { detail::check(osft_flinear_redecompose(get(), nullptr)); }
  /**
   * @brief Re-decomposes a new dense weight (osft_flinear_redecompose()).
   * @param weight  N x K.
   * @throws Error as osft_flinear_redecompose().
   */
  void redecompose(const TensorView &weight) {
    detail::check(osft_flinear_redecompose(get(), detail::in(weight)));
  }
  /**
   * @brief The frozen factors changed: drops the caches (osft_flinear_refresh()).
   * @throws Error as osft_flinear_refresh().
   */
  void refresh() { detail::check(osft_flinear_refresh(get())); }
  /**
   * @brief The trainable factors were written other than through the
   * runtime (an optimizer step on them): a kept dense W is rebuilt at the
   * next call (osft_flinear_mark_updated()). Needed for layers created with
   * trainable_updates = OSFT_FLINEAR_UPDATES_REPORTED.
   * @throws Error as osft_flinear_mark_updated().
   */
  void mark_updated() { detail::check(osft_flinear_mark_updated(get())); }
  /**
   * @brief What the layer has done so far: rebuilds of W, builds of the
   * frozen part, reported changes, whether W is kept (osft_flinear_get_info()).
   * @return The counters.
   * @throws Error as osft_flinear_get_info().
   */
  FlinearInfo info() const {
    FlinearInfo i;
    detail::check(osft_flinear_get_info(get(), &i));
    return i;
  }

 private:
  explicit Flinear(std::shared_ptr<osft_flinear_s> h) noexcept : h_(std::move(h)) {}
  std::shared_ptr<osft_flinear_s> h_;
};

// ================================================================ tiled MLP

/** @brief Options of an Mlp, defaults from osft_mlp_options_init(). */
struct MlpOptions : osft_mlp_options_t {
  /** @brief The defaults (AUTO tiling, the weights' dtype). */
  MlpOptions() : osft_mlp_options_t() {
    detail::check(osft_mlp_options_init(this, sizeof(osft_mlp_options_t)));
  }
};

/**
 * @brief The projections of an Mlp: for each of gate (gated variants), up and
 * down a dense weight or a layer. Weights are borrowed; layers are kept alive
 * by the Mlp.
 */
struct MlpWeights {
  TensorView gate;                     /**< I x H, or empty */
  TensorView up;                       /**< I x H, or empty */
  TensorView down;                     /**< H x I, or empty */
  const Flinear *gate_layer = nullptr; /**< instead of gate */
  const Flinear *up_layer = nullptr;   /**< instead of up */
  const Flinear *down_layer = nullptr; /**< instead of down */
  TensorView gate_bias;                /**< I, optional */
  TensorView up_bias;                  /**< I, optional */
  TensorView down_bias;                /**< H, optional */
};

/** @brief The gradients of Mlp::backward(); empty views are not computed. */
struct MlpGrads {
  TensorView grad_x;                          /**< (..., H) */
  TensorView grad_gate;                       /**< dense gate's gradient */
  TensorView grad_up;                         /**< dense up's gradient */
  TensorView grad_down;                       /**< dense down's gradient */
  TensorView grad_gate_bias;                  /**< I */
  TensorView grad_up_bias;                    /**< I */
  TensorView grad_down_bias;                  /**< H */
  const FlinearGrads *gate_factors = nullptr; /**< a gate layer's factor gradients */
  const FlinearGrads *up_factors = nullptr;   /**< an up layer's factor gradients */
  const FlinearGrads *down_factors = nullptr; /**< a down layer's factor gradients */
  uint32_t accumulate = 0;                    /**< OR of OSFT_MLP_ACCUMULATE_* */
};

/** @brief Tiles of a call (osft_mlp_get_tile_count()). */
struct TileCount {
  int64_t num_tiles;   /**< tiles */
  int64_t tile_tokens; /**< the most tokens in one tile */
};

/** @brief How calls are carried out (osft_mlp_get_plan()). */
struct MlpPlan : osft_mlp_plan_t {
  /** @brief All fields 0, struct_size set (osft_mlp_plan_init()). */
  MlpPlan() : osft_mlp_plan_t() {
    detail::check(osft_mlp_plan_init(this, sizeof(osft_mlp_plan_t)));
  }
};

/** @brief A tiled MLP (osft_mlp_t). Move-only; keeps its context and layers alive. */
class Mlp {
 public:
  /** @brief An empty object. */
  Mlp() noexcept = default;
  /**
   * @brief Creates a tiled MLP (osft_mlp_create()).
   * @param ctx           The context.
   * @param variant       The structure.
   * @param hidden        H.
   * @param intermediate  I.
   * @param weights       The projections.
   * @param opts          The options.
   * @throws Error as osft_mlp_create().
   */
  Mlp(const Context &ctx, osft_mlp_variant_t variant, int64_t hidden,
      int64_t intermediate, const MlpWeights &weights,
      const MlpOptions &opts = MlpOptions()) {
    osft_mlp_weights_t w;
    detail::check(osft_mlp_weights_init(&w, sizeof w));
    w.gate = detail::in(weights.gate);
    w.up = detail::in(weights.up);
    w.down = detail::in(weights.down);
    w.gate_layer = weights.gate_layer ? weights.gate_layer->get() : nullptr;
    w.up_layer = weights.up_layer ? weights.up_layer->get() : nullptr;
    w.down_layer = weights.down_layer ? weights.down_layer->get() : nullptr;
    w.gate_bias = detail::in(weights.gate_bias);
    w.up_bias = detail::in(weights.up_bias);
    w.down_bias = detail::in(weights.down_bias);
    osft_mlp_t raw = nullptr;
    detail::check(
        osft_mlp_create(ctx.get(), variant, hidden, intermediate, &w, &opts, &raw));
    h_ = detail::own(raw, &osft_mlp_destroy, ctx.owner(), layer_owner(weights.gate_layer),
                     layer_owner(weights.up_layer), layer_owner(weights.down_layer));
  }
  /** @brief Moves the handle; the source becomes empty. @param o The source. */
  Mlp(Mlp &&o) noexcept = default;
  /**
   * @brief Moves the handle, releasing this one's first.
   * @param o  The source, left empty.
   * @return *this.
   */
  Mlp &operator=(Mlp &&o) noexcept = default;
  /** @brief Not copyable. */
  Mlp(const Mlp &) = delete;
  /** @brief Not copyable. @return never. */
  Mlp &operator=(const Mlp &) = delete;
  /** @brief Destroys the MLP (then releases its context and layers). */
  ~Mlp() = default;

  /**
   * @brief The C handle.
   * @return It, or NULL for an empty object.
   */
  osft_mlp_t get() const noexcept { return h_.get(); }
  /**
   * @brief Whether the object holds an MLP.
   * @return get() != NULL.
   */
  explicit operator bool() const noexcept { return h_ != nullptr; }

  /**
   * @brief The tiles a call over `tokens` rows makes (osft_mlp_get_tile_count()).
   * @param tokens  M.
   * @return The tile count and the largest tile.
   * @throws Error as osft_mlp_get_tile_count().
   */
  TileCount tile_count(int64_t tokens) const {
    TileCount t{0, 0};
    detail::check(osft_mlp_get_tile_count(get(), tokens, &t.num_tiles, &t.tile_tokens));
    return t;
  }
  /**
   * @brief How calls over `tokens` rows are carried out: tiles, whether the
   * backward recomputes, the memory kept between forward and backward
   * (osft_mlp_get_plan()).
   * @param tokens     M.
   * @param num_tiles  The tile count the calls will pass (0: automatic).
   * @return The plan.
   * @throws Error as osft_mlp_get_plan().
   */
  MlpPlan plan(int64_t tokens, int64_t num_tiles = 0) const {
    MlpPlan p;
    detail::check(osft_mlp_get_plan(get(), tokens, num_tiles, &p));
    return p;
  }
  /**
   * @brief y = MLP(x) (osft_mlp_forward()).
   * @param x          (..., H).
   * @param y          (..., H), overwritten.
   * @param num_tiles  0: the MLP's rule; >= 1: exactly that many.
   * @throws Error as osft_mlp_forward().
   */
  void forward(const TensorView &x, const TensorView &y, int64_t num_tiles = 0) {
    detail::check(osft_mlp_forward(get(), detail::in(x), detail::out(y, "y"), num_tiles));
  }
  /**
   * @brief The backward of one forward (osft_mlp_backward()).
   * @param x          The forward's input.
   * @param grad_y     dL/dy.
   * @param grads      The gradients to write.
   * @param num_tiles  0: the MLP's rule; >= 1: exactly that many.
   * @throws Error as osft_mlp_backward().
   */
  void backward(const TensorView &x, const TensorView &grad_y, const MlpGrads &grads,
                int64_t num_tiles = 0) {
    osft_mlp_grads_t g;
    detail::check(osft_mlp_grads_init(&g, sizeof g));
    g.grad_x = detail::out(grads.grad_x, "grad_x");
    g.grad_gate = detail::out(grads.grad_gate, "grad_gate");
    g.grad_up = detail::out(grads.grad_up, "grad_up");
    g.grad_down = detail::out(grads.grad_down, "grad_down");
    g.grad_gate_bias = detail::out(grads.grad_gate_bias, "grad_gate_bias");
    g.grad_up_bias = detail::out(grads.grad_up_bias, "grad_up_bias");
    g.grad_down_bias = detail::out(grads.grad_down_bias, "grad_down_bias");
    osft_flinear_grads_t fg[3];
    const FlinearGrads *const src[3] = {grads.gate_factors, grads.up_factors,
                                        grads.down_factors};
    const osft_flinear_grads_t **dst[3] = {&g.gate_factors, &g.up_factors,
                                           &g.down_factors};
    for (int i = 0; i < 3; ++i) {
      if (src[i] == nullptr) continue;
      fg[i] = detail::c_grads(*src[i]);
      *dst[i] = &fg[i];
    }
    g.accumulate = grads.accumulate;
    detail::check(
        osft_mlp_backward(get(), detail::in(x), detail::in(grad_y), &g, num_tiles));
  }

 private:
  static std::shared_ptr<void> layer_owner(const Flinear *layer) {
    return layer ? std::shared_ptr<void>(layer->owner()) : std::shared_ptr<void>();
  }
  std::shared_ptr<osft_mlp_s> h_;
};

// =================================================== fused linear cross-entropy

/**
 * @brief Options of an Flce, defaults from osft_flce_options_init() (ignore
 * index -100, MEAN, fp32 accumulator, automatic chunking).
 */
struct FlceOptions : osft_flce_options_t {
  /** @brief The defaults. */
  FlceOptions() : osft_flce_options_t() {
    detail::check(osft_flce_options_init(this, sizeof(osft_flce_options_t)));
  }
  /**
   * @brief Vocab parallelism over `c` (sets comm, vocab_offset and
   * vocab_size_global); the Flce made from these options keeps `c` alive.
   * @param c              The communicator.
   * @param offset         The first global class of this rank's shard.
   * @param global_classes The global number of classes V.
   * @return *this.
   */
  FlceOptions &vocab_parallel(const Comm &c, int64_t offset, int64_t global_classes) {
    comm = c.get();
    vocab_offset = offset;
    vocab_size_global = global_classes;
    comm_owner = c.owner();
    return *this;
  }
  /** @brief Keeps the vocab-parallel communicator alive (see vocab_parallel()). */
  std::shared_ptr<void> comm_owner;
};

/**
 * @brief The inputs of Flce::compute(). A padded vocabulary is one field away:
 * set num_classes to the real V and pass the padded weight.
 */
struct FlceInputs {
  TensorView x;            /**< (..., H), fp32 or bf16 */
  TensorView weight;       /**< (V or more, H), x's dtype */
  TensorView targets;      /**< (...), int32 or int64 */
  TensorView bias;         /**< (V), optional */
  TensorView class_weight; /**< (V), fp32, optional */
  TensorView grad_loss;    /**< the upstream gradient, optional (1) */
  /** 0: every row of weight is a class. > 0: only the first num_classes rows
   * of weight, bias, class_weight, grad_weight and grad_bias are passed (a
   * vocabulary padded to a multiple, e.g. GPT-2's 50257 classes in 50304
   * rows): the padding rows are not classes, and their gradient rows are not
   * written. */
  int64_t num_classes = 0;
};

/** @brief The outputs of Flce::compute(); empty views are not computed. */
struct FlceOutputs {
  TensorView loss;         /**< fp32: one element (MEAN, SUM) or per token (NONE) */
  TensorView grad_x;       /**< (..., H) */
  TensorView grad_weight;  /**< (V, H) */
  TensorView grad_bias;    /**< (V) */
  TensorView z_loss;       /**< fp32, shaped like loss */
  TensorView accuracy;     /**< fp32, one element */
  TensorView argmax;       /**< targets' shape, int32 or int64 */
  TensorView token_loss;   /**< targets' shape, fp32 */
  uint32_t accumulate = 0; /**< OR of OSFT_FLCE_ACCUMULATE_* */
};

/** @brief What a call would do (osft_flce_get_plan()). */
struct FlcePlan : osft_flce_plan_t {
  /** @brief All fields 0, struct_size set (osft_flce_plan_init()). */
  FlcePlan() : osft_flce_plan_t() {
    detail::check(osft_flce_plan_init(this, sizeof(osft_flce_plan_t)));
  }
};

/**
 * @brief Fused linear cross-entropy (osft_flce_t). Move-only; keeps its
 * context (and a vocab-parallel communicator) alive.
 */
class Flce {
 public:
  /** @brief An empty object. */
  Flce() noexcept = default;
  /**
   * @brief Creates the handle (osft_flce_create()).
   * @param ctx   The context.
   * @param opts  The options.
   * @throws Error as osft_flce_create().
   */
  explicit Flce(const Context &ctx, const FlceOptions &opts = FlceOptions()) {
    osft_flce_t raw = nullptr;
    detail::check(osft_flce_create(ctx.get(), &opts, &raw));
    h_ = detail::own(raw, &osft_flce_destroy, ctx.owner(), opts.comm_owner);
  }
  /** @brief Moves the handle; the source becomes empty. @param o The source. */
  Flce(Flce &&o) noexcept = default;
  /**
   * @brief Moves the handle, releasing this one's first.
   * @param o  The source, left empty.
   * @return *this.
   */
  Flce &operator=(Flce &&o) noexcept = default;
  /** @brief Not copyable. */
  Flce(const Flce &) = delete;
  /** @brief Not copyable. @return never. */
  Flce &operator=(const Flce &) = delete;
  /** @brief Destroys the handle (then releases its context). */
  ~Flce() = default;

  /**
   * @brief The C handle.
   * @return It, or NULL for an empty object.
   */
  osft_flce_t get() const noexcept { return h_.get(); }
  /**
   * @brief Whether the object holds a handle.
   * @return get() != NULL.
   */
  explicit operator bool() const noexcept { return h_ != nullptr; }

  /**
   * @brief The options as read at creation (osft_flce_get_options()).
   * @return The options (comm_owner empty).
   * @throws Error as osft_flce_get_options().
   */
  FlceOptions options() const {
    FlceOptions o;
    detail::check(osft_flce_get_options(get(), &o));
    return o;
  }
  /**
   * @brief The loss and every requested output (osft_flce_compute()).
   * @param in   The inputs.
   * @param out  The outputs.
   * @throws Error as osft_flce_compute(); OSFT_STATUS_SHAPE_MISMATCH when
   *   in.num_classes exceeds the weight's rows.
   */
  void compute(const FlceInputs &in, const FlceOutputs &out) {
    if (in.num_classes > 0) return compute(narrow(in), narrow(out, in.num_classes));
    osft_flce_inputs_t ci;
    osft_flce_outputs_t co;
    c_args(in, out, ci, co);
    detail::check(osft_flce_compute(get(), &ci, &co));
  }
  /**
   * @brief The forward phase of a trainer whose forward and backward are
   * separate: the loss alone (a forward-only osft_flce_compute(), one GEMM).
   * @param in    The inputs (grad_loss is not used).
   * @param loss  fp32: one element (MEAN, SUM) or one per token (NONE).
   * @throws Error as osft_flce_compute().
   */
  void forward(const FlceInputs &in, const TensorView &loss) {
    FlceOutputs out;
    out.loss = loss;
    compute(in, out);
  }
  /**
   * @brief The backward phase: the gradients of the same inputs, with
   * in.grad_loss the upstream gradient known by then. The logits are
   * recomputed (three GEMMs: with forward(), four where compute() with the
   * gradients takes three; see "One call, or a forward and a backward" in
   * flce.h).
   * @param in     The inputs of forward(), plus grad_loss.
   * @param grads  The gradients to write (grad_x, grad_weight, grad_bias and
   *               accumulate); its other outputs may be set too.
   * @throws Error OSFT_STATUS_INVALID_ARGUMENT without a gradient output;
   *   others as osft_flce_compute().
   */
  void backward(const FlceInputs &in, const FlceOutputs &grads) {
    if (grads.grad_x.empty() && grads.grad_weight.empty() && grads.grad_bias.empty())
      detail::throw_error(OSFT_STATUS_INVALID_ARGUMENT,
                          "osftrt::Flce::backward: grads has no grad_x, grad_weight or "
                          "grad_bias");
    compute(in, grads);
  }
  /**
   * @brief What compute() would do, validating as it would (osft_flce_get_plan()).
   * @param in   The inputs.
   * @param out  The outputs (not written).
   * @return The plan.
   * @throws Error as osft_flce_get_plan().
   */
  FlcePlan plan(const FlceInputs &in, const FlceOutputs &out) const {
    if (in.num_classes > 0) return plan(narrow(in), narrow(out, in.num_classes));
    osft_flce_inputs_t ci;
    osft_flce_outputs_t co;
    c_args(in, out, ci, co);
    FlcePlan p;
    detail::check(osft_flce_get_plan(get(), &ci, &co, &p));
    return p;
  }
  /**
   * @brief Reports and clears the device-side target record
   * (osft_flce_check_targets()).
   * @throws Error OSFT_STATUS_INDEX_OUT_OF_RANGE naming the call, token and
   *   target; others as osft_flce_check_targets().
   */
  void check_targets() { detail::check(osft_flce_check_targets(get())); }

 private:
  static void c_args(const FlceInputs &in, const FlceOutputs &out, osft_flce_inputs_t &ci,
                     osft_flce_outputs_t &co) {
    detail::check(osft_flce_inputs_init(&ci, sizeof ci));
    ci.x = detail::in(in.x);
    ci.weight = detail::in(in.weight);
    ci.targets = detail::in(in.targets);
    ci.bias = detail::in(in.bias);
    ci.class_weight = detail::in(in.class_weight);
    ci.grad_loss = detail::in(in.grad_loss);
    detail::check(osft_flce_outputs_init(&co, sizeof co));
    co.loss = detail::out(out.loss, "loss");
    co.grad_x = detail::out(out.grad_x, "grad_x");
    co.grad_weight = detail::out(out.grad_weight, "grad_weight");
    co.grad_bias = detail::out(out.grad_bias, "grad_bias");
    co.z_loss = detail::out(out.z_loss, "z_loss");
    co.accuracy = detail::out(out.accuracy, "accuracy");
    co.argmax = detail::out(out.argmax, "argmax");
    co.token_loss = detail::out(out.token_loss, "token_loss");
    co.accumulate = out.accumulate;
  }
  static TensorView first_rows(const TensorView &v, int64_t n, const char *name) {
    if (v.empty()) return v;
    if (v.ndim() < 1 || v.size(0) < n)
      detail::throw_error(
          OSFT_STATUS_SHAPE_MISMATCH,
          std::string(name) + ": " +
              (v.ndim() < 1 ? std::string("0-d") : std::to_string(v.size(0)) + " rows") +
              ", fewer than num_classes = " + std::to_string(n));
    return v.rows(0, n);
  }
  static FlceInputs narrow(const FlceInputs &in) {
    FlceInputs r = in;
    r.weight = first_rows(in.weight, in.num_classes, "weight");
    r.bias = first_rows(in.bias, in.num_classes, "bias");
    r.class_weight = first_rows(in.class_weight, in.num_classes, "class_weight");
    r.num_classes = 0;
    return r;
  }
  static FlceOutputs narrow(const FlceOutputs &out, int64_t classes) {
    FlceOutputs r = out;
    r.grad_weight = first_rows(out.grad_weight, classes, "grad_weight");
    r.grad_bias = first_rows(out.grad_bias, classes, "grad_bias");
    return r;
  }
  std::shared_ptr<osft_flce_s> h_;
};

// ============================================================ the projector

/** @brief Options of a Projector, defaults from osft_projector_options_init(). */
struct ProjectorOptions : osft_projector_options_t {
  /** @brief The defaults (consistency check on, AUTO arithmetic). */
  ProjectorOptions() : osft_projector_options_t() {
    detail::check(osft_projector_options_init(this, sizeof(osft_projector_options_t)));
  }
};

/** @brief One projection target (osft_projection_target_t) as this rank holds it. */
struct ProjectionTarget {
  TensorView u_high;     /**< U_high, or empty: no U part */
  TensorView grad_u_low; /**< dU_low, or empty */
  TensorView u_low;      /**< U_low, or empty */
  osft_shard_layout_t u_layout = OSFT_SHARD_REPLICATED; /**< REPLICATED or U_ROWS */
  std::vector<int64_t> u_shards;                        /**< U_ROWS: N_p of every rank */
  TensorView v_high;     /**< V_high, or empty: no V part */
  TensorView grad_v_low; /**< dV_low, or empty */
  TensorView v_low;      /**< V_low, or empty */
  osft_shard_layout_t v_layout =
      OSFT_SHARD_REPLICATED;     /**< REPLICATED, V_COLS or V_ROWS */
  std::vector<int64_t> v_shards; /**< V_COLS: K_p, V_ROWS: r_p of every rank */
};

/** @brief The orthogonality residuals (osft_projector_orthogonality()). */
struct Orthogonality {
  double max_u; /**< max |U_high^T U_low| */
  double max_v; /**< max |V_low V_high^T| */
  /**
   * @brief The larger of the two (NaN if either is NaN).
   * @return max(max_u, max_v).
   */
  double max() const noexcept {
    if (max_u != max_u || max_v != max_v) return max_u + max_v;
    return max_u > max_v ? max_u : max_v;
  }
};

/** @brief What a projector holds and did (osft_projector_get_info()). */
struct ProjectorInfo : osft_projector_info_t {
  /** @brief All fields 0, struct_size set (osft_projector_info_init()). */
  ProjectorInfo() : osft_projector_info_t() {
    detail::check(osft_projector_info_init(this, sizeof(osft_projector_info_t)));
  }
};

/**
 * @brief The OSFT gradient projector (osft_projector_t). Move-only; keeps its
 * context, communicator and registered layers alive.
 */
class Projector {
 public:
  /** @brief An empty object. */
  Projector() noexcept = default;
  /**
   * @brief A one-rank projector (osft_projector_create() with comm NULL).
   * @param ctx   The context.
   * @param opts  The options.
   * @throws Error as osft_projector_create().
   */
  explicit Projector(const Context &ctx,
                     const ProjectorOptions &opts = ProjectorOptions()) {
    osft_projector_t raw = nullptr;
    detail::check(osft_projector_create(ctx.get(), nullptr, &opts, &raw));
    h_ = detail::own(raw, &osft_projector_destroy, ctx.owner());
  }
  /**
   * @brief A projector whose collectives run on `comm` (osft_projector_create()).
   * @param ctx   The context.
   * @param comm  A communicator of the same context.
   * @param opts  The options.
   * @throws Error as osft_projector_create().
   */
  Projector(const Context &ctx, const Comm &comm,
            const ProjectorOptions &opts = ProjectorOptions()) {
    osft_projector_t raw = nullptr;
    detail::check(osft_projector_create(ctx.get(), comm.get(), &opts, &raw));
    h_ = detail::own(raw, &osft_projector_destroy, ctx.owner(), comm.owner());
  }
  /** @brief Moves the handle; the source becomes empty. @param o The source. */
  Projector(Projector &&o) noexcept = default;
  /**
   * @brief Moves the handle, releasing this one's first (the projector before
   * its layers).
   * @param o  The source, left empty.
   * @return *this.
   */
  Projector &operator=(Projector &&o) noexcept {
    if (this != &o) {
      h_.reset();
      layers_ = std::move(o.layers_);
      h_ = std::move(o.h_);
    }
    return *this;
  }
  /** @brief Not copyable. */
  Projector(const Projector &) = delete;
  /** @brief Not copyable. @return never. */
  Projector &operator=(const Projector &) = delete;
  /** @brief Destroys the projector, then releases its layers, comm and context. */
  ~Projector() { h_.reset(); }

  /**
   * @brief The C handle.
   * @return It, or NULL for an empty object.
   */
  osft_projector_t get() const noexcept { return h_.get(); }
  /**
   * @brief Whether the object holds a projector.
   * @return get() != NULL.
   */
  explicit operator bool() const noexcept { return h_ != nullptr; }

  /**
   * @brief Registers a target (osft_projector_add_target()).
   * @param target  The target (tensors borrowed).
   * @return Its index.
   * @throws Error as osft_projector_add_target().
   */
  int64_t add_target(const ProjectionTarget &target) {
    osft_projection_target_t t;
    detail::check(osft_projection_target_init(&t, sizeof t));
    t.u_high = detail::in(target.u_high);
    t.grad_u_low = detail::out(target.grad_u_low, "grad_u_low");
    t.u_low = detail::out(target.u_low, "u_low");
    t.u_layout = target.u_layout;
    t.u_shards = target.u_shards.empty() ? nullptr : target.u_shards.data();
    t.n_u_shards = static_cast<int64_t>(target.u_shards.size());
    t.v_high = detail::in(target.v_high);
    t.grad_v_low = detail::out(target.grad_v_low, "grad_v_low");
    t.v_low = detail::out(target.v_low, "v_low");
    t.v_layout = target.v_layout;
    t.v_shards = target.v_shards.empty() ? nullptr : target.v_shards.data();
    t.n_v_shards = static_cast<int64_t>(target.v_shards.size());
    int64_t index = -1;
    detail::check(osft_projector_add_target(get(), &t, &index));
    return index;
  }
  /**
   * @brief Registers a layer (osft_projector_add_layer()); the projector keeps
   * it alive.
   * @param layer       The layer.
   * @param grad_u_low  dU_low (N x l), or empty.
   * @param grad_v_low  dV_low (l x K), or empty.
   * @return Its index.
   * @throws Error as osft_projector_add_layer().
   */
  int64_t add_layer(const Flinear &layer, const TensorView &grad_u_low,
                    const TensorView &grad_v_low) {
    layers_.reserve(layers_.size() + 1);  // no throw after the registration
    int64_t index = -1;
    detail::check(osft_projector_add_layer(
        get(), layer.get(), detail::out(grad_u_low, "grad_u_low"),
        detail::out(grad_v_low, "grad_v_low"), &index));
    layers_.push_back(layer.owner());
    return index;
  }
  /**
   * @brief Rebinds a target's gradients (osft_projector_set_grads()).
   * @param index       The target.
   * @param grad_u_low  The new dU_low, or empty.
   * @param grad_v_low  The new dV_low, or empty.
   * @throws Error as osft_projector_set_grads().
   */
  void set_grads(int64_t index, const TensorView &grad_u_low,
                 const TensorView &grad_v_low) {
    detail::check(osft_projector_set_grads(get(), index,
                                           detail::out(grad_u_low, "grad_u_low"),
                                           detail::out(grad_v_low, "grad_v_low")));
  }
  /**
   * @brief Runs the pending setup collectives (osft_projector_prepare()).
   * @throws Error as osft_projector_prepare().
   */
  void prepare() { detail::check(osft_projector_prepare(get())); }
  /**
   * @brief The frozen factors changed (osft_projector_invalidate()).
   * @throws Error as osft_projector_invalidate().
   */
  void invalidate() { detail::check(osft_projector_invalidate(get())); }
  /**
   * @brief Projects every registered gradient (osft_projector_project()).
   * @throws Error as osft_projector_project().
   */
  void project() { detail::check(osft_projector_project(get())); }
  /**
   * @brief Projects every registered trainable factor
   * (osft_projector_project_params()).
   * @throws Error as osft_projector_project_params().
   */
  void project_params() { detail::check(osft_projector_project_params(get())); }
  /**
   * @brief The orthogonality residuals (osft_projector_orthogonality()).
   * @return max |U_high^T U_low| and max |V_low V_high^T|.
   * @throws Error as osft_projector_orthogonality().
   */
  Orthogonality orthogonality() {
    Orthogonality o{0.0, 0.0};
    detail::check(osft_projector_orthogonality(get(), &o.max_u, &o.max_v));
    return o;
  }
  /**
   * @brief What the projector holds and did (osft_projector_get_info()).
   * @return The information.
   * @throws Error as osft_projector_get_info().
   */
  ProjectorInfo info() const {
    ProjectorInfo i;
    detail::check(osft_projector_get_info(get(), &i));
    return i;
  }

 private:
  std::vector<std::shared_ptr<osft_flinear_s>> layers_;  // destroyed after h_
  std::shared_ptr<osft_projector_s> h_;
};

// ================================================================ batched QR

/** @brief Options of the batched QR, defaults from osft_qr_options_init(). */
struct QrOptions : osft_qr_options_t {
  /** @brief The defaults (Householder, default thresholds and workers). */
  QrOptions() : osft_qr_options_t() {
    detail::check(osft_qr_options_init(this, sizeof(osft_qr_options_t)));
  }
};

/**
 * @brief The per-matrix outcome of a batched call. A call where some matrices
 * failed numerically is a result, not an exception: the others are written.
 */
struct QrResult {
  std::vector<osft_status_t> status; /**< one per matrix: SUCCESS or NUMERICAL_ERROR */
  std::string message; /**< the library's message when some failed, else "" */
  /**
   * @brief Whether every matrix succeeded.
   * @return true if none failed.
   */
  bool ok() const noexcept { return message.empty(); }
};

/**
 * @brief Batched QR and power iteration on a context (osft_qr_batch(),
 * osft_qr_power_iteration()). The C API has no QR handle: this object holds
 * the context (kept alive) and the options.
 */
class Qr {
 public:
  /**
   * @brief Batched QR on `ctx`.
   * @param ctx   The context.
   * @param opts  The options.
   */
  explicit Qr(const Context &ctx, const QrOptions &opts = QrOptions())
      : ctx_(ctx.owner()), opts_(opts) {}
  /**
   * @brief The options of later calls (modifiable).
   * @return The options.
   */
  QrOptions &options() noexcept { return opts_; }

  /**
   * @brief Thin QR of every a[i] into q[i] (and r[i]) (osft_qr_batch()).
   * @param a  The matrices, m_i x n_i, m_i >= n_i.
   * @param q  The Q outputs, one per matrix; empty: in place over a.
   * @param r  Empty (no R), or one entry per matrix, each empty or n_i x n_i.
   * @return The per-matrix statuses.
   * @throws Error for every failure but per-matrix numerical ones (as
   *   osft_qr_batch()); OSFT_STATUS_SHAPE_MISMATCH for lists of other lengths.
   */
  QrResult batch(const std::vector<TensorView> &a, const std::vector<TensorView> &q,
                 const std::vector<TensorView> &r = {}) const {
    lengths(a, q, "q", !q.empty());
    lengths(a, r, "r", !r.empty());
    const std::vector<const DLTensor *> ca = ins(a);
    const std::vector<DLTensor *> cq = outs(q, "q"), cr = outs(r, "r");
    QrResult res;
    res.status.assign(a.size(), OSFT_STATUS_SUCCESS);
    finish(osft_qr_batch(ctx_.get(), &opts_, a.size(), ca.data(),
                         q.empty() ? nullptr : cq.data(), r.empty() ? nullptr : cr.data(),
                         res.status.data()),
           res);
    return res;
  }
  /**
   * @brief `iterations` steps of q[i] <- qr(a[i] q[i]) (osft_qr_power_iteration()).
   * @param a           Square m_i x m_i matrices.
   * @param q           m_i x n_i starting bases, overwritten.
   * @param iterations  >= 1.
   * @return The per-matrix statuses.
   * @throws Error as batch().
   */
  QrResult power_iteration(const std::vector<TensorView> &a,
                           const std::vector<TensorView> &q, int iterations) const {
    lengths(a, q, "q", true);
    const std::vector<const DLTensor *> ca = ins(a);
    const std::vector<DLTensor *> cq = outs(q, "q");
    QrResult res;
    res.status.assign(a.size(), OSFT_STATUS_SUCCESS);
    finish(osft_qr_power_iteration(ctx_.get(), &opts_, a.size(), ca.data(), cq.data(),
                                   iterations, res.status.data()),
           res);
    return res;
  }

 private:
  static void lengths(const std::vector<TensorView> &a, const std::vector<TensorView> &b,
                      const char *name, bool required) {
    if (required && b.size() != a.size())
      detail::throw_error(OSFT_STATUS_SHAPE_MISMATCH,
                          std::string("osftrt::Qr: ") + name + " has " +
                              std::to_string(b.size()) + " entries, a has " +
                              std::to_string(a.size()));
  }
  static std::vector<const DLTensor *> ins(const std::vector<TensorView> &v) {
    std::vector<const DLTensor *> r(v.size());
    for (size_t i = 0; i < v.size(); ++i) r[i] = detail::in(v[i]);
    return r;
  }
  static std::vector<DLTensor *> outs(const std::vector<TensorView> &v,
                                      const char *name) {
    std::vector<DLTensor *> r(v.size());
    for (size_t i = 0; i < v.size(); ++i) r[i] = detail::out(v[i], name);
    return r;
  }
  static void finish(osft_status_t st, QrResult &res) {
    if (st == OSFT_STATUS_NUMERICAL_ERROR) {
      res.message = osft_last_error();
      return;
    }
    detail::check(st);
  }
  std::shared_ptr<osft_context_s> ctx_;
  QrOptions opts_;
};

}  // namespace osftrt

#endif /* OSFTRT_OSFTRT_HPP */
