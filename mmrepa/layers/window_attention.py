"""Attention in windows: partitioning a (B, H, W, C) map into windows and back, and running an
attention function in every window of a map of any size (padding with a key mask).

Shared by the windowed attention of the plain ViTs, MetaFormer's CAFormer and the joined ViT
blocks; Swin's shifted-window attention (``mmrepa.backbones.swin``) builds on the same
partition.
"""

import math
from typing import Callable, Optional, Tuple

import torch
import torch.nn.functional as F


def window_partition(x: torch.Tensor, window_size: int) -> torch.Tensor:
    """(B, H, W, C) with H, W multiples of the window -> (B * nW, window_size**2, C)."""
    B, H, W, C = x.shape
    x = x.view(B, H // window_size, window_size, W // window_size, window_size, C)
    return x.permute(0, 1, 3, 2, 4, 5).reshape(-1, window_size * window_size, C)


def window_reverse(windows: torch.Tensor, window_size: int, H: int, W: int) -> torch.Tensor:
    """Inverse of :func:`window_partition`: (B * nW, window_size**2, C) -> (B, H, W, C)."""
    C = windows.shape[-1]
    x = windows.view(-1, H // window_size, W // window_size, window_size, window_size, C)
    return x.permute(0, 1, 3, 2, 4, 5).reshape(-1, H, W, C)


def padded_size(hw_shape: Tuple[int, int], window_size: int) -> Tuple[int, int]:
    """(H, W) rounded up to whole windows."""
    # math.ceil makes a traced size a constant of the export; ``-(-s // ws)`` would be traced,
    # and ONNX's integer division truncates where Python's floors
    return tuple(math.ceil(s / window_size) * window_size for s in hw_shape)


def attend_in_windows(
    attend: Callable[[torch.Tensor, Optional[torch.Tensor]], torch.Tensor],
    x: torch.Tensor,
    window_size: int,
) -> torch.Tensor:
    """``attend(windows, key_mask)`` in every window of ``x`` (B, H, W, C) -> (B, H, W, C).

    ``windows`` is (B * nW, N, C). A map that fits in one window is attended whole, unpadded
    (``key_mask`` None). Otherwise the map is padded at the bottom and right with zero tokens
    to whole windows and ``key_mask`` (B * nW, 1, 1, N; True = real) lets every query of a
    window see that window's real keys only, so no window depends on how much padding it got.
    """
    B, H, W, C = x.shape
    ws = window_size
    if H <= ws and W <= ws:
        return attend(x.reshape(B, H * W, C), None).view(B, H, W, C)
    Hp, Wp = padded_size((H, W), ws)
    mask = None
    if (Hp, Wp) != (H, W):
        x = F.pad(x, (0, 0, 0, Wp - W, 0, Hp - H))
        valid = torch.zeros(1, Hp, Wp, 1, dtype=torch.bool, device=x.device)
        valid[:, :H, :W] = True
        mask = window_partition(valid, ws).view(-1, 1, 1, ws * ws).repeat(B, 1, 1, 1)
    out = attend(window_partition(x, ws), mask)
    return window_reverse(out, ws, Hp, Wp)[:, :H, :W]
