"""The arithmetic shared by every fold."""

from typing import List, Optional, Tuple, Union

import torch
import torch.nn as nn
from torch.nn.modules.batchnorm import _BatchNorm

from ..errors import FoldError


def fold_dtype(t: torch.Tensor) -> torch.dtype:
    """The dtype folds are computed in: float64 where the device has it (exact to ~1e-15)."""
    return torch.float32 if t.device.type == 'mps' else torch.float64


def _batchnorm_problem(bn: _BatchNorm) -> Optional[str]:
    """Why :func:`batchnorm_affine` refuses ``bn``, or None."""
    if bn.running_mean is None or bn.running_var is None:
        return (
            'BatchNorm without running statistics (track_running_stats=False) is not an '
            'affine map at inference and cannot be folded'
        )
    if not (torch.isfinite(bn.running_mean).all() and torch.isfinite(bn.running_var).all()):
        return (
            'BatchNorm running statistics are not finite (NaN or inf); the checkpoint or '
            'the training run that produced them is broken'
        )
    return None


def norm_fold_problems(norm: Optional[nn.Module], name: str) -> List[str]:
    """Why :func:`norm_affine` would refuse ``norm`` (named ``name`` in its owner), without
    computing it: each BatchNorm in it (itself, or RepBN's and PRepBN's) that has no running
    statistics or non-finite ones. For a module's ``fold_problems()``; reads only."""
    if norm is None or not is_affine_norm(norm):
        return []
    problems = []
    for path, bn in norm.named_modules():
        problem = _batchnorm_problem(bn) if isinstance(bn, _BatchNorm) else None
        if problem is not None:
            where = f'{name}.{path}' if path else name
            problems.append(f'{where} ({type(bn).__name__}): {problem}')
    return problems


def batchnorm_affine(bn: _BatchNorm, dtype: torch.dtype) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(scale, shift)`` with ``bn(x) == x * scale + shift`` per channel in eval mode."""
    problem = _batchnorm_problem(bn)
    if problem is not None:
        raise FoldError(problem)
    mean, var = bn.running_mean.to(dtype), bn.running_var.to(dtype)
    scale = torch.rsqrt(var + bn.eps)
    if bn.weight is not None:
        scale = scale * bn.weight.to(dtype)
    shift = -mean * scale
    if bn.bias is not None:
        shift = shift + bn.bias.to(dtype)
    return scale, shift


def norm_affine(norm: nn.Module, dtype: torch.dtype) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
    """Per-channel ``(scale, shift)`` of a norm that is affine at inference, else ``None``.

    BatchNorm layers qualify through the ``_BatchNorm`` base class (SyncBN included); other norms
    qualify by implementing ``eval_affine(dtype)``. LayerNorm is not affine and returns ``None``.
    """
    if isinstance(norm, _BatchNorm):
        return batchnorm_affine(norm, dtype)
    if hasattr(norm, 'eval_affine'):
        return norm.eval_affine(dtype)
    return None


def is_affine_norm(norm: nn.Module) -> bool:
    """Whether :func:`norm_affine` can fold ``norm`` (decided from its type, not its values)."""
    return isinstance(norm, _BatchNorm) or hasattr(norm, 'eval_affine')


def weight_and_bias(layer: nn.Module, dtype: torch.dtype) -> Tuple[torch.Tensor, torch.Tensor]:
    """A Linear's or conv's weight and bias in ``dtype``; zeros for a missing bias."""
    w = layer.weight.to(dtype)
    return w, layer.bias.to(dtype) if layer.bias is not None else w.new_zeros(w.shape[0])


def affine_into_linear(
    layer: nn.Linear, scale: torch.Tensor, shift: torch.Tensor, dtype: torch.dtype
) -> Tuple[torch.Tensor, torch.Tensor]:
    """``layer(x * scale + shift)`` as one Linear: ``W diag(scale)``, ``b + W shift``."""
    w, b = weight_and_bias(layer, dtype)
    return w * scale, b + w @ shift


def affine_into_conv(
    conv: nn.Conv2d, scale: torch.Tensor, shift: torch.Tensor, dtype: torch.dtype
) -> Tuple[torch.Tensor, torch.Tensor]:
    """``conv(x * scale + shift)`` (per input channel: a norm before the conv) as one conv:
    ``W`` scaled per input channel, ``b + Σ_taps W shift``. Exact only for a conv without
    padding: a padded tap reads a zero, not ``shift``."""
    w, b = weight_and_bias(conv, dtype)
    return w * scale.view(1, -1, 1, 1), b + w.sum(dim=(2, 3)) @ shift


def affine_after_conv(
    conv: Union[nn.Conv2d, torch.Tensor],
    scale: torch.Tensor,
    shift: torch.Tensor,
    dtype: torch.dtype,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """``conv(x) * scale + shift`` (per output channel: a norm after the conv) as one conv:
    ``W`` scaled per output channel, ``b · scale + shift``. ``conv`` may also be a bare kernel
    (C_out, C_in, kh, kw), a conv without bias (e.g. the sum of a block's branch kernels)."""
    if isinstance(conv, torch.Tensor):
        return conv.to(dtype) * scale.view(-1, 1, 1, 1), shift
    w, b = weight_and_bias(conv, dtype)
    return w * scale.view(-1, 1, 1, 1), b * scale + shift


def add_missing_bias(layer: nn.Module) -> None:
    """Give a Linear or conv built without a bias a zero one (the folded layer needs one)."""
    if layer.bias is None:
        layer.bias = nn.Parameter(layer.weight.new_zeros(layer.weight.shape[0]))
