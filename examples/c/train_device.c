/*
 * osftrt_train — where the tensors handed to libosftrt live.
 *
 * The trainer's own math (embedding, RMSNorm, residual adds, the head's
 * factor gradients, AdamW/SOAP) is host C code. A tensor that libosftrt
 * reads or writes is a mirrored buffer (dbuf_t): a host side for that code
 * and a device side for the library, copied around each library call. The
 * mode is chosen once, at start:
 *   DEV_HOST    dev == host, copies are no-ops: the plain CPU path;
 *   DEV_STAGED  dev is a second host allocation, copies are memcpy, the
 *               context is a CPU context: the staging logic of the GPU path,
 *               testable without a GPU (same numbers as DEV_HOST). The
 *               trainer's device memory lies in one guarded range that is
 *               readable only inside a library call (CHECK) or a copy, so
 *               host code that reads a device pointer, which would crash on
 *               a GPU, faults here too. (The library's own memory is not
 *               guarded: on a CPU context its tensors' data and its host
 *               metadata come from the same allocator.)
 *   DEV_CUDA    dev is cudaMalloc'ed (or library memory of a CUDA context),
 *               copies are cudaMemcpy2D (only when built with
 *               OSFTRT_TRAIN_CUDA).
 * The library's own memory (an OSFT layer's factors) is a device side the
 * trainer mirrors on the host where its C code needs it.
 *
 * Ordering on CUDA: the context runs on the legacy default stream and
 * cudaMemcpy2D is issued on it, so every copy waits for the library's
 * earlier work, and a download has finished when it returns.
 */
#define _DEFAULT_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "train.h"

#ifdef OSFTRT_TRAIN_CUDA
#include <cuda_runtime.h>
#endif

static dev_mode_t mode_now = DEV_HOST;

/* ------------------------------------------ DEV_STAGED's guarded memory */

/* One reserved address range, handed out in whole pages (a freed block is
 * reused for the next request of the same size, zeroed); [base, base+top)
 * is PROT_NONE except while `open_depth` > 0. The trainer's main thread
 * is its only user. */
typedef struct {
  size_t off, bytes;
} arena_block_t;
static struct {
  char *base;
  size_t reserved, top, page;
  int open_depth;
  arena_block_t free_list[4096];
  int nfree;
} arena;

static void arena_protect(size_t off, size_t bytes, int readable) {
  if (bytes && mprotect(arena.base + off, bytes,
                        readable ? PROT_READ | PROT_WRITE : PROT_NONE) != 0)
    train_fail("staged device memory: mprotect failed");
}

/* A fault inside the range: host code touched device memory. */
static void arena_fault(int sig, siginfo_t *info, void *uctx) {
  (void)uctx;
  const char *a = (const char *)info->si_addr;
  if (arena.base != NULL && a >= arena.base && a < arena.base + arena.reserved) {
    static const char msg[] =
        "osftrt_train: --device staged: host code touched device memory outside "
        "a libosftrt call or a copy (on a GPU this reads an invalid pointer)\n";
    ssize_t w = write(2, msg, sizeof msg - 1);
    (void)w;
    _exit(4);
  }
  signal(sig, SIG_DFL); /* any other fault: the default action */
  raise(sig);
}

static void arena_reserve(void) {
  arena.page = (size_t)sysconf(_SC_PAGESIZE);
  arena.reserved = (size_t)8 << 30; /* address space only (PROT_NONE, no reserve) */
  void *p = mmap(NULL, arena.reserved, PROT_NONE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) train_fail("--device staged: cannot reserve address space");
  arena.base = p;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = arena_fault;
  sa.sa_flags = SA_SIGINFO;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGSEGV, &sa, NULL);
}

static size_t arena_round(size_t bytes) {
  return (bytes + arena.page - 1) / arena.page * arena.page;
}

/* A freed block of the same size, else new pages at the top. */
static void *arena_alloc(size_t bytes) {
  const size_t size = arena_round(bytes);
  size_t off = arena.top;
  int i = 0;
  while (i < arena.nfree && arena.free_list[i].bytes != size) ++i;
  if (i < arena.nfree) {
    off = arena.free_list[i].off;
    arena.free_list[i] = arena.free_list[--arena.nfree];
  } else if (arena.top + size <= arena.reserved) {
    arena.top += size;
  } else {
    return NULL;
  }
  arena_protect(off, size, arena.open_depth > 0);
  return arena.base + off;
}

static void arena_free(void *p, size_t bytes) {
  const size_t size = arena_round(bytes);
  const size_t off = (size_t)((char *)p - arena.base);
  madvise(p, size, MADV_DONTNEED); /* zero-filled when next handed out */
  arena_protect(off, size, 0);     /* touched outside a library call: faults */
  if (arena.nfree < (int)(sizeof arena.free_list / sizeof arena.free_list[0]))
    arena.free_list[arena.nfree++] = (arena_block_t){off, size};
}

void dev_guard_open(void) {
  if (mode_now != DEV_STAGED) return;
  if (arena.open_depth++ == 0) arena_protect(0, arena.top, 1);
}

void dev_guard_close(void) {
  if (mode_now != DEV_STAGED) return;
  if (--arena.open_depth == 0) arena_protect(0, arena.top, 0);
}

void dev_select(dev_mode_t mode) {
#ifndef OSFTRT_TRAIN_CUDA
  if (mode == DEV_CUDA) train_fail("--device cuda: this trainer was built without CUDA");
#endif
  mode_now = mode;
  if (mode == DEV_STAGED && arena.base == NULL) arena_reserve();
}

