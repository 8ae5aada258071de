# DeiT-S-PRepBN (PRepBNViT 'small') on ImageNet-1k with SLAB's recipe (appendix Table A1):
# every LayerNorm a PRepBN, λ decaying from 1 to 0 over 300000 iterations (Table A1: 3e5
# decay steps for DeiT-S, about 240 of the 300 epochs at batch 1024), drop path 0, then 10 epochs of BatchNorm statistics only (the paper reports 80.2 % top-1, Table 1). Class
# token, as SLAB's deit.py.
_base_ = ['../_base_/models/in1k_classifier.py', '../_base_/schedules/slab_adamw_in1k.py']

model = dict(
    backbone=dict(
        type='PRepBNViT',
        arch='small',
        out_type='cls',
        out_indices=-1,
        drop_path_rate=0.0,
        out_norm_cfg=dict(type='PRepBN', eps=1e-6),
    ),  # SLAB's final norm is a PRepBN too
    neck=None,
    head=dict(in_channels=384),
)
optim_wrapper = dict(
    paramwise_cfg=dict(
        custom_keys={'pos_embed': dict(decay_mult=0.0), 'cls_token': dict(decay_mult=0.0)}
    )
)
iters_per_epoch = 1251  # 1,281,167 images / 1024
custom_hooks = [
    dict(type='PRepBNScheduleHook', warmup_iters=0, decay_iters=300000),
    dict(type='BNRecalibrationHook', num_batches=10 * iters_per_epoch),
]
