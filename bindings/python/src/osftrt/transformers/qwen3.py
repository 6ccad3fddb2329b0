"""Qwen3 (dense): the fused-loss causal LM and the tiled MLP."""
from transformers.models.qwen3 import modeling_qwen3 as _hf

from ._patch import Family, fused_loss_class, lean_norm_class, tiled_mlp_class

Qwen3ForCausalLM = fused_loss_class(_hf.Qwen3ForCausalLM, __name__)
Qwen3MLP = tiled_mlp_class(_hf.Qwen3MLP, __name__)

Qwen3RMSNorm = lean_norm_class(_hf.Qwen3RMSNorm, __name__)

FAMILY = Family("qwen3", Qwen3ForCausalLM, Qwen3MLP, activation_attrs=("hidden_act",), norm=Qwen3RMSNorm,
                mlp_output_unsaved=True)
