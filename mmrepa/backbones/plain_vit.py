"""What the plain (single-scale) ViTs share: patch and position embeddings resized to any
input, the class token, the output types, ViTDet's windowed blocks with a few global ones, and
reading timm / mmpretrain ViT checkpoints. :class:`~mmrepa.backbones.DepthRepViT` and
:class:`~mmrepa.backbones.RePaViT` build on it."""

import math
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
from mmengine.model.weight_init import trunc_normal_

from ..errors import CheckpointError, ConfigError
from ..layers import (
    ConvPatchEmbed,
    FoldablePatchEmbed,
    MixedTokens,
    draw_token_box,
    swap_token_box,
)
from ..layers.pos_embed import resize_pos_embed
from .base import DenseBackbone

OUT_TYPES = ('avg', 'cls', 'featmap', 'raw')


def _check_vit_options(
    out_type: str,
    with_cls_token: bool,
    window_size: Optional[int],
    mix_token: bool,
    mix_token_beta: float,
) -> None:
    """The outputs, MixToken and windows a plain ViT can combine."""
    if out_type not in OUT_TYPES:
        raise ConfigError(f'out_type must be one of {OUT_TYPES}, got {out_type!r}')
    if mix_token and (out_type != 'raw' or not with_cls_token):
        raise ConfigError(
            'mix_token=True mixes the patch tokens and trains the class token on the mixed '
            "target: it needs with_cls_token=True, out_type='raw' and a head that reads "
            'the box (TokenLabelClsHead)'
        )
    if mix_token and not mix_token_beta > 0:
        raise ConfigError(f'mix_token_beta must be > 0 (Beta(β, β)), got {mix_token_beta}')
    if out_type == 'cls' and not with_cls_token:
        raise ConfigError("out_type='cls' needs with_cls_token=True")
    if window_size is not None and with_cls_token:
        raise ConfigError(
            'windowed attention (window_size) works on the patch grid only: '
            'set with_cls_token=False (ViTDet drops the class token)'
        )


def _block_windows(
    depth: int, window_size: Optional[int], global_blocks: Sequence[int]
) -> List[Optional[int]]:
    """Each block's attention window: ``window_size``, None (global) for ``global_blocks``."""
    global_blocks = sorted({i + depth if i < 0 else i for i in global_blocks})
    if any(not 0 <= i < depth for i in global_blocks):
        raise ConfigError(
            f'global_blocks {global_blocks}: each index must be in [0, {depth - 1}] '
            f'(the model has {depth} blocks)'
        )
    return [None if i in global_blocks else window_size for i in range(depth)]


