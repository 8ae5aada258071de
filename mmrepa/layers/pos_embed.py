"""Learned absolute position embeddings resized to another patch grid (the plain ViTs, PVT)."""

from typing import Tuple

import torch
import torch.nn.functional as F


def resize_pos_embed(
    pos_embed: torch.Tensor,
    src_shape: Tuple[int, int],
    dst_shape: Tuple[int, int],
    mode: str = 'bicubic',
    num_extra_tokens: int = 0,
) -> torch.Tensor:
    """(1, extra + Hs·Ws, C) -> (1, extra + Hd·Wd, C): the patch grid resized with
    ``F.interpolate`` (``align_corners=False``, as mmpretrain, timm and mmdet's PVT), extra
    tokens (a class token) kept in front. At the source size it is the identity, skipped.

    Not mmpretrain's ``resize_pos_embed`` nor timm's ``resample_abs_pos_embed``: both resize in
    float32, which would cut a float64 model's forward (the fold checks) to float32."""
    if tuple(src_shape) == tuple(dst_shape):
        return pos_embed
    extra, grid = pos_embed[:, :num_extra_tokens], pos_embed[:, num_extra_tokens:]
    C = pos_embed.shape[-1]
    grid = grid.reshape(1, *src_shape, C).permute(0, 3, 1, 2)
    grid = F.interpolate(grid, size=tuple(dst_shape), mode=mode, align_corners=False)
    grid = grid.flatten(2).transpose(1, 2)
    return torch.cat([extra, grid], dim=1) if num_extra_tokens else grid
