/* Internal: the MLP's own kernels (the fused activation and its
 * derivative), a table per backend like backend/linalg_backend.h; the
 * activation math is in backend/mlp_activation.h. Kernels never validate:
 * arguments arrive checked. */
#ifndef OSFTRT_SRC_BACKEND_MLP_BACKEND_H
#define OSFTRT_SRC_BACKEND_MLP_BACKEND_H

#include "backend/linalg_backend.h"
#include "backend/mlp_activation.h"
#include "core/context_impl.h"

namespace osft {

/* Every view has the same rows x cols and dtype (f32 or bf16); rows may be
 * padded (each view its own ld). g == nullptr means the plain (ungated)
 * MLP. Outputs may be the very view of an input (element-wise in place):
 * each element's inputs are read before any of its outputs is written. */
struct MlpKernels {
  /* h = act(g) * u (gated), or h = act(u) (plain). h may be g or u. */
  void (*activate)(Context &ctx, mlp::Activation act, const Mat *g, const Mat &u,
                   const Mat &h);

  /* One pass from the upstream gradient dh:
   *   gated: dg = dh * u * act'(g), du = dh * act(g), h = act(g) * u
   *   plain: du = dh * act'(u), h = act(u)
   * h == nullptr: h is not written (dg is nullptr exactly when g is). h may
   * be u, dg may be g, du may be dh. */
  void (*activate_backward)(Context &ctx, mlp::Activation act, const Mat *g, const Mat &u,
                            const Mat &dh, const Mat *h, const Mat *dg, const Mat &du);
};

const MlpKernels &cpu_mlp_kernels() noexcept;
/* Throws OSFT_STATUS_NOT_SUPPORTED in builds without CUDA. */
const MlpKernels &cuda_mlp_kernels();

inline const MlpKernels &mlp_kernels(Context &ctx) {
  return on_cuda(ctx) ? cuda_mlp_kernels() : cpu_mlp_kernels();
}

}  // namespace osft

#endif