class PlainViT(DenseBackbone):
    """Base of the plain ViTs: ``patch_embed``, ``cls_token``, ``pos_embed`` and
    ``self.stages`` (one block per stage, called as ``block(x, hw_shape)``).

    Outputs, per ``out_type``, for every block in ``out_indices``, each through its own
    output norm ``norm{i}``:

    - ``'avg'``: (B, C), the mean of the patch tokens (class token excluded), then the norm
      (timm's ``global_pool='avg'`` with ``fc_norm``; mmpretrain's ``'avg_featmap'``).
    - ``'cls'``: (B, C), the normalized class token (timm's default; mmpretrain's
      ``'cls_token'`` with ``final_norm``).
    - ``'featmap'``: (B, C, ⌈H/p⌉, ⌈W/p⌉) maps of the patch tokens for dense prediction
      (ViTDet: feed them to :class:`~mmrepa.necks.SimpleFPN`).
    - ``'raw'``: (B, extra + h·w, C), every token normalized, the class token first
      (mmpretrain's ``'raw'``; LV-ViT's token-labelling head reads the class and patch tokens).
    """

    stem_name = 'patch_embed'

    def _setup_vit(
        self,
        embed_dims: int,
        depth: int,
        img_size: Union[int, Tuple[int, int]],
        patch_size: int,
        in_channels: int,
        with_cls_token: bool,
        out_type: str,
        out_indices: Union[int, Sequence[int]],
        window_size: Optional[int],
        global_blocks: Sequence[int],
        interpolate_mode: str,
        drop_rate: float,
        frozen_stages: int,
        norm_eval: bool,
        deploy: bool,
        conv_stem: bool = False,
        stem_channels: int = 64,
        mix_token: bool = False,
        mix_token_beta: float = 1.0,
    ) -> List[Optional[int]]:
        """Check the shared options, build the embeddings (a patchifying conv, or with
        ``conv_stem`` LV-ViT's convolutional embedding); returns each block's attention
        window (None: global)."""
        _check_vit_options(out_type, with_cls_token, window_size, mix_token, mix_token_beta)
        self.mix_token, self.mix_token_beta = mix_token, mix_token_beta
        out_indices = [out_indices] if isinstance(out_indices, int) else list(out_indices)
        out_indices = [i + depth if i < 0 else i for i in out_indices]
        self._check_options(depth, out_indices, frozen_stages, norm_eval, deploy)
        windows = _block_windows(depth, window_size, global_blocks)
        self.embed_dims = embed_dims
        self.in_channels, self.patch_size = in_channels, patch_size
        self.out_type, self.with_cls_token = out_type, with_cls_token
        self.num_extra_tokens = int(with_cls_token)
        self.interpolate_mode = interpolate_mode
        img_size = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)
        self.patch_resolution = (img_size[0] // patch_size, img_size[1] // patch_size)
        self.num_features = [embed_dims] * depth
        self._build_embeddings(conv_stem, stem_channels, drop_rate, deploy)
        return windows

    def _build_embeddings(
        self, conv_stem: bool, stem_channels: int, drop_rate: float, deploy: bool
    ) -> None:
        """The patch embedding, the class token (if any), the position embedding sized for
        the pretraining grid and the dropout after it."""
        embed_dims = self.embed_dims
        if conv_stem:
            self.patch_embed = ConvPatchEmbed(
                self.in_channels, embed_dims, self.patch_size, stem_channels, deploy=deploy
            )
        else:
            self.patch_embed = FoldablePatchEmbed(
                in_channels=self.in_channels,
                embed_dims=embed_dims,
                conv_type='Conv2d',
                kernel_size=self.patch_size,
                stride=self.patch_size,
                norm_cfg=None,
            )
        with_cls_token = self.with_cls_token
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dims)) if with_cls_token else None
        num_patches = self.patch_resolution[0] * self.patch_resolution[1]
        self.pos_embed = nn.Parameter(
            torch.zeros(1, self.num_extra_tokens + num_patches, embed_dims)
        )
        self.drop_after_pos = nn.Dropout(p=drop_rate)

    def _embed(self, x: torch.Tensor) -> Tuple[torch.Tensor, Tuple[int, int]]:
        """Image (B, in_channels, H, W) -> tokens (B, extra + h·w, C) with the position
        embedding resized to (h, w), and (h, w)."""
        self._check_input(x, self.patch_size, f'smaller than the patch size {self.patch_size}')
        B = x.shape[0]
        x, hw_shape = self.patch_embed(x)
        hw_shape = (int(hw_shape[0]), int(hw_shape[1]))  # plain ints, also when tracing
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(B, -1, -1), x], dim=1)
        x = x + resize_pos_embed(
            self.pos_embed,
            self.patch_resolution,
            hw_shape,
            self.interpolate_mode,
            self.num_extra_tokens,
        )
        return self.drop_after_pos(x), hw_shape

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        """x (B, in_channels, H, W) -> one output per ``out_indices`` (see ``out_type``).

        With ``mix_token`` in training mode, MixToken (:mod:`mmrepa.layers.mix_token`): the
        outputs are a :class:`~mmrepa.layers.MixedTokens` carrying the box."""
        x, hw_shape = self._embed(x)
        mix = self.mix_token and self.training  # MixToken is for training only
        box = draw_token_box(hw_shape, self.mix_token_beta) if mix else None
        if box is not None:
            # LV-ViT swaps before the position embedding, here after it (and its dropout): the
            # same tokens, as a swap moves tokens between images, not places; the dropout masks
            # differ only as draws of the same distribution
            x = swap_token_box(x, box, self.num_extra_tokens)
        outs = []
        for i, block in enumerate(self.stages):
            x = self._run_block(block, x, hw_shape)
            if i in self.out_indices:
                out = x if box is None else swap_token_box(x, box, self.num_extra_tokens)
                outs.append(self._format_output(i, out, hw_shape))
        return tuple(outs) if box is None else MixedTokens(outs, box)

    def _run_block(self, block: nn.Module, x: torch.Tensor, hw_shape) -> torch.Tensor:
        """One block; a subclass whose blocks do not checkpoint themselves wraps it here."""
        return block(x, hw_shape)

    def _format_output(self, i: int, x: torch.Tensor, hw_shape) -> torch.Tensor:
        norm = getattr(self, f'norm{i}')
        if self.out_type == 'cls':
            return norm(x[:, 0])
        if self.out_type == 'raw':
            return norm(x)
        patches = x[:, self.num_extra_tokens :]
        if self.out_type == 'avg':
            return norm(patches.mean(dim=1))
        return norm(patches).reshape(x.shape[0], *hw_shape, -1).permute(0, 3, 1, 2).contiguous()

    def _freeze_stages(self):
        super()._freeze_stages()
        if self.frozen_stages >= 0:
            for p in (self.cls_token, self.pos_embed):
                if p is not None:
                    p.requires_grad = False

    def get_layer_depth(self, param_name: str, prefix: str = '') -> Tuple[int, int]:
        """(depth, number of depths) for mmpretrain's layer-wise learning-rate decay: 0 for
        the embeddings, k + 1 for block k, the last for the output norms and whatever follows
        the backbone (the head)."""
        num_layers = len(self.stages) + 2
        if not param_name.startswith(prefix):
            return num_layers - 1, num_layers
        name = param_name[len(prefix) :]
        if name in ('cls_token', 'pos_embed') or name.startswith('patch_embed'):
            return 0, num_layers
        if name.startswith('stages.'):
            return int(name.split('.')[1]) + 1, num_layers
        return num_layers - 1, num_layers

    def _init_embeddings(self) -> None:
        """ViT's (timm / DeiT): truncated normal (std .02) position embedding and class token."""
        trunc_normal_(self.pos_embed, std=0.02)
        if self.cls_token is not None:
            trunc_normal_(self.cls_token, std=0.02)


