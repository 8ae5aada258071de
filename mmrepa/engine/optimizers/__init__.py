"""Gradient re-parameterization (Ding et al., Re-parameterizing Your Optimizers rather than
Architectures, §3): optimizers that train a plain model exactly like its imaginary multi-branch
CSLA model, and the constructor that builds them.

Registered in mmengine's root registries: ``RepOptSGD`` and ``RepOptAdamW`` in ``OPTIMIZERS``,
``RepOptOptimWrapperConstructor`` in ``OPTIM_WRAPPER_CONSTRUCTORS``.
"""

from .base import RepOptOptimizer
from .branch_scales import branch_multiplier, collect_branch_scales, scales_of_piece
from .constructor import RepOptOptimWrapperConstructor
from .repopt_adamw import RepOptAdamW
from .repopt_sgd import RepOptSGD

__all__ = [
    'RepOptOptimizer',
    'RepOptSGD',
    'RepOptAdamW',
    'RepOptOptimWrapperConstructor',
    'collect_branch_scales',
    'branch_multiplier',
    'scales_of_piece',
]
