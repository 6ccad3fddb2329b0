/* The library's CPU threads (src/core/cpu_blas.h): the process's thread
 * count and where it comes from, the engine told that count, and one pool
 * of persistent worker threads that runs the element-wise passes (OpenBLAS
 * engine) and the batched QR's lanes (both engines).
 *
 * Why a pool: the passes used to start and join std::threads on every call
 * (14,001 thread creations over 14,000 fused-CE calls, 80-120 us a call at
 * 6 x 300). A pool's cost is a wake-up: workers spin for kSpin after a job
 * (back-to-back passes between GEMMs find them awake), then sleep on a
 * futex; a caller wakes only as many as its job has parts, takes parts
 * itself, and does the whole job alone when the workers are slow to come,
 * so a loaded machine never waits for a sleeping thread.
 *
 * The job is one 64-bit word (generation, parts, next part): a thread takes
 * a part with a compare-and-swap on it, so a worker that wakes late for an
 * old job can never take a part of the next one. One job at a time: a call
 * that finds the pool taken (another context's call on another thread, or
 * a part that calls again) runs its parts itself.
 *
 * Fork: the child has none of the parent's workers; a pthread_atfork child
 * handler (registered when the count is first resolved) drops the pool (its memory is
 * leaked: its mutex and words may be held by threads that no longer exist) and the child
 * starts a fresh one on its first parallel call. */
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <thread>

#include "core/cpu_blas.h"
#include "core/logging.h"

namespace osft::blas {
namespace {

/* How long an idle worker (or a caller waiting for its workers) spins
 * before it sleeps: long enough to bridge the GEMM between two passes of
 * one call, short enough not to take a core from the host's own threads
 * between calls (OpenBLAS's idle threads: OPENBLAS_THREAD_TIMEOUT=16,
 * ~20 us, set by the Python package for the same reason). */
constexpr auto kSpin = std::chrono::microseconds(30);

inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

void futex_wait(std::atomic<uint32_t> *word, uint32_t expected) noexcept {
  static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t), "a futex word");
  syscall(SYS_futex, reinterpret_cast<uint32_t *>(word), FUTEX_WAIT_PRIVATE, expected,
          nullptr, nullptr, 0);
}
void futex_wake(std::atomic<uint32_t> *word, int count) noexcept {
  syscall(SYS_futex, reinterpret_cast<uint32_t *>(word), FUTEX_WAKE_PRIVATE, count,
          nullptr, nullptr, 0);
}

/* Spins until pred() or kSpin has passed; returns pred()'s last value. */
template <class Pred>
bool spin_until(const Pred &pred) noexcept {
  const auto deadline = std::chrono::steady_clock::now() + kSpin;
  for (;;) {
    for (int i = 0; i < 64; ++i) {
      if (pred()) return true;
      cpu_relax();
    }
    if (std::chrono::steady_clock::now() >= deadline) return pred();
  }
}

/* ------------------------------------------------------------- the count */

/* "4" or "4,2" (OMP_NUM_THREADS's nesting list: the outer level): the
 * count, or 0 when unset or not a positive integer (logged). */
int env_count(const char *name) {
  const char *v = std::getenv(name);
  if (v == nullptr || *v == '\0') return 0;
  char *end = nullptr;
  const long n = std::strtol(v, &end, 10);
  if (end == v || (*end != '\0' && *end != ',') || n < 1) {
    log_message(OSFT_LOG_WARN, "%s=\"%s\" is not a positive thread count; ignored", name,
                v);
    return 0;
  }
  return static_cast<int>(std::min<long>(n, kMaxThreads));
}

int affinity_count() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return std::min(n, kMaxThreads);
  }
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  return static_cast<int>(std::clamp<long>(online, 1, kMaxThreads));
}

/* The count without an explicit one, resolved once (the environment is not
 * read again: a host's later setenv would race with getenv). */
int automatic_count() {
  static const int n = [] {
    for (const char *name : {"OSFTRT_NUM_THREADS", "OMP_NUM_THREADS", threads_env()}) {
      if (const int c = env_count(name)) {
        log_message(OSFT_LOG_INFO, "CPU threads: %d (%s)", c, name);
        return c;
      }
    }
    const int c = affinity_count();
    log_message(OSFT_LOG_INFO, "CPU threads: %d (the CPUs of the process's affinity)", c);
    return c;
  }();
  return n;
}

/* What the engine's count is guarded by. Rebuilt in a forked child. */
struct EngineState {
  std::mutex mutex;
  int serial_holders = 0; /* SerialBlas objects alive */
};

EngineState *engine_state() {
  static EngineState *state = new EngineState(); /* never destroyed */
  return state;
}

