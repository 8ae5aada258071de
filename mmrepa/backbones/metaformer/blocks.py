"""The MetaFormer block (token mixer, then the MLP), its stage, the stem and the downsampling.

Everything is channels-last, (B, H, W, C), as in the original release.
"""

from typing import Optional, Sequence

import torch
import torch.nn as nn
from mmcv.cnn.bricks.drop import DropPath
from mmengine.model import BaseModule, ModuleList

from ...errors import ConfigError
from ...layers import ChannelIdleFFN, checkpoint_forward
from ...registry import build_norm_layer
from .arch import LN_NO_BIAS, MLP_RATIO
from .res_scale import LayerScale, ResScale


def _norm(cfg: Optional[dict], dims: int) -> Optional[nn.Module]:
    return build_norm_layer(cfg, dims)[1] if cfg is not None else None


class Stem(nn.Module):
    """Conv k7 s4 p2 (with bias), then the norm if any: (B, C_in, H, W) -> (B, H', W', C)."""

    def __init__(self, in_channels: int, dims: int, norm_cfg: Optional[dict] = LN_NO_BIAS):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, dims, kernel_size=7, stride=4, padding=2)
        self.norm = _norm(norm_cfg, dims)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x).permute(0, 2, 3, 1)
        return x if self.norm is None else self.norm(x)


class Downsampling(nn.Module):
    """The norm if any, then conv k3 s2 p1 (with bias): (B, H, W, C) -> (B, H', W', C')."""

    def __init__(self, in_dims: int, out_dims: int, norm_cfg: Optional[dict] = LN_NO_BIAS):
        super().__init__()
        self.norm = _norm(norm_cfg, in_dims)
        self.conv = nn.Conv2d(in_dims, out_dims, kernel_size=3, stride=2, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.norm is not None:
            x = self.norm(x)
        return self.conv(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)


def ffn_config(
    dims: int,
    idle_ratio: float,
    res_scale: bool,
    norm_cfg: dict = LN_NO_BIAS,
    act_cfg: dict = dict(type='StarReLU'),
    bias: bool = False,
    layer_scale_init: Optional[float] = None,
) -> dict:
    """The :class:`ChannelIdleFFN` arguments of a block's MLP branch; ``norm_cfg`` is the
    published model's pre-norm, BatchNorm replaces it when ``idle_ratio > 0``."""
    repa = idle_ratio > 0
    return dict(
        embed_dims=dims,
        mlp_ratio=MLP_RATIO,
        idle_ratio=idle_ratio,
        norm_cfg=dict(type='BN1d') if repa else norm_cfg,
        hidden_norm_cfg=dict(type='BN1d') if repa else None,
        act_cfg=act_cfg,
        bias=bias,
        res_scale=res_scale,
        layer_scale_init=layer_scale_init,
    )


class MetaFormerBlock(BaseModule):
    """``x = r1 * x + g1 * mixer(norm1(x))``, then the MLP branch
    ``x = r2 * x + g2 * mlp(norm(x))``; (B, H, W, C).

    ``r1`` (``res_scale1``) exists only with ``res_scale=True``, ``g1`` (``layer_scale1``:
    PoolFormer v1) only with a ``layer_scale_init``. The MLP branch is one
    :class:`~mmrepa.layers.ChannelIdleFFN`, ``mlp``, which owns its pre-norm, ``r2`` and
    ``g2`` and folds itself: RePaFormer's channel-idle MLP with ``idle_ratio > 0`` (BatchNorm
    pre-norm and hidden norm), the published MLP with ``idle_ratio=0`` (``norm_cfg`` as its
    pre-norm, which stays when folded; the scales and StarReLU's affine move into ``fc2``).
    timm's names for the branch (``norm2``, ``mlp.norm``, ``res_scale2.scale``,
    ``layer_scale2.scale``) are mapped by :func:`checkpoint_filter_fn`.
    """

    def __init__(
        self,
        dims: int,
        token_mixer: nn.Module,
        idle_ratio: float,
        res_scale: bool,
        drop_path_rate: float = 0.0,
        with_cp: bool = False,
        deploy: bool = False,
        init_cfg: Optional[dict] = None,
        norm_cfg: dict = LN_NO_BIAS,
        act_cfg: dict = dict(type='StarReLU'),
        bias: bool = False,
        layer_scale_init: Optional[float] = None,
    ):
        super().__init__(init_cfg=init_cfg)
        if res_scale and layer_scale_init is not None:
            raise ConfigError('a MetaFormer block has res_scale or layer scale, not both')
        self.with_cp = with_cp
        self.norm1 = build_norm_layer(norm_cfg, dims)[1]
        self.token_mixer = token_mixer
        self.res_scale1 = ResScale(dims) if res_scale else None
        self.layer_scale1 = (
            LayerScale(dims, layer_scale_init) if layer_scale_init is not None else None
        )
        self.drop_path = DropPath(drop_path_rate) if drop_path_rate > 0 else nn.Identity()
        ffn_cfg = ffn_config(dims, idle_ratio, res_scale, norm_cfg, act_cfg, bias, layer_scale_init)
        self.mlp = ChannelIdleFFN(**ffn_cfg, drop_path_rate=drop_path_rate, deploy=deploy)

    # a checkpoint of the other form is refused naming the block (mmrepa.fold.check_fold_state);
    # the mlp checks the same keys, but this check runs first, so the message names the block
    fold_state_keys = ('mlp.in_proj.weight', 'mlp.fc1.weight')

    @property
    def deploy(self) -> bool:
        """Whether the MLP branch is folded (the mixer answers for itself)."""
        return self.mlp.deploy

    @property
    def ffn(self) -> ChannelIdleFFN:
        """The MLP branch, by the name the other families' blocks give their FFN."""
        return self.mlp

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.drop_path(self.token_mixer(self.norm1(x)))
        scale = self.res_scale1 or self.layer_scale1  # at most one exists
        x = x + y if scale is None else scale(x, y)
        return self.mlp(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.with_cp:
            return checkpoint_forward(self, self._forward, x)
        return self._forward(x)


class MetaFormerStage(BaseModule):
    """Optional :class:`Downsampling`, then the blocks; (B, H, W, C) in and out."""

    def __init__(
        self,
        blocks: Sequence[nn.Module],
        downsample: Optional[nn.Module] = None,
        init_cfg: Optional[dict] = None,
    ):
        super().__init__(init_cfg=init_cfg)
        self.downsample = downsample
        self.blocks = ModuleList(blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.downsample is not None:
            x = self.downsample(x)
        for block in self.blocks:
            x = block(x)
        return x
