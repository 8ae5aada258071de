"""Folding: the protocol every foldable module follows, the walk that folds a whole model by
its own and foreign conventions (:mod:`.protocol`), and the arithmetic the folds share
(:mod:`.arithmetic`)."""

from .arithmetic import (
    batchnorm_affine,
    check_fold_state,
    check_fold_states,
    fold_dtype,
    is_affine_norm,
    norm_affine,
    norm_fold_problems,
)
from .protocol import (
    FoldError,
    FoldReport,
    Reparameterizable,
    all_or_nothing,
    check_eval_mode,
    check_foldable,
    find_fold_problems,
    fold_model,
    fold_submodules,
    is_foldable,
    reparameterize,
)

__all__ = [
    'FoldError',
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
]
