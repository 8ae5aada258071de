# Mask R-CNN with the joined DeiT-6-R backbone (6 blocks of 2 branches at λ = 1), the paper's COCO
# setting (its Table 3: 38.1 box AP / 33.5 mask AP; the detectron2/ViTDet recipe of MAE-Lite's
# tiny models): ViTDet's simple feature pyramid, 640x640 large-scale jitter (0.1-2.0), batch 64
# (8 processes x 8), 100 epochs, AdamW (weight decay 0.05), steps at 22/25 and 24/25 of training
# (the paper: 24/27, 26/27), 250 warm-up iterations, drop path 0. The backbone is fine-tuned
# unfolded at λ = 1 and folded for testing (tools/test.py --reparam). Not in the paper: the lr
# (ViTDet's 1e-4 at batch 64), window 14 with global blocks 2 and 5 (ViTDet's "every third"),
# position embedding interpolated from the 224-px pretraining, no relative positions.
_base_ = [
    'mmdet::_base_/models/mask-rcnn_r50_fpn.py',
    'mmdet::common/lsj-100e_coco-instance.py',
    '../_base_/models/depth_rep_vit.py',
]
custom_imports = dict(imports=['mmrepa'], allow_failed_imports=False)

pretrained = 'work_dirs/depthrep_vit_tiny_d6_8xb128_join_in1k/epoch_48.pth'
image_size = (640, 640)
model = dict(
    data_preprocessor=dict(pad_size_divisor=32),
    backbone=dict(
        _base_.depthrep_vit_backbone,
        _delete_=True,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained),
    ),
    neck=dict(_delete_=True, type='SimpleFPN', in_channels=192, out_channels=256, num_outs=5),
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
