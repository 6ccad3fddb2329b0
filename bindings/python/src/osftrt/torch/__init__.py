"""PyTorch modules over libosftrt (zero-copy: the library reads and writes
the tensors' own storage through DLPack), one module per capability:

* :mod:`.linear` -- :class:`OSFTLinear`, the OSFT layer built from an
  ``nn.Linear`` (trainable factors are ``nn.Parameter``\\ s the library uses
  in place); :func:`convert_linear_layers` converts chosen layers of a model.
  :mod:`.linear_state`: what it saves (its factors and the dense ``weight``
  they merge to, so plain readers and exact resumes both work) and loads.
* :mod:`.projector` -- :class:`OSFTProjector` projects the gradients (after
  ``backward()``) and the parameters (after ``optimizer.step()``) of every
  OSFT layer out of the frozen subspace, in one batched call; one rank or
  ``torch.distributed``; :meth:`OSFTProjector.attach` runs both by itself.
* :mod:`.cross_entropy` -- :func:`fused_linear_cross_entropy` /
  :class:`FusedLinearCrossEntropyLoss`, the LM-head loss without
  materialized logits.
* :mod:`.mlp` -- :class:`TiledMLP`, SwiGLU/GeGLU/GELU/SiLU/ReLU MLPs over
  tiles of tokens (dense or OSFT projections).
* :mod:`.norm` -- :func:`rms_norm`, RMSNorm whose backward keeps only
  its input and one float per row (long context).
* :mod:`.distributed` (imported on its own) -- OSFT under FSDP2 and DDP:
  :func:`~.distributed.prepare_fsdp2` (frozen factors shardable) and
  :func:`~.distributed.shard_aware_projector` (the projection on the
  DTensor shards, one collective per step for all layers).

Integrations beside them: ``osftrt.transformers`` (Hugging Face models
patched in place) and ``osftrt.peft`` (PEFT OSF adapters).
"""
from .cross_entropy import FusedLinearCrossEntropyLoss, fused_linear_cross_entropy
from .linear import LLAMA_LINEAR_NAMES, OSFTLinear, convert_linear_layers
from .linear_state import CheckpointError
from .mlp import TiledMLP, TiledMLPPlan, tiled_mlp
from .projector import OSFTProjector
from .norm import rms_norm

__all__ = [
    "OSFTLinear",
    "convert_linear_layers",
    "CheckpointError",
    "OSFTProjector",
    "fused_linear_cross_entropy",
    "FusedLinearCrossEntropyLoss",
    "TiledMLP",
    "TiledMLPPlan",
    "tiled_mlp",
    "LLAMA_LINEAR_NAMES",
    "rms_norm",
]
