"""RePa-ViT / RePa-DeiT: a plain ViT with channel-idle FFNs that fold at test time (RePaFormer).

With ``idle_ratio=0, ffn_norm='LN'`` the network is exactly timm's / mmpretrain's
``VisionTransformer`` (DeiT) and loads their checkpoints.
"""

import re
from typing import Dict, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
from mmcv.cnn.bricks.drop import DropPath
from mmengine.model import ModuleList
from mmengine.registry import MODELS

from ..checkpoint.loading import strip_prefixes
from ..errors import CheckpointError, ConfigError
from ..fold import (
    FoldPolicy,
    add_missing_bias,
    affine_into_linear,
    is_affine_norm,
    norm_affine,
    weight_and_bias,
)
from ..layers import (
    ChannelIdleFFN,
    PreNormBlock,
    SimplifiedLinearAttention,
    WindowedSelfAttention,
)
from ..layers.window_attention import attend_in_windows
from ..options import check_unit_interval, head_dim
from ..registry import build_norm_layer
from .base import drop_path_rates, lookup_arch, trunc_normal_init_
from .plain_vit import PlainViT, fit_pos_embed, split_vit_layers, vit_embeddings

# embed_dims, depth, heads: DeiT-Ti/S/B (Touvron et al. 2021) and ViT-L/H (Dosovitskiy et al.
# 2021), all with 16 x 16 patches: RePaFormer Table 1 (widths, depths, heads; its MACs,
# 59.8 G for L and 124.4 G for H at 224 px, are those of 14 x 14 = 196 tokens, i.e. patch 16
# also for Huge, not ViT-H/14's 256 tokens). idle_ratio: 0.75 for every size, the paper's
# default θ = 1 - μ/ρ with μ = 1, ρ = 4 (§4.1), with which all of Table 1 is trained.
# LV-ViT-S / M (Jiang et al. 2021; RePaFormer Table 1): FFN ratio ρ = 3, so θ = 1 - 1/3 (the
# folded FFN keeps C active channels: Table 1's 19.1 M / 40.1 M), the convolutional patch
# embedding, every residual branch divided by skip_lam = 2, no qkv bias (LV-ViT's code).
_LV_VIT = dict(idle_ratio=2 / 3, mlp_ratio=3.0, skip_lam=2.0, conv_stem=True, qkv_bias=False)
ARCH_SETTINGS: Dict[str, dict] = {
    'tiny': dict(embed_dims=192, num_layers=12, num_heads=3, idle_ratio=0.75),
    'small': dict(embed_dims=384, num_layers=12, num_heads=6, idle_ratio=0.75),
    'base': dict(embed_dims=768, num_layers=12, num_heads=12, idle_ratio=0.75),
    'large': dict(embed_dims=1024, num_layers=24, num_heads=16, idle_ratio=0.75),
    'huge': dict(embed_dims=1280, num_layers=32, num_heads=16, idle_ratio=0.75),
    'lv-vit-s': dict(embed_dims=384, num_layers=16, num_heads=6, **_LV_VIT),
    'lv-vit-m': dict(embed_dims=512, num_layers=20, num_heads=8, **_LV_VIT),
}
# what an arch may set besides its size, and the value when it does not
ARCH_DEFAULTS = dict(idle_ratio=0.75, mlp_ratio=4.0, skip_lam=1.0, conv_stem=False, qkv_bias=True)
ARCH_ALIASES = {
    't': 'tiny',
    's': 'small',
    'b': 'base',
    'l': 'large',
    'h': 'huge',
    'deit-tiny': 'tiny',
    'deit-small': 'small',
    'deit-base': 'base',
    'lvvit-s': 'lv-vit-s',
    'lvvit-m': 'lv-vit-m',
}


def resolve_arch(arch: Union[str, dict]) -> dict:
    """A size name (``'tiny'``, ``'small'``, ``'base'``, ``'large'``, ``'huge'``,
    ``'lv-vit-s'``, ``'lv-vit-m'``) or a dict with ``embed_dims``, ``num_layers``,
    ``num_heads`` (and optionally any of :data:`ARCH_DEFAULTS`), completed by
    :data:`ARCH_DEFAULTS`."""
    arch = lookup_arch(arch, ARCH_SETTINGS, ('embed_dims', 'num_layers', 'num_heads'), ARCH_ALIASES)
    return dict(ARCH_DEFAULTS, **arch)


