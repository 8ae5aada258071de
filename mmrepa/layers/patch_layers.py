"""mmcv's patch embedding and patch merging, with their norm folded when it is affine.

Both subclasses keep mmcv's forward and state-dict names (``projection``/``reduction``,
``norm``); folding only rewrites the weights and sets ``norm`` to None, which mmcv's forward
already skips. With a LayerNorm nothing folds and :meth:`reparameterize` changes nothing.
"""

from typing import List

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmcv.cnn.bricks.transformer import PatchEmbed, PatchMerging
from torch.nn.modules.batchnorm import _BatchNorm

from ..errors import ConfigError
from ..fold import FoldPolicy, Reparameterizable, is_affine_norm, norm_affine, norm_fold_problems
from ..registry import resolve_layer_type
from .channel_idle_ffn import channels_last_norm


def _with_mmrepa_norm(kwargs: dict) -> dict:
    """mmcv builds the norm itself: hand it mmrepa's norm classes, not their names."""
    if kwargs.get('norm_cfg') is not None:
        kwargs = dict(kwargs, norm_cfg=resolve_layer_type(kwargs['norm_cfg']))
    return kwargs


class _NormFolding(Reparameterizable):
    """``reparameterize`` of a patch layer whose affine ``norm`` folds into the layer named
    ``_target``; :meth:`_fold` says how (the norm comes after a conv, before a Linear)."""

    _target: str

    def _fold(self, weight, bias, scale, shift):
        """Folded ``(weight, bias)`` in the fold dtype; ``bias`` may be None."""
        raise NotImplementedError

    def _drop_foldable_norm(self) -> None:
        if self.norm is not None and is_affine_norm(self.norm):
            self.norm = None
            layer = getattr(self, self._target)
            if layer.bias is None:  # the folded layer needs one
                layer.bias = nn.Parameter(layer.weight.new_zeros(layer.weight.shape[0]))
        self.deploy = True

    def fold_problems(self) -> List[str]:
        """An affine norm must have finite running statistics."""
        return norm_fold_problems(self.norm, 'norm')

    def _fold_tensors(self, dtype: torch.dtype, policy: FoldPolicy) -> dict:
        """An affine norm into the conv / Linear; a LayerNorm stays (nothing to fold)."""
        if self.norm is None or not is_affine_norm(self.norm):
            return {}
        layer = getattr(self, self._target)
        scale, shift = norm_affine(self.norm, dtype)
        weight, bias = self._fold(
            layer.weight.to(dtype),
            None if layer.bias is None else layer.bias.to(dtype),
            scale,
            shift,
        )
        return {f'{self._target}.weight': weight, f'{self._target}.bias': bias}

    def _apply_fold(self, tensors: dict, policy: FoldPolicy) -> None:
        self._drop_foldable_norm()  # gives the layer a bias if it had none


class FoldablePatchEmbed(_NormFolding, PatchEmbed):
    """:class:`mmcv.cnn.bricks.transformer.PatchEmbed` whose norm folds into the conv.

    An affine norm after the conv (``y = conv(x) * s + t``) folds into the conv:
    ``W' = s · W`` per output channel and ``b' = s · b + t`` (the conv bias is scaled too).
    The adaptive padding is applied to the image before the conv, so the fold is exact on any
    input size.

    Args:
        deploy (bool): Build without the norm if it would fold (load folded checkpoints).
            Default: False.
        **kwargs: As :class:`~mmcv.cnn.bricks.transformer.PatchEmbed`.

    Input (B, C_in, H, W); output ((B, H'*W', embed_dims), (H', W')).
    """

    _target = 'projection'

    def __init__(self, deploy: bool = False, **kwargs):
        super().__init__(**_with_mmrepa_norm(kwargs))
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

    def _fold(self, weight, bias, scale, shift):
        bias = torch.zeros_like(scale) if bias is None else bias
        return weight * scale.view(-1, 1, 1, 1), bias * scale + shift


class FoldablePatchMerging(_NormFolding, PatchMerging):
    """:class:`mmcv.cnn.bricks.transformer.PatchMerging` whose norm folds into the reduction.

    An affine norm before the reduction Linear (``reduction(x * s + t)``) folds into it:
    ``W' = W · diag(s)`` and ``b' = W t (+ b)``; a reduction built without bias gains one. The
    padding to even sizes happens before the norm, so the fold is exact on any input size.

    Args:
        deploy (bool): Build without the norm if it would fold (load folded checkpoints).
            Default: False.
        **kwargs: As :class:`~mmcv.cnn.bricks.transformer.PatchMerging`.

    Input (B, H*W, C_in) and (H, W); output ((B, H'*W', out_channels), (H', W')).
    """

    _target = 'reduction'

    def __init__(self, deploy: bool = False, **kwargs):
        super().__init__(**_with_mmrepa_norm(kwargs))
        self.deploy = False
        s = self.sampler
        # Swin's 2x2, stride-2 merging with corner padding gathers with one reshape instead of
        # a permute to NCHW, im2col, and a copy before the norm.
        self._is_2x2 = (
            s.kernel_size == (2, 2)
            and s.stride == (2, 2)
            and s.dilation == (1, 1)
            and s.padding == (0, 0)
            and self.adaptive_padding is not None
            and self.adaptive_padding.padding == 'corner'
        )
        if not self._is_2x2 and isinstance(self.norm, _BatchNorm):
            raise ConfigError(
                'FoldablePatchMerging: a BatchNorm norm_cfg needs the 2x2, stride-2 '
                "merging with 'corner' padding (Swin's); use a LayerNorm, RepBN or "
                'PRepBN with other samplers'
            )
        if deploy:
            self._drop_foldable_norm()

    def forward(self, x: torch.Tensor, input_size):
        if not self._is_2x2:
            return super().forward(x, input_size)
        B, L, C = x.shape
        H, W = input_size
        x = x.view(B, H, W, C)
        if H % 2 or W % 2:
            x = F.pad(x, (0, 0, 0, W % 2, 0, H % 2))  # 'corner': bottom and right
        H2, W2 = (H + 1) // 2, (W + 1) // 2
        # channel-major, then the (row, col) offsets in raster order: nn.Unfold's order
        x = x.view(B, H2, 2, W2, 2, C).permute(0, 1, 3, 5, 2, 4).reshape(B, H2 * W2, 4 * C)
        x = channels_last_norm(self.norm, x) if self.norm is not None else x
        return self.reduction(x), (H2, W2)

    def _fold(self, weight, bias, scale, shift):
        folded_bias = weight @ shift
        return weight * scale, folded_bias if bias is None else folded_bias + bias
