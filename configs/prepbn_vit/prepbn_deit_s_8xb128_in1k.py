# DeiT-S-PRepBN (PRepBNViT 'small'): DeiT-T-PRepBN's recipe at this size, λ decaying from 1 to
# 0 over 300000 iterations (SLAB's Table A1: 3e5 decay steps for DeiT-S, about 240 of the 300
# epochs at batch 1024); the paper reports 80.2 % top-1, Table 1.
_base_ = './prepbn_deit_t_8xb128_in1k.py'

model = dict(backbone=dict(arch='small'), head=dict(in_channels=384))
custom_hooks = [
    dict(type='PRepBNScheduleHook', warmup_iters=0, decay_iters=300000),
    dict(type='BNRecalibrationHook', num_batches=12510),  # 10 epochs
]
