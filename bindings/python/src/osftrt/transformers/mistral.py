"""Mistral: the fused-loss causal LM and the tiled MLP."""
from transformers.models.mistral import modeling_mistral as _hf

from ._patch import Family, fused_loss_class, lean_norm_class, tiled_mlp_class

MistralForCausalLM = fused_loss_class(_hf.MistralForCausalLM, __name__)
MistralMLP = tiled_mlp_class(_hf.MistralMLP, __name__)

MistralRMSNorm = lean_norm_class(_hf.MistralRMSNorm, __name__)

FAMILY = Family("mistral", MistralForCausalLM, MistralMLP, activation_attrs=("hidden_act",), norm=MistralRMSNorm,
                mlp_output_unsaved=True)
