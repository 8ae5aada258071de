"""LayerNorm over the channels of NCHW maps (``LN2d``), the norm of ViTDet's simple pyramid, and
GroupNorm with one group on channels-last maps (``GN1``), PoolFormer's.

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

    Any ``(B, C, *spatial)`` input works; dimension 1 is normalized.
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


@MODELS.register_module(name='GN1')
class GroupNorm1(nn.Module):
    """GroupNorm with one group on channels-last maps: (B, H, W, C) -> (B, H, W, C).

    ``nn.GroupNorm(1, C)`` of the NCHW map, i.e. mean and variance over H, W and C together,
    then a per-channel ``weight`` (and ``bias``): PoolFormer's norm (v1 with a bias, v2 and
    the Identity/RandFormers without one, the MetaFormer release's ``LayerNormGeneral`` over
    dims (1, 2, 3)). The parameter names are ``nn.GroupNorm``'s, so timm's and mmpretrain's
    checkpoints load. Not an affine map of each token (it reads the whole map): it never folds.

    Args:
        num_channels (int): Channels C (the last dimension).
        eps (float): Added to the variance. Default: 1e-5 (``nn.GroupNorm``'s).
        bias (bool): Learn a per-channel shift. Default: True.
    """

    _abbr_ = 'gn'

    def __init__(self, num_channels: int, eps: float = 1e-5, bias: bool = True):
        super().__init__()
        self.num_channels, self.eps = num_channels, eps
        self.weight = nn.Parameter(torch.ones(num_channels))
        self.bias = nn.Parameter(torch.zeros(num_channels)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4 or x.shape[-1] != self.num_channels:
            raise ValueError(
                f'GN1 expects channels-last maps (B, H, W, {self.num_channels}), '
                f'got shape {tuple(x.shape)}'
            )
        y = F.layer_norm(x, x.shape[1:], eps=self.eps)
        return y * self.weight if self.bias is None else torch.addcmul(self.bias, y, self.weight)

    def extra_repr(self) -> str:
        return f'{self.num_channels}, eps={self.eps}, bias={self.bias is not None}'
