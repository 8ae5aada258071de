# Mask R-CNN 1x with a PRepBN-Swin-T backbone (SLAB): every norm inside the backbone moves from
# LayerNorm to RepBN during fine-tuning and folds into its neighbour at test time.
# Starts from the official Swin-T ImageNet weights: their LayerNorms fill the LN branches and the
# RepBN branches (statistics included) are learned while lambda decays, so norm_eval=False.
# Recipe of mmdet's configs/swin/mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py (AdamW, lr 1e-4, wd 0.05).
# From a PRepBN ImageNet checkpoint (already pure RepBN) instead: point init_cfg at it, set
# norm_eval=True and keep lambda at 0 with dict(type='PRepBNScheduleHook', decay_iters=0).
_base_ = [
    'mmdet::_base_/models/mask-rcnn_r50_fpn.py',
    'mmdet::_base_/datasets/coco_instance.py',
    '../_base_/schedules/swin_adamw_1x.py',
    'mmdet::_base_/default_runtime.py',
    '../_base_/models/prepbn_swin.py',
]
custom_imports = dict(imports=['mmrepa'], allow_failed_imports=False)

pretrained = 'https://github.com/SwinTransformer/storage/releases/download/v1.0.0/swin_tiny_patch4_window7_224.pth'  # noqa
model = dict(
    backbone=dict(
        _base_.prepbn_swin_backbone,
        _delete_=True,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained),
    ),
    neck=dict(in_channels=[96, 192, 384, 768]),
)

custom_hooks = [
    # pure LayerNorm while the LR warms up (1000 iterations), then lambda decays linearly and
    # reaches pure RepBN after 60 % of training, before the first LR step (epoch 8 of 12)
    dict(type='PRepBNScheduleHook', warmup_iters=1000, decay_ratio=0.6),
    # drop-path shifts the variance BatchNorm sees in training: re-estimate the statistics with
    # the final weights (and drop-path off) before the last checkpoint and validation
    dict(type='BNRecalibrationHook', num_batches=500),
]
