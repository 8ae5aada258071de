"""The MetaFormer family on one body: ConvFormer, CAFormer, PoolFormer (v1 and v2),
IdentityFormer and RandFormer, each with optional channel-idle (RePa) MLPs.

With ``idle_ratio=0`` these are the published models and load timm's, mmpretrain's (PoolFormer)
and the original releases' ImageNet checkpoints; with ``idle_ratio > 0`` the MLPs are
RePaFormer's channel-idle FFNs (BatchNorm pre-norm and hidden norm, the activation on the first
``ceil(4C(1 - idle_ratio))`` hidden channels), which fold into three matrices at test time.
The families differ only in the token mixer of each stage and in a few class attributes (the
block norm, the stem and downsampling norms, the MLP's activation and biases, layer scale or
res scale): see :class:`MetaFormer`.

Everything runs channels-last, (B, H, W, C), as the original release does; the outputs are NCHW.
"""

import re
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
from mmcv.cnn.bricks.drop import DropPath
from mmengine.model import BaseModule, ModuleList
from mmengine.registry import MODELS

from ..checkpoint.loading import strip_prefixes
from ..errors import CheckpointError, ConfigError, ConfigTypeError, InputError
from ..fold import FoldPolicy, Reparameterizable, norm_fold_problems
from ..layers import (
    ChannelIdleFFN,
    LayerScale,
    Pooling,
    RandomMixing,
    ResScale,
    SepConv,
    WindowedSelfAttention,
    activate_first_,
    channels_last_norm,
    checkpoint_forward,
    num_active_channels,
)
from ..options import is_int_at_least, per_stage, per_stage_ratios
from ..registry import MODELS as MMREPA_MODELS
from ..registry import build_activation_layer, build_norm_layer
from .base import DenseBackbone, drop_path_rates, lookup_arch, trunc_normal_init_

# depths and dims of the published variants (the paper's Table II; timm's metaformer.py).
ARCH_SETTINGS: Dict[str, dict] = {
    's18': dict(depths=(3, 3, 9, 3), dims=(64, 128, 320, 512)),
    's36': dict(depths=(3, 12, 18, 3), dims=(64, 128, 320, 512)),
    'm36': dict(depths=(3, 12, 18, 3), dims=(96, 192, 384, 576)),
    'b36': dict(depths=(3, 12, 18, 3), dims=(128, 256, 512, 768)),
}
# PoolFormer (v1, v2), IdentityFormer and RandFormer: the PoolFormer paper's sizes (the
# MetaFormer baselines paper's Table I; timm's poolformer*). m36 / m48 end at 768, not 576.
POOLFORMER_ARCHS: Dict[str, dict] = {
    's12': dict(depths=(2, 2, 6, 2), dims=(64, 128, 320, 512)),
    's24': dict(depths=(4, 4, 12, 4), dims=(64, 128, 320, 512)),
    's36': dict(depths=(6, 6, 18, 6), dims=(64, 128, 320, 512)),
    'm36': dict(depths=(6, 6, 18, 6), dims=(96, 192, 384, 768)),
    'm48': dict(depths=(8, 8, 24, 8), dims=(96, 192, 384, 768)),
}
# PoolFormer v1's LayerScale initial values (timm's poolformer_*, mmpretrain's arch table)
POOLFORMER_LAYER_SCALE = {'s12': 1e-5, 's24': 1e-5, 's36': 1e-6, 'm36': 1e-6, 'm48': 1e-6}
NUM_STAGES = 4
MLP_RATIO = 4
# LayerNorm without bias, as in the blocks, the stem and the downsampling layers.
LN_NO_BIAS = dict(type='LN', eps=1e-6, bias=False)
# GroupNorm with one group (channels-last), without bias: PoolFormerV2's, Identity/RandFormer's
GN1_NO_BIAS = dict(type='GN1', eps=1e-6, bias=False)


def resolve_arch(arch: Union[str, dict], settings: Dict[str, dict] = ARCH_SETTINGS) -> dict:
    """A name of ``settings`` or ``dict(depths=..., dims=...)`` -> arch settings."""
    arch = lookup_arch(arch, settings, ('depths', 'dims'))
    if (
        set(arch) != {'depths', 'dims'}
        or len(arch['depths']) != NUM_STAGES
        or len(arch['dims']) != NUM_STAGES
    ):
        raise ConfigError(
            f'a custom arch needs {NUM_STAGES} depths and {NUM_STAGES} dims (one '
            f'per stage) and no other key, got {arch}'
        )
    return dict(depths=tuple(arch['depths']), dims=tuple(arch['dims']))


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
    """The :class:`ChannelIdleFFN` equivalent to a block's MLP branch (norm2, mlp, res_scale2
    or layer_scale2); ``norm_cfg`` is the published model's pre-norm, BatchNorm replaces it
    when ``idle_ratio > 0``."""
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


