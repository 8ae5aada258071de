from .hooks import (BNRecalibrationHook, PRepBNScheduleHook, ReparameterizeHook,
                    average_bn_statistics, recalibrate_bn, recalibrate_model_bn)

__all__ = [
    'BNRecalibrationHook', 'PRepBNScheduleHook', 'ReparameterizeHook', 'average_bn_statistics',
    'recalibrate_bn', 'recalibrate_model_bn'
]