def _arch_options(arch: Union[str, dict], idle_ratio, mlp_ratio, skip_lam, conv_stem, qkv_bias):
    """:func:`resolve_arch` with the options given (not None) in place of the arch's, checked."""
    arch = resolve_arch(arch)
    given = dict(
        idle_ratio=idle_ratio,
        mlp_ratio=mlp_ratio,
        skip_lam=skip_lam,
        conv_stem=conv_stem,
        qkv_bias=qkv_bias,
    )
    arch.update({k: v for k, v in given.items() if v is not None})
    arch['idle_ratio'] = check_unit_interval(arch['idle_ratio'], 'idle_ratio')
    if not arch['skip_lam'] > 0:
        raise ConfigError(
            f'skip_lam divides the residual branches: it must be > 0, got {arch["skip_lam"]}'
        )
    return arch


def _ffn_cfg(arch: dict, ffn_norm: str, norm_cfg: dict, act_cfg: dict, deploy: bool) -> dict:
    """Every block's :class:`~mmrepa.layers.ChannelIdleFFN` options: ``ffn_norm='BN'``
    BatchNorms before ``fc1`` and on the hidden layer, ``'LN'`` ``norm_cfg`` before ``fc1``."""
    if ffn_norm not in ('BN', 'LN'):
        raise ConfigError(f"ffn_norm must be 'BN' or 'LN', got {ffn_norm!r}")
    ffn_norms = (dict(type='BN1d'), dict(type='BN1d')) if ffn_norm == 'BN' else (norm_cfg, None)
    return dict(
        mlp_ratio=arch['mlp_ratio'],
        idle_ratio=arch['idle_ratio'],
        norm_cfg=ffn_norms[0],
        hidden_norm_cfg=ffn_norms[1],
        act_cfg=act_cfg,
        deploy=deploy,
    )


def _block_attn_types(attn_types: str, depth: int, with_cls_token: bool) -> str:
    """``attn_types`` as one letter per block (one letter given: every block)."""
    if len(attn_types) not in (1, depth) or set(attn_types) - set('SL'):
        raise ConfigError(
            f"attn_types must be 'S' (softmax attention) or 'L' (simplified linear "
            f'attention), one letter or one per block ({depth}); got {attn_types!r}'
        )
    attn_types = attn_types * depth if len(attn_types) == 1 else attn_types
    if 'L' in attn_types and with_cls_token:
        raise ConfigError(
            "simplified linear attention ('L' in attn_types) works on the patch grid "
            "only: set with_cls_token=False and out_type='avg' (SLAB-DeiT)"
        )
    return attn_types


