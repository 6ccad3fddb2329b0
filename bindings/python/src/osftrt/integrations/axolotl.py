"""An axolotl plugin: libosftrt's fused cross-entropy, tiled MLP, OSFT and long
context in an ``axolotl train`` run, set from the run's YAML.

.. code-block:: yaml

    plugins:
      - osftrt.integrations.axolotl.OsftrtPlugin
    # all optional, these are the defaults:
    osftrt_fused_cross_entropy: true   # the LM head's loss without logits
    osftrt_tiled_mlp: true             # every MLP over tiles of tokens
    osftrt_osft: false                 # OSFT: targets -> OSFTLinear, projector on the optimizer
    osftrt_rank_ratio: 0.5             # the frozen fraction of each spectrum
    osftrt_target_modules: [q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj]
    osftrt_rank_rounding: round        # or floor (mini_trainer's splits)
    osftrt_activation_memory: null     # bytes, or "min": long context in one setting
    osftrt_export: dense               # the final save: dense weights (plain transformers); "factors": as trained

The package registers the plugin under axolotl's ``axolotl.plugins`` entry
point too, so axolotl loads it in every run; it does nothing unless the run
names it in ``plugins:`` or sets ``osftrt: true``.

What it does, by axolotl's hooks:

* config validation (the plugin's pydantic arguments): refuses what replaces
  the same forwards, with the key to change: axolotl's own ``tiled_mlp`` and
  Liger's SwiGLU/GLU beside the tiled MLP, Liger's (fused linear) cross-entropy
  and Cut Cross-Entropy beside the fused cross-entropy, a LoRA/QLoRA adapter
  with OSFT, Liger's RMSNorm and ``gradient_checkpointing`` with
  ``osftrt_activation_memory`` (which checkpoints and swaps the norms itself);
* ``post_model_build`` (the model loaded, before adapters and before FSDP
  wraps it): :func:`osftrt.transformers.apply_osftrt`; under FSDP2 with
  ``projector=False``, the targets converted first (on the meta device on the
  ranks that ``fsdp_config.cpu_ram_efficient_loading`` leaves without
  weights: shapes and ranks only, rank 0's factors arrive with its state
  dict) and :func:`osftrt.torch.distributed.prepare_fsdp2` called so the
  frozen factors are sharded with the rest;
* ``add_callbacks_pre_trainer``: under FSDP2, a callback that attaches
  :func:`osftrt.torch.distributed.shard_aware_projector` to the trainer's
  optimizer when training begins (after the model is sharded);
* ``post_train``: with ``osftrt_export: dense`` (and no FSDP, whose
  checkpoints carry each layer's dense weight beside its factors),
  :func:`osftrt.transformers.merge_and_unpatch`, so axolotl's final
  ``save_pretrained`` writes a plain model.

Messages go to axolotl's logger namespace (``axolotl.integrations.osftrt``),
so axolotl's logging settings apply; ``osftrt_loss_file`` (a path) writes
each micro-batch's exact loss there, one per line, whether or not the
plugin patches the model (a diagnostic: the trainer's own logs round them).
"""
from __future__ import annotations

from typing import Literal, Optional, Union

from pydantic import BaseModel, Field, model_validator

try:
    from axolotl.integrations.base import BasePlugin
    from axolotl.utils.logging import get_logger
except ImportError as e:  # pragma: no cover
    raise ImportError("osftrt.integrations.axolotl needs axolotl (pip install axolotl; Python >= 3.12)") from e

LOG = get_logger("axolotl.integrations.osftrt")

PLUGIN_NAME = "osftrt.integrations.axolotl.OsftrtPlugin"
_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _named(cfg, what):
    plugins = cfg.get("plugins") or []
    return any(what in str(p) for p in plugins)


def enabled(cfg) -> bool:
    """The plugin acts when the run names it in ``plugins:`` or sets
    ``osftrt: true`` (``osftrt: false`` turns it off either way)."""
    get = cfg.get if hasattr(cfg, "get") else (lambda k, d=None: getattr(cfg, k, d))
    flag = get("osftrt", None)
    if flag is not None:
        return bool(flag)
    return _named({"plugins": get("plugins", None)}, "osftrt.integrations.axolotl")


