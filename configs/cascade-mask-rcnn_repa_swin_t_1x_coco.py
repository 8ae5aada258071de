# Cascade Mask R-CNN 1x with a RePa-Swin-T backbone: the Swin Mask R-CNN recipe of mmdet
# (AdamW, lr 1e-4, wd 0.05, 1x) on mmdet's Cascade Mask R-CNN.
_base_ = 'mmdet::cascade_rcnn/cascade-mask-rcnn_r50_fpn_1x_coco.py'
custom_imports = dict(imports=['mmrepa'], allow_failed_imports=False)

pretrained = 'checkpoints/repa_swin_tiny_in1k.pth'
model = dict(
    backbone=dict(
        _delete_=True,
        type='RePaSwin',
        arch='tiny',
        idle_ratio=0.75,
        ffn_norm='BN',
        drop_path_rate=0.2,
        out_indices=(0, 1, 2, 3),
        norm_eval=True,
        with_cp=False,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    neck=dict(in_channels=[96, 192, 384, 768]))

max_epochs = 12
train_cfg = dict(max_epochs=max_epochs)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=1000),
    dict(type='MultiStepLR', begin=0, end=max_epochs, by_epoch=True, milestones=[8, 11],
         gamma=0.1)
]
optim_wrapper = dict(
    type='OptimWrapper',
    paramwise_cfg=dict(custom_keys={
        'relative_position_bias_table': dict(decay_mult=0.),
        'norm': dict(decay_mult=0.)
    }),
    optimizer=dict(_delete_=True, type='AdamW', lr=0.0001, betas=(0.9, 0.999),
                   weight_decay=0.05))
