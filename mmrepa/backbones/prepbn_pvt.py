"""PRepBN-PVT and SLAB-PVT: the Pyramid Vision Transformer (v1) with progressive re-parameterized
BatchNorm, optionally with simplified linear attention.

Every LayerNorm of mmdet's ``PyramidVisionTransformer`` becomes a :class:`~mmrepa.layers.PRepBN`,
as in SLAB's release (its PVT passes the same ``LinearNorm`` to every patch embedding, block and
spatial-reduction attention); at test time each folds into its neighbour, so the folded backbone
computes no norm at all. With λ = 1 (pure LayerNorm, training mode) it is mmdet's PVT.
"""

import math
import re
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmcv.cnn.bricks.drop import DropPath
from mmengine.model import BaseModule, ModuleList
from mmengine.model.weight_init import constant_init, normal_init, trunc_normal_
from mmengine.registry import MODELS
from torch.nn.modules.batchnorm import _BatchNorm

from ..checkpoint.loading import strip_prefixes
from ..errors import CheckpointError, ConfigError, ConfigTypeError
from ..fold import (
    FoldPolicy,
    Reparameterizable,
    add_missing_bias,
    affine_into_linear,
    is_affine_norm,
    norm_affine,
    norm_fold_problems,
)
from ..fold.arithmetic import affine_into_conv
from ..layers import (
    ChannelIdleFFN,
    FoldablePatchEmbed,
    PreNormBlock,
    SimplifiedLinearAttention,
    channels_last_norm,
    from_linear_norm,
)
from ..layers.pos_embed import resize_pos_embed
from ..options import (
    check_int,
    per_stage,
    per_stage_ratios,
    pretrained_init_cfg,
    stage_attn_types,
)
from ..registry import build_norm_layer
from .base import DenseBackbone, PRepBNBackbone, drop_path_rates, lookup_arch

# num_layers of the PVT v1 sizes SLAB trains (embed_dims 64, num_heads (1, 2, 5, 8) for all).
ARCH_SETTINGS: Dict[str, dict] = {
    'tiny': dict(embed_dims=64, num_layers=(2, 2, 2, 2), num_heads=(1, 2, 5, 8)),
    'small': dict(embed_dims=64, num_layers=(3, 4, 6, 3), num_heads=(1, 2, 5, 8)),
    'medium': dict(embed_dims=64, num_layers=(3, 4, 18, 3), num_heads=(1, 2, 5, 8)),
}
ARCH_ALIASES = {'t': 'tiny', 's': 'small', 'm': 'medium'}
ARCH_KEYS = ('embed_dims', 'num_layers', 'num_heads')


