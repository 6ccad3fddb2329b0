"""Llama, Llama 2/3/3.1/3.2 and models that share its blocks: the fused-loss causal LM and the tiled MLP."""
from transformers.models.llama import modeling_llama as _hf

from ._patch import Family, fused_loss_class, lean_norm_class, tiled_mlp_class

LlamaForCausalLM = fused_loss_class(_hf.LlamaForCausalLM, __name__)
LlamaMLP = tiled_mlp_class(_hf.LlamaMLP, __name__)

LlamaRMSNorm = lean_norm_class(_hf.LlamaRMSNorm, __name__)

FAMILY = Family("llama", LlamaForCausalLM, LlamaMLP, activation_attrs=("hidden_act",), norm=LlamaRMSNorm,
                mlp_output_unsaved=True)