class RePaViTBlock(PreNormBlock):
    """Pre-norm ViT block: ``x + attn(norm1(x))``, then the FFN (which owns its norm and
    shortcut, :class:`~mmrepa.layers.ChannelIdleFFN`).

    ``skip_lam`` (LV-ViT): both residual branches are divided by it; the fold moves the
    factor into the attention's ``proj`` and the FFN's output matrix.

    ``attn_type``: ``'S'`` softmax attention (:class:`~mmrepa.layers.WindowedSelfAttention`;
    global, or in ``window_size`` windows with masked padding), ``'L'`` SLAB's simplified
    linear attention over the whole grid (its positional encoding, ``linear_window`` x
    ``linear_window``, resized to other grids). An affine
    ``norm1`` (RepBN, PRepBN, BatchNorm) folds into ``qkv``: padded window tokens are keys
    that are masked and queries that are dropped, so their projection does not matter and the
    fold is exact at any input size. ``deploy=True`` builds the folded structure.

    Input and output (B, N, C), N = extra tokens + H·W with ``hw_shape = (H, W)``.
    """

    def __init__(
        self,
        embed_dims: int,
        num_heads: int,
        ffn_cfg: dict,
        window_size: Optional[int] = None,
        attn_type: str = 'S',
        linear_window: int = 14,
        qkv_bias: bool = True,
        drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
        norm_cfg: dict = dict(type='LN', eps=1e-6),
        skip_lam: float = 1.0,
        with_cp: bool = False,
        deploy: bool = False,
        init_cfg: Optional[dict] = None,
    ):
        super().__init__(init_cfg=init_cfg)
        self.with_cp = with_cp
        self.window_size = window_size
        self.branch_scale = 1.0 / skip_lam
        self.deploy = deploy
        self.norm1 = build_norm_layer(norm_cfg, embed_dims)[1]
        if deploy and is_affine_norm(self.norm1):
            self.norm1 = None
        # the folded norm's shift becomes a qkv bias
        qkv_bias = qkv_bias or self.norm1 is None
        if attn_type == 'L':
            self.attn = SimplifiedLinearAttention(
                embed_dims, num_heads, linear_window, qkv_bias, drop_rate
            )
        else:
            self.attn = WindowedSelfAttention(
                embed_dims,
                head_dim(embed_dims, num_heads),
                num_heads,
                window_size,
                qkv_bias=qkv_bias,
                proj_bias=True,
            )
        self.attn_type = attn_type
        self.drop_path = DropPath(drop_path_rate) if drop_path_rate > 0 else nn.Identity()
        self.ffn = ChannelIdleFFN(
            embed_dims,
            drop_rate=drop_rate,
            drop_path_rate=drop_path_rate,
            branch_scale=self.branch_scale,
            **ffn_cfg,
        )

    def _mix(self, y: torch.Tensor, hw_shape: Tuple[int, int]) -> torch.Tensor:
        out = self._attend(y, hw_shape)
        # folded into attn.proj
        return out if self.deploy or self.branch_scale == 1.0 else out * self.branch_scale

    def _attend(self, y: torch.Tensor, hw_shape: Tuple[int, int]) -> torch.Tensor:
        B, N, C = y.shape
        if self.attn_type == 'L':  # the whole grid, its positional encoding resized
            return self.attn(y, hw_shape=hw_shape)
        # the layer's token-level call (its SDPA is the one mmdeploy's rewrite covers): the
        # class token makes the tokens no map
        if self.window_size is None:
            return self.attn._attend(y)
        return attend_in_windows(self.attn._attend, y.view(B, *hw_shape, C), self.window_size)

    def _fold_tensors(self, dtype: torch.dtype, policy: FoldPolicy) -> dict:
        """An affine ``norm1`` (``x * s + t``) into ``qkv``: ``W s``, ``b + W t``; the
        branch scale into ``proj``."""
        tensors = {}
        if self.norm1 is not None and is_affine_norm(self.norm1):
            scale, shift = norm_affine(self.norm1, dtype)
            w, b = affine_into_linear(self.attn.qkv, scale, shift, dtype)
            tensors.update({'attn.qkv.weight': w, 'attn.qkv.bias': b})
        if self.branch_scale != 1.0:
            w, b = weight_and_bias(self.attn.proj, dtype)
            tensors['attn.proj.weight'] = w * self.branch_scale
            tensors['attn.proj.bias'] = b * self.branch_scale
        return tensors

    def _apply_fold(self, tensors: dict, policy: FoldPolicy) -> None:
        if 'attn.qkv.weight' not in tensors:
            return
        self.norm1 = None
        add_missing_bias(self.attn.qkv)


