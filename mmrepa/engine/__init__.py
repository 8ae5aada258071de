from . import (
    optimizers,  # noqa: F401  (registers RepOptSGD, RepOptAdamW and their constructor)
    strategies,  # noqa: F401  (registers FoldableFSDPStrategy, foldable_block_policy)
)
from .hooks import (
    BNRecalibrationHook,
    BranchJoinScheduleHook,
    PRepBNScheduleHook,
    ReparameterizeHook,
    average_bn_statistics,
    recalibrate_bn,
    recalibrate_model_bn,
)
from .loops import FoldedTestLoop

__all__ = [
    'FoldedTestLoop',
    'BranchJoinScheduleHook',
    'BNRecalibrationHook',
    'PRepBNScheduleHook',
    'ReparameterizeHook',
    'average_bn_statistics',
    'recalibrate_bn',
    'recalibrate_model_bn',
]
