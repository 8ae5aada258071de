# RetinaNet 1x with a PRepBN-Swin-T backbone (SLAB), recipe of mmdet's
# configs/swin/retinanet_swin-t-p4-w7_fpn_1x_coco.py. Like mask-rcnn_prepbn_swin_t_1x_coco.py:
# starts from the official Swin-T weights (LN branches), learns the RepBN branches while lambda
# decays, recalibrates the BatchNorm statistics at the end, folds every norm at test time.
_base_ = [
    'mmdet::retinanet/retinanet_r50_fpn_1x_coco.py',
    '../_base_/models/prepbn_swin.py',
]
custom_imports = dict(imports=['mmrepa'], allow_failed_imports=False)

pretrained = 'https://github.com/SwinTransformer/storage/releases/download/v1.0.0/swin_tiny_patch4_window7_224.pth'  # noqa
model = dict(
    backbone=dict(
        _base_.prepbn_swin_backbone,
        _delete_=True,
        out_indices=(1, 2, 3),  # only what the FPN uses
        init_cfg=dict(type='Pretrained', checkpoint=pretrained),
    ),
    neck=dict(in_channels=[192, 384, 768], start_level=0, num_outs=5),
)

custom_hooks = [
    # pure LayerNorm during the 500-iteration LR warm-up, pure RepBN after 60 % of training
    dict(type='PRepBNScheduleHook', warmup_iters=500, decay_ratio=0.6),
    dict(type='BNRecalibrationHook', num_batches=500),
]

optim_wrapper = dict(optimizer=dict(lr=0.01))
