"""The arithmetic shared by every fold, and the check that a checkpoint has the right form."""

from typing import List, Optional, Tuple

import torch
import torch.nn as nn
from torch.nn.modules.batchnorm import _BatchNorm

from ..errors import CheckpointError
from .protocol import FoldError


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


def check_fold_state(state_dict: dict, prefix: str, module: nn.Module) -> None:
    """Refuse to load the other form of a module's weights.

    A module with a training and a folded form declares ``fold_state_keys = (folded_key,
    unfolded_key)``, a key only its folded and one only its unfolded state dict has, and calls
    this from ``_load_from_state_dict``: every load path (``load_state_dict``, mmengine's
    ``load_checkpoint`` for ``load_from``, resume and ``tools/test.py``) stops here instead of
    leaving the module at its initial weights under a "missing keys" warning.
    """
    folded_key, unfolded_key = module.fold_state_keys
    has_folded = prefix + folded_key in state_dict
    has_unfolded = prefix + unfolded_key in state_dict
    where = prefix[:-1] or type(module).__name__
    if module.deploy and has_unfolded and not has_folded:
        raise CheckpointError(
            f'{where}: the checkpoint holds unfolded weights ({prefix}{unfolded_key}) but '
            f'the model was built folded (deploy=True). Build it with deploy=False and fold after '
            f'loading, or fold the checkpoint first with tools/reparameterize.py.'
        )
    if not module.deploy and has_folded and not has_unfolded:
        raise CheckpointError(
            f'{where}: the checkpoint holds folded weights ({prefix}{folded_key}), written '
            f'by reparameterize, but the model was built unfolded. Build it with deploy=True '
            f'(for a config: --cfg-options model.backbone.deploy=True).'
        )


def check_fold_states(model: nn.Module, state_dict: dict) -> None:
    """:func:`check_fold_state` for every two-form submodule of ``model`` (``state_dict`` in
    ``model``'s names), before a loader reports the keys of the other form as missing."""
    for name, module in model.named_modules():
        if hasattr(module, 'fold_state_keys'):
            check_fold_state(state_dict, f'{name}.' if name else '', module)
