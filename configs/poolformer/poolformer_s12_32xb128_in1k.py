# PoolFormer-S12 (v1) on ImageNet-1k with the PoolFormer recipe (_base_/schedules/
# poolformer_in1k.py): AdamW at 4e-3, batch 4096, 300 epochs, drop path 0.1. As the release
# and mmpretrain: GroupNorm of the last stage's map, then pooling and a Linear classifier (the
# release reports 77.2 % top-1). 'mmrepa.PoolFormer': mmpretrain has a PoolFormer of its own.
_base_ = ['../_base_/models/in1k_classifier.py', '../_base_/schedules/poolformer_in1k.py']

model = dict(
    backbone=dict(type='mmrepa.PoolFormer', arch='s12', drop_path_rate=0.1),
    head=dict(in_channels=512),
)
