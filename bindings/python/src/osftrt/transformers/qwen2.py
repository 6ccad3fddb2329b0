"""Qwen2 and Qwen2.5: the fused-loss causal LM and the tiled MLP."""
from transformers.models.qwen2 import modeling_qwen2 as _hf

from ._patch import Family, fused_loss_class, lean_norm_class, tiled_mlp_class

Qwen2ForCausalLM = fused_loss_class(_hf.Qwen2ForCausalLM, __name__)
Qwen2MLP = tiled_mlp_class(_hf.Qwen2MLP, __name__)

Qwen2RMSNorm = lean_norm_class(_hf.Qwen2RMSNorm, __name__)

FAMILY = Family("qwen2", Qwen2ForCausalLM, Qwen2MLP, activation_attrs=("hidden_act",), norm=Qwen2RMSNorm,
                mlp_output_unsaved=True)
