# PVT-S-PRepBN on ImageNet-1k with SLAB's recipe (appendix Table A1): λ decaying from 1 to 0 over
# 300000 iterations (about 240 of the 300 epochs at batch 1024), drop path 0.1, then 10 epochs of
# BatchNorm statistics only (the paper reports 80.1 % top-1).
_base_ = './prepbn_pvt_t_8xb128_in1k.py'

model = dict(backbone=dict(arch='small', drop_path_rate=0.1))
custom_hooks = [
    dict(type='PRepBNScheduleHook', warmup_iters=0, decay_iters=300000),
    dict(type='BNRecalibrationHook', num_batches=12510),
]
