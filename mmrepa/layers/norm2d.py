"""LayerNorm over the channels of NCHW maps (``LN2d``), the norm of ViTDet's simple pyramid.

mmcv's norm registry has no such layer and mmpretrain's ``LN2d`` lives in mmpretrain's registry,
which detection and segmentation must not need; this one is ``'LN2d'`` in mmrepa's child
registry (``'mmrepa.LN2d'`` from any scope, plain ``'LN2d'`` through
:func:`mmrepa.registry.build_norm_layer`).
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..registry import MODELS


@MODELS.register_module(name='LN2d')
class LayerNorm2d(nn.LayerNorm):
    """LayerNorm of each position's channel vector: (B, C, H, W) -> (B, C, H, W).

    The same function as ``nn.LayerNorm(C)`` on the channels-last tensor: mean and variance
    over C only, then a per-channel ``weight`` and ``bias``. Those are the parameter names of
    ``nn.LayerNorm`` (and of ViTDet's and mmpretrain's ``LayerNorm2d``), so checkpoints load.

    Args:
        num_channels (int): Channels C (dimension 1 of the input).
        eps (float): Added to the variance. Default: 1e-6.
        elementwise_affine (bool): Learn ``weight`` and ``bias``. Default: True.

    Any (B, C, *spatial) input works; dimension 1 is normalized.
    """

    _abbr_ = 'ln'  # mmcv names the layer ``ln`` inside a ConvModule (``neck.x.ln.weight``)

    def __init__(self, num_channels: int, eps: float = 1e-6, elementwise_affine: bool = True):
        super().__init__(num_channels, eps=eps, elementwise_affine=elementwise_affine)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() < 2 or x.shape[1] != self.normalized_shape[0]:
            raise ValueError(
                f'LN2d expects (B, {self.normalized_shape[0]}, ...) inputs, '
                f'got shape {tuple(x.shape)}'
            )
        # F.layer_norm normalizes the trailing dims: move C last, normalize, move it back.
        y = F.layer_norm(x.movedim(1, -1), self.normalized_shape, self.weight, self.bias, self.eps)
        return y.movedim(-1, 1)
