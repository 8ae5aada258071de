"""RePa-Swin: Swin Transformer with channel-idle FFNs that fold at test time (RePaFormer).

With ``idle_ratio=0, ffn_norm='LN'`` the network is exactly mmdet's ``SwinTransformer`` and
loads its checkpoints unchanged; with ``shift_small_maps=False`` too, the released Swin
(Microsoft's, timm's), whose classification checkpoints it loads as well.
"""

from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
from mmengine.model import ModuleList
from mmengine.registry import MODELS

from ...errors import ConfigError, ConfigTypeError
from ...layers import FoldablePatchEmbed, channels_last_norm
from ...options import (
    check_int,
    per_stage,
    per_stage_ratios,
    pretrained_init_cfg,
    stage_attn_types,
)
from ..base import DenseBackbone, drop_path_rates, lookup_arch, trunc_normal_init_
from .blocks import RePaSwinStage
from .checkpoint import checkpoint_filter_fn
from .patch_merging import FoldablePatchMerging

# embed_dims, depths, num_heads of the published Swin variants.
ARCH_SETTINGS: Dict[str, dict] = {
    'tiny': dict(embed_dims=96, depths=(2, 2, 6, 2), num_heads=(3, 6, 12, 24)),
    'small': dict(embed_dims=96, depths=(2, 2, 18, 2), num_heads=(3, 6, 12, 24)),
    'base': dict(embed_dims=128, depths=(2, 2, 18, 2), num_heads=(4, 8, 16, 32)),
}
ARCH_ALIASES = {'t': 'tiny', 's': 'small', 'b': 'base'}


def resolve_arch(arch: Union[str, dict]) -> dict:
    """``'tiny' | 'small' | 'base'`` (or t/s/b) or an explicit dict -> arch settings."""
    arch = lookup_arch(arch, ARCH_SETTINGS, ('embed_dims', 'depths', 'num_heads'), ARCH_ALIASES)
    if len(arch['depths']) != len(arch['num_heads']):
        raise ConfigError(
            f'arch depths {arch["depths"]} and num_heads {arch["num_heads"]} '
            'must have one entry per stage'
        )
    return arch


# mmdet SwinTransformer arguments RePaSwin accepts, so that a config can switch a Swin backbone's
# type without `_delete_=True`; the arch ones override ``arch``.
MMDET_ARCH_ARGS = ('embed_dims', 'depths', 'num_heads')
MMDET_OTHER_ARGS = (
    'pretrain_img_size',
    'strides',
    'use_abs_pos_embed',
    'convert_weights',
    'pretrained',
)


def _arch_with_overrides(arch: Union[str, dict, None], overrides: dict) -> dict:
    """``arch`` (default ``'tiny'``) with mmdet's ``embed_dims``/``depths``/``num_heads``; an
    explicit ``arch`` they contradict is an error (typically the base config's Swin-T values
    left under a new ``arch``)."""
    given = {k: overrides[k] for k in MMDET_ARCH_ARGS if k in overrides}
    if arch is None:
        settings = resolve_arch('tiny')
        settings.update(given)
        return resolve_arch(settings)
    settings = resolve_arch(arch)
    clash = {k: v for k, v in given.items() if tuple(_as_list(v)) != tuple(_as_list(settings[k]))}
    if clash:
        raise ConfigError(
            f'arch={arch!r} has {", ".join(f"{k}={settings[k]}" for k in clash)} but '
            f'{", ".join(f"{k}={v}" for k, v in clash.items())} was also given (mmdet '
            'SwinTransformer arguments, perhaps inherited from a base config): drop one of '
            'them, or replace the inherited backbone with _delete_=True'
        )
    return settings


