"""ResScale and LayerScale: learnable per-channel scales on a residual block's shortcut or
branch (MetaFormer baselines; PoolFormer v1)."""

import torch
import torch.nn as nn


class ResScale(nn.Module):
    """``r * shortcut + branch`` with a learnable ``scale`` r of shape (C,), initialised to 1.

    Tensors are channels-last (..., C). The parameter is named ``scale`` as in timm's
    ``Scale``, so a block's ``res_scale1.scale`` matches timm checkpoints.
    """

    def __init__(self, dim: int, init_value: float = 1.0):
        super().__init__()
        self.scale = nn.Parameter(torch.full((dim,), float(init_value)))

    def forward(self, shortcut: torch.Tensor, branch: torch.Tensor) -> torch.Tensor:
        return torch.addcmul(branch, shortcut, self.scale)


class LayerScale(ResScale):
    """``shortcut + g * branch`` with a learnable ``scale`` g of shape (C,) (CaiT's LayerScale),
    channels-last; named ``scale`` as timm's ``Scale`` (``layer_scale1.scale``)."""

    def forward(self, shortcut: torch.Tensor, branch: torch.Tensor) -> torch.Tensor:
        return torch.addcmul(shortcut, branch, self.scale)
