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

from typing import Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
from mmengine.model import ModuleList
from mmengine.registry import MODELS

from ...errors import ConfigError, ConfigTypeError, InputError
from ...layers import WindowedSelfAttention
from ...options import is_int_at_least, per_stage, per_stage_ratios
from ...registry import MODELS as MMREPA_MODELS
from ..base import DenseBackbone, drop_path_rates, trunc_normal_init_
from .arch import (
    ARCH_SETTINGS,
    GN1_NO_BIAS,
    LN_NO_BIAS,
    NUM_STAGES,
    POOLFORMER_ARCHS,
    POOLFORMER_LAYER_SCALE,
    resolve_arch,
)
from .blocks import Downsampling, MetaFormerBlock, MetaFormerStage, Stem
from .checkpoint import checkpoint_filter_fn
from .mixers import Pooling, RandomMixing
from .sep_conv import SepConv


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
        mixer_cfg = dict(
            window_sizes=window_sizes,
            global_blocks=global_blocks,
            head_dim=head_dim,
            token_grids=token_grids,
            deploy=deploy,
        )
        block_cfg = dict(
            with_cp=with_cp,
            deploy=deploy,
            norm_cfg=self.block_norm_cfg,
            act_cfg=self.mlp_act_cfg,
            bias=self.mlp_bias,
            layer_scale_init=layer_scale_init,
        )
        dpr = drop_path_rates(drop_path_rate, sum(self.depths))
        self.stages = ModuleList(
            self._stage(i, dpr, mixer_cfg, block_cfg) for i in range(NUM_STAGES)
        )
        self._setup_outputs(out_norm_cfg)

    def _stage(self, i: int, dpr: Sequence[float], mixer_cfg: dict, block_cfg: dict):
        """Stage ``i``: its blocks, then (built after them) the downsampling into it."""
        dims, first = self.num_features[i], sum(self.depths[:i])
        blocks = [
            MetaFormerBlock(
                dims,
                self._mixer(i, j, **mixer_cfg),
                idle_ratio=self.idle_ratios[i],
                res_scale=i in self.res_scale_stages,
                drop_path_rate=dpr[first + j],
                **block_cfg,
            )
            for j in range(self.depths[i])
        ]
        downsample = None
        if i > 0:
            downsample = Downsampling(self.num_features[i - 1], dims, self.downsample_norm_cfg)
        return MetaFormerStage(blocks, downsample)

    def _mixer(self, i, j, window_sizes, global_blocks, head_dim, token_grids, deploy) -> nn.Module:
        """The token mixer of block ``j`` of stage ``i``."""
        dims, kind = self.num_features[i], self.token_mixers[i]
        if kind == 'conv':
            return SepConv(dims, deploy=deploy)
        if kind == 'attn':
            window = None if j in global_blocks[i] else window_sizes[i]
            return WindowedSelfAttention(dims, head_dim=head_dim, window_size=window)
        if kind == 'pool':
            return Pooling()
        if kind == 'random':
            return RandomMixing(token_grids[i])
        return nn.Identity()

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
