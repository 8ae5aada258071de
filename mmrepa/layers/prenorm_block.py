"""The pre-norm transformer block the plain and pyramid ViTs share."""

from typing import List, Tuple

import torch
from mmengine.model import BaseModule

from ..fold import Reparameterizable, norm_fold_problems
from .channel_idle_ffn import channels_last_norm
from .grad_checkpoint import checkpoint_forward


class PreNormBlock(Reparameterizable, BaseModule):
    """``x + drop_path(mix(norm1(x)))``, then ``ffn`` (which owns its norm and shortcut, a
    :class:`~mmrepa.layers.ChannelIdleFFN`), per-block gradient checkpointing (``with_cp``)
    and the problems of folding ``norm1``. A subclass builds ``norm1`` (None once folded),
    ``attn``, ``drop_path``, ``ffn`` and ``with_cp``, folds ``norm1`` into what reads it, and
    overrides :meth:`_mix` when its token mixer is not ``attn(y, hw_shape)``.

    Input and output (B, N, C) with ``hw_shape``, the token grid.
    """

    def _mix(self, y: torch.Tensor, hw_shape: Tuple[int, int]) -> torch.Tensor:
        return self.attn(y, hw_shape)

    def _forward(self, x: torch.Tensor, hw_shape: Tuple[int, int]) -> torch.Tensor:
        y = x if self.norm1 is None else channels_last_norm(self.norm1, x)
        x = x + self.drop_path(self._mix(y, hw_shape).reshape(x.shape))
        return self.ffn(x)

    def forward(self, x: torch.Tensor, hw_shape: Tuple[int, int]) -> torch.Tensor:
        if self.with_cp:
            return checkpoint_forward(self, self._forward, x, hw_shape)
        return self._forward(x, hw_shape)

    def fold_problems(self) -> List[str]:
        """An affine ``norm1`` must have finite running statistics."""
        return norm_fold_problems(self.norm1, 'norm1')
