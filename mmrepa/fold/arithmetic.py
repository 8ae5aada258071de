"""The arithmetic shared by every fold, and the check that a checkpoint has the right form."""
from typing import Optional, Tuple

import torch
import torch.nn as nn
from torch.nn.modules.batchnorm import _BatchNorm

from ..errors import CheckpointError
from .protocol import FoldError


def fold_dtype(t: torch.Tensor) -> torch.dtype:
    """The dtype folds are computed in: float64 where the device has it (exact to ~1e-15)."""
    return torch.float32 if t.device.type == 'mps' else torch.float64


def batchnorm_affine(bn: _BatchNorm, dtype: torch.dtype) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(scale, shift)`` with ``bn(x) == x * scale + shift`` per channel in eval mode."""
    if bn.running_mean is None or bn.running_var is None:
        raise FoldError('BatchNorm without running statistics (track_running_stats=False) '
                        'is not an affine map at inference and cannot be folded')
    mean, var = bn.running_mean.to(dtype), bn.running_var.to(dtype)
    if not (torch.isfinite(mean).all() and torch.isfinite(var).all()):
        raise FoldError('BatchNorm running statistics are not finite (NaN or inf); the '
                        'checkpoint or the training run that produced them is broken')
    scale = torch.rsqrt(var + bn.eps)
    if bn.weight is not None:
        scale = scale * bn.weight.to(dtype)
    shift = -mean * scale
    if bn.bias is not None:
        shift = shift + bn.bias.to(dtype)
    return scale, shift


def norm_affine(norm: nn.Module,
                dtype: torch.dtype) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
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
            f'loading, or fold the checkpoint first with tools/reparameterize.py.')
    if not module.deploy and has_folded and not has_unfolded:
        raise CheckpointError(
            f'{where}: the checkpoint holds folded weights ({prefix}{folded_key}), written '
            f'by reparameterize, but the model was built unfolded. Build it with deploy=True '
            f'(for a config: --cfg-options model.backbone.deploy=True).')


def check_fold_states(model: nn.Module, state_dict: dict) -> None:
    """:func:`check_fold_state` for every two-form submodule of ``model`` (``state_dict`` in
    ``model``'s names), before a loader reports the keys of the other form as missing."""
    for name, module in model.named_modules():
        if hasattr(module, 'fold_state_keys'):
            check_fold_state(state_dict, f'{name}.' if name else '', module)
