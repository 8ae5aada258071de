"""Inverted separable convolution, ConvFormer's token mixer (MetaFormer baselines, Sec. 2.3,
Eq. 6), with its StarReLU-scale fold."""

from typing import List, Optional

import torch
import torch.nn as nn
from mmengine.model import BaseModule

from ...errors import ConfigError
from ...fold import FoldPolicy, Reparameterizable, fold_dtype
from ...layers import has_output_affine, output_affine
from ...registry import MODELS, build_activation_layer
from .activations import SquaredReLU


@MODELS.register_module()
class SepConv(Reparameterizable, BaseModule):
    """Pointwise -> StarReLU -> depthwise k x k -> pointwise (MobileNetV2's inverted block).

    Works on channels-last tokens: x (B, H, W, C) -> (B, H, W, C). Parameter names follow
    timm's ``SepConv`` (``pwconv1``, ``act1``, ``dwconv``, ``pwconv2``); the pointwise layers
    are ``nn.Linear`` (the original release's shapes; timm stores them as 1x1 convolutions).

    :meth:`reparameterize` moves StarReLU's scale ``s`` into the depthwise kernels and keeps
    ``relu(x)**2 + b / s`` as the activation. This is exact with the zero padding of the
    depthwise conv (``dwconv(s * u + b) == s * dwconv(u + b / s)`` since ``s * 0 = 0``), whereas
    moving ``b`` into a bias would not be: near the border the conv sees fewer taps of it.

    Args:
        dim (int): Channels C.
        expansion_ratio (float): Hidden channels as a multiple of C. Default: 2.
        kernel_size (int): Depthwise kernel size (odd), padding ``kernel_size // 2``. Default: 7.
        bias (bool): Biases on the three layers. Default: False.
        act_cfg (dict): Activation after ``pwconv1``. Default: ``dict(type='StarReLU')``.
        deploy (bool): Build the folded structure directly (the same as the training structure
            for an activation without an output affine). Default: False.
        init_cfg (dict, optional): Initialization config.
    """

    def __init__(
        self,
        dim: int,
        expansion_ratio: float = 2,
        kernel_size: int = 7,
        bias: bool = False,
        act_cfg: dict = dict(type='StarReLU'),
        deploy: bool = False,
        init_cfg: Optional[dict] = None,
    ):
        super().__init__(init_cfg=init_cfg)
        if kernel_size % 2 != 1:
            raise ConfigError(
                f'SepConv kernel_size must be odd (same-size output), got {kernel_size}'
            )
        hidden = int(expansion_ratio * dim)
        self.deploy = deploy
        self.pwconv1 = nn.Linear(dim, hidden, bias=bias)
        act = build_activation_layer(act_cfg)
        self.foldable = has_output_affine(act)
        self.act1 = SquaredReLU(bias=True) if deploy and self.foldable else act
        self.dwconv = nn.Conv2d(
            hidden, hidden, kernel_size, padding=kernel_size // 2, groups=hidden, bias=bias
        )
        self.pwconv2 = nn.Linear(hidden, dim, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.act1(self.pwconv1(x))
        # NCHW view with channels-last strides: the conv runs without a layout copy.
        x = self.dwconv(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)
        return self.pwconv2(x)

    def fold_problems(self) -> List[str]:
        """The activation's scale must not be 0 (it is divided by)."""
        if self.deploy or not self.foldable:
            return []
        if output_affine(self.act1, fold_dtype(self.dwconv.weight))[0] == 0:
            return [
                'the StarReLU scale before the depthwise conv is exactly 0, so its output is '
                'the constant bias, which the zero-padded conv does not map to a constant: '
                'this SepConv cannot be folded'
            ]
        return []

    def _fold_tensors(self, dtype: torch.dtype, policy: FoldPolicy) -> dict:
        """The activation's scale into the depthwise kernels (a conv bias is added after the
        kernel and stays as it is); nothing without an output affine."""
        if not self.foldable:
            return {}
        s, b = output_affine(self.act1, dtype)
        return {'dwconv.weight': self.dwconv.weight.to(dtype) * s, 'act1.bias': b / s}

    def _apply_fold(self, tensors: dict, policy: FoldPolicy) -> None:
        if self.foldable:
            like = self.dwconv.weight
            self.act1 = SquaredReLU(bias=True).to(device=like.device, dtype=like.dtype)
