"""Multi-head self-attention over the whole token map or over windows (CAFormer's mixer)."""

from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.model import BaseModule

from ..options import check_int
from ..registry import MODELS
from .window_attention import attend_in_windows


@MODELS.register_module()
class WindowedSelfAttention(BaseModule):
    """Vanilla multi-head self-attention, global or in non-overlapping windows.

    Works on channels-last maps: x (B, H, W, C) -> (B, H, W, C). Parameters are those of timm's
    MetaFormer ``Attention`` (``qkv``: C -> 3 * heads * head_dim, ``proj``: heads * head_dim
    -> C; no positional parameters), so the window size can change without touching a
    checkpoint.

    With ``window_size=w`` the map is padded to multiples of ``w`` and cut into w x w windows;
    padded positions are masked out as keys, so no window attends to padding and a window that
    covers the whole map gives exactly global attention. Memory then grows linearly with the
    map (one (w^2 x w^2) matrix per window and head) instead of quadratically.

    Args:
        embed_dims (int): Channels C.
        head_dim (int): Channels per head. Default: 32.
        num_heads (int, optional): Heads; default ``max(1, C // head_dim)`` (as timm).
        window_size (int, optional): Window side in tokens; ``None`` for global attention.
            Default: None.
        qkv_bias (bool): Bias on ``qkv``. Default: False.
        proj_bias (bool): Bias on ``proj``. Default: False.
        init_cfg (dict, optional): Initialization config.
    """

    def __init__(
        self,
        embed_dims: int,
        head_dim: int = 32,
        num_heads: Optional[int] = None,
        window_size: Optional[int] = None,
        qkv_bias: bool = False,
        proj_bias: bool = False,
        init_cfg: Optional[dict] = None,
    ):
        super().__init__(init_cfg=init_cfg)
        check_int(window_size, 'window_size', none_means='global attention')
        self.head_dim = head_dim
        self.num_heads = num_heads or max(1, embed_dims // head_dim)
        self.window_size = window_size
        attention_dims = self.num_heads * head_dim
        self.qkv = nn.Linear(embed_dims, 3 * attention_dims, bias=qkv_bias)
        self.proj = nn.Linear(attention_dims, embed_dims, bias=proj_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.window_size is None:
            B, H, W, C = x.shape
            return self._attend(x.reshape(B, H * W, C)).view(B, H, W, C)
        return attend_in_windows(self._attend, x, self.window_size)

    def _attend(self, x: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """x (G, N, C): attention within each of the G groups of N tokens."""
        G, N, _ = x.shape
        qkv = self.qkv(x).view(G, N, 3, self.num_heads, self.head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each (G, heads, N, head_dim)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.proj(out.transpose(1, 2).reshape(G, N, -1))

    def extra_repr(self) -> str:
        return (
            f'num_heads={self.num_heads}, head_dim={self.head_dim}, window_size={self.window_size}'
        )
