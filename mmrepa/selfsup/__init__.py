"""Self-supervised pre-training for mmpretrain (imports mmpretrain; list ``'mmrepa.selfsup'`` in
a config's ``custom_imports``): DepthRepViT as the encoder of mmpretrain's MAE, and MAE with
attention-map distillation from a teacher ViT (the depth re-parameterization paper's D-MAE
route, its §4; docs/backbones/depth_rep_vit.md)."""

from .. import backbones  # noqa: F401  (registers the backbones the encoders build on)
from .distill import DistilledMAE, attention_distill_loss, vit_attention_maps
from .mae import MAEDepthRepViT

__all__ = ['DistilledMAE', 'MAEDepthRepViT', 'attention_distill_loss', 'vit_attention_maps']