def conflicts(cfg) -> list:
    """The settings of `cfg` (a dict) that replace the forwards osftrt would
    patch, each with what to change."""
    out = []
    fused = cfg.get("osftrt_fused_cross_entropy", True)
    tiled = cfg.get("osftrt_tiled_mlp", True)
    osft = cfg.get("osftrt_osft", False)
    memory = cfg.get("osftrt_activation_memory")
    if tiled and cfg.get("tiled_mlp"):
        out.append("tiled_mlp (axolotl's TiledMLP) and osftrt_tiled_mlp both replace the MLP forward: "
                   "set one of them to false")
    if tiled and (cfg.get("liger_glu_activation") or cfg.get("liger_swiglu")):
        out.append("liger_glu_activation and osftrt_tiled_mlp both replace the MLP forward: "
                   "set liger_glu_activation: false or osftrt_tiled_mlp: false")
    if fused and (cfg.get("liger_fused_linear_cross_entropy") or cfg.get("liger_cross_entropy")):
        out.append("liger_fused_linear_cross_entropy / liger_cross_entropy and osftrt_fused_cross_entropy all "
                   "replace the loss: keep one")
    if fused and (_named(cfg, "cut_cross_entropy") and cfg.get("cut_cross_entropy", True)):
        out.append("Cut Cross-Entropy (its plugin) and osftrt_fused_cross_entropy both replace the loss: "
                   "drop the plugin or set osftrt_fused_cross_entropy: false")
    if osft and cfg.get("adapter"):
        out.append("adapter: %s with osftrt_osft: OSFT trains the model's own factors, not an adapter; "
                   "remove the adapter or set osftrt_osft: false" % cfg.get("adapter"))
    if memory is not None and cfg.get("liger_rms_norm"):
        out.append("liger_rms_norm with osftrt_activation_memory (which swaps the RMSNorms for its own): "
                   "set liger_rms_norm: false")
    if memory is not None and cfg.get("gradient_checkpointing"):
        out.append("gradient_checkpointing with osftrt_activation_memory (which checkpoints each layer "
                   "itself): set gradient_checkpointing: false")
    if osft and cfg.get("fsdp_config") and str(cfg.get("fsdp_version", 2)) not in ("2",):
        out.append("OSFT under FSDP needs FSDP2 (fsdp_version: 2)")
    return out


class OsftrtArgs(BaseModel):
    """The plugin's keys in an axolotl config (see the module's doc)."""

    osftrt: Optional[bool] = None
    osftrt_fused_cross_entropy: bool = True
    osftrt_tiled_mlp: bool = True
    osftrt_osft: bool = False
    osftrt_rank_ratio: float = Field(default=0.5, gt=0.0, lt=1.0)
    osftrt_target_modules: Optional[list[str]] = None
    osftrt_rank_rounding: Literal["round", "floor"] = "round"
    osftrt_activation_memory: Optional[Union[int, Literal["min", "as long as possible"]]] = None
    osftrt_export: Literal["dense", "factors"] = "dense"
    osftrt_loss_file: Optional[str] = None

    @model_validator(mode="before")
    @classmethod
    def check_conflicts(cls, data):
        if isinstance(data, dict) and enabled(data):
            found = conflicts(data)
            if found:
                raise ValueError("osftrt plugin: " + "; ".join(found))
        return data


def _fsdp2(cfg) -> bool:
    return bool(cfg.get("fsdp_config")) and str(cfg.get("fsdp_version") or 2) == "2"


def _convert_for_fsdp(model, cfg):
    """OSFT targets converted before sharding; on a rank whose weights are on
    the meta device (cpu_ram_efficient_loading), layers of the same shapes
    and frozen ranks on the meta device, filled by rank 0's state dict."""
    import torch
    import torch.nn as nn

    from ..torch import OSFTLinear
    from ..torch.linear import _parent_of, frozen_rank

    names = frozenset(cfg.get("osftrt_target_modules") or _TARGETS)
    ratio, rounding = cfg.get("osftrt_rank_ratio", 0.5), cfg.get("osftrt_rank_rounding", "round")
    done = {}
    for qn, m in [(qn, m) for qn, m in model.named_modules()
                  if isinstance(m, nn.Linear) and not isinstance(m, OSFTLinear) and qn.rsplit(".", 1)[-1] in names]:
        if m.weight.is_meta:
            n, kin = m.weight.shape
            k = min(n, kin)
            dt = m.weight.dtype if m.weight.dtype in (torch.float32, torch.bfloat16) else torch.float32
            meta = dict(device="meta", dtype=dt)
            b = torch.empty(n, **meta) if m.bias is not None else None
            new = OSFTLinear(torch.empty(n, k, **meta), torch.empty(k, **meta), torch.empty(k, kin, **meta),
                             frozen_rank(k, ratio, rounding), b)
        else:
            new = OSFTLinear.from_linear(m, ratio, rank_rounding=rounding)
        parent, leaf = _parent_of(model, qn)
        setattr(parent, leaf, new)
        done[qn] = new
    return done


