from .hooks import BranchJoinScheduleHook
from .hooks import (BNRecalibrationHook, PRepBNScheduleHook, ReparameterizeHook,
                    average_bn_statistics, recalibrate_bn, recalibrate_model_bn)
from . import optimizers  # noqa: F401  (registers RepOptSGD, RepOptAdamW and their constructor)

__all__ = [
    'BranchJoinScheduleHook',
    'BNRecalibrationHook', 'PRepBNScheduleHook', 'ReparameterizeHook', 'average_bn_statistics',
    'recalibrate_bn', 'recalibrate_model_bn'
]
