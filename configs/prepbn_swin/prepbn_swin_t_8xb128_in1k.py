# Swin-T-PRepBN on ImageNet-1k with SLAB's recipe (appendix Table A1): every LayerNorm a
# PRepBN with λ = 0 from the first iteration (Table A1: 0 decay steps for Swin-T, pure RepBN),
# drop path 0.1, then 10 epochs of BatchNorm statistics only (the paper reports 81.4 % top-1).
_base_ = ['../_base_/models/in1k_classifier.py', '../_base_/schedules/slab_adamw_in1k.py']

# shift_small_maps=False: the 7x7 last stage at 224 px is one window without shift, as the
# released Swin computes it (the detection configs keep mmdet's shift, see
# docs/backbones/repa_swin.md#swin-as-released).
model = dict(
    backbone=dict(
        type='PRepBNSwin',
        arch='tiny',
        drop_path_rate=0.1,
        out_norm_cfg=dict(type='PRepBN'),
        shift_small_maps=False,
    ),  # SLAB's final norm is a PRepBN too
    head=dict(in_channels=768),
)
iters_per_epoch = 1251  # 1,281,167 images / 1024
custom_hooks = [
    dict(type='PRepBNScheduleHook', warmup_iters=0, decay_iters=0),
    dict(type='BNRecalibrationHook', num_batches=10 * iters_per_epoch),
]
