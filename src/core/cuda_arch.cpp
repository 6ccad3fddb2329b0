/* Matching a GPU's compute capability against the built architectures. */
#include "core/cuda_arch.h"

#include <cctype>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

/* One entry of the list, e.g. "90", "90a", "86-real", "80-virtual". */
bool entry_runs(const std::string &entry, int major, int minor) {
  if (entry == "native" || entry == "all" || entry == "all-major") return true;
  size_t digits = 0;
  while (digits < entry.size() && std::isdigit(static_cast<unsigned char>(entry[digits])))
    ++digits;
  if (digits < 2) return false;
  const int cc = std::atoi(entry.substr(0, digits).c_str());
  std::string rest = entry.substr(digits);
  const char suffix = rest.empty() ? '\0' : rest[0];
  if (suffix == 'a' || suffix == 'f') rest = rest.substr(1);
  const bool sass = rest != "-virtual";
  const bool ptx = rest != "-real";
  const int built_major = cc / 10, built_minor = cc % 10, device = major * 10 + minor;
  if (suffix == 'a') return device == cc;                                 /* sm_90a */
  if (suffix == 'f') return major == built_major && minor >= built_minor; /* a family */
  if (sass && major == built_major && minor >= built_minor) return true;
  return ptx && device >= cc;
}

}  // namespace

extern "C" int osfti_cuda_arch_supported(const char *archs, int major, int minor) {
  if (archs == nullptr) return 0;
  std::string entry;
  for (const char *p = archs;; ++p) {
    if (*p == ',' || *p == ';' || *p == ' ' || *p == '\0') {
      if (!entry.empty() && entry_runs(entry, major, minor)) return 1;
      entry.clear();
      if (*p == '\0') return 0;
    } else {
      entry += *p;
    }
  }
}
