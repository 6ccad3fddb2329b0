/* find_cuda_module() for the shared library: the CUDA module is a file of
 * its own, libosftrt_cuda.so.1, opened with dlopen on first use. Where it is
 * looked for, in order:
 *   1. $OSFTRT_CUDA_MODULE, when set: the module's path, or a folder that
 *      holds it (only there);
 *   2. the folder of the libosftrt.so.1 that is running (where the build
 *      and `make install` put it);
 *   3. the dynamic loader's search path (LD_LIBRARY_PATH, the cache).
 * The first file that exists is the one used: when it cannot be loaded
 * (a CUDA library it needs is missing), that reason is reported. */
#include <dlfcn.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "backend/cuda_module.h"
#include "osftrt/version.h"

namespace osft {
namespace {

constexpr const char *kModuleName = "libosftrt_cuda.so.1";

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

/* Opens `file` (a path, or a bare soname for the loader's search) and takes
 * the table from it, or says why not. */
const CudaModule *open_module(const std::string &file, std::string *why) {
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
  auto entry = reinterpret_cast<osftrt_cuda_module_entry_fn>(
      dlsym(handle, OSFTRT_CUDA_MODULE_ENTRY));
  char reason[256] = "";
  const CudaModule *m =
      entry != nullptr ? entry(OSFT_VERSION_NUMBER, reason, sizeof reason) : nullptr;
  if (entry == nullptr) {
    *why = file + " is not a libosftrt CUDA module (no " OSFTRT_CUDA_MODULE_ENTRY ")";
  } else if (m == nullptr) {
    *why = file + ": " + reason;
  } else if (m->version != OSFT_VERSION_NUMBER || m->table_bytes != sizeof(CudaModule)) {
    char buf[160];
    std::snprintf(buf, sizeof buf,
                  ": module version %u (table %u bytes), core %u (%zu bytes)", m->version,
                  m->table_bytes, OSFT_VERSION_NUMBER, sizeof(CudaModule));
    *why = file + buf;
    m = nullptr;
  }
  if (m == nullptr) dlclose(handle);
  return m; /* a loaded module stays for the life of the process */
}

}  // namespace

const CudaModule *find_cuda_module(std::string *why) {
  const char *env = std::getenv("OSFTRT_CUDA_MODULE");
  if (env != nullptr && env[0] != '\0') {
    std::string file = env;
    if (is_folder_name(file)) {
      while (file.size() > 1 && file.back() == '/') file.pop_back();
      file += std::string("/") + kModuleName;
    }
    const CudaModule *m = open_module(file, why);
    if (m == nullptr) *why += " (from OSFTRT_CUDA_MODULE)";
    return m;
  }
  const std::string folder = core_folder();
  if (!folder.empty()) {
    const std::string beside = folder + "/" + kModuleName;
    if (access(beside.c_str(), F_OK) == 0) return open_module(beside, why);
  }
  const CudaModule *m = open_module(kModuleName, why);
  if (m == nullptr && why->find(std::string(kModuleName) + ": " + kModuleName +
                                ": cannot open") != std::string::npos)
    *why = std::string(kModuleName) + " was found neither beside libosftrt (" +
           (folder.empty() ? "?" : folder) +
           ") nor on the loader's search path; install it there or set "
           "OSFTRT_CUDA_MODULE to its path";
  return m;
}

}  // namespace osft
