"""Folding: the protocol every foldable module follows, the walk that folds a whole model by
its own and foreign conventions (:mod:`.protocol`), and the arithmetic the folds share
(:mod:`.arithmetic`)."""
from .arithmetic import (batchnorm_affine, check_fold_state, check_fold_states, fold_dtype,
                         is_affine_norm, norm_affine)
from .protocol import (FoldError, FoldReport, Reparameterizable, check_eval_mode, fold_model,
                       fold_submodules, is_foldable, reparameterize)

__all__ = [
    'FoldError', 'FoldReport', 'Reparameterizable', 'check_eval_mode', 'fold_model',
    'fold_submodules', 'is_foldable', 'reparameterize', 'batchnorm_affine', 'check_fold_state',
    'check_fold_states', 'fold_dtype', 'is_affine_norm', 'norm_affine'
]
