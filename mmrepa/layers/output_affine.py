"""The output-affine fold protocol: an activation that is an affine map of a simpler one.

An activation with ``act(x) = bare(x) * s + b`` exposes ``output_affine(dtype) -> (s, b)`` and
``bare() -> module``. A fold can then move ``s`` and ``b`` into the linear layer that follows
and keep only the bare activation (MetaFormer's StarReLU is one such activation).
"""

from typing import Optional, Tuple

import torch
import torch.nn as nn


def has_output_affine(act: nn.Module) -> bool:
    """Whether ``act`` implements the protocol (``output_affine`` and ``bare``)."""
    return all(callable(getattr(act, name, None)) for name in ('output_affine', 'bare'))


def output_affine(
    act: nn.Module, dtype: torch.dtype
) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
    """``(s, b)`` of an activation implementing the protocol, else ``None``."""
    return act.output_affine(dtype) if has_output_affine(act) else None


def bare_activation(act: nn.Module) -> nn.Module:
    """The activation without its output affine (a new module), or ``act`` itself."""
    return act.bare() if has_output_affine(act) else act
