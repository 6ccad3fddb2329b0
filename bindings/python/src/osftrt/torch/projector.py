"""The OSFT gradient and parameter projection of a PyTorch model:
:class:`OSFTProjector` (one batched library call for every layer, at most one
collective), and its hooks that run it inside ``loss.backward()`` and
``optimizer.step()``."""
from __future__ import annotations

import weakref

import torch
import torch.nn as nn

from .. import Communicator, capi
from ._common import context_for, detached
from .linear import OSFTLinear

__all__ = ["OSFTProjector"]

_LAYOUTS = {
    None: capi.OSFT_SHARD_REPLICATED,
    "replicated": capi.OSFT_SHARD_REPLICATED,
    "u_rows": capi.OSFT_SHARD_U_ROWS,
    "v_rows": capi.OSFT_SHARD_V_ROWS,
    "v_cols": capi.OSFT_SHARD_V_COLS,
    "cols": capi.OSFT_SHARD_V_COLS,
}


#: osft_projection_arithmetic_t by name (include/osftrt/projection.h)
ARITHMETICS = {
    "auto": capi.OSFT_PROJECTION_ARITHMETIC_AUTO,
    "exact": capi.OSFT_PROJECTION_ARITHMETIC_EXACT,
    "fp32": capi.OSFT_PROJECTION_ARITHMETIC_FP32,
    "bf16": capi.OSFT_PROJECTION_ARITHMETIC_BF16,
}


def _arithmetic(name):
    if name not in ARITHMETICS:
        raise ValueError(f"arithmetic: {name!r}; one of {', '.join(ARITHMETICS)}")
    return ARITHMETICS[name]


def _layout(kind, layout):
    """"rows" means U's rows for U and V_high's rows for V."""
    if layout == "rows":
        return capi.OSFT_SHARD_U_ROWS if kind == "u" else capi.OSFT_SHARD_V_ROWS
    return _LAYOUTS[layout]


class _ProjectionHooks:
    """What :class:`OSFTProjector` and
    :class:`~osftrt.torch.distributed.ShardedOSFTProjector` share to run
    their projections by themselves: the hook handles (:meth:`detach`), the
    once-per-backward callback that projects the gradients, the optimizer
    step hooks and the context manager. A subclass sets ``self._hooks = []``
    and provides ``project_gradients()``, ``project_parameters()``,
    ``close()`` and ``_factors()`` (the trainable factors: an optimizer that
    holds one of them is followed)."""

    #: True: the gradient projection is queued again from inside the final
    #: callbacks of the backward, so that it runs after every callback queued
    #: during it (FSDP2's reduce-scatter finalization, DDP's finalize_backward)
    _after_final_callbacks = False
    _backward_queued = False

    def detach(self):
        for h in self._hooks:
            h.remove()
        self._hooks = []

    def _on_grad(self, grad):
        if not self._backward_queued:
            self._backward_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(
                self._requeue if self._after_final_callbacks else self._after_backward
            )
        return grad

    def _requeue(self):
        torch.autograd.Variable._execution_engine.queue_callback(self._after_backward)

    def _after_backward(self):
        self._backward_queued = False
        self.project_gradients()

    def _hook_steps(self, optimizer, *, gradients):
        """The hooks on `optimizer`'s steps (None: on the steps of any
        optimizer that holds one of the factors): the parameter projection
        after every step and, with `gradients`, the gradient projection
        before it. Appended to self._hooks."""
        if optimizer is None:
            self._hooks += _around_any_step(self, gradients)
            return
        before = self.project_gradients if gradients else None
        self._hooks += _around_step(optimizer, before, self.project_parameters)

    def _owns(self, optimizer):
        ids = {id(p) for p in self._factors()}
        return any(id(p) in ids for g in optimizer.param_groups for p in g["params"])

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


