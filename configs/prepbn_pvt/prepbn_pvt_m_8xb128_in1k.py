# PVT-M-PRepBN on ImageNet-1k with SLAB's recipe (appendix Table A1): λ decaying from 1 to 0 over
# 300000 iterations, drop path 0.3, then 10 epochs of BatchNorm statistics only (the paper
# reports 81.7 % top-1).
_base_ = './prepbn_pvt_t_8xb128_in1k.py'

model = dict(backbone=dict(arch='medium', drop_path_rate=0.3))
custom_hooks = [
    dict(type='PRepBNScheduleHook', warmup_iters=0, decay_iters=300000),
    dict(type='BNRecalibrationHook', num_batches=12510),
]
