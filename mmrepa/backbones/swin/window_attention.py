"""Swin's (shifted) window attention, with padding to any input size.

Parameter names follow mmdet's ``ShiftWindowMSA`` (``w_msa.qkv``, ``w_msa.proj``,
``w_msa.relative_position_bias_table``) so mmdet Swin checkpoints load unchanged. The attention
core ``w_msa`` is softmax window attention (:class:`WindowMSA`) or SLAB's simplified linear
attention (:class:`~mmrepa.layers.SimplifiedLinearAttention`); both expose ``qkv``, ``proj``,
``proj_drop`` and ``attend(qkv_windows, mask)``.
"""

from typing import NamedTuple, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmcv.cnn.bricks.drop import DropPath
from mmengine.model import BaseModule
from mmengine.model.weight_init import trunc_normal_

from ...errors import ConfigError
from ...layers import SimplifiedLinearAttention
from ...layers.window_attention import padded_size, window_partition, window_reverse
from ...options import head_dim


class WindowLayout(NamedTuple):
    """Where each token of an (H, W) map goes when it is padded, shifted and split in windows.

    ``gather``: (nW * N,) source token of every window position (0 for padding, which is
    zeroed after the gather). ``scatter``: (H * W,) window position of every real token.
    ``padded``: the window positions that hold padding.
    """

    gather: torch.Tensor
    scatter: torch.Tensor
    padded: torch.Tensor


def window_layout(
    H: int, W: int, window_size: int, shift_size: int, device: torch.device
) -> WindowLayout:
    """One index gather replaces pad + roll + partition (and one the way back): on a CPU each of
    those is a full copy of the map, the roll two."""
    Hp, Wp = padded_size((H, W), window_size)
    # Every cell gets its own id, padding H * W onwards, so one scatter inverts the gather: no
    # boolean indexing or sorting, hence no value-dependent shapes (torch.compile traces it
    # without graph breaks) and only ops the ONNX exporter has.
    ids = torch.empty((Hp, Wp), dtype=torch.long, device=device)
    ids[:H, :W] = torch.arange(H * W, device=device).view(H, W)
    # no empty assignments: mmdeploy exports them as an empty constant in a Concat, which
    # OpenVINO's ONNX reader refuses
    if Wp > W:
        ids[:H, W:] = torch.arange(H * W, H * Wp, device=device).view(H, Wp - W)
    if Hp > H:
        ids[H:] = torch.arange(H * Wp, Hp * Wp, device=device).view(Hp - H, Wp)
    if shift_size:
        ids = torch.roll(ids, shifts=(-shift_size, -shift_size), dims=(0, 1))
    gather = window_partition(ids.view(1, Hp, Wp, 1), window_size).flatten()
    positions = torch.arange(gather.numel(), device=device)
    inverse = torch.zeros_like(positions).scatter(0, gather, positions)
    # padding's positions: in the order of the ids, not of the positions (written as a set)
    scatter, padded = inverse[: H * W], inverse[H * W :]
    real = gather < H * W
    return WindowLayout(gather.masked_fill(~real, 0), scatter, padded)


def shifted_window_mask(
    H: int, W: int, window_size: int, shift_size: int, device: torch.device
) -> torch.Tensor:
    """Additive mask (nW, N, N) that keeps a shifted window from mixing regions that are not
    neighbours in the image: 0 within a region, -100 across (as in Swin)."""

    def bands(n):  # 0 before the last window, 1 in it before the shift, 2 in the shift
        i = torch.arange(n, device=device)
        return (i >= n - window_size).long() + (i >= n - shift_size).long()

    region = (bands(H)[:, None] * 3 + bands(W)[None, :]).float()
    ids = window_partition(region.view(1, H, W, 1), window_size).squeeze(-1)  # nW, N
    diff = ids.unsqueeze(1) - ids.unsqueeze(2)
    return torch.zeros_like(diff).masked_fill_(diff != 0, -100.0)


