"""NVIDIA Emerging-Optimizers' SOAP (``emerging-optimizers`` on PyPI,
``emerging_optimizers.soap.SOAP``) with every parameter's eigenbasis refresh
in one batched call per step -- the idea of its PR 118, which batched the
QRs by shape and was not merged.

>>> from osftrt.integrations.soap import SOAP        # instead of emerging_optimizers.soap.SOAP
>>> opt = SOAP(model.parameters(), lr=3e-4)           # same arguments, same state, same trajectory

Stock SOAP refreshes each parameter's two eigenbases Q_L, Q_R by power
iteration, ``Q = torch.linalg.qr(K @ Q).Q`` (``utils.eig.orthogonal_iteration``),
one matrix after another: on a CPU each small QR is overhead and one
thread's work, on a GPU one kernel launch sequence per matrix. Here the step
is the stock step split in three passes over the parameters: (1) each
parameter's Kronecker factors, first-moment projection and eigenbasis sort,
exactly as stock; (2) one :func:`osftrt.power_iteration` over every
(Kronecker factor, sorted eigenbasis) pair of the step, all shapes mixed,
spread over the library's workers; (3) each parameter's Adam update in the
new basis, exactly as stock. Parameters are independent, so the passes do
what the per-parameter loop did; only the QR is computed elsewhere (LAPACK
Householder with diag(R) >= 0 instead of ``torch.linalg.qr``'s signs: a
column's sign does not change SOAP's update, whose second moment is
squared and whose first moment is re-projected at every refresh).

A Kronecker factor is often singular (a gradient of shape m x n with n < m
gives L = G G^T of rank <= n; rows no gradient reached): its product K Q is
rank-deficient, and torch's QR returns a Q anyway. The library does the same
(Householder QR is defined for any finite matrix) and counts them in
``refresh_stats["rank_deficient"]``; a product with NaN or Inf (a gradient
that overflowed) raises :class:`osftrt.NumericalError` naming the parameter,
where stock SOAP would carry NaN into the eigenbasis silently.

The first step's refresh uses ``eigh`` (as stock), and so does every step
with ``use_eigh=True``: those are not batched. ``stream_list`` is accepted
for signature compatibility and unused (the batched call replaces the
round-robin streams).
"""
from __future__ import annotations

import time
from functools import partial

import torch

import osftrt

try:
    from emerging_optimizers import utils as _eo_utils
    from emerging_optimizers.scalar_optimizers import update_functions as _eo_update
    from emerging_optimizers.soap import soap as _eo_soap
    from emerging_optimizers.soap import soap_utils as _eo_soap_utils
except ImportError as e:  # pragma: no cover - exercised where the package is absent
    raise ImportError("osftrt.integrations.soap needs NVIDIA's emerging-optimizers (pip install emerging-optimizers; "
                      "Python >= 3.12)") from e

__all__ = ["SOAP", "batched_eigenbasis_refresh"]


def batched_eigenbasis_refresh(kronecker_factors, eigenbases, power_iter_steps=1, *, context=None,
                               max_concurrency=0, names=None):
    """Q_i <- qr(K_i Q_i), power_iter_steps times, for every pair of the
    lists in one library call; returns the new eigenbases (fp32, fresh
    tensors) and the per-pair rank-deficiency flags. names (optional, one
    per pair) name a failed pair in the NumericalError."""
    qs = [q.detach().to(torch.float32).contiguous().clone() for q in eigenbases]
    ks = [k.detach().to(torch.float32).contiguous() for k in kronecker_factors]
    try:
        st = osftrt.power_iteration(ks, qs, iterations=int(power_iter_steps), context=context,
                                    max_concurrency=max_concurrency)
    except osftrt.NumericalError as e:
        which = [names[i] if names else str(i) for i in e.failed]
        raise osftrt.NumericalError(e.status, "SOAP eigenbasis refresh: %s (%s); the step was not completed"
                                    % (", ".join(which), e.message)) from e
    return qs, st.rank_deficient


