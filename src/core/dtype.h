/* Internal: the element types libosftrt computes with, and their mapping
 * from DLPack's DLDataType. C-callable. */
#ifndef OSFTRT_SRC_CORE_DTYPE_H
#define OSFTRT_SRC_CORE_DTYPE_H

#include "core/core_api.h"
#include <stddef.h>

#include <dlpack/dlpack.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One bit per dtype, so an operation can state what it accepts as a mask. */
typedef enum osfti_dtype_e {
  OSFTI_DTYPE_INVALID = 0,
  OSFTI_F32 = 1 << 0,
  OSFTI_F64 = 1 << 1,
  OSFTI_F16 = 1 << 2,
  OSFTI_BF16 = 1 << 3,
  OSFTI_I32 = 1 << 4,
  OSFTI_I64 = 1 << 5
} osfti_dtype_t;

#define OSFTI_FLOATS (OSFTI_F32 | OSFTI_F64 | OSFTI_F16 | OSFTI_BF16)
#define OSFTI_INTS (OSFTI_I32 | OSFTI_I64)

/* OSFTI_DTYPE_INVALID for anything else (including lanes != 1). */
osfti_dtype_t osfti_dtype_from_dl(DLDataType dtype);

/* Bytes per element; 0 for OSFTI_DTYPE_INVALID. */
OSFT_CORE_API size_t osfti_dtype_size(osfti_dtype_t dtype);

/* "float32", "bfloat16", "int64", ...; "invalid" otherwise. */
OSFT_CORE_API const char *osfti_dtype_name(osfti_dtype_t dtype);

/* Writes the names in `mask` as "float32 or bfloat16" into buf. */
void osfti_dtype_mask_names(unsigned mask, char *buf, size_t size);

#ifdef __cplusplus
}
#endif

#endif