class OSFTProjector(_ProjectionHooks):
    """Keeps OSFT updates orthogonal to the frozen subspace.

    ``OSFTProjector(model)`` registers every OSFTLinear of the model;
    after ``loss.backward()`` call :meth:`project_gradients` (one batched
    library call for all layers, at most one all-reduce), after
    ``optimizer.step()`` :meth:`project_parameters`. :meth:`orthogonality`
    gives (max|U_high^T U_low|, max|V_low V_high^T|). Or call :meth:`attach`
    once and both run by themselves, in a plain loop or under
    ``transformers.Trainer``.

    comm: None (one rank), "torch" (torch.distributed, default group), a
    torch.distributed group, or an :class:`osftrt.Communicator`. Sharded
    factors (FSDP-style) are registered with :meth:`add_target`.
    arithmetic: how the coefficients enter each update ("auto", the
    default: follows each tensor's dtype, one bf16 GEMM for bf16 factors on a
    GPU and the exact update for fp32 ones; "exact", "fp32", "bf16"; see
    osft_projection_arithmetic_t in include/osftrt/projection.h).
    """

    def __init__(self, model=None, *, comm=None, context=None, check_consistency=True, arithmetic="auto"):
        self._context = context
        self._modules = []
        self._targets = []  # (index, module or None)
        self._grad_keys = {}
        self._comm = None
        self._handle = None
        self._comm_arg = comm
        self._check = check_consistency
        self._arithmetic = _arithmetic(arithmetic)
        self._hooks = []
        self.projections = {"gradients": 0, "parameters": 0}
        if model is not None:
            mods = [model] if isinstance(model, OSFTLinear) else [m for m in (model.modules() if isinstance(model, nn.Module) else model) if isinstance(m, OSFTLinear)]
            for m in mods:
                self.add_module(m)

    def _ensure(self, like):
        if self._handle is None:
            self._context = self._context or context_for(like, None)
            c = self._comm_arg
            if c is None:
                self._comm = None
            elif isinstance(c, Communicator):
                self._comm = c
            elif c == "torch":
                self._comm = Communicator.torch_distributed(self._context)
            else:
                self._comm = Communicator.torch_distributed(self._context, group=c)
            o = capi.osft_projector_options_t()
            o.check_consistency = 1 if self._check else 0
            o.arithmetic = self._arithmetic
            self._handle = capi.osft_projector_create(self._context.handle, self._comm.handle if self._comm else None, o)
        return self._handle

    def add_module(self, m: OSFTLinear):
        h = self._ensure(m.u_low)
        t = capi.osft_projection_target_t()
        t.u_high, t.u_low, t.v_high, t.v_low = m.u_high.detach(), m.u_low.detach(), m.v_high.detach(), m.v_low.detach()
        idx = capi.osft_projector_add_target(h, t)
        self._targets.append((idx, m))
        self._modules.append(m)
        return idx

    def add_target(
        self,
        *,
        u_high=None,
        u_low=None,
        grad_u_low=None,
        u_layout=None,
        u_shards=None,
        v_high=None,
        v_low=None,
        grad_v_low=None,
        v_layout=None,
        v_shards=None,
    ):
        """Registers explicit (possibly sharded) tensors. Layouts: None or
        "replicated"; U: "rows" (u_shards = every rank's rows of U); V:
        "rows" (v_shards = every rank's rows of V_high) or "cols" (columns).
        Returns the target's index."""
        like = next(t for t in (u_high, v_high) if t is not None)
        h = self._ensure(like)
        t = capi.osft_projection_target_t()
        if u_high is not None:
            t.u_high, t.u_low, t.grad_u_low = detached(u_high), detached(u_low), detached(grad_u_low)
            t.u_layout = _layout("u", u_layout)
            if u_shards is not None:
                t.u_shards = list(u_shards)
                t.n_u_shards = len(u_shards)
        if v_high is not None:
            t.v_high, t.v_low, t.grad_v_low = detached(v_high), detached(v_low), detached(grad_v_low)
            t.v_layout = _layout("v", v_layout)
            if v_shards is not None:
                t.v_shards = list(v_shards)
                t.n_v_shards = len(v_shards)
        idx = capi.osft_projector_add_target(h, t)
        self._targets.append((idx, None))
        return idx

    def set_grads(self, index, grad_u_low=None, grad_v_low=None):
        capi.osft_projector_set_grads(self._handle, index, detached(grad_u_low), detached(grad_v_low))
        self._grad_keys[index] = (None if grad_u_low is None else grad_u_low.data_ptr(), None if grad_v_low is None else grad_v_low.data_ptr())

    def _bind_grads(self):
        for idx, m in self._targets:
            if m is None:
                continue
            gu, gv = m.u_low.grad, m.v_low.grad
            key = (None if gu is None else gu.data_ptr(), None if gv is None else gv.data_ptr())
            if self._grad_keys.get(idx) != key:
                self.set_grads(idx, gu, gv)

    @torch.no_grad()
    def project_gradients(self):
        """dU_low -= U_high U_high^T dU_low, dV_low -= dV_low V_high^T V_high
        for every registered layer, in one call (in place on .grad)."""
        if self._handle is None:
            return
        self._bind_grads()
        capi.osft_projector_project(self._handle)
        self.projections["gradients"] += 1

    @torch.no_grad()
    def project_parameters(self):
        """The same projection on U_low, V_low (call after optimizer.step())."""
        if self._handle is None:
            return
        capi.osft_projector_project_params(self._handle)
        self.projections["parameters"] += 1
        for m in self._modules:  # written behind torch's version counters
            m.factors_changed()

    def orthogonality(self):
        """(max|U_high^T U_low|, max|V_low V_high^T|) over every target and rank."""
        if self._handle is None:
            return (0.0, 0.0)
        return tuple(capi.osft_projector_orthogonality(self._handle))

    def prepare(self):
        capi.osft_projector_prepare(self._handle)

    def invalidate(self):
        capi.osft_projector_invalidate(self._handle)

    def info(self):
        i = capi.osft_projector_info_t()
        capi.osft_projector_get_info(self._handle, i)
        return {
            k: getattr(i, k)
            for k in ("targets", "reduced_elements", "collectives_per_project", "coefficient_bytes", "gathered_bytes", "setup_pending",
                      # what the last project()/project_params() did (library 1.2)
                      "last_gemms", "last_gemm_calls", "last_elementwise_calls", "last_collectives", "last_host_waits")
        }

    # --- hooks: no extra calls in the user's loop -------------------------------
    def attach(self, optimizer=None, *, gradients="step"):
        """Runs the projections by themselves from now on:

        * the gradient projection once before every ``step()``
          (``gradients="step"``, the default: under gradient accumulation it
          is paid once per optimizer step, not per micro-batch, and it is
          exact, the projection being linear: projecting the sum equals
          summing the projections), or at the end of every ``backward()``
          that reaches an OSFT factor (``"backward"``: gradient clipping then
          sees the projected gradients, whose norm is at most the
          unprojected one's);
        * the parameter projection after every ``step()``;

        of `optimizer`, or, when `optimizer` is None, of any optimizer that
        updates a registered factor (so an optimizer that
        ``transformers.Trainer`` creates later is covered too). Returns self;
        :meth:`detach` removes the hooks. ``projections`` counts the calls.
        """
        if gradients not in ("step", "backward"):
            raise ValueError("gradients must be 'step' or 'backward'")
        self.detach()
        if gradients == "backward":
            for m in self._modules:
                for p in (m.u_low, m.v_low):
                    self._hooks.append(p.register_hook(self._on_grad))
        self._hook_steps(optimizer, gradients=gradients == "step")
        return self

    def _factors(self):
        return [p for m in self._modules for p in (m.u_low, m.v_low)]

    def close(self):
        self.detach()
        if self._handle is not None:
            self._handle.close()
            self._handle = None
        if self._comm is not None and self._comm is not self._comm_arg:
            self._comm.close()
        self._comm = None


