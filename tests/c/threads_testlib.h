/* What the CPU thread tests share (test_threads.c, test_threads_steady.c):
 * one small call of every capability on one context, at shapes whose
 * element-wise passes and QR lanes reach the library's thread pool (more
 * than two parts' worth of work per pass), with fixed random inputs, and a
 * checksum of every output the round wrote. */
#ifndef OSFTRT_THREADS_TESTLIB_H
#define OSFTRT_THREADS_TESTLIB_H

#include <stdint.h>

#include "osftrt/osftrt.h"
#include "test_tensors.h"

enum { THREADS_QR_COUNT = 4 };

typedef struct {
  osft_context_t ctx;
  /* FLCE: x M x H, W V x H */
  osft_flce_t flce;
  tt *fx, *fw, *fy, *floss, *fgx, *fgw;
  /* OSFT layer N x K, M tokens, bias */
  osft_flinear_t layer;
  tt *lw, *lx, *lb, *ly, *lgy, *lgx, *lgu, *lgs, *lgv, *lgb;
  /* projection of the layer's gradients */
  osft_comm_t comm;
  osft_projector_t proj;
  /* SwiGLU tiled MLP */
  osft_mlp_t mlp;
  tt *mw[3], *mx, *my, *mgy, *mgx, *mgw[3];
  /* batched QR */
  tt *qa[THREADS_QR_COUNT], *qq[THREADS_QR_COUNT], *qr[THREADS_QR_COUNT];
} threads_work;

/* Builds the handles and inputs on `ctx` (inputs from `seed`). */
void threads_work_init(threads_work *w, osft_context_t ctx, unsigned seed);
/* Destroys the handles and tensors (not the context). */
void threads_work_free(threads_work *w);

/* One call of each capability: FLCE (loss, grad_x, grad_W), the OSFT
 * layer's forward and backward, the projection of its gradients, the tiled
 * MLP's forward and backward, the batched QR. Outputs are poisoned first.
 * Fails the test (CMocka) on any error. */
void threads_round(threads_work *w);

/* A hash of the bytes of every output of the last round. */
uint64_t threads_checksum(const threads_work *w);

/* The loss of the last round (for comparisons across thread counts). */
double threads_loss(const threads_work *w);

#endif
