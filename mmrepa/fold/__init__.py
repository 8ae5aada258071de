"""Folding: the base every foldable module derives from and the fold it owns (:mod:`.base`),
the checks before a fold and its undo (:mod:`.checks`), the walk that folds a whole model by
its own and foreign conventions (:mod:`.protocol`), and the arithmetic the folds share
(:mod:`.arithmetic`). The protocol: ``docs/folding_protocol.md``."""

from .arithmetic import (
    add_missing_bias,
    affine_after_conv,
    affine_into_linear,
    batchnorm_affine,
    fold_dtype,
    is_affine_norm,
    norm_affine,
    norm_fold_problems,
    weight_and_bias,
)
from .base import FoldPolicy, Reparameterizable, check_fold_state, check_fold_states
from .checks import all_or_nothing, check_eval_mode, check_foldable, find_fold_problems, is_foldable
from .protocol import FoldError, FoldReport, fold_model, fold_submodules, reparameterize

__all__ = [
    'FoldError',
    'FoldPolicy',
    'FoldReport',
    'Reparameterizable',
    'all_or_nothing',
    'check_eval_mode',
    'check_foldable',
    'find_fold_problems',
    'fold_model',
    'fold_submodules',
    'is_foldable',
    'reparameterize',
    'batchnorm_affine',
    'check_fold_state',
    'check_fold_states',
    'fold_dtype',
    'is_affine_norm',
    'norm_affine',
    'norm_fold_problems',
    'add_missing_bias',
    'affine_into_linear',
    'affine_after_conv',
    'weight_and_bias',
]
