"""SLAB's simplified linear attention (SLA, the SLAB paper's §4.2) inside windows."""

from typing import Optional, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.model import BaseModule

from ..errors import ConfigError
from ..options import head_dim


class SimplifiedLinearAttention(BaseModule):
    """Linear attention with a ReLU kernel and a depthwise-conv local term, per window.

    Per head, on the N tokens of a window (window_size² of them, or h·w)::

        K   = K + P                                    # P: learnable positional encoding (N, C)
        O_i = relu(Q_i) (relu(K)ᵀ V) / (relu(Q_i) Σ_j relu(K_j)ᵀ + 1e-6)
        out = proj(O + DWC(V))                         # DWC: depthwise k×k conv on the window

    The kernel products are computed in at least float32 (autocast off), key-value product
    first, so the cost is linear in N. The depthwise conv has ``head_dim`` channels and is shared
    by all heads; it sees the window as an image and pads its borders with zeros. Parameter names
    (``qkv``, ``proj``, ``dwc``, ``positional_encoding``) follow SLAB's release.

    Args:
        embed_dims (int): Channels C.
        num_heads (int): Heads; C must be divisible by it.
        window_size (int | tuple[int, int]): Window side, or (h, w) of a non-square window
            (a PVT stage's map at its pretraining size); the positional encoding has one
            position per window token.
        qkv_bias (bool): Bias on the qkv projection. Default: True.
        proj_drop_rate (float): Dropout after the output projection. Default: 0.
        dwc_kernel_size (int): Kernel of the depthwise conv on V (odd). Default: 5.

    :meth:`attend` maps the projected qkv (B * nW, N, 3C) to (B * nW, N, C) before ``proj``;
    :meth:`forward` maps windows (B * nW, N, C) to (B * nW, N, C).
    """

    uses_mask = False  # a linear kernel has no (N, N) scores to mask

    def __init__(
        self,
        embed_dims: int,
        num_heads: int,
        window_size: Union[int, Tuple[int, int]],
        qkv_bias: bool = True,
        proj_drop_rate: float = 0.0,
        dwc_kernel_size: int = 5,
        init_cfg: Optional[dict] = None,
    ):
        super().__init__(init_cfg=init_cfg)
        dim = head_dim(embed_dims, num_heads)
        if dwc_kernel_size % 2 == 0:
            raise ConfigError(f'dwc_kernel_size must be odd, got {dwc_kernel_size}')
        self.embed_dims = embed_dims
        self.num_heads = num_heads
        self.window_size = window_size
        ws = tuple(window_size) if isinstance(window_size, (tuple, list)) else (window_size,) * 2
        self.grid = ws  # (h, w) of the window
        self.qkv = nn.Linear(embed_dims, embed_dims * 3, bias=qkv_bias)
        self.proj = nn.Linear(embed_dims, embed_dims)
        self.proj_drop = nn.Dropout(proj_drop_rate)
        self.dwc = nn.Conv2d(dim, dim, dwc_kernel_size, padding=dwc_kernel_size // 2, groups=dim)
        self.positional_encoding = nn.Parameter(torch.zeros(1, ws[0] * ws[1], embed_dims))

    def attend(
        self,
        qkv: torch.Tensor,
        mask: Optional[torch.Tensor] = None,
        hw_shape: Optional[Tuple[int, int]] = None,
    ) -> torch.Tensor:
        """qkv (B * nW, N, 3C) -> (B * nW, N, C) before ``proj``; ``mask`` is ignored.
        ``hw_shape``: the token grid when it is not the window (a plain ViT's or a PVT
        stage's whole map at another input size): the positional encoding is resized to it
        (bicubic), as a ViT's position embedding is."""
        BnW, N, C = qkv.shape[0], qkv.shape[1], qkv.shape[2] // 3
        h = self.num_heads
        grid = self.grid if hw_shape is None else tuple(hw_shape)
        q, k, v = qkv.view(BnW, N, 3, C).unbind(2)
        pe = self.positional_encoding
        if grid != self.grid:
            pe = (
                F.interpolate(
                    pe.transpose(1, 2).reshape(1, C, *self.grid), size=grid, mode='bicubic'
                )
                .flatten(2)
                .transpose(1, 2)
            )
        k = k + pe

        def heads(t):  # B*nW, h, N, d
            return t.reshape(BnW, N, h, C // h).transpose(1, 2)

        q, k, v = heads(F.relu(q)), heads(F.relu(k)), heads(v)
        work = torch.promote_types(qkv.dtype, torch.float32)
        with torch.autocast(device_type=qkv.device.type, enabled=False):
            qw, kw = q.to(work), k.to(work)
            kv = kw.transpose(-2, -1) @ v.to(work)  # B*nW, h, d, d
            norm = qw @ kw.sum(dim=2).unsqueeze(-1)  # B*nW, h, N, 1
            out = ((qw @ kv) / (norm + 1e-6)).to(qkv.dtype)
        d = C // h
        local = self.dwc(v.transpose(-2, -1).reshape(BnW * h, d, *grid))
        out = out + local.view(BnW, h, d, N).transpose(-2, -1)
        return out.transpose(1, 2).reshape(BnW, N, C)

    def forward(
        self,
        x: torch.Tensor,
        mask: Optional[torch.Tensor] = None,
        hw_shape: Optional[Tuple[int, int]] = None,
    ) -> torch.Tensor:
        return self.proj_drop(self.proj(self.attend(self.qkv(x), hw_shape=hw_shape)))

    def extra_repr(self) -> str:
        return (
            f'embed_dims={self.embed_dims}, num_heads={self.num_heads}, '
            f'window_size={self.window_size}'
        )
