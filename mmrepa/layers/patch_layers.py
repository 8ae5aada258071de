"""mmcv's patch embedding with its norm folded when it is affine, LV-ViT's convolutional patch
embedding, whose BatchNorms fold into its convs, and the norm fold they share with Swin's patch
merging (``mmrepa.backbones.swin``).

The mmcv subclasses keep mmcv's forward and state-dict names (``projection``/``reduction``,
``norm``); folding only rewrites the weights and sets ``norm`` to None, which mmcv's forward
already skips. With a LayerNorm nothing folds and :meth:`reparameterize` changes nothing.
"""

from typing import Callable, List, Optional

import torch
import torch.nn as nn
from mmcv.cnn.bricks.transformer import AdaptivePadding, PatchEmbed
from mmengine.model import BaseModule

from ..errors import ConfigError
from ..fold import (
    FoldPolicy,
    Reparameterizable,
    add_missing_bias,
    affine_after_conv,
    is_affine_norm,
    norm_affine,
    norm_fold_problems,
)
from ..registry import resolve_layer_type
from .channel_idle_ffn import channels_last_norm


def with_mmrepa_norm(kwargs: dict) -> dict:
    """mmcv builds the norm itself: hand it mmrepa's norm classes, not their names."""
    if kwargs.get('norm_cfg') is not None:
        kwargs = dict(kwargs, norm_cfg=resolve_layer_type(kwargs['norm_cfg']))
    return kwargs


class NormFolding(Reparameterizable):
    """``reparameterize`` of a patch layer whose affine ``norm`` folds into the layer named
    ``_target``; ``_fold(layer, scale, shift, dtype)`` says how (the norm comes after a conv,
    before a Linear)."""

    _target: str
    _fold: Callable

    def _drop_foldable_norm(self) -> None:
        if self.norm is not None and is_affine_norm(self.norm):
            self.norm = None
            add_missing_bias(getattr(self, self._target))
        self.deploy = True

    def fold_problems(self) -> List[str]:
        """An affine norm must have finite running statistics."""
        return norm_fold_problems(self.norm, 'norm')

    def _fold_tensors(self, dtype: torch.dtype, policy: FoldPolicy) -> dict:
        """An affine norm into the conv / Linear; a LayerNorm stays (nothing to fold)."""
        if self.norm is None or not is_affine_norm(self.norm):
            return {}
        scale, shift = norm_affine(self.norm, dtype)
        weight, bias = self._fold(getattr(self, self._target), scale, shift, dtype)
        return {f'{self._target}.weight': weight, f'{self._target}.bias': bias}

    def _apply_fold(self, tensors: dict, policy: FoldPolicy) -> None:
        self._drop_foldable_norm()  # gives the layer a bias if it had none


class FoldablePatchEmbed(NormFolding, PatchEmbed):
    """:class:`mmcv.cnn.bricks.transformer.PatchEmbed` whose norm folds into the conv.

    An affine norm after the conv (``y = conv(x) * s + t``) folds into the conv:
    ``W' = s · W`` per output channel and ``b' = s · b + t`` (the conv bias is scaled too).
    The adaptive padding is applied to the image before the conv, so the fold is exact on any
    input size.

    Args:
        deploy (bool): Build without the norm if it would fold (load folded checkpoints).
            Default: False.
        **kwargs: As :class:`~mmcv.cnn.bricks.transformer.PatchEmbed`.

    Input (B, C_in, H, W); output ``((B, H'*W', embed_dims), (H', W'))``.
    """

    _target = 'projection'
    _fold = staticmethod(affine_after_conv)

    def __init__(self, deploy: bool = False, **kwargs):
        super().__init__(**with_mmrepa_norm(kwargs))
        self.deploy = False
        if deploy:
            self._drop_foldable_norm()

    def forward(self, x: torch.Tensor):
        if self.adaptive_padding:
            x = self.adaptive_padding(x)
        x = self.projection(x)
        out_size = (x.shape[2], x.shape[3])
        x = x.flatten(2).transpose(1, 2)
        if self.norm is not None:  # over channels, also for a BatchNorm
            x = channels_last_norm(self.norm, x)
        return x, out_size