class SpatialReductionAttention(Reparameterizable, BaseModule):
    """PVT's attention: keys and values from the map reduced by a ``sr_ratio`` strided conv.

    ``q = x W_q``; with ``sr_ratio > 1`` the (already normalised) tokens are reshaped to the
    map, reduced by ``sr`` (kernel = stride = ``sr_ratio``, no padding) and normalised by
    ``norm`` before ``kv``. An affine ``norm`` (RepBN, PRepBN) folds into ``kv``. Names follow
    the PVT release (``q``, ``kv``, ``proj``, ``sr``, ``norm``).

    Input (B, H*W, C) with ``hw_shape = (H, W)``; output (B, H*W, C), before the shortcut.
    """

    def __init__(
        self,
        embed_dims: int,
        num_heads: int,
        sr_ratio: int = 1,
        qkv_bias: bool = True,
        attn_drop_rate: float = 0.0,
        proj_drop_rate: float = 0.0,
        norm_cfg: dict = dict(type='LN'),
        deploy: bool = False,
        init_cfg: Optional[dict] = None,
    ):
        super().__init__(init_cfg=init_cfg)
        if embed_dims % num_heads:
            raise ConfigError(f'embed_dims {embed_dims} must be divisible by num_heads {num_heads}')
        self.num_heads = num_heads
        self.sr_ratio = sr_ratio
        self.attn_drop_rate = attn_drop_rate
        self.q = nn.Linear(embed_dims, embed_dims, bias=qkv_bias)
        self.kv = nn.Linear(embed_dims, 2 * embed_dims, bias=qkv_bias)
        self.proj = nn.Linear(embed_dims, embed_dims)
        self.proj_drop = nn.Dropout(proj_drop_rate)
        self.sr = self.norm = None
        if sr_ratio > 1:
            self.sr = nn.Conv2d(embed_dims, embed_dims, sr_ratio, stride=sr_ratio)
            self.norm = build_norm_layer(norm_cfg, embed_dims)[1]
        self.deploy = False
        if deploy and is_affine_norm(self.norm):
            self._apply_fold({}, FoldPolicy())
            self.deploy = True

    def reduced(self, x: torch.Tensor, hw_shape: Tuple[int, int]) -> torch.Tensor:
        """The tokens keys and values are computed from: (B, H*W, C) -> (B, N_kv, C)."""
        if self.sr is None:
            return x
        B, _, C = x.shape
        y = self.sr(x.transpose(1, 2).reshape(B, C, *hw_shape)).flatten(2).transpose(1, 2)
        return y if self.norm is None else channels_last_norm(self.norm, y)

    def forward(self, x: torch.Tensor, hw_shape: Tuple[int, int]) -> torch.Tensor:
        B, N, C = x.shape
        h = self.num_heads
        q = self.q(x).view(B, N, h, C // h).transpose(1, 2)
        k, v = self.kv(self.reduced(x, hw_shape)).view(B, -1, 2, h, C // h).permute(2, 0, 3, 1, 4)
        drop = self.attn_drop_rate if self.training else 0.0
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=drop)  # scale head_dim ** -0.5
        return self.proj_drop(self.proj(out.transpose(1, 2).reshape(B, N, C)))

    def fold_problems(self) -> List[str]:
        return norm_fold_problems(self.norm, 'norm')

    def _fold_tensors(self, dtype: torch.dtype, policy: FoldPolicy) -> dict:
        """An affine ``norm`` (``y * s + t``) into ``kv``."""
        if self.norm is None or not is_affine_norm(self.norm):
            return {}
        w, b = affine_into_linear(self.kv, *norm_affine(self.norm, dtype), dtype)
        return {'kv.weight': w, 'kv.bias': b}

    def _apply_fold(self, tensors: dict, policy: FoldPolicy) -> None:
        if self.norm is not None and is_affine_norm(self.norm):
            self.norm = None
            add_missing_bias(self.kv)


class PVTBlock(PreNormBlock):
    """``x + attn(norm1(x))`` then the FFN (which owns its norm ``norm1`` and the shortcut).

    ``attn_type``: ``'S'`` PVT's spatial-reduction attention; ``'L'`` SLAB's simplified linear
    attention (:class:`~mmrepa.layers.SimplifiedLinearAttention`) over the whole map, without
    spatial reduction (``sr_ratio`` unused), its positional encoding sized ``linear_grid`` and
    resized to other maps. An affine ``norm1`` folds into everything that reads it: ``attn.q``
    and ``attn.sr`` (or ``attn.kv`` without spatial reduction), or the linear attention's
    ``attn.qkv``. ``deploy=True`` builds the folded structure.
    """

    def __init__(
        self,
        embed_dims: int,
        num_heads: int,
        sr_ratio: int,
        ffn_cfg: dict,
        attn_type: str = 'S',
        linear_grid: Optional[Tuple[int, int]] = None,
        qkv_bias: bool = True,
        drop_rate: float = 0.0,
        attn_drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
        norm_cfg: dict = dict(type='LN'),
        with_cp: bool = False,
        deploy: bool = False,
        init_cfg: Optional[dict] = None,
    ):
        super().__init__(init_cfg=init_cfg)
        self.with_cp = with_cp
        self.deploy = False
        self.norm1 = build_norm_layer(norm_cfg, embed_dims)[1]
        if attn_type == 'L':
            self.attn = SimplifiedLinearAttention(
                embed_dims, num_heads, linear_grid, qkv_bias=qkv_bias, proj_drop_rate=drop_rate
            )
        else:
            self.attn = SpatialReductionAttention(
                embed_dims,
                num_heads,
                sr_ratio,
                qkv_bias=qkv_bias,
                attn_drop_rate=attn_drop_rate,
                proj_drop_rate=drop_rate,
                norm_cfg=norm_cfg,
                deploy=deploy,
            )
        self.drop_path = DropPath(drop_path_rate) if drop_path_rate > 0 else nn.Identity()
        self.ffn = ChannelIdleFFN(
            embed_dims, drop_rate=drop_rate, drop_path_rate=drop_path_rate, **ffn_cfg
        )
        if deploy and is_affine_norm(self.norm1):
            self._apply_fold({}, FoldPolicy())
            self.deploy = True

    def _mix(self, y: torch.Tensor, hw_shape: Tuple[int, int]) -> torch.Tensor:
        return self.attn(y, hw_shape=hw_shape)

    def _readers(self) -> List[str]:
        if isinstance(self.attn, SimplifiedLinearAttention):
            return ['qkv']
        return ['q', 'sr' if self.attn.sr is not None else 'kv']

    def _fold_tensors(self, dtype: torch.dtype, policy: FoldPolicy) -> dict:
        """An affine ``norm1`` (``x * s + t``) into ``q`` and ``sr`` (or ``kv``), or ``qkv``;
        ``sr`` has no padding, so every tap of the conv reads a normalised token and the fold is
        exact on any map size (the linear attention's depthwise conv pads ``v``, after ``qkv``)."""
        if self.norm1 is None or not is_affine_norm(self.norm1):
            return {}
        scale, shift = norm_affine(self.norm1, dtype)
        out = {}
        for name in self._readers():
            layer = getattr(self.attn, name)
            fold = affine_into_conv if isinstance(layer, nn.Conv2d) else affine_into_linear
            out[f'attn.{name}.weight'], out[f'attn.{name}.bias'] = fold(layer, scale, shift, dtype)
        return out

    def _apply_fold(self, tensors: dict, policy: FoldPolicy) -> None:
        if self.norm1 is None or not is_affine_norm(self.norm1):
            return
        self.norm1 = None
        for name in self._readers():
            add_missing_bias(getattr(self.attn, name))


class PVTStage(BaseModule):
    """A PVT stage: patch embedding (stages after the first), position embedding, blocks."""

    def __init__(
        self,
        blocks: List[PVTBlock],
        patch_embed: Optional[nn.Module],
        pos_shape: Optional[Tuple[int, int]],
        embed_dims: int,
        drop_rate: float,
    ):
        super().__init__()
        self.patch_embed = patch_embed
        self.pos_shape = pos_shape
        self.pos_embed = None
        if pos_shape is not None:
            self.pos_embed = nn.Parameter(torch.zeros(1, pos_shape[0] * pos_shape[1], embed_dims))
        self.pos_drop = nn.Dropout(drop_rate)
        self.blocks = ModuleList(blocks)

    def position_embedding(self, hw_shape: Tuple[int, int]) -> torch.Tensor:
        """The embedding bilinearly resized to the map, as mmdet's PVT."""
        return resize_pos_embed(self.pos_embed, self.pos_shape, hw_shape, mode='bilinear')

    def forward(self, x: torch.Tensor, hw_shape: Tuple[int, int]):
        if self.pos_embed is not None:
            x = x + self.position_embedding(hw_shape)
        x = self.pos_drop(x)
        for block in self.blocks:
            x = block(x, hw_shape)
        return x


def _pair(value) -> Tuple[int, int]:
    return tuple(value) if isinstance(value, (list, tuple)) else (value, value)


def _per_stage_options(depths: Tuple[int, ...], **options) -> Dict[str, list]:
    """Every option as one value per stage of ``num_layers`` (:func:`per_stage`)."""
    return {name: per_stage(value, len(depths), name) for name, value in options.items()}


def _pretrain_grids(img: Tuple[int, int], patch_sizes: Sequence[int]) -> List[Tuple[int, int]]:
    """Each stage's map at the pretraining image size, which sizes its position embedding and
    linear attention's encoding: mmdet divides by the product of the patch sizes so far (not
    of the strides)."""
    grids, cumulative_patch = [], 1
    for k in patch_sizes:
        cumulative_patch *= k
        grids.append(tuple(side // cumulative_patch for side in img))
    return grids


def _arch(arch: Union[str, dict, None], given: dict) -> dict:
    """``arch`` (default ``'tiny'``) with mmdet's ``embed_dims``/``num_layers``/``num_heads``;
    an explicit ``arch`` they contradict is an error."""
    if arch is None:
        settings = dict(lookup_arch('tiny', ARCH_SETTINGS, ARCH_KEYS), **given)
        return lookup_arch(settings, ARCH_SETTINGS, ARCH_KEYS)
    settings = lookup_arch(arch, ARCH_SETTINGS, ARCH_KEYS, ARCH_ALIASES)
    clash = {
        k: v
        for k, v in given.items()
        if (tuple(v) if isinstance(v, (list, tuple)) else v)
        != (tuple(settings[k]) if isinstance(settings[k], (list, tuple)) else settings[k])
    }
    if clash:
        raise ConfigError(
            f'arch={arch!r} has {", ".join(f"{k}={settings[k]}" for k in clash)} but '
            f'{", ".join(f"{k}={v}" for k, v in clash.items())} was also given (mmdet PVT '
            'arguments, perhaps from a base config): drop one of them'
        )
    return settings


def _prepbn_cfg(norm_cfg: dict, prepbn_cfg: dict) -> dict:
    """The PRepBN config that stands in for mmdet's ``norm_cfg`` (a LayerNorm: its ``eps``
    carries over); any other norm cannot be honoured."""
    cfg = dict(norm_cfg)
    kind = cfg.pop('type', None)
    eps = cfg.pop('eps', None)
    if kind not in ('LN', 'LayerNorm') or cfg:
        raise ConfigError(
            f'norm_cfg={norm_cfg}: PRepBNPVT replaces the LayerNorms with prepbn_cfg; only '
            "norm_cfg=dict(type='LN', eps=...) can be honoured"
        )
    PRepBNBackbone._check_prepbn_cfg(prepbn_cfg)
    return dict(prepbn_cfg) if eps is None or 'eps' in prepbn_cfg else dict(prepbn_cfg, eps=eps)


@MODELS.register_module()
class PRepBNPVT(PRepBNBackbone, DenseBackbone):
    """Pyramid Vision Transformer (v1) backbone whose norms are PRepBN (SLAB's PRepBN-PVT),
    optionally with simplified linear attention (SLAB-PVT).

    mmdet's ``PyramidVisionTransformer`` with every LayerNorm a PRepBN: the patch-embedding
    norms, each block's ``norm1`` and FFN norm, and the norm after the spatial-reduction conv.
    While training each computes ``λ·LN(x) + (1 − λ)·RepBN(x)`` with λ set by
    ``PRepBNScheduleHook``; in eval mode it is RepBN, and :meth:`reparameterize` folds it away:
    the patch-embedding norm into the conv before it (bias scaled too), ``norm1`` into ``q``
    and the spatial-reduction conv (``kv`` in the last stage, which has no reduction), the
    reduction's norm into ``kv``, the FFN norm into ``fc1``. The folded backbone computes no
    norm; nothing pads after a norm, so every fold is exact on any input size.

    ``attn_types='LLLL'`` gives SLAB-PVT: simplified linear attention in every stage over the
    whole map, without spatial reduction (SLAB's release: its PVT_LA_SR_RATIOS 1111), the keys'
    positional encoding sized for the stage's map at ``pretrain_img_size`` (resized bicubically
    to other maps), a 5 x 5 depthwise conv on the values; ``norm1`` folds into its ``qkv``.

    Args:
        arch (str | dict, optional): ``'tiny'``, ``'small'``, ``'medium'`` (or ``t/s/m``), or
            ``dict(embed_dims=..., num_layers=..., num_heads=...)``; stage i has
            ``embed_dims * num_heads[i]`` channels. Default: ``'tiny'``, changed by mmdet-style
            ``embed_dims``/``num_layers``/``num_heads`` if given.
        pretrain_img_size (int | tuple): Image size the position embeddings are sized for
            (resized bilinearly to other inputs). Default: 224.
        in_channels (int): Input image channels. Default: 3.
        num_stages (int): Must equal the arch's number of stages. Default: 4.
        patch_sizes, strides, paddings (Sequence[int]): Per-stage patch-embedding conv.
            Default: (4, 2, 2, 2), (4, 2, 2, 2), (0, 0, 0, 0).
        sr_ratios (Sequence[int]): Spatial-reduction ratio per stage, used by the ``'S'``
            stages. Default: (8, 4, 2, 1).
        attn_types (str, optional): One letter per stage: ``'S'`` PVT's spatial-reduction
            attention, ``'L'`` simplified linear attention (``'LLLL'``: SLAB-PVT).
            Default: all ``'S'``.
        mlp_ratios (Sequence[float]): FFN hidden width / channels per stage.
            Default: (8, 8, 4, 4).
        idle_ratio (float | Sequence[float]): Fraction of FFN hidden channels left linear
            (RePaFormer), one value or one per stage; 0 is PVT's FFN. Default: 0.
        qkv_bias (bool): Bias in ``q`` and ``kv``. Default: True.
        drop_rate, attn_drop_rate (float): Dropout rates. Default: 0.
        drop_path_rate (float): Stochastic depth, rising linearly to this. Default: 0.1.
        use_abs_pos_embed (bool): Learned absolute position embedding per stage. Default: True.
        act_cfg (dict): FFN activation. Default: ``dict(type='GELU')``.
        norm_cfg (dict): mmdet's norm; only a LayerNorm, whose ``eps`` the PRepBNs take.
            Default: ``dict(type='LN', eps=1e-6)``.
        prepbn_cfg (dict): The norm that replaces it; affine at inference (``PRepBN`` or
            ``RepBN``). Default: ``dict(type='PRepBN')``.
        out_norm_cfg (dict, optional): Norms on the outputs; None as mmdet's PVT. Default: None.
        out_indices (Sequence[int] | int): Stages whose outputs are returned.
            Default: (0, 1, 2, 3).
        frozen_stages (int): Freeze the first patch embedding (0) and stages 1..n (n >= 1,
            each with its patch embedding and position embedding). Default: -1.
        norm_eval (bool): Keep the BatchNorms inside the PRepBNs in eval mode. Default: False.
        with_cp (bool): Gradient checkpointing per block. Default: False.
        deploy (bool): Build the folded structure directly. Default: False.
        init_cfg (dict, optional): ``dict(type='Pretrained', checkpoint=PATH)`` loads mmrepa,
            mmdet (also a whole detector's), PVT-release and SLAB checkpoints, see
            :func:`checkpoint_filter_fn`; mmdet's ``dict(checkpoint=PATH)`` too.
        **mmdet_pvt_args: mmdet ``PyramidVisionTransformer`` arguments with no counterpart:
            ``embed_dims``, ``num_layers``, ``num_heads`` (the arch), ``pretrained``
            (deprecated, becomes ``init_cfg``), ``convert_weights`` (unused: the layout is
            recognised from the keys), ``norm_after_stage`` and ``use_conv_ffn`` (PVTv2's;
            only False).

    Input (B, in_channels, H, W), any size the strides and reductions fit; outputs NCHW maps of
    ``embed_dims * num_heads[i]`` channels for the stages in ``out_indices``.
    """

    stem_name = 'patch_embed'

    def __init__(
        self,
        arch: Union[str, dict, None] = None,
        pretrain_img_size: Union[int, Sequence[int]] = 224,
        in_channels: int = 3,
        num_stages: int = 4,
        patch_sizes: Sequence[int] = (4, 2, 2, 2),
        strides: Sequence[int] = (4, 2, 2, 2),
        paddings: Sequence[int] = (0, 0, 0, 0),
        sr_ratios: Sequence[int] = (8, 4, 2, 1),
        attn_types: Optional[str] = None,
        mlp_ratios: Sequence[float] = (8, 8, 4, 4),
        idle_ratio: Union[float, Sequence[float]] = 0.0,
        qkv_bias: bool = True,
        drop_rate: float = 0.0,
        attn_drop_rate: float = 0.0,
        drop_path_rate: float = 0.1,
        use_abs_pos_embed: bool = True,
        act_cfg: dict = dict(type='GELU'),
        norm_cfg: dict = dict(type='LN', eps=1e-6),
        prepbn_cfg: dict = dict(type='PRepBN'),
        out_norm_cfg: Optional[dict] = None,
        out_indices: Union[int, Sequence[int]] = (0, 1, 2, 3),
        frozen_stages: int = -1,
        norm_eval: bool = False,
        with_cp: bool = False,
        deploy: bool = False,
        init_cfg: Optional[dict] = None,
        **mmdet_pvt_args,
    ):
        init_cfg = _translate_mmdet_args(mmdet_pvt_args, init_cfg)
        super().__init__(init_cfg=init_cfg)
        arch = _arch(arch, {k: mmdet_pvt_args[k] for k in ARCH_KEYS if k in mmdet_pvt_args})
        depths = tuple(arch['num_layers'])
        stages = _per_stage_options(
            depths,
            num_heads=tuple(arch['num_heads']),
            patch_sizes=patch_sizes,
            strides=strides,
            paddings=paddings,
            sr_ratios=sr_ratios,
            mlp_ratios=mlp_ratios,
        )
        if num_stages != len(depths):
            raise ConfigError(f'num_stages={num_stages} but num_layers {depths} has {len(depths)}')
        if isinstance(out_indices, int):
            out_indices = (out_indices,)
        self._check_options(len(depths), out_indices, frozen_stages, norm_eval, deploy)
        norm = _prepbn_cfg(norm_cfg, prepbn_cfg)
        stages['idle_ratios'] = per_stage_ratios(idle_ratio, self.num_stages, 'idle_ratio')
        self.attn_types = stage_attn_types(attn_types, self.num_stages, 'LLLL')
        self.in_channels = in_channels
        self.num_features = [arch['embed_dims'] * h for h in stages['num_heads']]
        self.arch_settings = dict(arch, num_layers=depths, num_heads=tuple(stages['num_heads']))
        self._geometry = self._stage_geometry(stages)
        self.min_input_size = self._min_input_size()
        block_cfg = dict(
            qkv_bias=qkv_bias,
            drop_rate=drop_rate,
            attn_drop_rate=attn_drop_rate,
            norm_cfg=norm,
            with_cp=with_cp,
            deploy=deploy,
        )
        ffn_cfg = dict(norm_cfg=norm, hidden_norm_cfg=None, act_cfg=act_cfg, deploy=deploy)
        grids = _pretrain_grids(_pair(pretrain_img_size), stages['patch_sizes'])
        pos_shapes = grids if use_abs_pos_embed else [None] * len(depths)
        dpr = drop_path_rates(drop_path_rate, sum(depths))
        self.stages = ModuleList()
        for i, depth in enumerate(depths):
            first = sum(depths[:i])
            rates = dpr[first : first + depth]
            self._add_stage(i, stages, grids[i], pos_shapes[i], rates, block_cfg, ffn_cfg)
        self._setup_outputs(out_norm_cfg)
        # In eval mode a fresh RepBN does not normalise; start from PVT's init so that an
        # unloaded model is sane (init_weights applies it again or loads a checkpoint).
        self._default_init()

    def _stage_geometry(self, stages: dict) -> list:
        """Per stage: the patch conv's kernel, stride and padding and the reduction the
        attention applies (none in an 'L' stage: the linear attention sees every token)."""
        return [
            (
                _pair(check_int(k, 'patch_sizes')),
                _pair(s),
                _pair(p),
                1 if t == 'L' else check_int(r, 'sr_ratios'),
            )
            for k, s, p, r, t in zip(
                stages['patch_sizes'],
                stages['strides'],
                stages['paddings'],
                stages['sr_ratios'],
                self.attn_types,
            )
        ]

    def _add_stage(
        self,
        i: int,
        stages: dict,
        grid: Tuple[int, int],
        pos_shape: Optional[Tuple[int, int]],
        drop_path_rates: Sequence[float],
        block_cfg: dict,
        ffn_cfg: dict,
    ) -> None:
        """Build stage ``i`` (its patch embedding first, as mmdet) and append it."""
        embed = self._patch_embed(i, stages, block_cfg['norm_cfg'], block_cfg['deploy'])
        if i == 0:
            self.patch_embed = embed
        blocks = self._blocks(i, stages, grid, drop_path_rates, block_cfg, ffn_cfg)
        dims, drop_rate = self.num_features[i], block_cfg['drop_rate']
        self.stages.append(PVTStage(blocks, None if i == 0 else embed, pos_shape, dims, drop_rate))

    def _patch_embed(self, i: int, stages: dict, norm: dict, deploy: bool) -> nn.Module:
        """Stage ``i``'s patch embedding (conv, then the norm)."""
        return FoldablePatchEmbed(
            in_channels=self.in_channels if i == 0 else self.num_features[i - 1],
            embed_dims=self.num_features[i],
            kernel_size=stages['patch_sizes'][i],
            stride=stages['strides'][i],
            padding=stages['paddings'][i],
            bias=True,
            norm_cfg=norm,
            deploy=deploy,
        )

    def _blocks(
        self,
        i: int,
        stages: dict,
        grid: Tuple[int, int],
        drop_path_rates: Sequence[float],
        block_cfg: dict,
        ffn_cfg: dict,
    ) -> List[PVTBlock]:
        """Stage ``i``'s blocks, one per drop-path rate."""
        ffn_cfg = dict(
            ffn_cfg, mlp_ratio=stages['mlp_ratios'][i], idle_ratio=stages['idle_ratios'][i]
        )
        return [
            PVTBlock(
                self.num_features[i],
                stages['num_heads'][i],
                stages['sr_ratios'][i],
                ffn_cfg,
                attn_type=self.attn_types[i],
                linear_grid=grid,
                drop_path_rate=rate,
                **block_cfg,
            )
            for rate in drop_path_rates
        ]

    def _min_input_size(self) -> int:
        """The smallest side every patch embedding and spatial reduction fits."""
        for size in range(1, 4097):
            s, ok = size, True
            for (k, _), (st, _), (p, _), r in self._geometry:
                s = (s + 2 * p - k) // st + 1
                ok = ok and s >= max(1, r)
            if ok:
                return size
        raise ConfigError('no input size up to 4096 fits these patch sizes and sr_ratios')

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        """x: (B, in_channels, H, W) -> tuple of (B, C_i, H_i, W_i)."""
        self._check_input(
            x,
            self.min_input_size,
            f'PRepBNPVT with these patch sizes and sr_ratios needs at least '
            f'{self.min_input_size} px per side',
        )
        outs = []
        for i, stage in enumerate(self.stages):
            embed = self.patch_embed if i == 0 else stage.patch_embed
            x, hw_shape = embed(x)
            hw_shape = (int(hw_shape[0]), int(hw_shape[1]))
            x = stage(x, hw_shape)
            if i in self.out_indices:
                x = channels_last_norm(getattr(self, f'norm{i}'), x)
            x = x.transpose(1, 2).reshape(x.shape[0], -1, *hw_shape)
            if i in self.out_indices:
                outs.append(x)
        return tuple(outs)

    def _default_init(self):
        """PVT's initialisation (mmdet's): truncated-normal Linear weights and position
        embeddings, He-normal convs (fan-out), identity norms."""
        for m in self.modules():
            if isinstance(m, nn.Linear):
                trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, (nn.LayerNorm, _BatchNorm)):
                constant_init(m, 1.0, bias=0.0)
            elif isinstance(m, nn.Conv2d):
                fan_out = m.kernel_size[0] * m.kernel_size[1] * m.out_channels // m.groups
                normal_init(m, 0, math.sqrt(2.0 / fan_out))
            elif isinstance(m, PVTStage) and m.pos_embed is not None:
                trunc_normal_(m.pos_embed, std=0.02)

    def filter_checkpoint(self, state_dict):
        """Any PVT layout in PRepBNPVT names; see :func:`checkpoint_filter_fn`."""
        return checkpoint_filter_fn(state_dict, self)


_MMDET_ONLY = ('embed_dims', 'num_layers', 'num_heads', 'pretrained', 'convert_weights')
_PVT_V2 = ('norm_after_stage', 'use_conv_ffn')


def _translate_mmdet_args(args: dict, init_cfg: Optional[dict]) -> Optional[dict]:
    """Check mmdet PVT's arguments without a counterpart; returns the ``init_cfg`` to use."""
    unknown = set(args) - set(_MMDET_ONLY) - set(_PVT_V2)
    if unknown:
        raise ConfigTypeError(f'PRepBNPVT got unexpected arguments {sorted(unknown)}')
    for key in _PVT_V2:
        if args.get(key):
            raise ConfigError(
                f'{key}=True (a PVTv2 option) cannot be honoured: PRepBNPVT is PVT v1; '
                f'set {key}=False'
            )
    init_cfg = pretrained_init_cfg(args.get('pretrained'), init_cfg)
    if isinstance(init_cfg, dict) and 'checkpoint' in init_cfg and 'type' not in init_cfg:
        init_cfg = dict(init_cfg, type='Pretrained')  # mmdet's PVT configs leave out the type
    return init_cfg


_RELEASE_KEY = re.compile(r'^(patch_embed|pos_embed|block)(\d)(.*)$')
_MMDET_KEY = re.compile(r'^layers\.(\d+)\.(\d)\.(.*)$')


def _from_release(state_dict: Dict[str, torch.Tensor], model: PRepBNPVT) -> dict:
    """PVT release / SLAB classification layout (``patch_embed1.proj``, ``pos_embed1``,
    ``block1.0.attn.q``, ``block1.0.mlp.fc1``, ``norm``, ``cls_token``, ``head``)."""
    out = {}
    last = model.num_stages - 1
    for k, v in state_dict.items():
        if k.startswith(('head.', 'cls_token')):
            continue
        if k.startswith('norm.'):  # the classifier's final norm
            if model.has_output_norm(last):
                out[f'norm{last}' + k[len('norm') :]] = v
            continue
        m = _RELEASE_KEY.match(k)
        if m is None:
            out[k] = v
            continue
        kind, i, rest = m[1], int(m[2]) - 1, m[3]
        if kind == 'patch_embed':
            rest = rest.replace('.proj.', '.projection.')
            out[('patch_embed' if i == 0 else f'stages.{i}.patch_embed') + rest] = v
        elif kind == 'pos_embed':
            pos = model.stages[i].pos_shape
            if pos is not None and v.shape[1] == pos[0] * pos[1] + 1:
                v = v[:, 1:]  # the release's last stage carries the class token's embedding
            out[f'stages.{i}.pos_embed'] = v
        else:
            rest = rest.replace('.mlp.', '.ffn.').replace('.norm2.', '.ffn.norm1.')
            out[f'stages.{i}.blocks{rest}'] = v
    return _join_linear_qkv(out, model)


def _join_linear_qkv(state_dict: Dict[str, torch.Tensor], model: PRepBNPVT) -> dict:
    """SLAB-PVT's linear attention keeps PVT's ``q`` and ``kv``; the shared layer has one
    ``qkv`` (q rows, then k and v rows, the order of ``kv``)."""
    for i, stage in enumerate(model.stages):
        for j, block in enumerate(stage.blocks):
            if not isinstance(block.attn, SimplifiedLinearAttention):
                continue
            p = f'stages.{i}.blocks.{j}.attn.'
            for leaf in ('weight', 'bias'):
                if p + 'q.' + leaf in state_dict and p + 'kv.' + leaf in state_dict:
                    q, kv = state_dict.pop(p + 'q.' + leaf), state_dict.pop(p + 'kv.' + leaf)
                    state_dict[p + 'qkv.' + leaf] = torch.cat([q, kv])
    return state_dict


def _from_mmdet(state_dict: Dict[str, torch.Tensor], model: PRepBNPVT) -> dict:
    """mmdet ``PyramidVisionTransformer`` layout (``layers.{i}.{0: embed, 1: pos + blocks}``)."""
    has_pos = any(re.match(r'^layers\.\d+\.1\.0\.pos_embed$', k) for k in state_dict)
    out = {}
    for k, v in state_dict.items():
        m = _MMDET_KEY.match(k)
        if m is None:
            out[k] = v
            continue
        i, part, rest = int(m[1]), m[2], m[3]
        if part == '0':
            out[('patch_embed.' if i == 0 else f'stages.{i}.patch_embed.') + rest] = v
            continue
        if part == '2':  # norm_after_stage (PVTv2), which PRepBNPVT refuses
            out[f'layers.{i}.2.{rest}'] = v
            continue
        j, rest = rest.split('.', 1)
        if has_pos and j == '0':
            out[f'stages.{i}.pos_embed'] = v
            continue
        prefix = f'stages.{i}.blocks.{int(j) - has_pos}.'
        C = model.num_features[i] if i < model.num_stages else 0
        if rest.startswith('attn.attn.in_proj_'):  # q rows, then k and v rows
            leaf = rest[len('attn.attn.in_proj_') :]
            out[prefix + 'attn.q.' + leaf], out[prefix + 'attn.kv.' + leaf] = v[:C], v[C:]
            continue
        rest = rest.replace('attn.attn.out_proj.', 'attn.proj.').replace('norm2.', 'ffn.norm1.')
        if rest.startswith('ffn.layers.'):  # 1x1 convs: fc1 is layers.0, fc2 layers.3
            idx, leaf = rest[len('ffn.layers.') :].split('.', 1)
            rest = f'ffn.{"fc1" if idx == "0" else "fc2"}.{leaf}'
            v = v.flatten(1) if v.dim() == 4 else v
        out[prefix + rest] = v
    return out


def checkpoint_filter_fn(state_dict: Dict[str, torch.Tensor], model: PRepBNPVT) -> dict:
    """Convert a PVT-family state dict to :class:`PRepBNPVT` names.

    Understands: mmrepa's own layout (folded or not); mmdet ``PyramidVisionTransformer``
    backbones (``layers.*``, also inside a whole detector: ``backbone.*``), with the
    ``convert_weights`` layout recognised from the keys; the PVT release's classification
    checkpoints (``patch_embed1``, ``block1``, ``q``/``kv``, the class token dropped) and
    SLAB's (``LinearNorm``: ``X.norm1`` = LayerNorm branch, ``X.norm2`` = RepBN,
    ``iter/total_step`` = λ), SLAB-PVT's too (its linear attention's ``q`` and ``kv`` joined
    into ``qkv``). LayerNorm weights fill the LN branches of the PRepBNs. A
    checkpoint with more blocks, or another width, than the model is refused.
    """
    state_dict = from_linear_norm(strip_prefixes(state_dict))
    if any(k.startswith(('patch_embed1.', 'block1.')) for k in state_dict):
        state_dict = _from_release(state_dict, model)
    elif any(k.startswith('layers.') for k in state_dict):
        state_dict = _from_mmdet(state_dict, model)
    depths = model.arch_settings['num_layers']
    for k in state_dict:
        m = re.match(r'^stages\.(\d+)\.blocks\.(\d+)\.', k)
        if m and (int(m[1]) >= model.num_stages or int(m[2]) >= depths[int(m[1])]):
            raise CheckpointError(
                f'the checkpoint has {k} but this PRepBNPVT has num_layers {depths}: a '
                'checkpoint of another size or family; set arch (tiny/small/medium) to match'
            )
    return model.ln_weights_to_prepbn(state_dict)
