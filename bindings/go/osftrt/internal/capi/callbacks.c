/* C side of callbacks.go: trampolines from libosftrt's callbacks into Go. */
#include <stdint.h>
#include <osftrt/osftrt.h>

#include "_cgo_export.h"

static int64_t numel(const DLTensor *t) {
  int64_t n = 1;
  for (int i = 0; i < t->ndim; ++i) n *= t->shape[i];
  return n;
}

static osft_status_t cb_allreduce(void *user, DLTensor *buf) {
  return (osft_status_t)osftgoAllreduce((uintptr_t)user, (char *)buf->data + buf->byte_offset,
                                        buf->dtype.code, buf->dtype.bits, numel(buf));
}

static osft_status_t cb_allgather(void *user, const DLTensor *send, DLTensor *recv,
                                  const int64_t *counts, int64_t n_counts) {
  return (osft_status_t)osftgoAllgather(
      (uintptr_t)user, (char *)send->data + send->byte_offset,
      (char *)recv->data + recv->byte_offset, send->dtype.code, send->dtype.bits, numel(send),
      numel(recv), (int64_t *)counts, n_counts);
}

static osft_status_t cb_barrier(void *user) { return (osft_status_t)osftgoBarrier((uintptr_t)user); }

static void cb_release(void *user) { osftgoRelease((uintptr_t)user); }

void osftgo_fill_callbacks(osft_comm_callbacks_t *cb, uintptr_t user, int rank, int size,
                           int barrier) {
  cb->user = (void *)user;
  cb->rank = rank;
  cb->size = size;
  cb->allreduce_sum = cb_allreduce;
  cb->allgather = cb_allgather;
  cb->barrier = barrier ? cb_barrier : NULL;
  cb->release = cb_release;
}

static void log_trampoline(void *user, osft_log_level_t level, const char *message) {
  (void)user;
  osftgoLog((int)level, (char *)message);
}

osft_status_t osftgo_set_log(int on, int max_level) {
  return osft_set_log_callback(on ? log_trampoline : NULL, NULL, (osft_log_level_t)max_level);
}
