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
 *               testable without a GPU (same numbers as DEV_HOST);
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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train.h"

#ifdef OSFTRT_TRAIN_CUDA
#include <cuda_runtime.h>
#endif

static dev_mode_t mode_now = DEV_HOST;

void dev_select(dev_mode_t mode) {
#ifndef OSFTRT_TRAIN_CUDA
  if (mode == DEV_CUDA) train_fail("--device cuda: this trainer was built without CUDA");
#endif
  mode_now = mode;
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
  return xcalloc(bytes ? bytes : 1, 1);
}

void dev_free_bytes(void *p) {
  if (p == NULL) return;
#ifdef OSFTRT_TRAIN_CUDA
  if (mode_now == DEV_CUDA) {
    cuda_check(cudaFree(p), "cudaFree");
    return;
  }
#endif
  free(p);
}

/* rows x width bytes between two pitched layouts; `up`: host -> dev. */
static void copy_2d(void *dst, size_t dpitch, const void *src, size_t spitch,
                    size_t width, size_t rows, int up) {
  if (rows == 0 || width == 0) return;
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
  if (b->own_dev) dev_free_bytes(b->dev);
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
