# PVT-T-PRepBN on ImageNet-1k with SLAB's recipe (appendix Table A1): every LayerNorm a PRepBN
# with λ = 0 from the first iteration (Table A1: 0 decay steps for PVT-T, pure RepBN), no drop
# path, then 10 epochs of BatchNorm statistics only (the paper reports 76.0 % top-1).
# SLAB's PVT has neither a class token nor a final norm: average pooling of the last stage.
_base_ = ['../_base_/models/in1k_classifier.py', '../_base_/schedules/slab_adamw_in1k.py']

model = dict(
    backbone=dict(type='PRepBNPVT', arch='tiny', drop_path_rate=0.0),
    head=dict(in_channels=512),
)
iters_per_epoch = 1251  # 1,281,167 images / 1024
custom_hooks = [
    dict(type='PRepBNScheduleHook', warmup_iters=0, decay_iters=0),
    dict(type='BNRecalibrationHook', num_batches=10 * iters_per_epoch),
]
