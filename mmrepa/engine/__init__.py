from .hooks import (BNRecalibrationHook, PRepBNScheduleHook, ReparameterizeHook, recalibrate_bn,
                    recalibrate_model_bn)

__all__ = [
    'BNRecalibrationHook', 'PRepBNScheduleHook', 'ReparameterizeHook', 'recalibrate_bn',
    'recalibrate_model_bn'
]
