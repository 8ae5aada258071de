"""A pre-norm ViT block whose attention and FFN have n joined branches behind shared
LayerNorms; folds into a single-path block once λ = 1."""

from typing import Optional, Tuple

import torch
import torch.nn as nn
from mmcv.cnn.bricks.drop import DropPath
from mmengine.model import BaseModule

from ...fold import Reparameterizable
from ...layers.window_attention import attend_in_windows
from ...options import check_int
from ...registry import MODELS, build_norm_layer
from .attention import JoinedAttention
from .ffn import JoinedFFN


@MODELS.register_module()
class JoinedBlock(Reparameterizable, BaseModule):
    """A pre-norm ViT block whose two sub-layers have n joined branches (the paper's §3.2)::

        x = x + drop_path(attn(norm1(x)))     # Σ_b MHSA_b, joined pre-softmax (or at q/k/v)
        x = x + drop_path(mlp(norm2(x)))      # Σ_b FFN_b, joined pre-activation

    Both LayerNorms are shared by the branches and sit before the branch point (the only
    foldable reading); drop path acts on the summed sub-layer output, one mask per sample.
    :meth:`reparameterize` (λ == 1.0) gives a single-path block with timm's ViT names
    (``norm1``, ``attn.qkv``, ``attn.proj``, ``norm2``, ``mlp.fc1``, ``mlp.fc2``): a standard
    ViT block for ``join='qkv'`` or ``num_branches=1`` (timm / MAE-Lite block weights load
    into it unchanged), heads of width n·d_h for ``join='logits'``. The LayerNorms stay (their
    normalization is not linear); their affine is not folded, so the folded block keeps
    standard ViT shapes.

    Args:
        embed_dims (int): d.
        num_heads (int): H per branch. Default: 12 (the paper's ViT-Tiny; not timm's 3).
        num_branches (int): n >= 1. Default: 2.
        join (str): ``'logits'`` (the paper) or ``'qkv'`` (mmrepa's extension).
            Default: ``'logits'``.
        mlp_ratio (float): FFN hidden width / d. Default: 4.
        qkv_bias (bool): Bias on q, k, v. Default: True.
        drop_path_rate (float): Stochastic depth of both sub-layers. Default: 0.
        norm_cfg (dict): The shared norms. Default: ``dict(type='LN', eps=1e-6)``.
        act_cfg (dict): FFN activation. Default: ``dict(type='GELU')``.
        window_size (int, optional): Attend within non-overlapping windows of this side
            (``forward`` then needs ``hw_shape`` and tokens without a class token); the map is
            padded to multiples of the window and padded keys are masked, so any map size
            gives the same result folded and unfolded. ``None``: global. Default: None.
        join_lambda (float): Initial λ of both sub-layers. Default: 0.
        deploy (bool): Build the folded block. Default: False.
        init_cfg (dict, optional): Initialization config.

    ``forward(x, hw_shape=None, key_padding_mask=None)``: x (B, N, d) -> (B, N, d).
    ``key_padding_mask`` (B, N) bool, True for real tokens (global attention only): padding
    tokens are never attended to.
    """

    fold_state_keys = ('mlp.fc1.weight', 'mlp.branch_fc1.weight')  # names the block on load

    def __init__(
        self,
        embed_dims: int,
        num_heads: int = 12,
        num_branches: int = 2,
        join: str = 'logits',
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        drop_path_rate: float = 0.0,
        norm_cfg: dict = dict(type='LN', eps=1e-6),
        act_cfg: dict = dict(type='GELU'),
        window_size: Optional[int] = None,
        join_lambda: float = 0.0,
        deploy: bool = False,
        init_cfg: Optional[dict] = None,
    ):
        super().__init__(init_cfg=init_cfg)
        check_int(window_size, 'window_size', none_means='global attention')
        self.embed_dims, self.num_branches, self.join = embed_dims, num_branches, join
        self.window_size = window_size
        self.deploy = deploy
        self.norm1 = build_norm_layer(norm_cfg, embed_dims)[1]
        self.attn = JoinedAttention(
            embed_dims, num_heads, num_branches, join, qkv_bias, join_lambda, deploy
        )
        self.norm2 = build_norm_layer(norm_cfg, embed_dims)[1]
        self.mlp = JoinedFFN(embed_dims, mlp_ratio, num_branches, act_cfg, join_lambda, deploy)
        self.drop_path = DropPath(drop_path_rate) if drop_path_rate > 0 else nn.Identity()

    @property
    def current_join_lambda(self) -> float:
        return self.attn.current_join_lambda

    def set_join_lambda(self, value: float) -> None:
        """Set λ of both sub-layers (one global λ for both joining points, §3.4)."""
        self.attn.set_join_lambda(value)
        self.mlp.set_join_lambda(value)

    def forward(
        self,
        x: torch.Tensor,
        hw_shape: Optional[Tuple[int, int]] = None,
        key_padding_mask: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        B, N, C = x.shape
        if self.window_size is None:
            mask = None
            if key_padding_mask is not None:
                if key_padding_mask.shape != (B, N) or key_padding_mask.dtype != torch.bool:
                    raise ValueError(
                        f'key_padding_mask must be a bool tensor of shape (B, N) '
                        f'= ({B}, {N}), True for real tokens; got '
                        f'{key_padding_mask.dtype} {tuple(key_padding_mask.shape)}'
                    )
                mask = key_padding_mask[:, None, None, :]
            x = x + self.drop_path(self.attn(self.norm1(x), mask))
        else:
            if key_padding_mask is not None:
                raise ValueError(
                    'key_padding_mask is for global blocks; a windowed block masks '
                    'its own padding (pass hw_shape)'
                )
            x = x + self.drop_path(self._windowed_attention(self.norm1(x), hw_shape))
        return x + self.drop_path(self.mlp(self.norm2(x)))

    def _windowed_attention(self, u: torch.Tensor, hw_shape) -> torch.Tensor:
        B, N, C = u.shape
        if hw_shape is None or hw_shape[0] * hw_shape[1] != N:
            raise ValueError(
                f'a windowed JoinedBlock needs hw_shape=(H, W) with H * W = N = {N} '
                f'(patch tokens only, no class token); got hw_shape={hw_shape}'
            )
        # Padding tokens are zeros after the LN (which is not folded), but are masked as keys
        # anyway: no window may depend on how much padding it got.
        out = attend_in_windows(self.attn, u.view(B, *hw_shape, C), self.window_size)
        return out.reshape(B, N, C)

    def describe(self) -> str:
        return (
            f'{type(self).__name__}(embed_dims={self.embed_dims}, '
            f'num_branches={self.num_branches}, join={self.join!r})'
        )

    def extra_repr(self) -> str:
        return (
            f'num_branches={self.num_branches}, join={self.join!r}, '
            f'window_size={self.window_size}, deploy={self.deploy}'
        )
