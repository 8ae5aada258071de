# ViTDet's Mask R-CNN recipe for a plain ViT (mmdet's ViTDet project, detectron2's): the stride-16
# map through the simple feature pyramid (mmrepa's SimpleFPN), 640x640 large-scale jitter
# (0.1-2.0), batch 64 (8 processes x 8), 100 epochs, AdamW (lr 1e-4 at batch 64, weight decay
# 0.05, none on norms, biases and the position embedding), steps at 22/25 and 24/25 of training,
# 250 warm-up iterations. Use: list it in `_base_` with a backbone fragment, then set
# model = dict(backbone=dict(_base_.<family>_backbone, _delete_=True, init_cfg=...),
# neck=dict(in_channels=<the backbone's width>)).
_base_ = [
    'mmdet::_base_/models/mask-rcnn_r50_fpn.py',
    'mmdet::common/lsj-100e_coco-instance.py',
]
custom_imports = dict(imports=['mmrepa'], allow_failed_imports=False)

image_size = (640, 640)
model = dict(
    data_preprocessor=dict(pad_size_divisor=32),
    neck=dict(_delete_=True, type='SimpleFPN', out_channels=256, num_outs=5),
)

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='RandomResize', scale=image_size, ratio_range=(0.1, 2.0), keep_ratio=True),
    dict(
        type='RandomCrop',
        crop_type='absolute_range',
        crop_size=image_size,
        recompute_bbox=True,
        allow_negative_crop=True,
    ),
    dict(type='FilterAnnotations', min_gt_bbox_wh=(1e-2, 1e-2)),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackDetInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=image_size, keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(
        type='PackDetInputs',
        meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor'),
    ),
]
train_dataloader = dict(batch_size=8, dataset=dict(dataset=dict(pipeline=train_pipeline)))
val_dataloader = dict(dataset=dict(pipeline=test_pipeline))
test_dataloader = val_dataloader

optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.05),
    paramwise_cfg=dict(
        norm_decay_mult=0.0, bias_decay_mult=0.0, custom_keys={'pos_embed': dict(decay_mult=0.0)}
    ),
)
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=False, begin=0, end=250),
    dict(type='MultiStepLR', begin=0, end=25, by_epoch=True, milestones=[22, 24], gamma=0.1),
]
