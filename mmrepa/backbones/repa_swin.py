"""RePa-Swin: Swin Transformer with channel-idle FFNs that fold at test time (RePaFormer).

With ``idle_ratio=0, ffn_norm='LN'`` the network is exactly mmdet's ``SwinTransformer`` and
loads its checkpoints unchanged.
"""

import math
import re
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
from mmengine.model import BaseModule, ModuleList
from mmengine.registry import MODELS

from ..checkpoint.loading import resize_to_model, strip_prefixes
from ..errors import ConfigError, ConfigTypeError
from ..fold import (
    FoldPolicy,
    Reparameterizable,
    add_missing_bias,
    is_affine_norm,
    norm_affine,
    norm_fold_problems,
    weight_and_bias,
)
from ..layers import (
    ChannelIdleFFN,
    FoldablePatchEmbed,
    FoldablePatchMerging,
    ShiftWindowMSA,
    channels_last_norm,
    checkpoint_forward,
    shifted_window_mask,
)
from ..options import (
    check_int,
    per_stage,
    per_stage_ratios,
    pretrained_init_cfg,
    stage_attn_types,
)
from ..registry import build_norm_layer
from .base import DenseBackbone, drop_path_rates, lookup_arch, trunc_normal_init_

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


class RePaSwinBlock(Reparameterizable, BaseModule):
    """Swin block: ``x + attn(norm1(x))`` then the FFN (which owns its norm and shortcut).

    An affine ``norm1`` (RepBN, PRepBN, BatchNorm) folds into the attention's ``qkv``
    (:meth:`reparameterize`); a LayerNorm stays. ``attn_type`` picks softmax window attention
    (``'S'``) or simplified linear attention (``'L'``), see :class:`ShiftWindowMSA`;
    ``deploy=True`` builds the folded structure.

    Input and output (B, H*W, C) with ``hw_shape = (H, W)``.
    """

    def __init__(
        self,
        embed_dims: int,
        num_heads: int,
        window_size: int,
        shift: bool,
        ffn_cfg: dict,
        qkv_bias: bool = True,
        qk_scale: Optional[float] = None,
        drop_rate: float = 0.0,
        attn_drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
        norm_cfg: dict = dict(type='LN'),
        attn_type: str = 'S',
        with_cp: bool = False,
        deploy: bool = False,
        init_cfg: Optional[dict] = None,
    ):
        super().__init__(init_cfg=init_cfg)
        self.with_cp = with_cp
        self.norm1 = build_norm_layer(norm_cfg, embed_dims)[1]
        norm_folded = deploy and is_affine_norm(self.norm1)
        if norm_folded:
            self.norm1 = None
        self.deploy = deploy
        self.attn = ShiftWindowMSA(
            embed_dims,
            num_heads,
            window_size,
            shift_size=window_size // 2 if shift else 0,
            qkv_bias=qkv_bias,
            qk_scale=qk_scale,
            attn_drop_rate=attn_drop_rate,
            proj_drop_rate=drop_rate,
            drop_path_rate=drop_path_rate,
            attn_type=attn_type,
            norm_folded=norm_folded,
        )
        self.ffn = ChannelIdleFFN(
            embed_dims, drop_rate=drop_rate, drop_path_rate=drop_path_rate, **ffn_cfg
        )

    def _forward(self, x, hw_shape, mask):
        y = x if self.norm1 is None else channels_last_norm(self.norm1, x)
        x = x + self.attn(y, hw_shape, mask)
        return self.ffn(x)

    def forward(
        self, x: torch.Tensor, hw_shape: Tuple[int, int], mask: Optional[torch.Tensor] = None
    ) -> torch.Tensor:
        if self.with_cp:
            return checkpoint_forward(self, self._forward, x, hw_shape, mask)
        return self._forward(x, hw_shape, mask)

    def fold_problems(self) -> List[str]:
        """An affine ``norm1`` must have finite running statistics."""
        return norm_fold_problems(self.norm1, 'norm1')

    def _fold_tensors(self, dtype: torch.dtype, policy: FoldPolicy) -> dict:
        """An affine ``norm1`` (``x * s + t``) into ``qkv``: ``W s``, ``b + W t``. Padded
        window tokens are zeros after the norm; they keep their pre-fold projection
        ``qkv(0) = b`` in ``padded_qkv`` (see :class:`ShiftWindowMSA`)."""
        if self.norm1 is None or not is_affine_norm(self.norm1):
            return {}
        scale, shift = norm_affine(self.norm1, dtype)
        qkv = self.attn.w_msa.qkv
        w, b = weight_and_bias(qkv, dtype)
        padded = self.attn.padded_qkv
        return {
            'attn.w_msa.qkv.weight': w * scale,
            'attn.w_msa.qkv.bias': b + w @ shift,
            'attn.padded_qkv': b if padded is None else padded.to(dtype),
        }

    def _apply_fold(self, tensors: dict, policy: FoldPolicy) -> None:
        if not tensors:
            return
        self.norm1 = None
        qkv, attn = self.attn.w_msa.qkv, self.attn
        add_missing_bias(qkv)
        if attn.padded_qkv is None:
            attn.padded_qkv = qkv.weight.new_empty(qkv.weight.shape[0])


