# Mask R-CNN 1x with a PRepBN-PVT-T backbone (SLAB Table 3): every norm inside the backbone moves
# from LayerNorm to RepBN during fine-tuning and folds into its neighbour at test time.
# Starts from the PVT release's ImageNet weights: their LayerNorms fill the LN branches and the
# RepBN branches (statistics included) are learned while lambda decays, so norm_eval=False.
# Recipe of SLAB's detection config (mask_rcnn_pvt_t_prepbn_fpn_1x_coco: mmdet's Mask R-CNN R-50
# FPN 1x, AdamW lr 1e-4, weight decay 0.05, no gradient clipping).
# From a PRepBN ImageNet checkpoint (already pure RepBN) instead: point init_cfg at it, set
# norm_eval=True and keep lambda at 0 with dict(type='PRepBNScheduleHook', decay_iters=0).
_base_ = [
    'mmdet::_base_/models/mask-rcnn_r50_fpn.py',
    'mmdet::_base_/datasets/coco_instance.py',
    'mmdet::_base_/schedules/schedule_1x.py',
    'mmdet::_base_/default_runtime.py',
    '../_base_/models/prepbn_pvt.py',
]
custom_imports = dict(imports=['mmrepa'], allow_failed_imports=False)

pretrained = 'https://github.com/whai362/PVT/releases/download/v2/pvt_tiny.pth'
model = dict(
    backbone=dict(
        _base_.prepbn_pvt_backbone,
        _delete_=True,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained),
    ),
    neck=dict(in_channels=[64, 128, 320, 512]),
)
optim_wrapper = dict(
    optimizer=dict(_delete_=True, type='AdamW', lr=0.0001, weight_decay=0.05),
)

custom_hooks = [
    # pure LayerNorm during the 500-iteration LR warm-up, then lambda decays linearly and
    # reaches pure RepBN after 60 % of training, before the first LR step (epoch 8 of 12)
    dict(type='PRepBNScheduleHook', warmup_iters=500, decay_ratio=0.6),
    # drop-path shifts the variance BatchNorm sees in training: re-estimate the statistics with
    # the final weights (and drop-path off) before the last checkpoint and validation
    dict(type='BNRecalibrationHook', num_batches=500),
]