def _projector_callback():
    from transformers import TrainerCallback

    class AttachShardAwareProjector(TrainerCallback):
        def __init__(self):
            self.projector = None

        def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
            from ..torch.distributed import shard_aware_projector

            if optimizer is None:
                raise RuntimeError("osftrt plugin: the trainer gave no optimizer to attach the projector to")
            self.projector = shard_aware_projector(model).attach(optimizer)
            LOG.info("osftrt: shard-aware OSFT projector attached to the optimizer", main_process_only=True)

        def on_train_end(self, args, state, control, **kwargs):
            if self.projector is not None:
                u, v = self.projector.orthogonality()
                LOG.info("osftrt: orthogonality after training: max|U_high^T U_low| %.2e, max|V_low V_high^T| %.2e"
                         % (u, v))

    return AttachShardAwareProjector()


def _loss_recorder(path):
    from transformers import TrainerCallback

    class RecordLosses(TrainerCallback):
        """Wraps the trainer's compute_loss once training begins; writes
        every micro-batch's loss, unrounded, at the end."""

        def __init__(self):
            self.trainer = None
            self.losses = []

        def bind(self, trainer):
            real = trainer.compute_loss
            losses = self.losses

            def compute_loss(*args, **kwargs):
                out = real(*args, **kwargs)
                loss = out[0] if isinstance(out, tuple) else out
                losses.append(float(loss.detach().float().item()))
                return out

            trainer.compute_loss = compute_loss

        def on_train_end(self, args, state, control, **kwargs):
            with open(path, "w") as f:
                f.write("".join("%.9g\n" % x for x in self.losses))

    return RecordLosses()


class OsftrtPlugin(BasePlugin):
    """libosftrt in axolotl (see the module's doc for the keys)."""

    def __init__(self):
        super().__init__()
        self.patched = None
        self._recorder = None

    def get_input_args(self):
        return "osftrt.integrations.axolotl.OsftrtArgs"

    def post_model_build(self, cfg, model):
        if not enabled(cfg):
            return
        import osftrt.transformers as otf

        fsdp2 = _fsdp2(cfg)
        osft = bool(cfg.osftrt_osft)
        layers = {}
        if osft and fsdp2:
            layers = _convert_for_fsdp(model, cfg)
        memory = cfg.osftrt_activation_memory
        self.patched = otf.apply_osftrt(
            model, fused_cross_entropy=cfg.osftrt_fused_cross_entropy, tiled_mlp=cfg.osftrt_tiled_mlp,
            osft=osft and not fsdp2, rank_ratio=cfg.osftrt_rank_ratio,
            target_modules=tuple(cfg.osftrt_target_modules or _TARGETS), rank_rounding=cfg.osftrt_rank_rounding,
            activation_memory=memory)
        if osft and fsdp2:
            from ..torch.distributed import prepare_fsdp2

            prepare_fsdp2(model)
            self.patched.osft_layers = layers
        LOG.info("osftrt: fused cross-entropy %s, %d tiled MLPs, %d OSFT layers%s%s" % (
            "on" if self.patched.fused_cross_entropy else "off", self.patched.tiled_mlps,
            len(self.patched.osft_layers), " (FSDP2: projector attached when training begins)" if osft and fsdp2 else "",
            ", activation_memory %s" % memory if memory is not None else ""))

    def add_callbacks_pre_trainer(self, cfg, model):
        callbacks = []
        if cfg.osftrt_loss_file:
            self._recorder = _loss_recorder(cfg.osftrt_loss_file)
            callbacks.append(self._recorder)
        if enabled(cfg) and cfg.osftrt_osft and _fsdp2(cfg):
            callbacks.append(_projector_callback())
        return callbacks

    def post_trainer_create(self, cfg, trainer):
        if self._recorder is not None:
            self._recorder.bind(trainer)

    def post_train(self, cfg, model):
        if not enabled(cfg) or self.patched is None:
            return
        if cfg.osftrt_export == "dense" and not _fsdp2(cfg):
            import osftrt.transformers as otf

            target = getattr(model, "module", model)
            otf.merge_and_unpatch(target)
            LOG.info("osftrt: model merged back to plain %s for the final save" % type(target).__name__)
