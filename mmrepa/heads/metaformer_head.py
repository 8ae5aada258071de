"""The classification head of ConvFormer and CAFormer, for mmpretrain's ``ImageClassifier``."""

from typing import Optional, Tuple

import torch
import torch.nn as nn
from mmengine.registry import MODELS
from mmpretrain.models.heads import ClsHead

from ..backbones.metaformer import SquaredReLU
from ..errors import ConfigError


@MODELS.register_module()
class MetaFormerClsHead(ClsHead):
    """MetaFormer Baselines' head: LayerNorm of the pooled features, then an MLP
    ``fc1 -> SquaredReLU -> LayerNorm -> dropout -> fc2`` (timm's ``MlpHead``, same
    parameter names after :func:`mmrepa.backbones.metaformer.checkpoint_filter_fn`).

    Use it behind ``GlobalAveragePooling`` with the backbone's ``out_norm_cfg=None``: the
    paper normalises the pooled vector, not each position.

    Args:
        num_classes (int): Classes.
        in_channels (int): Channels of the pooled features (the last stage's width).
        mlp_ratio (float): Hidden width of the MLP = ``mlp_ratio * in_channels``; 0 gives a
            single Linear after the norm. Default: 4.
        head_dropout (float): Dropout before ``fc2``. Default: 0.
        eps (float): Epsilon of both LayerNorms. Default: 1e-6.
        **kwargs: :class:`ClsHead` options (``loss``, ``topk``, ``cal_acc``, ``init_cfg``).

    Shapes: ``feats[-1]`` (B, in_channels) -> logits (B, num_classes).
    """

    def __init__(
        self,
        num_classes: int,
        in_channels: int,
        mlp_ratio: float = 4.0,
        head_dropout: float = 0.0,
        eps: float = 1e-6,
        init_cfg: Optional[dict] = dict(type='TruncNormal', layer='Linear', std=0.02),
        **kwargs,
    ):
        super().__init__(init_cfg=init_cfg, **kwargs)
        if num_classes <= 0:
            raise ConfigError(f'num_classes must be positive, got {num_classes}')
        self.num_classes = num_classes
        self.norm = nn.LayerNorm(in_channels, eps=eps)
        hidden = int(mlp_ratio * in_channels)
        if hidden:
            self.fc1 = nn.Linear(in_channels, hidden)
            self.act = SquaredReLU()
            self.hidden_norm = nn.LayerNorm(hidden, eps=eps)
        self.head_drop = nn.Dropout(head_dropout)
        self.fc2 = nn.Linear(hidden or in_channels, num_classes)

    def pre_logits(self, feats: Tuple[torch.Tensor]) -> torch.Tensor:
        """The normalised pooled features (B, in_channels)."""
        return self.norm(feats[-1])

    def forward(self, feats: Tuple[torch.Tensor]) -> torch.Tensor:
        x = self.pre_logits(feats)
        if hasattr(self, 'fc1'):
            x = self.hidden_norm(self.act(self.fc1(x)))
        return self.fc2(self.head_drop(x))