def _as_list(value) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _translate_mmdet_swin_args(
    args: dict, patch_size: int, init_cfg: Optional[dict]
) -> Optional[dict]:
    """Check mmdet SwinTransformer's other arguments; returns the ``init_cfg`` to use."""
    unknown = set(args) - set(MMDET_ARCH_ARGS) - set(MMDET_OTHER_ARGS)
    if unknown:
        raise ConfigTypeError(f'RePaSwin got unexpected arguments {sorted(unknown)}')
    if args.get('use_abs_pos_embed'):
        raise ConfigError(
            'RePaSwin has no absolute position embedding (use_abs_pos_embed=True); '
            "it uses relative position bias only, as mmdet's Swin by default"
        )
    strides = args.get('strides')
    if strides is not None and tuple(strides) != (patch_size,) + (2,) * (len(strides) - 1):
        raise ConfigError(
            f'strides={tuple(strides)}: RePaSwin embeds patches with stride '
            f'patch_size (={patch_size}) and merges 2x2 patches between stages; '
            'set patch_size instead'
        )
    # pretrain_img_size only sizes mmdet's absolute position embedding, which is off; the
    # checkpoint layout (convert_weights) is recognised from the keys.
    return pretrained_init_cfg(args.get('pretrained'), init_cfg)


@MODELS.register_module()
class RePaSwin(DenseBackbone):
    """Swin Transformer backbone with channel-idle, foldable FFNs (RePa-Swin).

    Outputs NCHW feature maps at strides 4, 8, 16, 32 for the stages in ``out_indices``, each
    through its own output norm ``norm{i}``. Any input size works: the patch embedding, the
    windows and the patch merging pad as mmdet's Swin does.

    Args:
        arch (str | dict, optional): ``'tiny'``, ``'small'``, ``'base'`` (or ``t/s/b``), or
            ``dict(embed_dims=..., depths=..., num_heads=...)``. Default: ``'tiny'``, changed
            by mmdet-style ``embed_dims``/``depths``/``num_heads`` if given.
        in_channels (int): Input image channels. Default: 3.
        patch_size (int): Patch embedding size and stride. Default: 4.
        window_size (int): Attention window side. Default: 7.
        shift_small_maps (bool): How a stage attends a map no larger than its window
            (``min(H, W) <= window_size``: the 7x7 last stage at 224 px), decided per input
            from the map's size. True: mmdet's Swin, the map padded to the window and the odd
            blocks shifted with a mask (detection and segmentation configs). False: the
            released Swin (Microsoft's, timm's; the ImageNet configs), one window of side
            ``min(H, W)`` and no shift; the relative position bias of a window clamped so is
            read from the centre of the table of ``window_size``. Maps larger than the window
            are the same either way. Default: True.
        mlp_ratio (float): FFN hidden width / embed_dims. Default: 4.
        idle_ratio (float | Sequence[float]): Fraction of FFN hidden channels left linear, in
            [0, 1], one value or one per stage. Default: 0.75.
        ffn_norm (str): ``'BN'``: BatchNorm before ``fc1`` and on the hidden layer (everything
            folds); ``'LN'``: Swin's FFN, ``norm_cfg`` (LayerNorm unless changed) before ``fc1``
            and no hidden norm (with ``idle_ratio=0`` this is mmdet's Swin). Default: ``'BN'``.
        attn_types (str, optional): One letter per stage: ``'S'`` softmax window attention,
            ``'L'`` SLAB's simplified linear attention (e.g. ``'LLSS'``). Default: all ``'S'``.
        linear_window_sizes (int | Sequence[int]): Window side of the ``'L'`` stages, one value
            or one per stage; (56, 28, 14, 7) is each stage's whole map at 224 px, as SLAB-Swin
            is pretrained. Default: (56, 28, 14, 7).
        qkv_bias (bool): Bias in the qkv projections. Default: True.
        qk_scale (float, optional): Overrides ``head_dim ** -0.5``.
        patch_norm (bool): Norm after patch embedding and in patch merging. Default: True.
        drop_rate (float): Dropout rate. Default: 0.
        attn_drop_rate (float): Attention dropout rate. Default: 0.
        drop_path_rate (float): Stochastic depth, increasing linearly to this. Default: 0.1.
        act_cfg (dict): FFN activation. Default: ``dict(type='GELU')``.
        norm_cfg (dict): Norms of the attention branch, patch embedding and merging; affine
            ones (BatchNorm such as ``BN1d`` or ``SyncBN``, normalising each channel over all
            tokens; ``RepBN``, ``PRepBN``) fold into ``qkv``, the conv and the reduction.
            Default: ``dict(type='LN')``.
        out_norm_cfg (dict, optional): Norms applied to the outputs (a BatchNorm works per
            channel, as in ``norm_cfg``; None: none). Default: ``dict(type='LN')``.
        out_indices (Sequence[int]): Stages whose outputs are returned. Default: (0, 1, 2, 3).
        frozen_stages (int): Freeze the patch embedding (0) and stages 1..n (n >= 1):
            parameters fixed and eval mode. -1 freezes nothing. Default: -1.
        norm_eval (bool): Keep every BatchNorm in eval mode while training (frozen statistics,
            as detection fine-tuning with small batches needs). Default: False.
        with_cp (bool): Gradient checkpointing per block. Default: False.
        deploy (bool): Build the folded structure directly (load folded checkpoints).
            Default: False.
        init_cfg (dict, optional): ``dict(type='Pretrained', checkpoint=PATH)`` loads mmdet
            Swin, original Swin, timm Swin, RePaViT and mmrepa checkpoints (see
            :func:`checkpoint_filter_fn`); otherwise truncated-normal initialisation.
        **mmdet_swin_args: mmdet ``SwinTransformer`` arguments, so that a Swin config can change
            only the backbone's ``type``: ``embed_dims``, ``depths``, ``num_heads`` (the arch;
            an explicit ``arch`` must agree), ``strides`` (only ``(patch_size, 2, 2, 2)``),
            ``use_abs_pos_embed`` (only False), ``pretrain_img_size`` (sizes only the absolute
            embedding, so unused), ``convert_weights`` (unused: the checkpoint layout is
            recognised from its keys), ``pretrained`` (deprecated, becomes ``init_cfg``).
    """

    stem_name = 'patch_embed'

    def __init__(
        self,
        arch: Union[str, dict, None] = None,
        in_channels: int = 3,
        patch_size: int = 4,
        window_size: int = 7,
        shift_small_maps: bool = True,
        mlp_ratio: float = 4.0,
        idle_ratio: Union[float, Sequence[float]] = 0.75,
        ffn_norm: str = 'BN',
        attn_types: Optional[str] = None,
        linear_window_sizes: Union[int, Sequence[int]] = (56, 28, 14, 7),
        qkv_bias: bool = True,
        qk_scale: Optional[float] = None,
        patch_norm: bool = True,
        drop_rate: float = 0.0,
        attn_drop_rate: float = 0.0,
        drop_path_rate: float = 0.1,
        act_cfg: dict = dict(type='GELU'),
        norm_cfg: dict = dict(type='LN'),
        out_norm_cfg: dict = dict(type='LN'),
        out_indices: Sequence[int] = (0, 1, 2, 3),
        frozen_stages: int = -1,
        norm_eval: bool = False,
        with_cp: bool = False,
        deploy: bool = False,
        init_cfg: Optional[dict] = None,
        **mmdet_swin_args,
    ):
        init_cfg = _translate_mmdet_swin_args(mmdet_swin_args, patch_size, init_cfg)
        super().__init__(init_cfg=init_cfg)
        arch = _arch_with_overrides(arch, mmdet_swin_args)
        self.embed_dims = arch['embed_dims']
        self.num_features = [self.embed_dims * 2**i for i in range(len(arch['depths']))]
        check_int(window_size, 'window_size')
        self.in_channels = in_channels
        self.patch_size = patch_size
        self._check_options(len(arch['depths']), out_indices, frozen_stages, norm_eval, deploy)
        ffn_cfgs = self._ffn_cfgs(idle_ratio, ffn_norm, norm_cfg, mlp_ratio, act_cfg, deploy)
        self.attn_types = stage_attn_types(attn_types, self.num_stages, 'LLSS')
        window_sizes = self._window_sizes(window_size, linear_window_sizes)
        patch_norm_cfg = norm_cfg if patch_norm else None
        self.patch_embed = FoldablePatchEmbed(
            in_channels=in_channels,
            embed_dims=self.embed_dims,
            conv_type='Conv2d',
            kernel_size=patch_size,
            stride=patch_size,
            norm_cfg=patch_norm_cfg,
            deploy=deploy,
        )
        self.drop_after_pos = nn.Dropout(p=drop_rate)
        block_cfg = dict(
            qkv_bias=qkv_bias,
            qk_scale=qk_scale,
            drop_rate=drop_rate,
            attn_drop_rate=attn_drop_rate,
            norm_cfg=norm_cfg,
            shift_small_maps=shift_small_maps,
            with_cp=with_cp,
            deploy=deploy,
        )
        dpr = drop_path_rates(drop_path_rate, sum(arch['depths']))
        self.stages = ModuleList(
            self._stage(i, arch, window_sizes[i], dpr, ffn_cfgs[i], patch_norm_cfg, block_cfg)
            for i in range(self.num_stages)
        )
        self._setup_outputs(out_norm_cfg)

    def _ffn_cfgs(self, idle_ratio, ffn_norm: str, norm_cfg: dict, mlp_ratio, act_cfg, deploy):
        """Each stage's :class:`ChannelIdleFFN` arguments."""
        idle_ratios = per_stage_ratios(idle_ratio, self.num_stages, 'idle_ratio')
        if ffn_norm not in ('BN', 'LN'):
            raise ConfigError(f"ffn_norm must be 'BN' or 'LN', got {ffn_norm!r}")
        bn = ffn_norm == 'BN'
        norm, hidden_norm = (dict(type='BN1d'), dict(type='BN1d')) if bn else (norm_cfg, None)
        return [
            dict(
                mlp_ratio=mlp_ratio,
                idle_ratio=ratio,
                norm_cfg=norm,
                hidden_norm_cfg=hidden_norm,
                act_cfg=act_cfg,
                deploy=deploy,
            )
            for ratio in idle_ratios
        ]

    def _window_sizes(self, window_size: int, linear_window_sizes) -> List[int]:
        """Each stage's window side: ``linear_window_sizes`` in the ``'L'`` stages."""
        if 'L' not in self.attn_types:
            return [window_size] * self.num_stages
        linear = per_stage(linear_window_sizes, self.num_stages, 'linear_window_sizes')
        return [lw if t == 'L' else window_size for t, lw in zip(self.attn_types, linear)]

    def _stage(
        self,
        i: int,
        arch: dict,
        window_size: int,
        dpr: Sequence[float],
        ffn_cfg: dict,
        patch_norm_cfg: Optional[dict],
        block_cfg: dict,
    ) -> RePaSwinStage:
        """Stage ``i``: its blocks, then the patch merging into stage ``i + 1`` (none after the
        last)."""
        dims, depths = self.num_features[i], arch['depths']
        downsample = None
        if i < self.num_stages - 1:  # built before the blocks: the order of random init
            downsample = FoldablePatchMerging(
                in_channels=dims,
                out_channels=2 * dims,
                stride=2,
                norm_cfg=patch_norm_cfg,
                deploy=block_cfg['deploy'],
            )
        first = sum(depths[:i])
        return RePaSwinStage(
            dims,
            depths[i],
            arch['num_heads'][i],
            window_size,
            drop_path_rates=dpr[first : first + depths[i]],
            downsample=downsample,
            ffn_cfg=ffn_cfg,
            attn_type=self.attn_types[i],
            **block_cfg,
        )

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        """x: (B, in_channels, H, W) -> tuple of (B, C_i, ceil(H / 2^(i+2)), ...)."""
        self._check_input(x, self.patch_size, f'smaller than the patch size {self.patch_size}')
        x, hw_shape = self.patch_embed(x)
        # Plain ints, also under tracing (ONNX export): window layouts and masks are per size.
        hw_shape = (int(hw_shape[0]), int(hw_shape[1]))
        x = self.drop_after_pos(x)
        outs = []
        for i, stage in enumerate(self.stages):
            x, hw_shape, out, out_shape = stage(x, hw_shape)
            if i in self.out_indices:
                out = channels_last_norm(getattr(self, f'norm{i}'), out)
                outs.append(
                    out.view(-1, *out_shape, self.num_features[i]).permute(0, 3, 1, 2).contiguous()
                )
        return tuple(outs)

    def _default_init(self):
        """Swin's initialisation: truncated-normal Linear weights, identity norms."""
        trunc_normal_init_(self, (nn.Linear,))

    def filter_checkpoint(self, state_dict):
        """Any Swin layout in RePaSwin names; see :func:`checkpoint_filter_fn`."""
        return checkpoint_filter_fn(state_dict, self)
