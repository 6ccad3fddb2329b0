#include "core/dtype.h"

#include <cstdio>

extern "C" osfti_dtype_t osfti_dtype_from_dl(DLDataType dt) {
  if (dt.lanes != 1) return OSFTI_DTYPE_INVALID;
  switch (dt.code) {
    case kDLFloat:
      if (dt.bits == 32) return OSFTI_F32;
      if (dt.bits == 64) return OSFTI_F64;
      if (dt.bits == 16) return OSFTI_F16;
      break;
    case kDLBfloat:
      if (dt.bits == 16) return OSFTI_BF16;
      break;
    case kDLInt:
      if (dt.bits == 32) return OSFTI_I32;
      if (dt.bits == 64) return OSFTI_I64;
      break;
    default: break;
  }
  return OSFTI_DTYPE_INVALID;
}

extern "C" size_t osfti_dtype_size(osfti_dtype_t dtype) {
  switch (dtype) {
    case OSFTI_F32:
    case OSFTI_I32: return 4;
    case OSFTI_F64:
    case OSFTI_I64: return 8;
    case OSFTI_F16:
    case OSFTI_BF16: return 2;
    case OSFTI_DTYPE_INVALID: break;
  }
  return 0;
}

extern "C" const char *osfti_dtype_name(osfti_dtype_t dtype) {
  switch (dtype) {
    case OSFTI_F32: return "float32";
    case OSFTI_F64: return "float64";
    case OSFTI_F16: return "float16";
    case OSFTI_BF16: return "bfloat16";
    case OSFTI_I32: return "int32";
    case OSFTI_I64: return "int64";
    case OSFTI_DTYPE_INVALID: break;
  }
  return "invalid";
}

extern "C" void osfti_dtype_mask_names(unsigned mask, char *buf, size_t size) {
  size_t used = 0;
  if (size == 0) return;
  buf[0] = '\0';
  for (unsigned bit = OSFTI_F32; bit <= OSFTI_I64; bit <<= 1) {
    if ((mask & bit) == 0) continue;
    int n = std::snprintf(buf + used, size - used, "%s%s", used ? " or " : "",
                          osfti_dtype_name(static_cast<osfti_dtype_t>(bit)));
    if (n < 0 || static_cast<size_t>(n) >= size - used) return;
    used += static_cast<size_t>(n);
  }
}
