"""Swin's patch merging: mmcv's ``PatchMerging`` whose norm folds into the reduction."""

import torch
import torch.nn.functional as F
from mmcv.cnn.bricks.transformer import PatchMerging
from torch.nn.modules.batchnorm import _BatchNorm

from ...errors import ConfigError
from ...fold import affine_into_linear
from ...layers.channel_idle_ffn import channels_last_norm
from ...layers.patch_layers import NormFolding, with_mmrepa_norm


class FoldablePatchMerging(NormFolding, PatchMerging):
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
    _fold = staticmethod(affine_into_linear)

    def __init__(self, deploy: bool = False, **kwargs):
        super().__init__(**with_mmrepa_norm(kwargs))
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