class _Removable:
    def __init__(self, remove):
        self.remove = remove


def _around_step(optimizer, before, after):
    """before() (unless None) and after() around every optimizer.step():
    the optimizer's own hooks on torch >= 2.0, one wrapped step on 1.13
    (which has neither hook). Returns the handles."""
    if hasattr(optimizer, "register_step_pre_hook"):
        hooks = []
        if before is not None:
            hooks.append(optimizer.register_step_pre_hook(lambda *unused: before()))
        hooks.append(optimizer.register_step_post_hook(lambda opt, args, kwargs: after()))
        return hooks
    step = optimizer.step

    def wrapped(*a, **k):
        if before is not None:
            before()
        out = step(*a, **k)
        after()
        return out

    optimizer.step = wrapped
    return [_Removable(lambda: optimizer.__dict__.pop("step", None))]


def _around_any_step(projector, gradients):
    """Torch's global optimizer hooks (torch >= 2.0) for the steps of any
    optimizer that holds one of the projector's factors (an optimizer that
    ``transformers.Trainer`` creates later included): the parameter
    projection after the step and, with `gradients`, the gradient projection
    before it. Hold the projector weakly. Returns the handles."""
    try:
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
    except ImportError as e:  # torch 1.13
        raise RuntimeError("attach() without an optimizer needs torch >= 2.0; pass the optimizer") from e
    ref = weakref.ref(projector)
    owners = weakref.WeakKeyDictionary()

    def owner(optimizer):
        p = ref()
        if p is None:
            return None
        owns = owners.get(optimizer)
        if owns is None:
            owns = owners[optimizer] = p._owns(optimizer)
        return p if owns else None

    def pre(optimizer, args, kwargs):
        p = owner(optimizer)
        if p is not None:
            p.project_gradients()

    def post(optimizer, args, kwargs):
        p = owner(optimizer)
        if p is not None:
            p.project_parameters()

    handles = [register_optimizer_step_pre_hook(pre)] if gradients else []
    return handles + [register_optimizer_step_post_hook(post)]
