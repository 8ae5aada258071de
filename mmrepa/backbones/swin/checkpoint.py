"""Swin checkpoints (mmdet, Microsoft Swin, timm, RePaViT, mmrepa) in RePaSwin's names."""

import math
import re
from typing import Dict

import torch
import torch.nn as nn

from ...checkpoint.loading import resize_to_model, strip_prefixes


def _unfold_order(w: torch.Tensor) -> torch.Tensor:
    """Reorder a patch-merging tensor from Swin's concat order to ``nn.Unfold``'s order.

    Swin concatenates the 2x2 neighbours as (0,0), (1,0), (0,1), (1,1) blocks of C channels;
    mmcv's PatchMerging unfolds channel-major with positions (0,0), (0,1), (1,0), (1,1).
    """
    lead, C = w.shape[:-1], w.shape[-1] // 4
    return w.reshape(*lead, 4, C)[..., [0, 2, 1, 3], :].transpose(-1, -2).reshape(*lead, 4 * C)


def _from_original_swin(state_dict: Dict[str, torch.Tensor], model: nn.Module) -> dict:
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


_TIMM_DOWNSAMPLE = re.compile(r'layers\.(\d+)\.downsample\.')


def _is_timm_layout(state_dict: Dict[str, torch.Tensor]) -> bool:
    """timm merges patches at the start of stages 1.. (``layers.0.downsample`` is an
    Identity); the release, at the end of stages ..n-2 (``layers.0.downsample`` exists)."""
    stages = {int(m.group(1)) for m in map(_TIMM_DOWNSAMPLE.match, state_dict) if m}
    return bool(stages) and 0 not in stages


def _from_timm_swin(state_dict: Dict[str, torch.Tensor]) -> dict:
    """timm's Swin layout -> the Microsoft release's: ``layers.{i}.downsample`` (the merging
    into stage i) is ``layers.{i-1}.downsample``; the classifier ``head.fc`` is ``head``. The
    other names (``patch_embed.proj``, ``blocks.{j}.attn.qkv``, ``mlp.fc1``, ``norm``) are the
    release's; index and mask buffers are dropped later."""
    out = {}
    for k, v in state_dict.items():
        m = _TIMM_DOWNSAMPLE.match(k)
        if m:
            k = f'layers.{int(m.group(1)) - 1}.downsample.{k[m.end() :]}'
        elif k.startswith('head.fc.'):
            k = 'head.' + k[len('head.fc.') :]
        out[k] = v
    return out


# Swin's pre-FFN norm is the block's norm2; in RePaSwin the FFN owns it as ffn.norm1.
_BLOCK_NORM2 = re.compile(r'(\.blocks\.\d+)\.norm2\.')


def checkpoint_filter_fn(state_dict: Dict[str, torch.Tensor], model: nn.Module) -> dict:
    """Convert a Swin-family state dict to :class:`~mmrepa.backbones.RePaSwin` names.

    Understands: mmrepa's own layout (folded or not); mmdet ``SwinTransformer`` backbones
    (``ffn.layers.0.0`` etc.), also inside a whole detector (``backbone.*``); Microsoft Swin
    classification checkpoints (``layers.*``, ``mlp.*``, concat-order patch merging); timm's
    Swin (the release's names with the patch merging at the start of the next stage,
    ``head.fc``); RePaViT classification checkpoints
    (``layers.{i}.blocks.{j}.mlp.{norm1,norm2,fc1,fc2}``). Relative position bias tables of
    another window size are resized (bicubic).

    The classification releases (Microsoft's, timm's, RePaViT's) compute what their authors'
    code computes at 224 px in a model built with ``shift_small_maps=False``, as the ImageNet
    configs build it (docs/backbones/repa_swin.md#pretrained-weights).
    """
    state_dict = strip_prefixes(state_dict)
    if _is_timm_layout(state_dict):
        state_dict = _from_timm_swin(state_dict)
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
    # this rare path, because importing timm (an optional extra) takes seconds
    from ...integrations.optional import require

    require('timm', tool='resizing a Swin position-bias table')
    from timm.layers import resize_rel_pos_bias_table_simple

    window = (math.isqrt(L2) + 1) // 2
    resized = resize_rel_pos_bias_table_simple(table.float(), (window, window), tuple(shape))
    return resized.to(table.dtype).contiguous()