@MODELS.register_module()
class RePaViT(PlainViT):
    """Plain ViT / DeiT backbone with channel-idle, foldable FFNs (RePa-DeiT, RePa-ViT).

    Each block is a pre-norm ViT block whose FFN is a
    :class:`~mmrepa.layers.ChannelIdleFFN`: only ``1 - idle_ratio`` of its hidden channels
    see the activation, and :meth:`reparameterize` folds the rest, with the FFN's norms and
    shortcut, into three matrices. Outputs per ``out_type`` (class token, average or feature
    maps), see :class:`~mmrepa.backbones.plain_vit.PlainViT`; dense prediction uses
    ``out_type='featmap'`` with windowed attention and a few global blocks (ViTDet) and
    :class:`~mmrepa.necks.SimpleFPN`.

    LV-ViT's variant (RePa-LV-ViT, ``arch='lv-vit-s'`` / ``'lv-vit-m'``): LV-ViT's
    convolutional patch embedding (``conv_stem``, its BatchNorms fold into its convs), every
    residual branch divided by ``skip_lam`` (folded into the output projections), FFN ratio 3,
    no qkv bias. Its token-labelling head is
    :class:`~mmrepa.heads.TokenLabelClsHead` (``out_type='raw'``), and it trains with LV-ViT's
    MixToken (``mix_token``).

    Args:
        arch (str | dict): ``'tiny'``, ``'small'``, ``'base'`` (DeiT), ``'large'``, ``'huge'``
            (ViT; also ``t/s/b/l/h``), ``'lv-vit-s'``, ``'lv-vit-m'`` (LV-ViT), or
            ``dict(embed_dims, num_layers, num_heads)`` with optional ``idle_ratio``,
            ``mlp_ratio``, ``skip_lam``, ``conv_stem``, ``qkv_bias``. Default: ``'tiny'``.
        img_size (int | tuple): Pretraining size; sizes the position embedding, which is
            interpolated for other inputs. Default: 224.
        patch_size (int): Default: 16.
        in_channels (int): Default: 3.
        mlp_ratio (float, optional): FFN hidden width / embed_dims; None: the arch's (4; 3 for
            LV-ViT). Default: None.
        idle_ratio (float, optional): Fraction of FFN hidden channels left linear, in [0, 1];
            None: the arch's value (0.75; 2 / 3 for LV-ViT), whatever ``mlp_ratio``.
            Default: None.
        skip_lam (float, optional): Divide both residual branches of every block by it
            (LV-ViT); None: the arch's (1; 2 for LV-ViT). Default: None.
        conv_stem (bool, optional): LV-ViT's convolutional patch embedding
            (:class:`~mmrepa.layers.ConvPatchEmbed`) instead of one patchifying conv; None: the
            arch's. Default: None.
        stem_channels (int): Width of the convolutional patch embedding. Default: 64.
        mix_token (bool): LV-ViT's MixToken while training: a box of patch tokens drawn per
            batch (area from ``Beta(mix_token_beta, mix_token_beta)``) is swapped with the
            batch flipped after the patch embedding and put back before the outputs, which
            carry the box (:class:`~mmrepa.layers.MixedTokens`) for
            :class:`~mmrepa.heads.TokenLabelClsHead` to mix the class token's target. Needs
            ``with_cls_token=True`` and ``out_type='raw'``; eval mode and the folded model
            never mix. Default: False.
        mix_token_beta (float): Beta parameter of the box's area (LV-ViT: 1, a uniform
            area). Default: 1.
        ffn_norm (str): ``'BN'``: BatchNorm before ``fc1`` and on the hidden layer (RePaFormer;
            everything folds); ``'LN'``: the ViT FFN, ``norm_cfg`` before ``fc1`` and no hidden
            norm (with ``idle_ratio=0`` this is timm's / mmpretrain's ViT). Default: ``'BN'``.
        attn_types (str, optional): ``'S'`` (softmax attention) or ``'L'`` (SLAB's simplified
            linear attention, needs ``with_cls_token=False``), one letter for all blocks or
            one per block. Default: ``'S'``.
        linear_window (int, optional): Token grid side of the ``'L'`` blocks. Default: the
            pretraining grid (``img_size // patch_size``).
        qkv_bias (bool, optional): None: the arch's (True; False for LV-ViT). Default: None.
        drop_rate (float): Dropout after the position embedding, in the FFN and after the
            linear attention's projection (SLAB's). Default: 0.
        drop_path_rate (float): Stochastic depth, rising linearly over the blocks. Default: 0.1.
        with_cls_token (bool): Default: True.
        out_type (str): ``'cls'``, ``'avg'``, ``'featmap'`` or ``'raw'`` (every token).
            Default: ``'cls'``.
        out_indices (Sequence[int] | int): Blocks whose outputs are returned (negative counts
            from the end). Default: -1.
        window_size (int, optional): Windowed attention (padding masked) in every block not in
            ``global_blocks``; needs ``with_cls_token=False``. None: all global. Default: None.
        global_blocks (Sequence[int]): Blocks with global attention when ``window_size`` is
            set (ViTDet: every ``depth / 4``-th). Default: ().
        interpolate_mode (str): Position-embedding resizing. Default: ``'bicubic'``.
        act_cfg (dict): FFN activation. Default: ``dict(type='GELU')``.
        norm_cfg (dict): Block norms. Default: ``dict(type='LN', eps=1e-6)``.
        out_norm_cfg (dict, optional): Output norms (None: none). Default: as ``norm_cfg``.
        frozen_stages (int): Freeze the embeddings (0) and blocks 1..k (k >= 1). Default: -1.
        norm_eval (bool): Keep the BatchNorms in eval mode while training. Default: False.
        with_cp (bool): Gradient checkpointing per block. Default: False.
        deploy (bool): Build the folded structure (load folded checkpoints). Default: False.
        init_cfg (dict, optional): ``dict(type='Pretrained', checkpoint=PATH)`` loads timm and
            mmpretrain ViT / DeiT checkpoints and mmrepa's, also inside a whole classifier,
            detector or segmentor (see :func:`checkpoint_filter_fn`); otherwise ViT's
            truncated-normal initialisation.

    Input (B, in_channels, H, W) of any size of at least one patch.
    """

    def __init__(
        self,
        arch: Union[str, dict] = 'tiny',
        img_size: Union[int, Tuple[int, int]] = 224,
        patch_size: int = 16,
        in_channels: int = 3,
        mlp_ratio: Optional[float] = None,
        idle_ratio: Optional[float] = None,
        skip_lam: Optional[float] = None,
        conv_stem: Optional[bool] = None,
        stem_channels: int = 64,
        mix_token: bool = False,
        mix_token_beta: float = 1.0,
        ffn_norm: str = 'BN',
        attn_types: str = 'S',
        linear_window: Optional[int] = None,
        qkv_bias: Optional[bool] = None,
        drop_rate: float = 0.0,
        drop_path_rate: float = 0.1,
        with_cls_token: bool = True,
        out_type: str = 'cls',
        out_indices: Union[int, Sequence[int]] = -1,
        window_size: Optional[int] = None,
        global_blocks: Sequence[int] = (),
        interpolate_mode: str = 'bicubic',
        act_cfg: dict = dict(type='GELU'),
        norm_cfg: dict = dict(type='LN', eps=1e-6),
        out_norm_cfg: Optional[dict] = dict(type='LN', eps=1e-6),
        frozen_stages: int = -1,
        norm_eval: bool = False,
        with_cp: bool = False,
        deploy: bool = False,
        init_cfg: Optional[dict] = None,
    ):
        super().__init__(init_cfg=init_cfg)
        arch = _arch_options(arch, idle_ratio, mlp_ratio, skip_lam, conv_stem, qkv_bias)
        self.num_heads, depth = arch['num_heads'], arch['num_layers']
        self.idle_ratio = arch['idle_ratio']
        ffn_cfg = _ffn_cfg(arch, ffn_norm, norm_cfg, act_cfg, deploy)
        self.attn_types = _block_attn_types(attn_types, depth, with_cls_token)
        windows = self._setup_vit(
            arch['embed_dims'],
            depth,
            img_size,
            patch_size,
            in_channels,
            with_cls_token,
            out_type,
            out_indices,
            window_size,
            global_blocks,
            interpolate_mode,
            drop_rate,
            frozen_stages,
            norm_eval,
            deploy,
            conv_stem=arch['conv_stem'],
            stem_channels=stem_channels,
            mix_token=mix_token,
            mix_token_beta=mix_token_beta,
        )
        self.with_cp = with_cp
        block_cfg = dict(
            linear_window=linear_window or self.patch_resolution[0],
            qkv_bias=arch['qkv_bias'],
            drop_rate=drop_rate,
            norm_cfg=norm_cfg,
            skip_lam=arch['skip_lam'],
            with_cp=with_cp,
            deploy=deploy,
        )
        self.stages = self._blocks(windows, ffn_cfg, drop_path_rate, block_cfg)
        self._setup_outputs(out_norm_cfg)

    def _blocks(
        self, windows: list, ffn_cfg: dict, drop_path_rate: float, block_cfg: dict
    ) -> ModuleList:
        """One block per entry of ``windows`` (its attention window, None: global)."""
        dpr = drop_path_rates(drop_path_rate, len(windows))
        return ModuleList(
            [
                RePaViTBlock(
                    self.embed_dims,
                    self.num_heads,
                    ffn_cfg,
                    window_size=window,
                    attn_type=attn_type,
                    drop_path_rate=rate,
                    **block_cfg,
                )
                for window, attn_type, rate in zip(windows, self.attn_types, dpr)
            ]
        )

    def _default_init(self) -> None:
        """ViT's initialisation (timm / DeiT): truncated normal (std .02) for the position
        embedding, class token and every Linear, identity norms."""
        self._init_embeddings()
        trunc_normal_init_(self, (nn.Linear,))

    def filter_checkpoint(self, state_dict: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        """Any ViT layout in RePaViT names; see :func:`checkpoint_filter_fn`."""
        return checkpoint_filter_fn(state_dict, self)


# ----------------------------------------------------------------------------- checkpoints

# timm per-layer names -> the block's (the FFN owns the pre-FFN norm as ffn.norm1).
_TIMM_TO_BLOCK = (('norm2.', 'ffn.norm1.'), ('mlp.fc1.', 'ffn.fc1.'), ('mlp.fc2.', 'ffn.fc2.'))
_OWN_BLOCK_KEY = re.compile(r'^stages\.\d+\.(norm1|attn|ffn)\.')


def checkpoint_filter_fn(
    state_dict: Dict[str, torch.Tensor], model: RePaViT
) -> Dict[str, torch.Tensor]:
    """Convert a ViT state dict to :class:`RePaViT` names.

    Understands mmrepa's own layout (RePaViT / PRepBNViT, folded or not, passed through); timm
    ``VisionTransformer`` / DeiT (``blocks.i``) and mmpretrain ``VisionTransformer``
    (``layers.i.ln1``, ``ffn.layers.0.0``, ...), also inside a whole classifier, detector or
    segmentor. The classifier's final norm becomes the last output norm (``'cls'``: timm
    ``norm`` / mmpretrain ``ln1``; ``'avg'``: ``fc_norm`` / ``ln2``); the position embedding
    loses the class token's entry if the model has none and is resized to the model's grid;
    heads are reported unused. Checkpoints of other families (Swin, MetaFormer, DepthRepViT
    with branches, ...) and of another depth are refused.
    """
    state_dict = strip_prefixes(state_dict)
    if any(k.startswith('stages.') for k in state_dict):
        foreign = [k for k in state_dict if k.startswith('stages.') and not _OWN_BLOCK_KEY.match(k)]
        if foreign or not any(k.startswith('stages.0.attn.') for k in state_dict):
            example = foreign[0] if foreign else next(k for k in state_dict if 'stages.' in k)
            raise CheckpointError(
                f'not a RePaViT / PRepBNViT checkpoint: {example!r} belongs to another family '
                '(RePaViT loads its own, timm and mmpretrain ViT / DeiT checkpoints)'
            )
        out = dict(state_dict)
    else:
        layers, rest = split_vit_layers(state_dict)
        depth = len(model.stages)
        if sorted(layers) != list(range(depth)):
            raise CheckpointError(
                f'the checkpoint has {len(layers)} transformer layers, this RePaViT {depth}: '
                'it is a checkpoint of another size (arch)'
            )
        out = vit_embeddings(model, rest)
        for i, layer in layers.items():
            for name, value in layer.items():
                for old, new in _TIMM_TO_BLOCK:
                    if name.startswith(old):
                        name = new + name[len(old) :]
                        break
                out[f'stages.{i}.{name}'] = value
    if 'pos_embed' in out:
        out['pos_embed'] = fit_pos_embed(out['pos_embed'], model)
    return out
