# UperNet 160k on ADE20K 512x512 with a PRepBN-Swin-T backbone (SLAB), recipe of mmseg's
# configs/swin/swin-tiny-patch4-window7-in1k-pre_upernet_8xb2-160k_ade20k-512x512.py.
# Starts from the official Swin-T weights (LN branches) and learns the RepBN branches while
# lambda decays: pure LayerNorm during the 1500-iteration LR warm-up, pure RepBN after 60 % of
# the 160k iterations; BatchNorm statistics recalibrated at the end; every norm folds at test.
_base_ = [
    'mmseg::swin/swin-tiny-patch4-window7-in1k-pre_upernet_8xb2-160k_ade20k-512x512.py',
    '../_base_/models/prepbn_swin.py',
]
custom_imports = dict(imports=['mmrepa'], allow_failed_imports=False)

pretrained = 'https://github.com/SwinTransformer/storage/releases/download/v1.0.0/swin_tiny_patch4_window7_224.pth'  # noqa
model = dict(
    backbone=dict(
        _base_.prepbn_swin_backbone,
        _delete_=True,
        drop_path_rate=0.3,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained),
    ),
)

custom_hooks = [
    dict(type='PRepBNScheduleHook', warmup_iters=1500, decay_ratio=0.6),
    dict(type='BNRecalibrationHook', num_batches=500),
]