class MetaFormerMlp(nn.Module):
    """fc1 -> activation on the first ``active`` hidden channels -> [hidden BN] -> fc2.

    Channels-last: (..., C) -> (..., C). Names follow timm's ``Mlp`` (``fc1``, ``act``,
    ``norm``, ``fc2``).
    """

    def __init__(
        self,
        dims: int,
        hidden: int,
        active: int,
        act_cfg: dict,
        hidden_norm_cfg: Optional[dict],
        bias: bool = False,
    ):
        super().__init__()
        self.active = active
        self.fc1 = nn.Linear(dims, hidden, bias=bias)
        self.act = build_activation_layer(act_cfg)
        self.norm = build_norm_layer(hidden_norm_cfg, hidden)[1] if hidden_norm_cfg else None
        self.fc2 = nn.Linear(hidden, dims, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.reshape(-1, x.shape[-1])  # 2-D, so fc1's output is not a view
        h = activate_first_(self.act, self.fc1(tokens), self.active)
        if self.norm is not None:
            h = self.norm(h)
        return self.fc2(h).view(x.shape)


class MetaFormerBlock(Reparameterizable, BaseModule):
    """``x = r1 * x + g1 * mixer(norm1(x))``, then ``x = r2 * x + g2 * mlp(norm2(x))``;
    (B, H, W, C).

    ``r1``, ``r2`` (``res_scale1``, ``res_scale2``) exist only with ``res_scale=True``, ``g1``,
    ``g2`` (``layer_scale1``, ``layer_scale2``: PoolFormer v1) only with a
    ``layer_scale_init``. ``norm_cfg`` is the norm of both branches (of the MLP branch only
    with ``idle_ratio=0``: BatchNorm otherwise); ``act_cfg`` and ``bias`` the MLP's. The MLP
    branch (``norm2``, ``mlp``, its scale) is a channel-idle FFN with timm's names; folding
    turns it into a folded :class:`ChannelIdleFFN` ``ffn`` (with ``idle_ratio=0`` its
    LayerNorm / GroupNorm stays and only the scales and StarReLU's affine move into ``fc2``).
    """

    fold_state_keys = ('ffn.in_proj.weight', 'mlp.fc1.weight')  # see check_fold_state

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
        self.deploy = deploy
        ffn_cfg = ffn_config(dims, idle_ratio, res_scale, norm_cfg, act_cfg, bias, layer_scale_init)
        self.norm1 = build_norm_layer(norm_cfg, dims)[1]
        self.token_mixer = token_mixer
        self.res_scale1 = ResScale(dims) if res_scale else None
        self.layer_scale1 = self._layer_scale(dims, layer_scale_init)
        self.drop_path = DropPath(drop_path_rate) if drop_path_rate > 0 else nn.Identity()
        if deploy:
            self.ffn = ChannelIdleFFN(**ffn_cfg, deploy=True)
            return
        hidden = MLP_RATIO * dims
        self.norm2 = build_norm_layer(ffn_cfg['norm_cfg'], dims)[1]
        self.mlp = MetaFormerMlp(
            dims,
            hidden,
            num_active_channels(hidden, idle_ratio),
            act_cfg,
            ffn_cfg['hidden_norm_cfg'],
            bias=bias,
        )
        self.res_scale2 = ResScale(dims) if res_scale else None
        self.layer_scale2 = self._layer_scale(dims, layer_scale_init)

    @staticmethod
    def _layer_scale(dims: int, init: Optional[float]) -> Optional[LayerScale]:
        return LayerScale(dims, init) if init is not None else None

    @staticmethod
    def _residual(scale: Optional[ResScale], x: torch.Tensor, y: torch.Tensor):
        """``x + y``, or through the branch's ResScale / LayerScale (at most one exists)."""
        return x + y if scale is None else scale(x, y)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.drop_path(self.token_mixer(self.norm1(x)))
        x = self._residual(self.res_scale1 or self.layer_scale1, x, y)
        if self.deploy:
            return self.ffn(x)
        y = self.drop_path(self.mlp(channels_last_norm(self.norm2, x)))
        return self._residual(self.res_scale2 or self.layer_scale2, x, y)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.with_cp:
            return checkpoint_forward(self, self._forward, x)
        return self._forward(x)

    def fold_problems(self) -> List[str]:
        """The norms the MLP branch's fold reads must have finite running statistics."""
        if self.deploy:
            return []
        return norm_fold_problems(self.norm2, 'norm2') + norm_fold_problems(
            self.mlp.norm, 'mlp.norm'
        )

    def _apply_fold(self, tensors: dict, policy: FoldPolicy) -> None:
        """The MLP branch becomes a :class:`ChannelIdleFFN` made of its modules, folded."""
        ffn = ChannelIdleFFN.from_modules(
            self.norm2,
            self.mlp.fc1,
            self.mlp.act,
            self.mlp.fc2,
            self.mlp.active,
            hidden_norm=self.mlp.norm,
            res_scale=self.res_scale2.scale if self.res_scale2 is not None else None,
            layer_scale=self.layer_scale2.scale if self.layer_scale2 is not None else None,
        )
        ffn.train(self.training).reparameterize(policy)
        del self.norm2, self.mlp, self.res_scale2, self.layer_scale2
        self.ffn = ffn


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


class MetaFormer(DenseBackbone):
    """Shared body of the MetaFormer family; see :class:`ConvFormer` for the options.

    ``token_mixers`` gives each stage's mixer: ``'conv'`` (:class:`SepConv`), ``'attn'``
    (:class:`WindowedSelfAttention`, configured per stage by ``window_sizes`` and
    ``global_blocks``), ``'pool'`` (:class:`Pooling`), ``'identity'`` or ``'random'``
    (:class:`RandomMixing` over the stage's grid in ``token_grids``). What else differs between
    the families are the class attributes below, which a family sets; ``layer_scale_init``
    (PoolFormer v1) adds a LayerScale on both branches of every block.
    """

    arch_settings = ARCH_SETTINGS
    block_norm_cfg = LN_NO_BIAS  # norm1 of every block, norm2 of the published MLP
    downsample_norm_cfg: Optional[dict] = LN_NO_BIAS  # after the stem conv, before the others
    mlp_act_cfg = dict(type='StarReLU')
    mlp_bias = False
    res_scale_stages = (2, 3)  # ResScale on both shortcuts of stages 3 and 4 only

    def __init__(
        self,
        arch: Union[str, dict],
        token_mixers: Sequence[str],
        in_channels: int = 3,
        idle_ratio: Union[float, Sequence[float]] = 0.0,
        window_sizes: Sequence[Optional[int]] = (None,) * NUM_STAGES,
        global_blocks: Sequence[Sequence[int]] = ((),) * NUM_STAGES,
        head_dim: int = 32,
        token_grids: Sequence[Optional[Tuple[int, int]]] = (None,) * NUM_STAGES,
        layer_scale_init: Optional[float] = None,
        drop_path_rate: float = 0.0,
        out_norm_cfg: Optional[dict] = dict(type='LN', eps=1e-6),
        out_indices: Sequence[int] = (0, 1, 2, 3),
        frozen_stages: int = -1,
        norm_eval: bool = False,
        with_cp: bool = False,
        deploy: bool = False,
        init_cfg: Optional[dict] = None,
    ):
        super().__init__(init_cfg=init_cfg)
        arch = resolve_arch(arch, self.arch_settings)
        self.depths, self.num_features = arch['depths'], list(arch['dims'])
        self.token_mixers = tuple(token_mixers)
        self.in_channels = in_channels
        self._check_options(NUM_STAGES, out_indices, frozen_stages, norm_eval, deploy)
        self.idle_ratios = per_stage_ratios(idle_ratio, NUM_STAGES, 'idle_ratio')

        self.stem = Stem(in_channels, self.num_features[0], self.downsample_norm_cfg)
        dpr = drop_path_rates(drop_path_rate, sum(self.depths))
        self.stages = ModuleList()
        for i, depth in enumerate(self.depths):
            dims = self.num_features[i]
            blocks = []
            for j in range(depth):
                if token_mixers[i] == 'conv':
                    mixer = SepConv(dims, deploy=deploy)
                elif token_mixers[i] == 'attn':
                    window = None if j in global_blocks[i] else window_sizes[i]
                    mixer = WindowedSelfAttention(dims, head_dim=head_dim, window_size=window)
                elif token_mixers[i] == 'pool':
                    mixer = Pooling()
                elif token_mixers[i] == 'random':
                    mixer = RandomMixing(token_grids[i])
                else:
                    mixer = nn.Identity()
                blocks.append(
                    MetaFormerBlock(
                        dims,
                        mixer,
                        idle_ratio=self.idle_ratios[i],
                        res_scale=i in self.res_scale_stages,
                        drop_path_rate=dpr[sum(self.depths[:i]) + j],
                        with_cp=with_cp,
                        deploy=deploy,
                        norm_cfg=self.block_norm_cfg,
                        act_cfg=self.mlp_act_cfg,
                        bias=self.mlp_bias,
                        layer_scale_init=layer_scale_init,
                    )
                )
            downsample = (
                Downsampling(self.num_features[i - 1], dims, self.downsample_norm_cfg)
                if i > 0
                else None
            )
            self.stages.append(MetaFormerStage(blocks, downsample))
        self._setup_outputs(out_norm_cfg)

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        """x: (B, in_channels, H, W) -> per index in ``out_indices``: (B, C_i, H_i, W_i), with
        ``H_0 = floor((H - 3) / 4) + 1`` (the stem) and ``H_i = ceil(H_{i-1} / 2)``."""
        self._check_input(x, 3, 'the stem (kernel 7, padding 2) needs at least 3 x 3 pixels')
        x = self.stem(x)
        outs = []
        for i, stage in enumerate(self.stages):
            x = stage(x)
            if i in self.out_indices:
                out = getattr(self, f'norm{i}')(x)
                outs.append(out.permute(0, 3, 1, 2).contiguous())
        return tuple(outs)

    def _default_init(self):
        """timm's initialisation (the frozen random matrices keep their own)."""
        trunc_normal_init_(self, (nn.Linear, nn.Conv2d))

    def filter_checkpoint(self, state_dict):
        """A timm, mmpretrain, original-release or mmrepa state dict in our names, refused
        in one line if it is another family's or size's; see :func:`checkpoint_filter_fn`."""
        return checkpoint_filter_fn(state_dict, self)


def _window_sizes(window_size, token_mixers) -> list:
    sizes = per_stage(window_size, NUM_STAGES, 'window_size')
    for i, (size, mixer) in enumerate(zip(sizes, token_mixers)):
        if mixer != 'attn':
            if isinstance(window_size, (list, tuple)) and size is not None:
                raise ConfigError(
                    f'window_size {tuple(window_size)}: stage {i + 1} has no '
                    f'attention (SepConv); give None there'
                )
            sizes[i] = None
        elif size is not None and not is_int_at_least(size, 1):
            raise ConfigError(
                f'window_size must be None (global attention) or an integer >= 1, '
                f'one value or one per stage; got {window_size!r}'
            )
    return sizes


def _global_blocks(global_blocks, depths, token_mixers) -> list:
    if global_blocks is None:
        return [()] * NUM_STAGES
    if not isinstance(global_blocks, (list, tuple)) or len(global_blocks) != NUM_STAGES:
        raise ConfigError(
            f'global_blocks must give a sequence of block indices for each of the '
            f'{NUM_STAGES} stages, e.g. ((), (), (8, ), ()), got {global_blocks!r}'
        )
    for i, indices in enumerate(global_blocks):
        indices = tuple(indices or ())
        if indices and token_mixers[i] != 'attn':
            raise ConfigError(
                f'global_blocks: stage {i + 1} has no attention (SepConv); give () there'
            )
        for j in indices:
            if not 0 <= j < depths[i]:
                raise ConfigError(
                    f'global_blocks: block {j} does not exist in stage {i + 1}, '
                    f'which has {depths[i]} blocks (indices 0..{depths[i] - 1})'
                )
    return [tuple(ix or ()) for ix in global_blocks]


@MODELS.register_module()
class ConvFormer(MetaFormer):
    """ConvFormer backbone (MetaFormer baselines): SepConv token mixers in all four stages.

    Outputs NCHW maps at strides 4, 8, 16, 32 for the stages in ``out_indices``, each through its
    own output norm ``norm{i}``; any input size of at least 3 x 3 works (strided convolutions
    round up). State-dict names follow timm's ``metaformer.py``.

    Args:
        arch (str | dict): ``'s18'``, ``'s36'``, ``'m36'``, ``'b36'``, or
            ``dict(depths=(...4), dims=(...4))``. Default: ``'s18'``.
        in_channels (int): Input image channels. Default: 3.
        idle_ratio (float | Sequence[float]): 0 for the published MLP (LayerNorm, StarReLU on
            all hidden channels); in (0, 1] for RePaFormer's channel-idle MLP (BatchNorm
            pre-norm and hidden norm, StarReLU on ``ceil(4C(1 - idle_ratio))`` channels).
            One value or one per stage. Default: 0.
        drop_path_rate (float): Stochastic depth, rising linearly over the blocks to this.
            Default: 0.
        out_norm_cfg (dict, optional): Norm of each output; None for none (the classifier's
            :class:`~mmrepa.heads.MetaFormerClsHead` normalises after pooling, as the paper).
            Default: ``dict(type='LN', eps=1e-6)``.
        out_indices (Sequence[int]): Stages whose outputs are returned. Default: (0, 1, 2, 3).
        frozen_stages (int): Freeze the stem (0) and stages 1..n (n >= 1), their downsampling
            and output norms: parameters fixed, eval mode. -1 freezes nothing. Default: -1.
        norm_eval (bool): Keep every BatchNorm in eval mode while training. Default: False.
        with_cp (bool): Gradient checkpointing per block. Default: False.
        deploy (bool): Build the folded structure directly (to load folded checkpoints).
            Default: False.
        init_cfg (dict, optional): ``dict(type='Pretrained', checkpoint=PATH)`` loads timm,
            original-release and mmrepa checkpoints (see :func:`checkpoint_filter_fn`);
            otherwise timm's truncated-normal initialisation.
    """

    def __init__(self, arch: Union[str, dict] = 's18', **kwargs):
        attention_only = {'window_sizes', 'global_blocks', 'head_dim'} & set(kwargs)
        if attention_only:
            raise ConfigTypeError(
                f'ConvFormer has no attention, so no '
                f'{sorted(attention_only)}: use CAFormer for attention stages'
            )
        super().__init__(arch, ('conv',) * NUM_STAGES, **kwargs)


@MODELS.register_module()
class CAFormer(MetaFormer):
    """CAFormer backbone (MetaFormer baselines): SepConv in stages 1-2, attention in 3-4.

    Attention has head_dim 32 and no qkv/proj bias or positional parameters, so it can be
    windowed without touching the checkpoint: ``window_size`` limits it to non-overlapping
    windows (the map padded, padded keys masked) so detection at 800 x 1333 runs in bounded
    memory; ``global_blocks`` keeps a few blocks global. Every other argument is as in
    :class:`ConvFormer` and passed on.

    Args:
        window_size (int | None | Sequence[int | None]): Attention window side in tokens; one
            value for stages 3-4 or one per stage (``None`` at stages 1-2). ``None`` is global
            attention. Default: ``(None, None, 14, 7)``, the token grids of 224-pixel
            pretraining, so windows see what pretraining saw.
        global_blocks (Sequence[Sequence[int]], optional): Per stage, indices of blocks that
            attend globally whatever the window size, e.g. ``((), (), (8, ), ())``.
            Default: None (none).
        head_dim (int): Channels per attention head. Default: 32.
    """

    def __init__(
        self,
        arch: Union[str, dict] = 's18',
        window_size: Union[None, int, Sequence[Optional[int]]] = (None, None, 14, 7),
        global_blocks: Optional[Sequence[Sequence[int]]] = None,
        head_dim: int = 32,
        **kwargs,
    ):
        mixers = ('conv', 'conv', 'attn', 'attn')
        depths = resolve_arch(arch)['depths']
        super().__init__(
            arch,
            mixers,
            window_sizes=_window_sizes(window_size, mixers),
            global_blocks=_global_blocks(global_blocks, depths, mixers),
            head_dim=head_dim,
            **kwargs,
        )


def _refuse(family: str, kwargs: dict, options: Sequence[str], why: str) -> None:
    unknown = set(options) & set(kwargs)
    if unknown:
        raise ConfigTypeError(f'{family} has no {sorted(unknown)}: {why}')


_ATTENTION_OPTIONS = ('window_sizes', 'global_blocks', 'head_dim')


# mmpretrain has a PoolFormer of its own, which its scope finds first: mmpretrain configs name
# this one 'mmrepa.PoolFormer' (see the registration after the class)
@MODELS.register_module()
class PoolFormer(MetaFormer):
    """PoolFormer (v1, "MetaFormer is actually what you need"): pooling in all four stages.

    As timm's ``poolformer_*``, mmpretrain's ``PoolFormer`` and the original release:
    GroupNorm (one group, with bias, eps 1e-5) in the blocks, no norm in the stem and the
    downsampling layers, GELU MLPs with biases, a LayerScale on both branches and no res
    scale. The output norms are GroupNorms as mmpretrain's (``norm0``..``norm3``). With
    ``idle_ratio > 0`` it is RePaFormer's RePa-PoolFormer: the MLP branch gets BatchNorms and
    GELU on ``ceil(4C(1 - idle_ratio))`` hidden channels and folds; its LayerScale folds
    into the weights. Every other argument is as in :class:`ConvFormer`.

    Args:
        arch (str | dict): ``'s12'``, ``'s24'``, ``'s36'``, ``'m36'``, ``'m48'`` or
            ``dict(depths=(...4), dims=(...4))``. Default: ``'s12'``.
        layer_scale_init (float, optional): Initial LayerScale. Default: the arch's
            (1e-5 for s12 and s24, 1e-6 for the others and 1e-5 for a custom arch).
        out_norm_cfg (dict, optional): Norm of each output. Default:
            ``dict(type='GN1', eps=1e-5)``.
    """

    arch_settings = POOLFORMER_ARCHS
    block_norm_cfg = dict(type='GN1', eps=1e-5)
    downsample_norm_cfg = None
    mlp_act_cfg = dict(type='GELU')
    mlp_bias = True
    res_scale_stages = ()

    def __init__(
        self,
        arch: Union[str, dict] = 's12',
        layer_scale_init: Optional[float] = None,
        out_norm_cfg: Optional[dict] = dict(type='GN1', eps=1e-5),
        **kwargs,
    ):
        _refuse('PoolFormer', kwargs, _ATTENTION_OPTIONS, 'its token mixer is pooling')
        if layer_scale_init is None:
            name = arch.lower() if isinstance(arch, str) else None
            layer_scale_init = POOLFORMER_LAYER_SCALE.get(name, 1e-5)
        super().__init__(
            arch,
            ('pool',) * NUM_STAGES,
            layer_scale_init=layer_scale_init,
            out_norm_cfg=out_norm_cfg,
            **kwargs,
        )


MMREPA_MODELS.register_module(module=PoolFormer)


class _PoolFormerV2Body(MetaFormer):
    """PoolFormerV2, IdentityFormer and RandFormer (the MetaFormer baselines paper's Table I):
    ConvFormer's blocks (StarReLU MLPs without biases, res scale in stages 3-4, LayerNorm in
    the stem and downsampling) with GroupNorm (one group, no bias) in the blocks and
    PoolFormer's sizes."""

    arch_settings = POOLFORMER_ARCHS
    block_norm_cfg = GN1_NO_BIAS
    mixers: Tuple[str, ...] = ()

    def __init__(self, arch: Union[str, dict] = 's12', **kwargs):
        self._refuse_options(kwargs)
        super().__init__(arch, self.mixers, **kwargs)

    @classmethod
    def _refuse_options(cls, kwargs: dict) -> None:
        _refuse(
            cls.__name__,
            kwargs,
            _ATTENTION_OPTIONS + ('token_grids', 'layer_scale_init'),
            'it has no attention and no LayerScale',
        )


@MODELS.register_module()
class PoolFormerV2(_PoolFormerV2Body):
    """PoolFormerV2 backbone (MetaFormer baselines): pooling in all four stages, with the
    paper's block (see :class:`IdentityFormer`). Arguments as :class:`PoolFormer` (without
    ``layer_scale_init``: v2 has res scale instead) and :class:`ConvFormer`; the output
    norms are LayerNorms (``out_norm_cfg``) as ConvFormer's.

    With ``idle_ratio > 0``: a RePa-PoolFormerV2 (channel-idle MLPs, as RePa-ConvFormer's).
    """

    mixers = ('pool',) * NUM_STAGES


@MODELS.register_module()
class IdentityFormer(_PoolFormerV2Body):
    """IdentityFormer backbone (MetaFormer baselines): identity mapping as the token mixer
    of all four stages, so the blocks mix no tokens; the stem and the downsampling
    convolutions do. PoolFormerV2's block and sizes (s12, s24, s36, m36, m48): GroupNorm
    with one group and no bias, StarReLU MLPs without biases, res scale in stages 3-4.
    Arguments as :class:`ConvFormer`; ``idle_ratio > 0`` gives RePa MLPs."""

    mixers = ('identity',) * NUM_STAGES


@MODELS.register_module()
class RandFormer(_PoolFormerV2Body):
    """RandFormer backbone (MetaFormer baselines): identity mapping in stages 1-2, random
    mixing (a frozen random N x N matrix over the N tokens) in stages 3-4.

    The random matrices are sized for the token grids of ``img_size`` input (196 and 49
    tokens at 224), and those grids are the only ones the model runs at: any other input
    size is refused with an error, so RandFormer is a classifier at its training size with
    no detection or segmentation configs. The matrices are frozen parameters
    (``requires_grad=False``), counted in the parameters as the paper's "+ 0.2 M" and so on.

    Args:
        img_size (int | tuple): Input size (H, W) the random matrices are made for.
            Default: 224.
        **kwargs: As :class:`IdentityFormer`.
    """

    mixers = ('identity', 'identity', 'random', 'random')

    def __init__(
        self, arch: Union[str, dict] = 's12', img_size: Union[int, Sequence[int]] = 224, **kwargs
    ):
        size = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)
        if len(size) != 2 or not all(is_int_at_least(v, 3) for v in size):
            raise ConfigError(f'img_size must be an integer or (H, W), each >= 3, got {img_size!r}')
        # the stem (k7 s4 p2), then three k3 s2 p1 convolutions
        grid = [((size[0] - 3) // 4 + 1, (size[1] - 3) // 4 + 1)]
        for _ in range(NUM_STAGES - 1):
            grid.append(tuple((v - 1) // 2 + 1 for v in grid[-1]))
        self._refuse_options(kwargs)
        MetaFormer.__init__(self, arch, self.mixers, token_grids=grid, **kwargs)
        self.img_size = size

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        if x.dim() == 4 and tuple(x.shape[2:]) != self.img_size:
            raise InputError(
                f'RandFormer mixes tokens with fixed matrices made for {self.img_size[0]} x '
                f'{self.img_size[1]} input and got {tuple(x.shape[2:])}: resize the images, '
                f'or build it with img_size={tuple(x.shape[2:])} (and train it there)'
            )
        return super().forward(x)


_RELEASE_DOWNSAMPLE = re.compile(r'^downsample_layers\.(\d+)\.(pre_norm|post_norm|conv)\.')
_RELEASE_BLOCK = re.compile(r'^stages\.(\d+)\.(\d+)\.')


def _from_original_release(state_dict: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """sail-sg/metaformer layout -> timm's names (``downsample_layers.0`` is the stem)."""
    out = {}
    for k, v in state_dict.items():
        m = _RELEASE_DOWNSAMPLE.match(k)
        if m:
            i, part = int(m.group(1)), 'conv' if m.group(2) == 'conv' else 'norm'
            k = (f'stem.{part}.' if i == 0 else f'stages.{i}.downsample.{part}.') + k[m.end() :]
        elif _RELEASE_BLOCK.match(k):
            k = _RELEASE_BLOCK.sub(r'stages.\1.blocks.\2.', k)
        elif k.startswith('norm.'):  # the classifier's norm; timm calls it head.norm
            k = 'head.' + k
        elif k.startswith('head.'):
            k = 'head.fc.' + k[len('head.') :]
        out[k] = v
    return out


_POOLFORMER_NETWORK = re.compile(r'^network\.(\d+)\.')
_POOLFORMER_OUT_NORM = re.compile(r'^norm(\d+)\.')


def _from_poolformer_release(state_dict: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """PoolFormer v1's original release and mmpretrain's ``PoolFormer`` -> timm's names.

    Both keep stages and downsampling layers in one list, ``network.{2i}.{j}`` being block j
    of stage i and ``network.{2i-1}`` the downsampling into stage i; mmpretrain's output norms
    are ``norm{2i}``; the release's classifier is ``norm`` and ``head``.
    """
    out = {}
    for k, v in state_dict.items():
        m = _POOLFORMER_NETWORK.match(k)
        n = _POOLFORMER_OUT_NORM.match(k)
        rest = k[m.end() :] if m else ''
        if k.startswith('patch_embed.proj.'):
            k = 'stem.conv.' + k[len('patch_embed.proj.') :]
        elif m and int(m.group(1)) % 2:
            k = f'stages.{(int(m.group(1)) + 1) // 2}.downsample.' + rest.replace('proj.', 'conv.')
        elif m:
            block, _, name = rest.partition('.')
            name = re.sub(r'^layer_scale_([12])$', r'layer_scale\1.scale', name)
            k = f'stages.{int(m.group(1)) // 2}.blocks.{block}.{name}'
        elif n and int(n.group(1)) % 2 == 0:
            k = f'norm{int(n.group(1)) // 2}.' + k[n.end() :]
        elif k.startswith('norm.'):
            k = 'head.' + k
        elif k.startswith('head.'):
            k = 'head.fc.' + k[len('head.') :]
        out[k] = v
    return out


_BLOCK_NORM = re.compile(r'^stages\.(\d+)\.blocks\.(\d+)\.norm1\.weight$')
# the parameters that tell the token mixers apart (pooling and identity have none)
_MIXER_KEYS = {'pwconv1.weight': 'conv', 'qkv.weight': 'attn', 'random_matrix': 'random'}
_FAMILIES = {
    ('conv',) * 4: 'ConvFormer',
    ('conv', 'conv', 'attn', 'attn'): 'CAFormer',
    ('none', 'none', 'random', 'random'): 'RandFormer',
}


def _structure(state_dict: Dict[str, torch.Tensor]) -> Optional[dict]:
    """Depths, widths, the mixer of each stage (``'none'``: without parameters) and whether
    the blocks have LayerScale, as read from a state dict in our names; None without blocks."""
    depths, dims = [0] * NUM_STAGES, [0] * NUM_STAGES
    for k, v in state_dict.items():
        m = _BLOCK_NORM.match(k)
        if m and int(m.group(1)) < NUM_STAGES:
            i, j = int(m.group(1)), int(m.group(2))
            depths[i] = max(depths[i], j + 1)
            dims[i] = v.shape[0] if v.dim() == 1 else 0
    if not any(depths):
        return None
    mixers = []
    for i in range(NUM_STAGES):
        prefix = f'stages.{i}.blocks.0.token_mixer.'
        found = [kind for key, kind in _MIXER_KEYS.items() if prefix + key in state_dict]
        mixers.append(found[0] if found else 'none')
    layer_scale = any('.layer_scale1.' in k for k in state_dict)
    return dict(depths=tuple(depths), dims=tuple(dims), mixers=tuple(mixers), ls=layer_scale)


def _describe(structure: dict) -> str:
    family = _FAMILIES.get(structure['mixers'])
    if family is None:
        if structure['mixers'] != ('none',) * 4:
            family = f'MetaFormer with mixers {structure["mixers"]}'
        elif structure['ls']:
            family = 'PoolFormer (v1)'
        else:
            family = 'PoolFormerV2 or IdentityFormer'
    size = dict(depths=structure['depths'], dims=structure['dims'])
    for table in (ARCH_SETTINGS, POOLFORMER_ARCHS):
        names = [name for name, arch in table.items() if arch == size]
        if names:
            return f'{family} {names[0]}'
    return f'{family} with depths {size["depths"]} and dims {size["dims"]}'


def _check_structure(state_dict: Dict[str, torch.Tensor], model: MetaFormer) -> None:
    """Refuse, in one line, a checkpoint of another family or size than ``model``'s.

    PoolFormerV2 and IdentityFormer have the same parameters: their checkpoints cannot be
    told apart, and either loads into the other."""
    mixers = tuple('none' if m in ('pool', 'identity') else m for m in model.token_mixers)
    own = dict(
        depths=model.depths,
        dims=tuple(model.num_features),
        mixers=mixers,
        ls=any(b.layer_scale1 is not None for b in model.stages[0].blocks),
    )
    found = _structure(state_dict)
    name = type(model).__name__
    if found is None:
        raise CheckpointError(
            f'the checkpoint has no MetaFormer blocks (stages.<i>.blocks.<j>.norm1.weight '
            f'after conversion): it is not a {name} checkpoint'
        )
    if found != own:
        raise CheckpointError(
            f'the checkpoint is a {_describe(found)}, the model a {_describe(own)} ({name}): '
            f'give the checkpoint of this family and size, or build the matching type and arch'
        )


def checkpoint_filter_fn(
    state_dict: Dict[str, torch.Tensor], model: MetaFormer, check_structure: bool = True
) -> dict:
    """Convert a MetaFormer-family state dict to :class:`MetaFormer` names and shapes.

    Understands: timm's ``metaformer.py`` (``convformer_s18.sail_in1k``,
    ``poolformer_s12.sail_in1k``, ``poolformerv2_s12.sail_in1k`` etc.: same names; its
    1x1-conv pointwise weights become Linear weights); the MetaFormer release
    (``downsample_layers.*``, ``stages.{i}.{j}.*``, ``norm``, ``head``: ConvFormer,
    CAFormer, PoolFormerV2, IdentityFormer, RandFormer); PoolFormer v1's release and
    mmpretrain's ``PoolFormer`` (``patch_embed``, ``network.*``, ``norm{2i}``); mmrepa's own
    (folded or not, matching ``deploy``), also inside a whole detector or classifier
    (``backbone.*``). The classifier's final norm becomes the last output norm; the classifier
    itself is not loaded (the loader lists it as unused). With ``check_structure``, a
    checkpoint of another family or size is refused (:class:`CheckpointError`, one line).
    """
    state_dict = strip_prefixes(state_dict)
    if any(k.startswith('downsample_layers.') for k in state_dict):
        state_dict = _from_original_release(state_dict)
    elif any(k.startswith(('network.', 'patch_embed.')) for k in state_dict):
        state_dict = _from_poolformer_release(state_dict)
    if check_structure:
        _check_structure(state_dict, model)
    last_norm = f'norm{model.num_stages - 1}'
    out = {}
    for k, v in state_dict.items():
        if k.startswith('head.norm.') and model.has_output_norm(model.num_stages - 1):
            k = last_norm + k[len('head.norm') :]
        out[k] = v  # the classifier (head.fc.*) is left in, to be reported as unused
    own = model.state_dict()
    for k, v in out.items():
        if k in own and v.dim() == 4 and own[k].dim() == 2 and v.shape[2:] == (1, 1):
            out[k] = v.flatten(1)  # timm's 1x1 conv (out, in, 1, 1) -> Linear (out, in)
    return out