dev_mode_t dev_current(void) {
  return mode_now;
}

osft_device_type_t dev_context_type(void) {
  return mode_now == DEV_CUDA ? OSFT_DEVICE_CUDA : OSFT_DEVICE_CPU;
}

#ifdef OSFTRT_TRAIN_CUDA
static void cuda_check(cudaError_t err, const char *what) {
  if (err != cudaSuccess)
    train_fail("CUDA error in %s: %s", what, cudaGetErrorString(err));
}
#endif

void *dev_malloc_bytes(size_t bytes) {
  if (mode_now == DEV_HOST) train_fail("dev_malloc_bytes in host mode");
#ifdef OSFTRT_TRAIN_CUDA
  if (mode_now == DEV_CUDA) {
    void *p = NULL;
    cuda_check(cudaMalloc(&p, bytes ? bytes : 1), "cudaMalloc");
    cuda_check(cudaMemset(p, 0, bytes), "cudaMemset");
    return p;
  }
#endif
  void *p = arena_alloc(bytes ? bytes : 1);
  if (p == NULL) train_fail("--device staged: out of staged device memory");
  return p;
}

void dev_free_bytes(void *p, size_t bytes) {
  if (p == NULL) return;
#ifdef OSFTRT_TRAIN_CUDA
  if (mode_now == DEV_CUDA) {
    cuda_check(cudaFree(p), "cudaFree");
    return;
  }
#endif
  arena_free(p, bytes ? bytes : 1);
}

/* rows x width bytes between two pitched layouts; `up`: host -> dev. */
static void copy_2d(void *dst, size_t dpitch, const void *src, size_t spitch,
                    size_t width, size_t rows, int up) {
  if (rows == 0 || width == 0) return;
  dev_guard_open();
#ifdef OSFTRT_TRAIN_CUDA
  if (mode_now == DEV_CUDA) {
    cuda_check(cudaMemcpy2D(dst, dpitch, src, spitch, width, rows,
                            up ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost),
               up ? "upload" : "download");
    return;
  }
#else
  (void)up;
#endif
  for (size_t i = 0; i < rows; ++i)
    memcpy((char *)dst + i * dpitch, (const char *)src + i * spitch, width);
  dev_guard_close();
}

void dev_upload_bytes(void *dev, const void *host, size_t bytes) {
  if (mode_now != DEV_HOST && dev != host) copy_2d(dev, bytes, host, bytes, bytes, 1, 1);
}

static void dbuf_shape(dbuf_t *b, int64_t rows, int64_t cols, int64_t ld) {
  memset(b, 0, sizeof *b);
  b->rows = rows;
  b->cols = cols;
  b->ld = ld;
  b->bytes = sizeof(float) * (size_t)(rows > 0 ? (rows - 1) * ld + cols : 0);
}

void dbuf_alloc(dbuf_t *b, int64_t rows, int64_t cols) {
  dbuf_shape(b, rows, cols, cols);
  b->host = xcalloc((size_t)(rows * cols), sizeof(float));
  b->own_host = 1;
  b->dev = mode_now == DEV_HOST ? (void *)b->host : dev_malloc_bytes(b->bytes);
  b->own_dev = mode_now != DEV_HOST;
}

void dbuf_mirror_host(dbuf_t *b, float *host, int64_t rows, int64_t cols, int64_t ld) {
  dbuf_shape(b, rows, cols, ld);
  b->host = host;
  b->dev = mode_now == DEV_HOST ? (void *)host : dev_malloc_bytes(b->bytes);
  b->own_dev = mode_now != DEV_HOST;
}

void dbuf_mirror_dev(dbuf_t *b, void *dev, int64_t rows, int64_t cols, int64_t ld) {
  dbuf_shape(b, rows, cols, ld);
  b->dev = dev;
  if (mode_now == DEV_HOST) {
    b->host = dev;
    return;
  }
  b->host = xcalloc(b->bytes / sizeof(float) + 1, sizeof(float));
  b->own_host = 1;
  dbuf_download(b);
}

void dbuf_free(dbuf_t *b) {
  if (b->own_dev) dev_free_bytes(b->dev, b->bytes);
  if (b->own_host) free(b->host);
  memset(b, 0, sizeof *b);
}

void dbuf_upload_rows(const dbuf_t *b, int64_t rows) {
  if (b->dev == (void *)b->host) return;
  const size_t pitch = sizeof(float) * (size_t)b->ld;
  copy_2d(b->dev, pitch, b->host, pitch, sizeof(float) * (size_t)b->cols, (size_t)rows,
          1);
}

void dbuf_download_rows(const dbuf_t *b, int64_t rows) {
  if (b->dev == (void *)b->host) return;
  const size_t pitch = sizeof(float) * (size_t)b->ld;
  copy_2d(b->host, pitch, b->dev, pitch, sizeof(float) * (size_t)b->cols, (size_t)rows,
          0);
}

void dbuf_upload(const dbuf_t *b) {
  dbuf_upload_rows(b, b->rows);
}

void dbuf_download(const dbuf_t *b) {
  dbuf_download_rows(b, b->rows);
}

void tview_dev(tview_t *v, const dbuf_t *b, int64_t rows) {
  tview_mat(v, (float *)b->dev, rows, b->cols, b->ld);
  v->t.device.device_type = mode_now == DEV_CUDA ? kDLCUDA : kDLCPU;
}

void tview_dev_vec(tview_t *v, const dbuf_t *b) {
  tview_dev(v, b, 1);
  v->t.ndim = 1;
  v->shape[0] = b->cols;
  v->strides[0] = 1;
}
