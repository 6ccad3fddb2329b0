"""OSFT under ``torch.distributed``: PyTorch FSDP2 (``fully_shard``) and DDP.

>>> import osftrt.torch as ot
>>> from osftrt.torch.distributed import prepare_fsdp2, shard_aware_projector
>>> ot.convert_linear_layers(model, names, rank_ratio=0.5)   # 1. convert
>>> prepare_fsdp2(model)                                     # 2. frozen factors -> frozen parameters
>>> for layer in model.layers: fully_shard(layer)            # 3. shard (any FSDP2 policy,
>>> fully_shard(model)                                       #    MixedPrecisionPolicy included)
>>> opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
>>> proj = shard_aware_projector(model).attach(opt)          # 4. projections run by themselves

* :func:`prepare_fsdp2` turns each :class:`~osftrt.torch.OSFTLinear`'s
  frozen factors (``u_high``, ``s_high``, ``v_high``; buffers by default)
  into parameters with ``requires_grad=False``. FSDP2 shards only
  parameters: without it every rank keeps the whole frozen subspace (about
  the size of the dense weight) and ``MixedPrecisionPolicy`` casts the
  trainable factors but not the frozen ones (the layer needs all six in one
  dtype). Convert before ``fully_shard``: a model that is already sharded
  cannot be converted (its weights are DTensors).
* :class:`ShardedOSFTProjector` (:func:`shard_aware_projector`) projects
  the gradients and the parameters of every OSFT layer of an FSDP2, DDP or
  plain model in one batched library call. It reads each factor's layout
  from its DTensor placement (``Shard(0)`` of the FSDP2 mesh, uneven and
  empty shards included, or replicated) and registers this rank's local
  shards: ``U`` sharded by rows -> one all-reduce of the coefficients of
  all layers per projection; ``V_high`` sharded by its singular-vector rows
  -> gathered once (cached), projected locally, no collective per step (a
  replicated ``V_high`` with row-sharded ``V_low`` is registered the same
  way, over row slices of V_high). S is never projected. Gradients are re-bound when FSDP2 gives them new storage
  (cheap data-pointer check); parameters are re-registered if their storage
  moves (``load_state_dict(assign=True)``, ``to_empty``).

FSDP2 support needs torch >= 2.7 (:data:`MIN_TORCH_FSDP2`): below it
:func:`prepare_fsdp2`, and the projector on sharded factors, raise a
RuntimeError that says so. A DDP-wrapped or unsharded model needs no FSDP2.

When the projections run (:meth:`ShardedOSFTProjector.attach`):
``gradients="step"`` (default) projects the gradients in an optimizer
step pre-hook -- after FSDP2's reduce-scatter or DDP's all-reduce has
produced the final gradients, also under gradient accumulation with
``set_requires_gradient_sync(False)`` / ``no_sync()`` -- and the parameters
in the step post-hook. ``gradients="backward"`` projects at the end of every
backward instead (after FSDP2's / DDP's own end-of-backward callbacks), so
``clip_grad_norm_`` between ``backward()`` and ``step()`` sees projected
gradients. A tensor hook on the parameters (what :meth:`OSFTProjector.attach`
and PEFT's OSF use) cannot work under FSDP2: ``fully_shard`` replaces the
Parameter objects, and the unsharded gradients it would see are reduce-
scattered afterwards.
"""
from __future__ import annotations

import re
import weakref

import torch
import torch.nn as nn

from .. import Communicator
from ._common import context_for
from .linear import OSFTLinear
from .projector import OSFTProjector, _ProjectionHooks

__all__ = ["prepare_fsdp2", "ShardedOSFTProjector", "shard_aware_projector", "shard_sizes", "FROZEN_FACTORS",
           "MIN_TORCH_FSDP2"]

FROZEN_FACTORS = ("u_high", "s_high", "v_high")

#: The oldest torch of the FSDP2 support: the tests (gloo, CPU) pass on 2.7,
#: 2.11 and 2.15. 2.6, the first with ``torch.distributed.fsdp.fully_shard``,
#: fails inside FSDP2 on CPU tensors (its all-gather stream has no
#: ``record_event``); 2.4 and 2.5 have FSDP2 only as
#: ``torch.distributed._composable``, untested.
MIN_TORCH_FSDP2 = (2, 7)


def _torch_version():
    """(major, minor) of the torch in use ((0, 0) where it does not parse)."""
    m = re.match(r"(\d+)\.(\d+)", torch.__version__)
    return tuple(map(int, m.groups())) if m else (0, 0)


def _require_fsdp2(what):
    if _torch_version() < MIN_TORCH_FSDP2:
        raise RuntimeError("%s: OSFT under FSDP2 needs torch >= %d.%d, this is torch %s" % (
            (what,) + MIN_TORCH_FSDP2 + (torch.__version__,)))


