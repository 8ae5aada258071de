"""StarReLU and squared ReLU, the MetaFormer baselines' activations (Yu et al., "MetaFormer
Baselines for Vision", Sec. 2.4.1: squared ReLU Eq. 10, StarReLU Eq. 15).

StarReLU implements the output-affine fold protocol (:mod:`mmrepa.layers.output_affine`):
``StarReLU(x) = SquaredReLU(x) * s + b``.
"""

from typing import Optional, Tuple

import torch
import torch.nn as nn

from ...registry import MODELS


def _autograd_needed(*tensors: Optional[torch.Tensor]) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


@MODELS.register_module()
class SquaredReLU(nn.Module):
    """``relu(x)**2``, plus a learnable scalar ``bias`` if ``bias=True``; any shape.

    Without autograd the result is computed in place on relu's output: on CPU the element-wise
    passes cost as much as a small GEMM.
    """

    def __init__(self, bias: bool = False):
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(1)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(x)
        if _autograd_needed(x, self.bias):
            y = y.square()
            return y if self.bias is None else y + self.bias
        y = y.square_()
        return y if self.bias is None else y.add_(self.bias)


@MODELS.register_module()
class StarReLU(nn.Module):
    """StarReLU ``s * relu(x)**2 + b`` with scalars ``scale`` = s and ``bias`` = b; any shape.

    Args:
        scale_value (float): Initial s. Default: 1.
        bias_value (float): Initial b. Default: 0.
        scale_learnable (bool): Whether s is trained. Default: True.
        bias_learnable (bool): Whether b is trained. Default: True.

    Without autograd the result is computed in place, as in :class:`SquaredReLU`.
    """

    def __init__(
        self,
        scale_value: float = 1.0,
        bias_value: float = 0.0,
        scale_learnable: bool = True,
        bias_learnable: bool = True,
    ):
        super().__init__()
        self.scale = nn.Parameter(
            torch.full((1,), float(scale_value)), requires_grad=scale_learnable
        )
        self.bias = nn.Parameter(torch.full((1,), float(bias_value)), requires_grad=bias_learnable)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(x)
        if _autograd_needed(x, self.scale, self.bias):
            return self.scale * y.square() + self.bias
        return y.square_().mul_(self.scale).add_(self.bias)

    def output_affine(self, dtype: torch.dtype) -> Tuple[torch.Tensor, torch.Tensor]:
        """``(s, b)`` as 0-d tensors in ``dtype``: ``self(x) == bare()(x) * s + b``."""
        return self.scale.detach().to(dtype).reshape(()), self.bias.detach().to(dtype).reshape(())

    def bare(self) -> nn.Module:
        return SquaredReLU()
