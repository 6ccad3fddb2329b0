"""TRL's ``SFTTrainer`` on a model patched by libosftrt.

>>> from osftrt.integrations.trl import SFTTrainer     # instead of trl.SFTTrainer
>>> trainer = SFTTrainer(model=model, args=SFTConfig(...), train_dataset=ds,
...                      osftrt=dict(osft=True, rank_ratio=0.5))   # apply_osftrt's arguments
>>> trainer.train(); trainer.save_model(out)           # out opens in plain transformers

The counterpart of ``SFTConfig(use_liger_kernel=True)``: ``osftrt=`` takes
:func:`osftrt.transformers.apply_osftrt`'s keyword arguments and patches the
model in place before TRL sees it (a model patched beforehand works the
same, with ``osftrt=None``). With the fused cross-entropy the model returns
no logits, as Liger's does: TRL's per-step ``entropy`` and
``mean_token_accuracy`` (computed from logits) are then not logged, the loss,
``num_tokens`` and everything else are. ``trl.SFTTrainer`` itself trains
an OSFT-patched model as well when the fused cross-entropy is off
(``fused_cross_entropy=False``); this class is what makes the fused loss fit
TRL's metrics.

Saving: a patched model's ``state_dict`` carries each OSFT layer's dense
``weight`` beside its factors, so ``trainer.save_model`` (and every
``save_steps`` checkpoint) opens in plain ``transformers`` as the trained
model, and resumes in a patched one with the same frozen subspaces.
"""
from __future__ import annotations

try:
    import trl
    from transformers import Trainer
except ImportError as e:  # pragma: no cover
    raise ImportError("osftrt.integrations.trl needs TRL (pip install trl)") from e

__all__ = ["SFTTrainer", "fused_loss"]


def fused_loss(model) -> bool:
    """True where `model` (or the model a wrapper holds) computes its loss
    with osftrt's fused cross-entropy (no logits with labels)."""
    for m in (model, getattr(model, "module", None), getattr(getattr(model, "base_model", None), "model", None)):
        if m is not None and hasattr(m, "_osftrt_flce_options"):
            return True
    return False


class SFTTrainer(trl.SFTTrainer):
    """``trl.SFTTrainer`` for a model patched by
    :func:`osftrt.transformers.apply_osftrt` (``osftrt=``: its keyword
    arguments, to patch here). Same arguments as TRL's otherwise."""

    def __init__(self, model=None, args=None, *rest, osftrt=None, **kwargs):
        self.osftrt_patched = None
        if osftrt is not None:
            if isinstance(model, str):
                raise TypeError("osftrt=: pass the model object (loaded with from_pretrained), not its name")
            import osftrt.transformers as otf

            self.osftrt_patched = otf.apply_osftrt(model, **dict(osftrt))
        if args is not None and getattr(args, "use_liger_kernel", False) and fused_loss(model):
            raise ValueError("use_liger_kernel and osftrt's fused cross-entropy both replace the loss: keep one")
        super().__init__(model, args, *rest, **kwargs)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if not fused_loss(model):
            return super().compute_loss(model, inputs, return_outputs=return_outputs,
                                        num_items_in_batch=num_items_in_batch)
        # TRL's compute_loss without what needs logits (as under Liger)
        mode = "train" if self.model.training else "eval"
        inputs.pop("_prediction_loss_only", None)
        inputs["use_cache"] = False
        if getattr(self, "aux_loss_enabled", False):
            inputs["output_router_logits"] = True
        loss, outputs = Trainer.compute_loss(self, model, inputs, return_outputs=True,
                                             num_items_in_batch=num_items_in_batch)
        metrics = getattr(self, "_metrics", None)
        if metrics is not None:
            if mode == "train" and "attention_mask" in inputs:
                tokens = self.accelerator.gather_for_metrics(inputs["attention_mask"].sum()).sum().item()
                self._total_train_tokens += tokens // getattr(self, "_tp_size", 1)
            metrics[mode]["num_tokens"] = [getattr(self, "_total_train_tokens", 0)]
            if getattr(self, "aux_loss_enabled", False) and getattr(outputs, "aux_loss", None) is not None:
                metrics[mode]["aux_loss"].append(self.accelerator.gather_for_metrics(outputs.aux_loss).mean().item())
        return (loss, outputs) if return_outputs else loss
