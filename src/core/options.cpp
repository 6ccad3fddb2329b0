#include "core/options.h"

namespace osft {

void check_struct_size(const char *arg, const char *type, size_t struct_size,
                       size_t v1_size) {
  if (struct_size < v1_size)
    raise(OSFT_STATUS_INVALID_STRUCT_SIZE,
          "%s->struct_size: %zu is smaller than the 1.0 layout of %s (%zu "
          "bytes); initialize it with its *_init function",
          arg, struct_size, type, v1_size);
}

}  // namespace osft
