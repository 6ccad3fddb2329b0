/**
 * @file
 * @brief libosftrt — tensors.
 *
 * Every tensor argument is a DLPack DLTensor (from the system's dlpack
 * package, <dlpack/dlpack.h>), borrowed for the duration of the call: the
 * library never keeps a pointer to a DLTensor struct or to its shape/strides
 * arrays after returning, unless a function says otherwise (handles that
 * adopt caller-owned factor tensors document it and copy the descriptor).
 *
 * What every operation checks, before it writes anything:
 * @code{.unparsed}
 *   - the DLTensor pointer (unless documented optional) and, for non-empty
 *     tensors, `data` are non-NULL                -> OSFT_STATUS_INVALID_ARGUMENT
 *   - dtype is one the operation accepts: kDLFloat 32/64/16, kDLBfloat 16,
 *     kDLInt 32/64 for targets; lanes == 1        -> OSFT_STATUS_DTYPE_MISMATCH
 *   - rank and every dimension (shapes are in elements; "any leading dims"
 *     means the leading dims are flattened into rows)
 *                                                 -> OSFT_STATUS_SHAPE_MISMATCH
 *   - strides (in elements; NULL means compact row-major): compact
 *     row-major, or where documented, row-major with a row stride >= the row
 *     length; byte_offset keeps the data aligned to its element size
 *                                                 -> OSFT_STATUS_BAD_LAYOUT
 *   - device: kDLCPU (or pinned kDLCUDAHost) for a CPU context; kDLCUDA (or
 *     kDLCUDAManaged) with device_id equal to the context's for a CUDA
 *     context                                     -> OSFT_STATUS_DEVICE_MISMATCH
 *   - outputs do not overlap inputs or each other where forbidden (address
 *     ranges; column slices of one matrix with the same row stride are
 *     recognized as disjoint)                     -> OSFT_STATUS_ALIASING
 * @endcode
 * Each message names the argument (e.g. "grad_w: shape [4096, 1024], expected
 * [4096, 4096]").
 *
 * @code
 *   float *data = ...;               // 4096 x 1024 floats on the host
 *   int64_t shape[2] = {4096, 1024};
 *   DLTensor w = {0};
 *   w.data = data;
 *   w.device.device_type = kDLCPU;   // device_id 0
 *   w.ndim = 2;
 *   w.dtype.code = kDLFloat;  w.dtype.bits = 32;  w.dtype.lanes = 1;
 *   w.shape = shape;
 *   w.strides = NULL;                // compact row-major
 * @endcode
 *
 * @par Non-finite values (NaN, Inf)
 * Non-finite values. Validation looks at descriptors, not values: no call
 * scans a tensor for NaN or Inf unless its header says so. Where a header does
 * not say otherwise, NaN and Inf in inputs propagate through the arithmetic
 * (IEEE 754) into the outputs, the call returns OSFT_STATUS_SUCCESS and the
 * outputs are written. The calls that refuse non-finite input are listed in
 * flinear.h (decomposition) and qr.h (per matrix); option fields that are
 * floating-point reject NaN (and Inf where the field says "finite") with
 * OSFT_STATUS_INVALID_ARGUMENT before anything is written.
 */
#ifndef OSFTRT_TENSOR_H
#define OSFTRT_TENSOR_H

#include <dlpack/dlpack.h>

/**
 * @defgroup osftrt_tensor Tensors
 * @brief Every tensor argument is a borrowed DLPack DLTensor, checked on every
 * call (osftrt/tensor.h).
 *
 * The checks and the statuses they give are listed in tensor.h.
 */

#endif /* OSFTRT_TENSOR_H */
