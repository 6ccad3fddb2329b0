/* Internal: carving several scratch buffers out of the context's single
 * workspace. An operation plans every buffer first and allocates once, so
 * it grows the workspace at most once and fails (out of memory) before it
 * writes anything. */
#ifndef OSFTRT_SRC_CORE_SCRATCH_H
#define OSFTRT_SRC_CORE_SCRATCH_H

#include <cstddef>
#include <cstdint>

#include "core/matrix_view.h"
#include "core/context_impl.h"
#include "core/error.h"

namespace osft {

class ScratchPlan {
 public:
  /* Alignment of every buffer: what cuBLAS and vector loads like. */
  static constexpr size_t alignment = 256;

  /* Reserves a rows x cols matrix of `dtype`; returns its slot. */
  int add_mat(int64_t rows, int64_t cols, osfti_dtype_t dtype) {
    return add(static_cast<size_t>(rows * cols) * osfti_dtype_size(dtype), rows, cols,
               dtype);
  }
  size_t bytes() const noexcept { return total_; }

  /* Takes the workspace (throws OSFT_STATUS_OUT_OF_MEMORY) and returns the
   * views of every slot, compact row-major. */
  void allocate(Context &ctx) { base_ = static_cast<char *>(workspace(ctx, total_)); }

  Mat mat(int slot) const noexcept {
    const Slot &s = slots_[slot];
    return Mat{base_ + s.offset, s.rows, s.cols, s.cols, s.dtype};
  }

 private:
  struct Slot {
    size_t offset;
    int64_t rows, cols;
    osfti_dtype_t dtype;
  };
  static constexpr int max_slots = 16;

  int add(size_t bytes, int64_t rows, int64_t cols, osfti_dtype_t dtype) {
    if (count_ == max_slots)
      raise(OSFT_STATUS_INTERNAL_ERROR, "scratch: too many buffers");
    total_ = (total_ + alignment - 1) / alignment * alignment;
    slots_[count_] = Slot{total_, rows, cols, dtype};
    total_ += bytes;
    return count_++;
  }

  Slot slots_[max_slots] = {};
  int count_ = 0;
  size_t total_ = 0;
  char *base_ = nullptr;
};

}  // namespace osft

#endif