class RePaSwinStage(BaseModule):
    """``depth`` blocks alternating plain and shifted windows, then optional patch merging."""

    def __init__(
        self,
        embed_dims: int,
        depth: int,
        num_heads: int,
        window_size: int,
        drop_path_rates: Sequence[float],
        downsample: Optional[nn.Module] = None,
        init_cfg: Optional[dict] = None,
        **block_kwargs,
    ):
        super().__init__(init_cfg=init_cfg)
        self.window_size = window_size
        self.blocks = ModuleList(
            [
                RePaSwinBlock(
                    embed_dims,
                    num_heads,
                    window_size,
                    shift=i % 2 == 1,
                    drop_path_rate=drop_path_rates[i],
                    **block_kwargs,
                )
                for i in range(depth)
            ]
        )
        self.downsample = downsample
        self._mask_cache = None

    def shifted_window_mask(self, hw_shape: Tuple[int, int], device) -> Optional[torch.Tensor]:
        """The mask all shifted blocks share; kept for the next input of the same size."""
        masked = [block.attn for block in self.blocks if block.attn.needs_mask]
        if not masked:
            return None
        attn = masked[0]
        key = (attn.padded_shape(hw_shape), attn.window_size, attn.shift_size, device)
        if self._mask_cache is None or self._mask_cache[0] != key:
            self._mask_cache = (key, shifted_window_mask(*key[0], *key[1:]))
        return self._mask_cache[1]

    def forward(self, x: torch.Tensor, hw_shape: Tuple[int, int]):
        """Returns (next-stage input, its hw_shape, this stage's output, its hw_shape)."""
        mask = self.shifted_window_mask(hw_shape, x.device)
        for block in self.blocks:
            x = block(x, hw_shape, mask if block.attn.needs_mask else None)
        if self.downsample is None:
            return x, hw_shape, x, hw_shape
        x_down, down_shape = self.downsample(x, hw_shape)
        return x_down, down_shape, x, hw_shape


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
            Swin, original Swin, RePaViT and mmrepa checkpoints (see
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
        depths, num_heads = arch['depths'], arch['num_heads']
        self.num_features = [self.embed_dims * 2**i for i in range(len(depths))]
        check_int(window_size, 'window_size')
        self.in_channels = in_channels
        self.patch_size = patch_size
        self._check_options(len(depths), out_indices, frozen_stages, norm_eval, deploy)
        idle_ratios = per_stage_ratios(idle_ratio, self.num_stages, 'idle_ratio')
        if ffn_norm not in ('BN', 'LN'):
            raise ConfigError(f"ffn_norm must be 'BN' or 'LN', got {ffn_norm!r}")
        ffn_norms = (dict(type='BN1d'), dict(type='BN1d')) if ffn_norm == 'BN' else (norm_cfg, None)
        self.attn_types = stage_attn_types(attn_types, self.num_stages, 'LLSS')
        window_sizes = [window_size] * self.num_stages
        if 'L' in self.attn_types:
            linear = per_stage(linear_window_sizes, self.num_stages, 'linear_window_sizes')
            window_sizes = [
                lw if t == 'L' else window_size for t, lw in zip(self.attn_types, linear)
            ]

        self.patch_embed = FoldablePatchEmbed(
            in_channels=in_channels,
            embed_dims=self.embed_dims,
            conv_type='Conv2d',
            kernel_size=patch_size,
            stride=patch_size,
            norm_cfg=norm_cfg if patch_norm else None,
            deploy=deploy,
        )
        self.drop_after_pos = nn.Dropout(p=drop_rate)
        dpr = drop_path_rates(drop_path_rate, sum(depths))
        self.stages = ModuleList()
        for i, depth in enumerate(depths):
            dims = self.num_features[i]
            downsample = (
                FoldablePatchMerging(
                    in_channels=dims,
                    out_channels=2 * dims,
                    stride=2,
                    norm_cfg=norm_cfg if patch_norm else None,
                    deploy=deploy,
                )
                if i < self.num_stages - 1
                else None
            )
            ffn_cfg = dict(
                mlp_ratio=mlp_ratio,
                idle_ratio=idle_ratios[i],
                norm_cfg=ffn_norms[0],
                hidden_norm_cfg=ffn_norms[1],
                act_cfg=act_cfg,
                deploy=deploy,
            )
            self.stages.append(
                RePaSwinStage(
                    dims,
                    depth,
                    num_heads[i],
                    window_sizes[i],
                    drop_path_rates=dpr[sum(depths[:i]) : sum(depths[: i + 1])],
                    downsample=downsample,
                    ffn_cfg=ffn_cfg,
                    qkv_bias=qkv_bias,
                    qk_scale=qk_scale,
                    drop_rate=drop_rate,
                    attn_drop_rate=attn_drop_rate,
                    norm_cfg=norm_cfg,
                    attn_type=self.attn_types[i],
                    with_cp=with_cp,
                    deploy=deploy,
                )
            )
        self._setup_outputs(out_norm_cfg)

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


def _unfold_order(w: torch.Tensor) -> torch.Tensor:
    """Reorder a patch-merging tensor from Swin's concat order to ``nn.Unfold``'s order.

    Swin concatenates the 2x2 neighbours as (0,0), (1,0), (0,1), (1,1) blocks of C channels;
    mmcv's PatchMerging unfolds channel-major with positions (0,0), (0,1), (1,0), (1,1).
    """
    lead, C = w.shape[:-1], w.shape[-1] // 4
    return w.reshape(*lead, 4, C)[..., [0, 2, 1, 3], :].transpose(-1, -2).reshape(*lead, 4 * C)


def _from_original_swin(state_dict: Dict[str, torch.Tensor], model: RePaSwin) -> dict:
    """Microsoft Swin / RePaViT classification layout -> mmdet-style names."""
    out = {}
    last_norm = f'norm{model.num_stages - 1}'
    for k, v in state_dict.items():
        if k.startswith('head.') or k.endswith(('relative_position_index', 'attn_mask')):
            continue
        if k.startswith('norm.'):
            if model.has_output_norm(model.num_stages - 1):  # the classifier's final norm
                out[last_norm + k[len('norm') :]] = v
            continue
        k = k.replace('patch_embed.proj.', 'patch_embed.projection.')
        if k.startswith('layers.'):
            stage = int(k.split('.')[1])
            k = 'stages.' + k[len('layers.') :]
            k = k.replace('.attn.', '.attn.w_msa.').replace('.mlp.', '.ffn.')
            # per-merged-channel tensors (weights, norm statistics) change order; scalars don't
            if (
                '.downsample.' in k
                and v.dim() >= 1
                and stage < model.num_stages
                and v.shape[-1] == 4 * model.num_features[stage]
            ):
                v = _unfold_order(v)
        out[k] = v
    return out


# Swin's pre-FFN norm is the block's norm2; in RePaSwin the FFN owns it as ffn.norm1.
_BLOCK_NORM2 = re.compile(r'(\.blocks\.\d+)\.norm2\.')


def checkpoint_filter_fn(state_dict: Dict[str, torch.Tensor], model: RePaSwin) -> dict:
    """Convert a Swin-family state dict to :class:`RePaSwin` names.

    Understands: mmrepa's own layout (folded or not); mmdet ``SwinTransformer`` backbones
    (``ffn.layers.0.0`` etc.), also inside a whole detector (``backbone.*``); Microsoft Swin
    classification checkpoints (``layers.*``, ``mlp.*``, concat-order patch merging); RePaViT
    classification checkpoints (``layers.{i}.blocks.{j}.mlp.{norm1,norm2,fc1,fc2}``).
    Relative position bias tables of another window size are resized (bicubic).
    """
    state_dict = strip_prefixes(state_dict)
    if any(k.startswith('layers.') for k in state_dict):
        state_dict = _from_original_swin(state_dict, model)
    out = {}
    for k, v in state_dict.items():
        if k.endswith(('relative_position_index', 'attn_mask')):
            continue
        k = k.replace('.ffn.layers.0.0.', '.ffn.fc1.').replace('.ffn.layers.1.', '.ffn.fc2.')
        out[_BLOCK_NORM2.sub(r'\1.ffn.norm1.', k)] = v
    return resize_to_model(out, model, 'relative_position_bias_table', _resize_bias_table)


def _resize_bias_table(table: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    (_, heads), (L2, heads2) = table.shape, shape
    if heads != heads2:
        return table  # reported as a shape mismatch by the loader
    # timm's bicubic resize (align_corners=False) of the (2·ws − 1)² grid; imported here, on
    # this rare path, because importing timm takes seconds
    from timm.layers import resize_rel_pos_bias_table_simple

    window = (math.isqrt(L2) + 1) // 2
    resized = resize_rel_pos_bias_table_simple(table.float(), (window, window), tuple(shape))
    return resized.to(table.dtype).contiguous()
