"""The RePa-Swin block (window attention, then the channel-idle FFN) and stage."""

from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
from mmengine.model import BaseModule, ModuleList

from ...fold import (
    FoldPolicy,
    Reparameterizable,
    add_missing_bias,
    affine_into_linear,
    is_affine_norm,
    norm_affine,
    norm_fold_problems,
    weight_and_bias,
)
from ...layers import ChannelIdleFFN, channels_last_norm, checkpoint_forward
from ...registry import build_norm_layer
from .window_attention import ShiftWindowMSA, shifted_window_mask


class RePaSwinBlock(Reparameterizable, BaseModule):
    """Swin block: ``x + attn(norm1(x))`` then the FFN (which owns its norm and shortcut).

    An affine ``norm1`` (RepBN, PRepBN, BatchNorm) folds into the attention's ``qkv``
    (:meth:`reparameterize`); a LayerNorm stays. ``attn_type`` picks softmax window attention
    (``'S'``) or simplified linear attention (``'L'``), and ``shift_small_maps`` what a map
    no larger than the window gets, see :class:`ShiftWindowMSA`; ``deploy=True`` builds the
    folded structure.

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
        shift_small_maps: bool = True,
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
            shift_small_maps=shift_small_maps,
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
        weight, bias = affine_into_linear(qkv, scale, shift, dtype)
        padded = self.attn.padded_qkv
        # qkv(0) = b, the bias before the fold, unless an earlier fold kept it already
        padded = weight_and_bias(qkv, dtype)[1] if padded is None else padded.to(dtype)
        return {
            'attn.w_msa.qkv.weight': weight,
            'attn.w_msa.qkv.bias': bias,
            'attn.padded_qkv': padded,
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
        masked = [block.attn for block in self.blocks if block.attn.masks(hw_shape)]
        if not masked:
            return None
        attn = masked[0]
        key = (attn.padded_shape(hw_shape), *attn.window_and_shift(hw_shape), device)
        if self._mask_cache is None or self._mask_cache[0] != key:
            self._mask_cache = (key, shifted_window_mask(*key[0], *key[1:]))
        return self._mask_cache[1]

    def forward(self, x: torch.Tensor, hw_shape: Tuple[int, int]):
        """Returns (next-stage input, its hw_shape, this stage's output, its hw_shape)."""
        mask = self.shifted_window_mask(hw_shape, x.device)
        for block in self.blocks:
            x = block(x, hw_shape, mask if block.attn.masks(hw_shape) else None)
        if self.downsample is None:
            return x, hw_shape, x, hw_shape
        x_down, down_shape = self.downsample(x, hw_shape)
        return x_down, down_shape, x, hw_shape