def relative_position_index(hw_shape: Tuple[int, int], window_size: int) -> torch.Tensor:
    """(N, N) rows of the (2 * window_size - 1)² relative position table for the tokens of an
    (h, w) window, h, w <= window_size: offset (dy, dx) is row (dy + ws - 1) (2 ws - 1) +
    (dx + ws - 1), as Swin's index for h = w = window_size."""
    h, w = hw_shape
    coords = torch.stack(torch.meshgrid(torch.arange(h), torch.arange(w), indexing='ij')).flatten(1)
    rel = (coords[:, :, None] - coords[:, None, :]) + (window_size - 1)  # 2, N, N
    return rel[0] * (2 * window_size - 1) + rel[1]


class WindowMSA(BaseModule):
    """Multi-head self-attention inside windows, with a learned relative position bias.

    Args:
        embed_dims (int): Channels C.
        num_heads (int): Attention heads; C must be divisible by it.
        window_size (int): Window side Wh = Ww.
        qkv_bias (bool): Bias on the qkv projection. Default: True.
        qk_scale (float, optional): Overrides ``head_dim ** -0.5``.
        attn_drop_rate (float): Dropout on attention weights. Default: 0.
        proj_drop_rate (float): Dropout after the output projection. Default: 0.

    Input (B * nW, N, C) with N = window_size**2, optional additive mask (nW, N, N);
    output (B * nW, N, C). :meth:`attend` does the same from the projected (B * nW, N, 3C)
    ``qkv`` up to (excluding) the output projection.
    """

    uses_mask = True  # honours the shifted-window mask

    def __init__(
        self,
        embed_dims: int,
        num_heads: int,
        window_size: int,
        qkv_bias: bool = True,
        qk_scale: Optional[float] = None,
        attn_drop_rate: float = 0.0,
        proj_drop_rate: float = 0.0,
        init_cfg: Optional[dict] = None,
    ):
        super().__init__(init_cfg=init_cfg)
        dim = head_dim(embed_dims, num_heads)
        self.embed_dims = embed_dims
        self.num_heads = num_heads
        self.window_size = window_size
        self.scale = qk_scale or dim**-0.5
        self.attn_drop_rate = attn_drop_rate
        self.relative_position_bias_table = nn.Parameter(
            torch.zeros((2 * window_size - 1) ** 2, num_heads)
        )
        # Derived from window_size, so not part of the state dict.
        self.register_buffer(
            'relative_position_index',
            relative_position_index((window_size, window_size), window_size),
            persistent=False,
        )
        self._clamped_index = None  # (window (h, w), its index) of the last clamped window
        self.qkv = nn.Linear(embed_dims, embed_dims * 3, bias=qkv_bias)
        self.proj = nn.Linear(embed_dims, embed_dims)
        self.proj_drop = nn.Dropout(proj_drop_rate)

    def init_weights(self):
        super().init_weights()
        trunc_normal_(self.relative_position_bias_table, std=0.02)

    def relative_position_bias(self, hw_shape: Optional[Tuple[int, int]] = None) -> torch.Tensor:
        """(num_heads, N, N) for the window, or for a smaller ``hw_shape`` window (a map that
        is smaller than the window, attended whole): each pair of tokens reads the entry of
        its relative offset, so the table's central (2h - 1) x (2w - 1) entries."""
        index = self.relative_position_index
        if hw_shape is not None and tuple(hw_shape) != (self.window_size,) * 2:
            cached = self._clamped_index
            if cached is None or cached[0] != tuple(hw_shape) or cached[1].device != index.device:
                sub = relative_position_index(hw_shape, self.window_size).to(index.device)
                self._clamped_index = cached = (tuple(hw_shape), sub)
            index = cached[1]
        return self.relative_position_bias_table[index].permute(2, 0, 1)

    def attend(
        self,
        qkv: torch.Tensor,
        mask: Optional[torch.Tensor] = None,
        hw_shape: Optional[Tuple[int, int]] = None,
    ) -> torch.Tensor:
        """qkv (B * nW, N, 3C) -> attention output (B * nW, N, C), before ``proj``.
        ``hw_shape``: the window's (h, w) when it is smaller than ``window_size`` (a clamped
        window, see :meth:`relative_position_bias`)."""
        BnW, N, C = qkv.shape[0], qkv.shape[1], qkv.shape[2] // 3
        qkv = qkv.view(BnW, N, 3, self.num_heads, C // self.num_heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each B*nW, heads, N, d
        bias = self.relative_position_bias(hw_shape).unsqueeze(0)  # 1, heads, N, N
        if mask is not None:
            # Batch-major windows: window w of image b is row b * nW + w. A 4-D mask keeps
            # SDPA on its fused CPU kernel (faster than the 5-D broadcast, docs/speed.md); for
            # one image the expand-reshape is a view.
            nW = mask.shape[0]
            bias = (bias + mask.unsqueeze(1)).unsqueeze(0).expand(BnW // nW, -1, -1, -1, -1)
            bias = bias.reshape(BnW, *bias.shape[2:])
        x = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=bias.to(q.dtype),
            dropout_p=self.attn_drop_rate if self.training else 0.0,
            scale=self.scale,
        )
        return x.reshape(BnW, self.num_heads, N, -1).transpose(1, 2).reshape(BnW, N, C)

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        return self.proj_drop(self.proj(self.attend(self.qkv(x), mask)))


class ShiftWindowMSA(BaseModule):
    """Window attention on a token map of any size: pad to the window, shift, attend, undo.

    The map is padded with zero tokens, as in mmdet's Swin, whose projection is ``qkv(0)``.
    Once a norm has been folded into ``qkv`` (by ``RePaSwinBlock``'s fold) a zero token no
    longer projects to the pre-fold ``qkv(0)``, so that value is kept in the ``padded_qkv``
    buffer and written over the padded tokens' projections: the folded model stays exact on
    every input size (docs/backbones/prepbn_swin.md#folds).

    Args:
        embed_dims, num_heads, window_size, qkv_bias, qk_scale, attn_drop_rate,
        proj_drop_rate: As in :class:`WindowMSA`.
        shift_size (int): Cyclic shift towards the bottom right; 0 for plain windows.
        drop_path_rate (float): Stochastic depth on the output. Default: 0.
        attn_type (str): ``'S'``: softmax window attention with relative position bias
            (:class:`WindowMSA`); ``'L'``: simplified linear attention
            (:class:`~mmrepa.layers.SimplifiedLinearAttention`, no shifted-window mask, as in
            SLAB). Default: ``'S'``.
        norm_folded (bool): Build the structure ``RePaSwinBlock``'s fold of its norm leaves
            (a ``qkv`` bias and the ``padded_qkv`` buffer), to load folded checkpoints.
            Default: False.
        shift_small_maps (bool): What a map no larger than the window (``min(H, W) <=
            window_size``, decided per input) gets. True: padded to the window and shifted
            with the mask, as mmdet's Swin. False: one window of side ``min(H, W)`` and no
            shift, as the released Swin (Microsoft's; timm's on square maps), see
            :meth:`window_and_shift`. Default: True.

    Input (B, H*W, C) with ``hw_shape = (H, W)``; output (B, H*W, C).
    """

    def __init__(
        self,
        embed_dims: int,
        num_heads: int,
        window_size: int,
        shift_size: int = 0,
        qkv_bias: bool = True,
        qk_scale: Optional[float] = None,
        attn_drop_rate: float = 0.0,
        proj_drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
        attn_type: str = 'S',
        norm_folded: bool = False,
        shift_small_maps: bool = True,
        init_cfg: Optional[dict] = None,
    ):
        super().__init__(init_cfg=init_cfg)
        if not 0 <= shift_size < window_size:
            raise ConfigError(
                f'shift_size must be in [0, window_size={window_size}), got {shift_size}'
            )
        self.window_size = window_size
        self.shift_size = shift_size
        self.shift_small_maps = shift_small_maps
        qkv_bias = qkv_bias or norm_folded
        if attn_type == 'S':
            self.w_msa = WindowMSA(
                embed_dims,
                num_heads,
                window_size,
                qkv_bias,
                qk_scale,
                attn_drop_rate,
                proj_drop_rate,
            )
        elif attn_type == 'L':
            self.w_msa = SimplifiedLinearAttention(
                embed_dims, num_heads, window_size, qkv_bias, proj_drop_rate
            )
        else:
            raise ConfigError(f"attn_type must be 'S' (softmax) or 'L' (linear), got {attn_type!r}")
        self.register_buffer('padded_qkv', torch.zeros(3 * embed_dims) if norm_folded else None)
        self._layout_cache = None
        self.drop = DropPath(drop_path_rate) if drop_path_rate > 0 else nn.Identity()

    def window_and_shift(self, hw_shape: Tuple[int, int]) -> Tuple[int, int]:
        """The window side and shift on an (H, W) map. With ``shift_small_maps=False`` a map
        with ``min(H, W) <= window_size`` is split in windows of side ``min(H, W)`` (padding
        the longer side, as any map) and not shifted: the released Swin's rule (timm decides
        each side apart, which differs on non-square maps only)."""
        side = min(hw_shape)
        if self.shift_small_maps or side > self.window_size:
            return self.window_size, self.shift_size
        return side, 0

    def padded_shape(self, hw_shape: Tuple[int, int]) -> Tuple[int, int]:
        return padded_size(hw_shape, self.window_and_shift(hw_shape)[0])

    def masks(self, hw_shape: Tuple[int, int]) -> bool:
        """Whether :meth:`forward` uses a shifted-window mask on an (H, W) map."""
        return bool(self.window_and_shift(hw_shape)[1]) and self.w_msa.uses_mask

    def forward(
        self, x: torch.Tensor, hw_shape: Tuple[int, int], mask: Optional[torch.Tensor] = None
    ) -> torch.Tensor:
        """``mask``: the shifted-window mask for the padded shape (computed here if None)."""
        B, L, C = x.shape
        H, W = hw_shape
        ws, shift = self.window_and_shift(hw_shape)
        Hp, Wp = padded_size(hw_shape, ws)
        if not self.masks(hw_shape):
            mask = None
        elif mask is None:
            mask = shifted_window_mask(Hp, Wp, ws, shift, x.device)
        plain = not shift and (Hp, Wp) == (H, W)
        if plain:
            windows = window_partition(x.view(B, H, W, C), ws)
        else:
            layout = self._layout(hw_shape, ws, shift, x.device)
            windows = x.index_select(1, layout.gather)
            if len(layout.padded):  # zero tokens, as mmdet pads; no padded copy of the map
                windows[:, layout.padded] = 0
            windows = windows.view(-1, ws * ws, C)
        qkv = self.w_msa.qkv(windows)  # B*nW, N, 3C
        if self.padded_qkv is not None and not plain and len(layout.padded):
            qkv = self._write_padded_qkv(qkv.view(B, -1, 3 * C), layout.padded).view(qkv.shape)
        # a clamped window: the attention's bias (or linear positional encoding) for its size
        clamped = {} if ws == self.window_size else dict(hw_shape=(ws, ws))
        x = self.w_msa.proj_drop(self.w_msa.proj(self.w_msa.attend(qkv, mask, **clamped)))
        if plain:
            x = window_reverse(x, ws, H, W).reshape(B, L, C)
        else:
            x = x.view(B, -1, C).index_select(1, layout.scatter)
        return self.drop(x)

    def _write_padded_qkv(self, qkv: torch.Tensor, padded: torch.Tensor) -> torch.Tensor:
        """``qkv`` (B, nW * N, 3C) with ``padded_qkv`` at the padded window positions."""
        value = self.padded_qkv.to(qkv.dtype)
        if torch.jit.is_tracing():  # the ONNX exporter drops in-place writes through views
            return qkv.index_copy(1, padded, value.expand(qkv.shape[0], len(padded), -1))
        qkv[:, padded] = value
        return qkv

    def _layout(self, hw_shape: Tuple[int, int], ws: int, shift: int, device) -> WindowLayout:
        key = (tuple(hw_shape), ws, shift, device)
        if self._layout_cache is None or self._layout_cache[0] != key:
            # the same size usually comes again (a video, a benchmark, a test set of one size)
            self._layout_cache = (key, window_layout(*hw_shape, ws, shift, device))
        return self._layout_cache[1]
