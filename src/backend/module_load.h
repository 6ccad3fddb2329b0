/* Internal: opening an optional backend module of the shared library (the
 * CUDA module libosftrt_cuda.so.1, src/backend/cuda_module.h; the MPI
 * module libosftrt_mpi.so.1, src/comm/comm_mpi_module.h) with dlopen.
 *
 * Every module exports one entry function (ModuleEntry) that checks the
 * core's version and returns its table, which starts with a ModuleHeader.
 * Where it is looked for, in order:
 *   1. $ENV (e.g. OSFTRT_CUDA_MODULE), when set: the module's path, or a
 *      folder that holds it (only there);
 *   2. the folder of the libosftrt.so.1 that is running (where the build,
 *      `cmake --install` and the Python wheel put it);
 *   3. the dynamic loader's search path (LD_LIBRARY_PATH, the cache).
 * The first file that exists is the one used: when it cannot be loaded (a
 * library it needs is missing), that reason is reported. */
#ifndef OSFTRT_SRC_BACKEND_MODULE_LOAD_H
#define OSFTRT_SRC_BACKEND_MODULE_LOAD_H

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>

#include "osftrt/version.h"

namespace osft {

/* The first members of every module's table. */
struct ModuleHeader {
  uint32_t version;     /* OSFT_VERSION_NUMBER of the module's build */
  uint32_t table_bytes; /* sizeof its table in the module's build */
};

/* A module's exported entry: its table, after checking that the core
 * asking is of its own version (core_version: the core's
 * OSFT_VERSION_NUMBER); nullptr on a mismatch, with the reason in
 * why[0..why_bytes). */
using ModuleEntry = const ModuleHeader *(*)(uint32_t core_version, char *why,
                                            size_t why_bytes);

/* For a module's entry: whether the core asking is of the module's own
 * version; if not, why[0..why_bytes) says which versions met. Inline: the
 * module needs it before it may call into the core. */
inline bool module_version_matches(uint32_t core_version, char *why, size_t why_bytes) {
  if (core_version == OSFT_VERSION_NUMBER) return true;
  if (why != nullptr && why_bytes > 0)
    std::snprintf(why, why_bytes,
                  "the module is libosftrt %u.%u.%u's, the core asking is %u.%u.%u: "
                  "install both from one build",
                  OSFT_VERSION_MAJOR, OSFT_VERSION_MINOR, OSFT_VERSION_PATCH,
                  core_version / 10000, core_version / 100 % 100, core_version % 100);
  return false;
}

/* What to open: the file name (libosftrt_cuda.so.1), the environment
 * variable that may name it, and the entry's symbol. */
struct ModuleSpec {
  const char *file;
  const char *env;
  const char *entry;
};

/* Opens the module and returns its table, checked to be of this core's
 * version and of `table_bytes`; or nullptr with the reason in *why. A
 * module once returned stays loaded for the life of the process. */
const ModuleHeader *open_module(const ModuleSpec &spec, size_t table_bytes,
                                std::string *why);

/* A module's table, found on first use and kept for the process: the one
 * place the core loads a module (the CUDA module: backend/cuda_module.cpp,
 * the MPI module: comm/comm_mpi_module.cpp). Thread-safe; a failure is
 * retried on the next call. Once loaded, a call is one atomic load: the
 * CUDA forwarders ask for the table on every kernel launch. */
template <class Table>
class LoadedModule {
 public:
  using Find = const Table *(*)(std::string *why);
  explicit LoadedModule(Find find) noexcept : find_(find) {}

  /* The table, or nullptr with the reason in *why; *now: this call found
   * it (or failed to). */
  const Table *load(std::string *why, bool *now) {
    *now = false;
    if (const Table *t = table_.load(std::memory_order_acquire)) return t;
    std::lock_guard<std::mutex> hold(lock_);
    const Table *t = table_.load(std::memory_order_relaxed);
    if (t != nullptr) return t;
    *now = true;
    t = find_(why);
    table_.store(t, std::memory_order_release);
    return t;
  }
  /* The table if an earlier call loaded it, else nullptr; never loads. */
  const Table *loaded() const noexcept { return table_.load(std::memory_order_acquire); }

 private:
  Find find_;
  std::mutex lock_;
  std::atomic<const Table *> table_{nullptr};
};

}  // namespace osft

#endif
