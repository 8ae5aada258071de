# RetinaNet 1x with a PRepBN-PVT-T backbone: mmdet's configs/pvt/retinanet_pvt-t_fpn_1x_coco.py
# (PVT's own detection setup: AdamW lr 1e-4, weight decay 1e-4) with the backbone's type
# changed; starts from the PVT release's weights (LN branches), learns the RepBN branches while
# lambda decays, recalibrates the BatchNorm statistics at the end, folds every norm at test time.
_base_ = 'mmdet::pvt/retinanet_pvt-t_fpn_1x_coco.py'
custom_imports = dict(imports=['mmrepa'], allow_failed_imports=False)

pretrained = 'https://github.com/whai362/PVT/releases/download/v2/pvt_tiny.pth'
model = dict(
    backbone=dict(
        type='PRepBNPVT',
        norm_eval=False,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained),
    )
)

custom_hooks = [
    # pure LayerNorm during the 500-iteration LR warm-up, pure RepBN after 60 % of training
    dict(type='PRepBNScheduleHook', warmup_iters=500, decay_ratio=0.6),
    dict(type='BNRecalibrationHook', num_batches=500),
]
