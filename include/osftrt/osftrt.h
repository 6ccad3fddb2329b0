/**
 * @file
 * @brief libosftrt — the OSFT fine-tuning runtime. Include this one header.
 *
 * A stable C ABI (C11; no C++ or CUDA types in any public header) around a
 * C++ core with CPU (OpenBLAS/LAPACK) and CUDA (cuBLAS, cuSOLVER, NCCL)
 * backends. Conventions shared by every function:
 *
 *   - Names: functions and types osft_*, macros and enum values OSFT_*.
 *   - Handles are opaque pointers, created and destroyed in pairs; destroy
 *     accepts NULL.
 *   - Every fallible call returns osft_status_t; osft_last_error() gives a
 *     thread-local message naming the argument and the reason
 *     (osftrt/status.h). On failure nothing the caller passed is modified.
 *   - Options structs begin with `size_t struct_size` and are initialized by
 *     an *_init(ptr, sizeof *ptr) function or its OSFT_*_INIT(ptr) macro, so
 *     fields can be appended without breaking compiled callers (ABI.md).
 *   - Tensors are DLPack DLTensors (osftrt/tensor.h), checked on every call.
 *   - A context is used by one thread at a time; distinct contexts are
 *     independent (osftrt/context.h).
 *
 * @par Stable section
 * Stable section: everything reachable from this header is part of the
 * OSFTRT_1.0 ABI and is append-only.
 *
 * @code
 *   #include <osftrt/osftrt.h>
 *
 *   osft_context_options_t o;
 *   OSFT_CONTEXT_OPTIONS_INIT(&o);  // a CPU context with the defaults
 *   osft_context_t ctx;
 *   if (osft_context_create(&ctx, &o) != OSFT_STATUS_SUCCESS) {
 *     fputs(osft_last_error(), stderr);
 *     return 1;
 *   }
 *   // ... create handles on ctx, compute, destroy the handles ...
 *   osft_context_destroy(ctx);
 * @endcode
 */
#ifndef OSFTRT_OSFTRT_H
#define OSFTRT_OSFTRT_H

#include "osftrt/export.h"
#include "osftrt/status.h"
#include "osftrt/version.h"
#include "osftrt/log.h"
#include "osftrt/tensor.h"
#include "osftrt/context.h"
#include "osftrt/flce.h"
#include "osftrt/flinear.h"
#include "osftrt/mlp.h"
#include "osftrt/comm.h"
#include "osftrt/projection.h"
#include "osftrt/qr.h"

/**
 * @defgroup osftrt_api libosftrt
 * @brief The whole public API: include osftrt/osftrt.h (conventions in
 * osftrt.h).
 *
 * One group per header: @ref osftrt_status, @ref osftrt_export,
 * @ref osftrt_version, @ref osftrt_log, @ref osftrt_tensor,
 * @ref osftrt_context, @ref osftrt_flce, @ref osftrt_flinear,
 * @ref osftrt_mlp, @ref osftrt_comm, @ref osftrt_projection and
 * @ref osftrt_qr.
 */

/**
 * @mainpage libosftrt API reference
 *
 * libosftrt — the OSFT fine-tuning runtime: a stable C ABI for the hot loops
 * of LLM fine-tuning. Include osftrt/osftrt.h; its description (osftrt.h)
 * states the conventions every function follows, and @ref osftrt_api lists
 * one group per header. C++ programs may include osftrt/osftrt.hpp instead:
 * a header-only C++17 layer over the same functions (@ref osftrt_cpp).
 */

#endif /* OSFTRT_OSFTRT_H */