std::atomic<int> g_explicit{0}; /* 0: none */
std::atomic<bool> g_forked{false};
std::atomic<int> g_count{0}; /* in effect; 0: not resolved (yet, or since a fork) */

/* Resolves the count and tells the engine; with the engine state locked. */
int resolve_locked(const EngineState &s) {
  const int e = g_explicit.load(std::memory_order_relaxed);
  const int n = e > 0 ? e : automatic_count();
  if (s.serial_holders == 0) set_threads(n);
  g_count.store(n, std::memory_order_release);
  return n;
}

void on_fork_child() noexcept;

int resolve_slow() {
  static std::once_flag atfork;
  std::call_once(atfork, [] { pthread_atfork(nullptr, nullptr, on_fork_child); });
  EngineState *s = engine_state();
  std::lock_guard<std::mutex> lock(s->mutex);
  const int n = g_count.load(std::memory_order_acquire);
  return n > 0 ? n : resolve_locked(*s);
}

/* --------------------------------------------------------------- the pool */

using PartFn = FunctionRef<void(int)>;

/* The job word: generation (32 bits), parts (16), next part to take (16). */
constexpr uint64_t pack(uint32_t gen, uint32_t parts, uint32_t next) {
  return uint64_t{gen} << 32 | uint64_t{parts} << 16 | next;
}
constexpr uint32_t parts_of(uint64_t w) {
  return static_cast<uint32_t>(w >> 16) & 0xffffu;
}
constexpr uint32_t next_of(uint64_t w) {
  return static_cast<uint32_t>(w) & 0xffffu;
}
static_assert(kMaxThreads < 0xffff, "parts fit the job word");

struct Pool {
  alignas(64) std::atomic<uint64_t> job{0};
  std::atomic<const PartFn *> fn{nullptr};
  alignas(64) std::atomic<uint32_t> epoch{0}; /* bumped per job: sleepers' futex */
  std::atomic<int> sleepers{0};
  alignas(64) std::atomic<uint32_t> remaining{0}; /* parts of the job not finished */
  std::atomic<int> caller_sleeping{0};
  alignas(64) std::atomic<bool> taken{false};
  /* Only the thread that holds `taken` writes these (workers is read by
   * pool_workers() too). */
  uint32_t generation = 0;
  std::atomic<int> workers{0};
  bool start_failed = false;
};

std::atomic<Pool *> g_pool{nullptr};

/* Takes and runs parts of the job in `w` (re-read as it changes) until
 * none is left: of whichever job the word holds by then. */
void take_parts(Pool &pool, uint64_t w) noexcept {
  for (;;) {
    if (next_of(w) >= parts_of(w)) return;
    if (!pool.job.compare_exchange_weak(w, w + 1, std::memory_order_acq_rel,
                                        std::memory_order_acquire))
      continue; /* w was reloaded */
    /* The word still held this job when the part was taken, and the job
     * cannot end before the part does: fn is this job's. */
    const PartFn *fn = pool.fn.load(std::memory_order_acquire);
    (*fn)(static_cast<int>(next_of(w)));
    if (pool.remaining.fetch_sub(1, std::memory_order_acq_rel) == 1 &&
        pool.caller_sleeping.load(std::memory_order_seq_cst) != 0)
      futex_wake(&pool.remaining, 1);
    w = pool.job.load(std::memory_order_acquire);
  }
}

void worker_main(Pool *pool) noexcept {
  sigset_t all;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, nullptr); /* the host's signals go to its threads */
  pthread_setname_np(pthread_self(), "osftrt-worker");
  for (;;) {
    const uint32_t seen = pool->epoch.load(std::memory_order_acquire);
    take_parts(*pool, pool->job.load(std::memory_order_acquire));
    if (spin_until([&] { return pool->epoch.load(std::memory_order_acquire) != seen; }))
      continue;
    pool->sleepers.fetch_add(1, std::memory_order_seq_cst);
    if (pool->epoch.load(std::memory_order_seq_cst) == seen)
      futex_wait(&pool->epoch, seen);
    pool->sleepers.fetch_sub(1, std::memory_order_seq_cst);
  }
}

void on_fork_child() noexcept {
  /* Only this thread exists now. The old pool's words and the engine
   * state's mutex may be held by threads that are gone: leak both. */
  g_pool.store(nullptr, std::memory_order_relaxed);
  g_forked.store(true, std::memory_order_relaxed);
  new (engine_state()) EngineState();
  g_count.store(0, std::memory_order_relaxed); /* re-resolve and re-tell the engine */
}