def _dtensor_type():
    try:
        from torch.distributed.tensor import DTensor
    except Exception:  # torch < 2.5
        try:
            from torch.distributed._tensor import DTensor
        except Exception:  # torch without DTensor (1.13, or torch.distributed unavailable)
            return None
    return DTensor


_DTensor = _dtensor_type()


def _is_dtensor(t):
    return _DTensor is not None and isinstance(t, _DTensor)


def _local(t):
    """This rank's part of t (a DTensor's local tensor, else t), detached."""
    if t is None:
        return None
    if _is_dtensor(t):
        t = t._local_tensor if hasattr(t, "_local_tensor") else t.to_local()
    return t.detach()


def shard_sizes(n, world):
    """Every rank's share of n rows under FSDP2's dim-0 sharding
    (``torch.chunk`` semantics: ceil(n / world) per rank, the last ranks get
    fewer, possibly none)."""
    chunk = -(-n // world) if n else 0
    return [max(0, min(chunk, n - i * chunk)) for i in range(world)]


@torch.no_grad()
def prepare_fsdp2(model: nn.Module) -> nn.Module:
    """Makes the frozen factors of every OSFTLinear of `model` parameters
    with ``requires_grad=False`` (same names, same state_dict keys), each in
    its own compact storage, so that ``fully_shard`` shards them and its
    ``MixedPrecisionPolicy`` casts them like the trainable factors. Call
    after the conversion and before ``fully_shard``; idempotent. Returns
    `model`."""
    _require_fsdp2("prepare_fsdp2")
    for m in model.modules():
        if not isinstance(m, OSFTLinear):
            continue
        if _is_dtensor(m.u_low):
            raise TypeError("prepare_fsdp2: the model is already sharded; call it before fully_shard")
        for name in FROZEN_FACTORS:
            if name in m._buffers:
                t = m._buffers.pop(name)
                m.register_parameter(name, nn.Parameter(t.detach().clone(), requires_grad=False))
        # S and V^T no longer share one storage with the frozen parts: give
        # the trainable parts their own too (FSDP2 copies them anyway) and
        # drop the whole-factor buffers
        for full in ("_s_full", "_vt_full"):
            m._buffers.pop(full, None)
        for name in ("s_low", "v_low"):
            p = m._parameters[name]
            if p is not None and not _is_dtensor(p):
                p.data = p.detach().clone()
        m.close()  # the layer handle was built over the old storage
    return model


def _placement(t):
    """("rep", None, None) or ("shard", dim, group) of a factor."""
    if not _is_dtensor(t):
        return ("rep", None, None)
    _require_fsdp2("ShardedOSFTProjector")
    mesh, places = t.device_mesh, t.placements
    shard = [(i, p) for i, p in enumerate(places) if p.is_shard()]
    if any(not (p.is_shard() or p.is_replicate()) for p in places):
        raise NotImplementedError("OSFT factor with placements %s (partial)" % (places,))
    if not shard:
        return ("rep", None, None)
    if len(shard) > 1:
        raise NotImplementedError("OSFT factor sharded over several mesh dims: %s" % (places,))
    i, p = shard[0]
    group = mesh.get_group(i) if mesh.ndim > 1 else mesh.get_group()
    return ("shard", p.dim, group)


def _group_key(group):
    """What identifies a process group for the projector's collectives: its
    ranks, in order, and its backend -- not the Python object. With a GPU
    present and a gloo default group, torch (2.11 and 2.15 at least) gives
    every 1-D DeviceMesh over all ranks a group of its own
    (``new_group(ranks=all)`` in ``DeviceMesh._init_one_process_group``),
    and ``fully_shard`` without ``mesh=`` builds a new default mesh per
    call: the layers of one model then hold different, equivalent groups."""
    import torch.distributed as dist

    return (tuple(dist.get_process_group_ranks(group)), str(dist.get_backend(group)))


class ShardedOSFTProjector(_ProjectionHooks):
    """The OSFT gradient and parameter projection of a model whose
    OSFTLinear factors are FSDP2-sharded DTensors, DDP-replicated or plain
    tensors (see the module's docstring). Build it after ``fully_shard`` (or
    the DDP wrapper); every rank builds it and calls it in the same order.

    group: the process group of the collectives; None: the FSDP2 mesh's
    group (or, with nothing sharded, the default group when
    torch.distributed is initialized). comm: an :class:`osftrt.Communicator`
    to use instead (e.g. one over the library's own NCCL engine; its ranks
    must be the mesh's; the caller closes it). ``stats()`` counts the
    collectives. arithmetic: as for :class:`OSFTProjector` ("auto": follows
    the dtype of each factor, so FSDP2's fp32 parameters get the exact update).
    """

    def __init__(self, model, *, group=None, comm=None, context=None, check_consistency=True, arithmetic="auto"):
        self._mods = [m for m in model.modules() if isinstance(m, OSFTLinear)]
        if not self._mods:
            raise ValueError("the model has no OSFTLinear layer")
        self._group_arg = group
        self._context = context
        self._check = check_consistency
        self._arithmetic = arithmetic
        self._proj = None
        self._comm = comm
        self._own_comm = comm is None
        self._targets = []  # [(index, trainable parameter getter)]
        self._grad_keys = []
        self._param_key = None
        self._hooks = []
        self.layouts = {}
        self.rebuilds = 0
        self.projections = {"gradients": 0, "parameters": 0}
        self._build()

    # --- registration ---------------------------------------------------------
    def _tensors(self):
        return [t for m in self._mods for t in (m.u_high, m.u_low, m.v_high, m.v_low)]

    def _key(self):
        # the storage of every factor, and the frozen factors' version: a
        # load_state_dict (refresh()) makes the gathered V_high stale
        return (tuple((lt.data_ptr(), lt.shape, lt.dtype) for lt in map(_local, self._tensors())),
                tuple(getattr(m, "frozen_version", 0) for m in self._mods))

    def _build(self):
        if self._proj is not None:
            self._proj.close()
            self.rebuilds += 1
        plan, groups = [], []
        for m in self._mods:
            u = self._plan_u(m)
            v = self._plan_v(m)
            plan.append((m, u, v))
            groups += [g for g in (u.get("group"), v.get("group")) if g is not None]
        group = self._group_arg
        if group is None and groups:
            group = groups[0]
            key = _group_key(group)
            keys = {key} | {_group_key(g) for g in groups[1:] if g is not group}
            if len(keys) > 1:
                raise NotImplementedError("OSFT factors sharded over different process groups (ranks, backend): %s"
                                          % sorted(keys))
        if self._context is None:
            self._context = self._comm.context if self._comm is not None else context_for(_local(self._mods[0].u_low), None)
        if self._comm is None:
            ctx = self._context
            import torch.distributed as dist

            if group is not None or (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
                self._comm = Communicator.torch_distributed(ctx, group)
        world = self._comm.size if self._comm is not None else 1
        rank = self._comm.rank if self._comm is not None else 0
        proj = OSFTProjector(comm=self._comm, context=self._context, check_consistency=self._check,
                             arithmetic=self._arithmetic)
        self._targets = []
        self.layouts = {}
        for m, u, v in plan:
            for part, spec in (("u", u), ("v", v)):
                idx = proj.add_target(**self._target_args(part, m, spec, world, rank))
                self._targets.append((idx, m, part))
                name = part + "_" + {None: "replicated", "rows_of_replicated": "rows"}.get(spec["layout"], spec["layout"])
                self.layouts[name] = self.layouts.get(name, 0) + 1
        self._proj = proj
        self._grad_keys = [None] * len(self._targets)
        self._param_key = self._key()

    @staticmethod
    def _plan_u(m):
        hi, lo = _placement(m.u_high), _placement(m.u_low)
        if lo[0] == "rep" and hi[0] == "rep":
            return {"layout": None}
        if lo[0] == "shard" and lo[1] == 0 and (hi[0] == "rep" or hi[1] == 0):
            return {"layout": "rows", "group": lo[2], "slice_high": hi[0] == "rep"}
        raise NotImplementedError("U_low %s with U_high %s: only dim-0 (row) sharding of U is supported" % (lo[:2], hi[:2]))

    @staticmethod
    def _plan_v(m):
        hi, lo = _placement(m.v_high), _placement(m.v_low)
        if hi[0] == "rep" and lo[0] == "rep":
            return {"layout": None}
        if hi[0] == "rep" and lo[1] == 0:
            # every rank holds V_high whole but only its rows of V_low: the
            # library's V_ROWS layout over slices of V_high (gathered once at
            # setup and cached, nothing per step; the replicated layout would
            # need the same l on every rank)
            return {"layout": "rows_of_replicated", "group": lo[2]}
        if hi[1] == 0 and (lo[0] == "rep" or lo[1] == 0):
            return {"layout": "rows", "group": hi[2]}
        if hi[1] == 1 and lo[1] == 1:
            return {"layout": "cols", "group": hi[2]}
        raise NotImplementedError("V_low %s with V_high %s" % (lo[:2], hi[:2]))

    def _target_args(self, part, m, spec, world, rank):
        layout = spec["layout"]
        if part == "u":
            hi, lo = _local(m.u_high), _local(m.u_low)
            args = {"u_high": hi, "u_low": lo}
            if layout == "rows":
                sizes = shard_sizes(m.u_low.shape[0], world)
                if spec["slice_high"]:
                    off = sum(sizes[:rank])
                    args["u_high"] = hi[off : off + sizes[rank]]
                args.update(u_layout="rows", u_shards=sizes)
            return args
        hi, lo = _local(m.v_high), _local(m.v_low)
        args = {"v_high": hi, "v_low": lo}
        if layout == "rows_of_replicated":
            sizes = shard_sizes(m.v_high.shape[0], world)
            off = sum(sizes[:rank])
            args.update(v_high=hi[off : off + sizes[rank]], v_layout="rows", v_shards=sizes)
        elif layout == "rows":
            args.update(v_layout="rows", v_shards=shard_sizes(m.v_high.shape[0], world))
        elif layout == "cols":
            args.update(v_layout="cols", v_shards=shard_sizes(m.v_high.shape[1], world))
        return args

    def _bind(self):
        if self._key() != self._param_key:
            self._build()
        for j, (idx, m, part) in enumerate(self._targets):
            g = _local((m.u_low if part == "u" else m.v_low).grad)
            key = None if g is None else (g.data_ptr(), g.shape, g.dtype)
            if key != self._grad_keys[j]:
                if part == "u":
                    self._proj.set_grads(idx, grad_u_low=g)
                else:
                    self._proj.set_grads(idx, grad_v_low=g)
                self._grad_keys[j] = key

    # --- the projections ------------------------------------------------------
    @torch.no_grad()
    def project_gradients(self):
        """Projects this rank's shards of dU_low and dV_low of every layer in
        one library call (at most one collective)."""
        self._bind()
        self._proj.project_gradients()
        self.projections["gradients"] += 1

    @torch.no_grad()
    def project_parameters(self):
        """The same projection on this rank's shards of U_low and V_low
        (after ``optimizer.step()``)."""
        self._bind()
        self._proj.project_parameters()
        self.projections["parameters"] += 1
        for m in self._mods:  # written behind torch's version counters
            m.factors_changed()

    def orthogonality(self):
        """(max|U_high^T U_low|, max|V_low V_high^T|) over all layers and
        ranks (collective)."""
        self._bind()
        return self._proj.orthogonality()

    def prepare(self):
        """Runs the one-time setup collectives now (consistency check, the
        V_high gathers); otherwise the first projection does."""
        self._bind()
        self._proj.prepare()

    def info(self):
        """The library projector's info plus the layouts in use
        ({"u_rows": n, "v_rows": n, "u_replicated": n, ...})."""
        i = self._proj.info()
        i["layouts"] = dict(self.layouts)
        i["layers"] = len(self._mods)
        return i

    def stats(self):
        """The communicator's counters (allreduce_calls, allgather_calls,
        bytes, ...); zeros when there is no communicator."""
        if self._comm is None:
            return {"allreduce_calls": 0, "allgather_calls": 0, "barrier_calls": 0, "allreduce_bytes": 0,
                    "allgather_bytes": 0, "failures": 0}
        return self._comm.stats()

    # --- hooks ----------------------------------------------------------------
    def attach(self, optimizer=None, *, gradients="step"):
        """Runs the projections by themselves: the gradients before every
        ``optimizer.step()`` (``gradients="step"``) or at the end of every
        backward (``"backward"``), the parameters after every step. With
        `optimizer` None: every optimizer that holds one of the trainable
        factors (torch's global optimizer hooks). Returns self."""
        if gradients not in ("step", "backward"):
            raise ValueError("gradients must be 'step' or 'backward'")
        self.detach()
        if gradients == "backward":
            ref = weakref.ref(self)
            for m in self._mods:
                self._hooks.append(m.register_forward_hook(_forward_hook(ref)))
        self._hook_steps(optimizer, gradients=gradients == "step")
        return self

    def _factors(self):
        return [p for m in self._mods for p in (m.u_low, m.v_low)]

    # the gradient projection of gradients="backward" runs after FSDP2's /
    # DDP's own end-of-backward callbacks
    _after_final_callbacks = True

    def close(self):
        self.detach()
        if self._proj is not None:
            self._proj.close()
            self._proj = None
        if self._comm is not None and self._own_comm:
            self._comm.close()
        self._comm = None


def _forward_hook(ref):
    def hook(module, args, output):
        p = ref()
        if p is not None and torch.is_grad_enabled() and isinstance(output, torch.Tensor) and output.requires_grad:
            output.register_hook(p._on_grad)

    return hook


def shard_aware_projector(model, group=None, **kwargs) -> ShardedOSFTProjector:
    """A :class:`ShardedOSFTProjector` over every OSFTLinear of `model`
    (FSDP2-sharded, DDP-wrapped or plain); call ``.attach(optimizer)`` on it
    to have the projections run by themselves."""
    return ShardedOSFTProjector(model, group=group, **kwargs)
