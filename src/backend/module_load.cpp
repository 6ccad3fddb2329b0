/* open_module() of src/backend/module_load.h. */
#include "backend/module_load.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "osftrt/version.h"

namespace osft {
namespace {

/* The folder of the file this function was loaded from ("" if unknown). */
std::string core_folder() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void *>(&core_folder), &info) == 0 ||
      info.dli_fname == nullptr)
    return "";
  const std::string path = info.dli_fname;
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash);
}

bool is_folder_name(const std::string &path) {
  return !path.empty() &&
         (path.back() == '/' || access((path + "/.").c_str(), F_OK) == 0);
}

/* Opens `file` (a path, or a bare name for the loader's search) and takes
 * the table from it, or says why not. */
const ModuleHeader *open_file(const std::string &file, const ModuleSpec &spec,
                              size_t table_bytes, std::string *why) {
  void *handle = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char *e = dlerror();
    *why =
        std::string("cannot load ") + file + ": " + (e != nullptr ? e : "dlopen failed");
    if (why->find("OSFTRT_CORE_PRIVATE") != std::string::npos)
      *why += " (the module comes from another build than this libosftrt " +
              std::string(osft_version_string()) + ")";
    return nullptr;
  }
  auto entry = reinterpret_cast<ModuleEntry>(dlsym(handle, spec.entry));
  char reason[256] = "";
  const ModuleHeader *m =
      entry != nullptr ? entry(OSFT_VERSION_NUMBER, reason, sizeof reason) : nullptr;
  if (entry == nullptr) {
    *why = file + " is not a libosftrt module (no " + spec.entry + ")";
  } else if (m == nullptr) {
    *why = file + ": " + reason;
  } else if (m->version != OSFT_VERSION_NUMBER || m->table_bytes != table_bytes) {
    char buf[160];
    std::snprintf(buf, sizeof buf,
                  ": module version %u (table %u bytes), core %u (%zu bytes)", m->version,
                  m->table_bytes, OSFT_VERSION_NUMBER, table_bytes);
    *why = file + buf;
    m = nullptr;
  }
  if (m == nullptr) dlclose(handle);
  return m;
}

}  // namespace

const ModuleHeader *open_module(const ModuleSpec &spec, size_t table_bytes,
                                std::string *why) {
  const char *env = std::getenv(spec.env);
  if (env != nullptr && env[0] != '\0') {
    std::string file = env;
    if (is_folder_name(file)) {
      while (file.size() > 1 && file.back() == '/') file.pop_back();
      file += std::string("/") + spec.file;
    }
    const ModuleHeader *m = open_file(file, spec, table_bytes, why);
    if (m == nullptr) *why += std::string(" (from ") + spec.env + ")";
    return m;
  }
  const std::string folder = core_folder();
  if (!folder.empty()) {
    const std::string beside = folder + "/" + spec.file;
    if (access(beside.c_str(), F_OK) == 0)
      return open_file(beside, spec, table_bytes, why);
  }
  const ModuleHeader *m = open_file(spec.file, spec, table_bytes, why);
  const std::string not_found =
      std::string(spec.file) + ": " + spec.file + ": cannot open";
  if (m == nullptr && why->find(not_found) != std::string::npos)
    *why = std::string(spec.file) + " was found neither beside libosftrt (" +
           (folder.empty() ? "?" : folder) +
           ") nor on the loader's search path; install it there or set " + spec.env +
           " to its path";
  return m;
}

}  // namespace osft