Pool *the_pool() {
  Pool *p = g_pool.load(std::memory_order_acquire);
  if (p != nullptr) return p;
  num_threads(); /* registers the fork handler */
  Pool *fresh = new (std::nothrow) Pool();
  if (fresh == nullptr) return nullptr;
  Pool *expected = nullptr;
  if (g_pool.compare_exchange_strong(expected, fresh, std::memory_order_acq_rel))
    return fresh;
  delete fresh; /* another thread made it first */
  return expected;
}

/* Starts workers up to count - 1 (the caller is the count's last thread). */
void start_workers(Pool &pool, int count) noexcept {
  while (pool.workers.load(std::memory_order_relaxed) < count - 1 && !pool.start_failed) {
    try {
      std::thread(worker_main, &pool).detach();
      pool.workers.fetch_add(1, std::memory_order_relaxed);
    } catch (...) {
      pool.start_failed = true; /* run with the workers there are */
      log_message(OSFT_LOG_WARN, "CPU threads: could not start a worker; using %d",
                  pool.workers.load() + 1);
    }
  }
}

void run_here(int parts, PartFn part) {
  for (int p = 0; p < parts; ++p) part(p);
}

}  // namespace

int num_threads() noexcept {
  const int n = g_count.load(std::memory_order_acquire);
  return n > 0 ? n : resolve_slow();
}

void set_num_threads(int n) noexcept {
  EngineState *s = engine_state();
  std::lock_guard<std::mutex> lock(s->mutex);
  g_explicit.store(n, std::memory_order_relaxed);
  resolve_locked(*s);
}

int pool_workers() noexcept {
  const Pool *p = g_pool.load(std::memory_order_acquire);
  return p == nullptr ? 0 : p->workers.load(std::memory_order_relaxed);
}

void run_parts(int parts, PartFn part) {
  if (parts <= 1) return run_here(parts, part);
  Pool *pool = the_pool();
  if (pool == nullptr || pool->taken.exchange(true, std::memory_order_acquire))
    return run_here(parts, part);
  start_workers(*pool, num_threads());
  const int workers = pool->workers.load(std::memory_order_relaxed);
  if (workers == 0) {
    pool->taken.store(false, std::memory_order_release);
    return run_here(parts, part);
  }
  const uint32_t gen = ++pool->generation;
  pool->fn.store(&part, std::memory_order_relaxed);
  pool->remaining.store(static_cast<uint32_t>(parts), std::memory_order_relaxed);
  const uint64_t w = pack(gen, static_cast<uint32_t>(parts), 0);
  pool->job.store(w, std::memory_order_release);
  pool->epoch.fetch_add(1, std::memory_order_seq_cst);
  if (pool->sleepers.load(std::memory_order_seq_cst) > 0)
    futex_wake(&pool->epoch, std::min(parts - 1, workers));
  take_parts(*pool, w);
  /* Wait for the parts that workers took. */
  auto done = [pool] { return pool->remaining.load(std::memory_order_acquire) == 0; };
  if (!spin_until(done)) {
    for (;;) {
      pool->caller_sleeping.store(1, std::memory_order_seq_cst);
      const uint32_t r = pool->remaining.load(std::memory_order_seq_cst);
      if (r == 0) break;
      futex_wait(&pool->remaining, r);
    }
    pool->caller_sleeping.store(0, std::memory_order_relaxed);
  }
  pool->taken.store(false, std::memory_order_release);
}

void parallel_for_pool(int64_t n, int64_t grain,
                       FunctionRef<void(int64_t, int64_t)> body) {
  const int64_t parts = std::max<int64_t>(
      1, std::min<int64_t>(num_threads(), n / std::max<int64_t>(grain, 1)));
  if (parts == 1) return body(0, n);
  const int64_t share = (n + parts - 1) / parts;
  run_parts(static_cast<int>(parts), [&](int p) {
    const int64_t begin = p * share, end = std::min(n, begin + share);
    if (begin < end) body(begin, end);
  });
}

bool forked_child() noexcept {
  return g_forked.load(std::memory_order_relaxed);
}

SerialBlas::SerialBlas() {
  num_threads(); /* resolved, so the destructor has a count to give back */
  EngineState *s = engine_state();
  std::lock_guard<std::mutex> lock(s->mutex);
  if (s->serial_holders++ == 0) set_threads(1);
}

SerialBlas::~SerialBlas() {
  EngineState *s = engine_state();
  std::lock_guard<std::mutex> lock(s->mutex);
  /* (a SerialBlas alive across a fork finds the child's count at 0) */
  if (s->serial_holders > 0 && --s->serial_holders == 0)
    set_threads(std::max(1, g_count.load()));
}

}  // namespace osft::blas
