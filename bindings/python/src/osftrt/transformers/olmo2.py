"""OLMo 2: the fused-loss causal LM and the tiled MLP."""
from transformers.models.olmo2 import modeling_olmo2 as _hf

from ._patch import Family, fused_loss_class, lean_norm_class, tiled_mlp_class

Olmo2ForCausalLM = fused_loss_class(_hf.Olmo2ForCausalLM, __name__)
Olmo2MLP = tiled_mlp_class(_hf.Olmo2MLP, __name__)

Olmo2RMSNorm = lean_norm_class(_hf.Olmo2RMSNorm, __name__, weight_first=False)

FAMILY = Family("olmo2", Olmo2ForCausalLM, Olmo2MLP, activation_attrs=("hidden_act",), norm=Olmo2RMSNorm)