# ----------------------------------------------------------------------------- checkpoints

# Per-layer tensors in timm names, from mmpretrain's.
_MMPRETRAIN_NAMES = (
    ('ln1.', 'norm1.'),
    ('ln2.', 'norm2.'),
    ('ffn.layers.0.0.', 'mlp.fc1.'),
    ('ffn.layers.1.', 'mlp.fc2.'),
)


def split_vit_layers(
    state_dict: Dict[str, torch.Tensor], source: str = 'the checkpoint'
) -> Tuple[Dict[int, Dict[str, torch.Tensor]], Dict[str, torch.Tensor]]:
    """A timm (``blocks.i``) or mmpretrain (``layers.i``) ViT -> ({i: {timm name: tensor}},
    the other keys, ``patch_embed.proj`` as ``patch_embed.projection``). A checkpoint whose
    numbered layers are not ViT layers (Swin's ``layers.i.blocks``, ...) is refused."""
    layers, rest = {}, {}
    for key, value in state_dict.items():
        head, _, tail = key.partition('.')
        if head in ('blocks', 'layers') and tail.split('.')[0].isdigit():
            index, _, name = tail.partition('.')
            if head == 'layers':
                for old, new in _MMPRETRAIN_NAMES:
                    if name.startswith(old):
                        name = new + name[len(old) :]
            layers.setdefault(int(index), {})[name] = value
        else:
            rest[key.replace('patch_embed.proj.', 'patch_embed.projection.')] = value
    if not layers or any('attn.qkv.weight' not in layer for layer in layers.values()):
        example = next(iter(state_dict), 'nothing')
        raise CheckpointError(
            f'{source} is not a plain ViT checkpoint (timm / mmpretrain / mmrepa layout, '
            f'blocks.i.attn.qkv or layers.i.attn.qkv); its first key is {example!r}'
        )
    return layers, rest


def final_norm_source(model: PlainViT, rest: Dict[str, torch.Tensor]) -> Optional[str]:
    """The checkpoint norm that plays the role of the last output norm: the pooled-feature
    norm for ``'avg'`` (timm ``fc_norm``, mmpretrain ``ln2``), the final norm for ``'cls'``
    and ``'raw'`` (timm ``norm``, mmpretrain ``ln1``). Feature maps get none (the dense head
    adds them)."""
    if model.out_type == 'featmap' or not model.has_output_norm(model.out_indices[-1]):
        return None
    names = ('fc_norm', 'ln2') if model.out_type == 'avg' else ('norm', 'ln1')
    return next((n for n in names if f'{n}.weight' in rest), None)


def vit_embeddings(model: PlainViT, rest: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """The embeddings and the classifier norm of a timm / mmpretrain checkpoint's non-layer
    keys (see :func:`split_vit_layers`) in :class:`PlainViT` names."""
    out = {
        k: v for k, v in rest.items() if k.startswith(('patch_embed.', 'pos_embed', 'cls_token'))
    }
    norm = final_norm_source(model, rest)
    if norm is not None:
        last = f'norm{model.out_indices[-1]}'
        out.update({f'{last}.weight': rest[f'{norm}.weight'], f'{last}.bias': rest[f'{norm}.bias']})
    return out


def fit_pos_embed(pos: torch.Tensor, model: PlainViT) -> torch.Tensor:
    """Drop a class-token entry the model does not have; resize the grid to the model's."""
    tokens = pos.shape[1]
    extra = 0 if math.isqrt(tokens) ** 2 == tokens else 1
    side = math.isqrt(tokens - extra)
    if side * side != tokens - extra:
        return pos  # not a square grid: reported as a shape mismatch by the loader
    if extra and not model.with_cls_token:
        pos, extra = pos[:, 1:], 0
    if extra != model.num_extra_tokens:
        return pos  # a class token the checkpoint lacks: reported by the loader
    work = pos if pos.dtype == torch.float64 else pos.float()  # bicubic needs fp32 or fp64
    resized = resize_pos_embed(
        work, (side, side), model.patch_resolution, model.interpolate_mode, extra
    )
    return resized.to(pos.dtype)