class ConvPatchEmbed(Reparameterizable, BaseModule):
    """LV-ViT's convolutional patch embedding: three conv-BN-ReLU layers (7 x 7 stride 2, then
    two 3 x 3), then a ``patch_size / 2`` projection with stride ``patch_size / 2``, so that a
    token still covers ``patch_size`` pixels. State-dict names are LV-ViT's (``conv1``,
    ``bn1``, ..., ``proj`` as ``projection``, FoldablePatchEmbed's name).

    :meth:`reparameterize` folds each BatchNorm into the conv before it (``W' = s · W``,
    ``b' = t``); ``deploy=True`` builds the convs with biases and no norms. Before the
    projection the map is padded at the bottom and right to a multiple of its stride (mmcv's
    ``AdaptivePadding``, as ViT's patch embedding pads the image), after the ReLU, where both
    forms agree: the fold is exact at any input size.

    Args:
        in_channels (int): Image channels. Default: 3.
        embed_dims (int): Token width. Default: 384.
        patch_size (int): Pixels per token side, even. Default: 16.
        stem_channels (int): Width of the three convs (LV-ViT S / M: 64). Default: 64.
        deploy (bool): Build the folded form. Default: False.

    Input (B, in_channels, H, W); output ((B, h * w, embed_dims), (h, w)) with
    ``h = ceil(ceil(H / 2) / (patch_size / 2))``.
    """

    fold_state_keys = ('conv1.bias', 'bn1.running_mean')

    def __init__(
        self,
        in_channels: int = 3,
        embed_dims: int = 384,
        patch_size: int = 16,
        stem_channels: int = 64,
        deploy: bool = False,
        init_cfg: Optional[dict] = None,
    ):
        super().__init__(init_cfg=init_cfg)
        if patch_size < 2 or patch_size % 2:
            raise ConfigError(
                f'the convolutional patch embedding halves the image first: patch_size must '
                f'be even, got {patch_size}'
            )
        self.deploy = deploy
        widths = (in_channels, stem_channels, stem_channels, stem_channels)
        for i, kernel in enumerate((7, 3, 3), start=1):
            conv = nn.Conv2d(
                widths[i - 1],
                widths[i],
                kernel,
                stride=2 if i == 1 else 1,
                padding=kernel // 2,
                bias=deploy,
            )
            self.add_module(f'conv{i}', conv)
            if not deploy:
                self.add_module(f'bn{i}', nn.BatchNorm2d(stem_channels))
        self.act = nn.ReLU(inplace=True)
        step = patch_size // 2
        self.adaptive_padding = AdaptivePadding(kernel_size=step, stride=step, padding='corner')
        self.projection = nn.Conv2d(stem_channels, embed_dims, step, stride=step)

    def forward(self, x: torch.Tensor):
        for i in (1, 2, 3):
            x = getattr(self, f'conv{i}')(x)
            if not self.deploy:
                x = getattr(self, f'bn{i}')(x)
            x = self.act(x)
        x = self.projection(self.adaptive_padding(x))
        out_size = (x.shape[2], x.shape[3])
        return x.flatten(2).transpose(1, 2), out_size

    def fold_problems(self) -> List[str]:
        """Each BatchNorm must have finite running statistics."""
        return [p for i in (1, 2, 3) for p in norm_fold_problems(getattr(self, f'bn{i}'), f'bn{i}')]

    def _fold_tensors(self, dtype: torch.dtype, policy: FoldPolicy) -> dict:
        tensors = {}
        for i in (1, 2, 3):
            scale, shift = norm_affine(getattr(self, f'bn{i}'), dtype)
            weight, bias = affine_after_conv(getattr(self, f'conv{i}'), scale, shift, dtype)
            tensors[f'conv{i}.weight'], tensors[f'conv{i}.bias'] = weight, bias
        return tensors

    def _apply_fold(self, tensors: dict, policy: FoldPolicy) -> None:
        for i in (1, 2, 3):
            delattr(self, f'bn{i}')
            add_missing_bias(getattr(self, f'conv{i}'))
