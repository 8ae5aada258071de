"""mmpretrain's ``ImageClassifier`` plus the branch-diversity loss of depth
re-parameterization (Zhou et al., Rethinking Vision Transformer Depth via Structural
Reparameterization, §4 and Table 5)."""

from typing import List

import torch
from mmengine.registry import MODELS
from mmpretrain.models import ImageClassifier
from mmpretrain.structures import DataSample

from ..errors import ConfigError


@MODELS.register_module()
class DiversityImageClassifier(ImageClassifier):
    """``ImageClassifier`` whose training loss adds the backbone's diversity term as
    ``loss_div``: α · the mean over joined sub-layers and branch pairs of cos²(f_b, f_c).

    The backbone computes it during the forward (``DepthRepViT(diversity_loss_weight=α)``,
    the paper's α = 0.05) and hands it over through ``pop_diversity_loss()``; with α = 0 or a
    single branch there is nothing to add. Prediction is unchanged.

    Args:
        **kwargs: As :class:`mmpretrain.models.ImageClassifier`.
    """

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        if not hasattr(self.backbone, 'pop_diversity_loss'):
            raise ConfigError(
                f'DiversityImageClassifier needs a backbone with a diversity loss (DepthRepViT '
                f'with diversity_loss_weight > 0), got {type(self.backbone).__name__}; use '
                "type='ImageClassifier' instead"
            )

    def loss(self, inputs: torch.Tensor, data_samples: List[DataSample]) -> dict:
        losses = super().loss(inputs, data_samples)
        diversity = self.backbone.pop_diversity_loss()
        if diversity is not None:
            losses['loss_div'] = diversity
        return losses