class SOAP(_eo_soap.SOAP):
    """``emerging_optimizers.soap.SOAP`` with the eigenbasis refresh of all
    parameters batched into one :func:`osftrt.power_iteration` per step.
    Same constructor arguments (plus ``context`` and ``max_concurrency`` for
    the library call), same state dict, same updates up to fp32 rounding of
    the QR. ``refresh_stats`` holds the last step's {"pairs",
    "rank_deficient", "seconds"} (the batched call's wall time)."""

    def __init__(self, params, lr, *args, context=None, max_concurrency=0, **kwargs):
        super().__init__(params, lr, *args, **kwargs)
        self._osftrt_context = context
        self._osftrt_max_concurrency = int(max_concurrency)
        self.refresh_stats = {"pairs": 0, "rank_deficient": 0, "seconds": 0.0}

    @torch.no_grad()
    def step(self, closure=None):
        if closure is not None:
            raise ValueError("closure is not supported")
        for group in self.param_groups:
            self._init_group(group)

        # pass 1: Kronecker factors, exp_avg back to the original basis, sort
        work = []  # (group, p, state, grad, curr_iter, eigenbasis_list or None (eigh done), exp_avg)
        pairs_k, pairs_q, names = [], [], []
        for gi, group in enumerate(self.param_groups):
            for pi, p in enumerate(group["params"]):
                if p.grad is None:
                    continue
                grad = p.grad.to(torch.float32)
                state = self.state[p]
                curr_iter_1_based = state["step"] + 1
                kronecker_factor_list = [state["L"], state["R"]]
                eigenbasis_list = [state["Q_L"], state["Q_R"]]
                if not self.use_kl_shampoo:
                    update_fn = _eo_soap.update_kronecker_factors
                else:
                    update_fn = partial(_eo_soap.update_kronecker_factors_kl_shampoo, eigenbasis_list=eigenbasis_list,
                                        eps=group["eps"])
                shampoo_beta = group["shampoo_beta"]
                if self.correct_shampoo_beta_bias:
                    shampoo_beta = 1 - (1 - shampoo_beta) / (1 - shampoo_beta**curr_iter_1_based)
                with _eo_utils.fp32_matmul_precision(self.fp32_matmul_prec):
                    update_fn(kronecker_factor_list=kronecker_factor_list, grad=grad, shampoo_beta=shampoo_beta)
                use_eigh = self.use_eigh if state["step"] != 0 else True
                with _eo_utils.fp32_matmul_precision(self.qr_fp32_matmul_prec):
                    if use_eigh:  # stock, per parameter
                        updated, exp_avg, exp_avg_sq = _eo_soap.update_eigenbasis_and_exp_avgs(
                            kronecker_factor_list=kronecker_factor_list, eigenbasis_list=eigenbasis_list,
                            exp_avg_sq=state["exp_avg_sq"], exp_avg=state["exp_avg"], use_eigh=True,
                            power_iter_steps=self.power_iter_steps)
                        state["Q_L"], state["Q_R"] = updated
                        state["exp_avg"], state["exp_avg_sq"] = exp_avg, exp_avg_sq
                        work.append((group, p, state, grad, curr_iter_1_based, None, None))
                        continue
                    exp_avg = _eo_soap.precondition(state["exp_avg"], eigenbasis_list, dims=[[0], [1]])
                    sorted_list, exp_avg_sq = _eo_soap_utils.sort_eigenbasis_by_approx_eigvals(
                        kronecker_factor_list, eigenbasis_list, state["exp_avg_sq"])
                state["exp_avg_sq"] = exp_avg_sq
                work.append((group, p, state, grad, curr_iter_1_based, len(pairs_k), exp_avg))
                for side, (k, q) in enumerate(zip(kronecker_factor_list, sorted_list)):
                    pairs_k.append(k)
                    pairs_q.append(q)
                    names.append("param_groups[%d][%d] (%s, %s)" % (gi, pi, "L" if side == 0 else "R",
                                                                  "x".join(map(str, p.shape))))

        # pass 2: every refresh of the step in one call
        t0 = time.perf_counter()
        new_q, deficient = batched_eigenbasis_refresh(pairs_k, pairs_q, self.power_iter_steps,
                                                      context=self._osftrt_context,
                                                      max_concurrency=self._osftrt_max_concurrency,
                                                      names=names) if pairs_k else ([], [])
        self.refresh_stats = {"pairs": len(pairs_k), "rank_deficient": int(sum(deficient)),
                              "seconds": time.perf_counter() - t0}

        # pass 3: exp_avg into the new basis, weight decay, the Adam update
        for group, p, state, grad, curr_iter_1_based, first, exp_avg in work:
            if first is not None:
                updated = [new_q[first].to(state["Q_L"].dtype), new_q[first + 1].to(state["Q_R"].dtype)]
                with _eo_utils.fp32_matmul_precision(self.qr_fp32_matmul_prec):
                    state["exp_avg"] = _eo_soap.precondition(exp_avg, updated, dims=[[0], [0]])
                state["Q_L"], state["Q_R"] = updated
            eigenbasis_list = [state["Q_L"], state["Q_R"]]
            self._apply_weight_decay_inplace(p, grad, group["lr"], group["weight_decay"])
            with _eo_utils.fp32_matmul_precision(self.fp32_matmul_prec):
                grad_projected = _eo_soap.precondition(grad, eigenbasis_list=eigenbasis_list, dims=[[0], [0]])
            adam_update = _eo_update.calculate_adam_update(
                grad_projected, state["exp_avg"], state["exp_avg_sq"], betas=group["betas"], eps=group["eps"],
                correct_bias=self.correct_bias, nesterov=self.nesterov, step=curr_iter_1_based)
            with _eo_utils.fp32_matmul_precision(self.fp32_matmul_prec):
                precond_update = _eo_soap.precondition(adam_update, eigenbasis_list=eigenbasis_list, dims=[[0], [1]])
            _eo_soap._clip_update_rms_in_place(precond_update, self.max_update_rms)
            p.add_(precond_update, alpha=-group["lr"])
            state["step"] += 1
        return None
