from .bn_recalibration_hook import (
    BNRecalibrationHook,
    average_bn_statistics,
    recalibrate_bn,
    recalibrate_model_bn,
)
from .branch_join_schedule_hook import BranchJoinScheduleHook, join_lambda, join_modules
from .prepbn_schedule_hook import PRepBNScheduleHook, prepbn_lambda
from .progress_hook import ProgressHook
from .reparameterize_hook import ReparameterizeHook

__all__ = [
    'BranchJoinScheduleHook',
    'join_lambda',
    'join_modules',
    'BNRecalibrationHook',
    'average_bn_statistics',
    'recalibrate_bn',
    'recalibrate_model_bn',
    'PRepBNScheduleHook',
    'prepbn_lambda',
    'ProgressHook',
    'ReparameterizeHook',
]
