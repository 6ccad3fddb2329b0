"""Gemma 2: GeGLU (tanh) MLPs and final logit softcapping: the fused-loss causal LM and the tiled MLP."""
from transformers.models.gemma2 import modeling_gemma2 as _hf

from ._patch import Family, fused_loss_class, lean_norm_class, tiled_mlp_class

Gemma2ForCausalLM = fused_loss_class(_hf.Gemma2ForCausalLM, __name__)
Gemma2MLP = tiled_mlp_class(_hf.Gemma2MLP, __name__)

Gemma2RMSNorm = lean_norm_class(_hf.Gemma2RMSNorm, __name__, offset=1.0, weight_first=False, eps_attr="eps")

FAMILY = Family("gemma2", Gemma2ForCausalLM, Gemma2MLP, activation_attrs=("hidden_activation", "hidden_act"), norm=Gemma2RMSNorm)
