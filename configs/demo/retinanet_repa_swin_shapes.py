# `make demo`: a small RePa-Swin RetinaNet trained from scratch on the generated shapes data
# (mmrepa.datasets.make_shapes_coco) in a few CPU minutes. Real data: use the configs above.
_base_ = 'mmdet::retinanet/retinanet_r50_fpn_1x_coco.py'
custom_imports = dict(imports=['mmrepa'], allow_failed_imports=False)

data_root = 'data/demo_shapes/'
image_size = 128
metainfo = dict(
    classes=('circle', 'square', 'triangle'), palette=[(220, 20, 60), (0, 128, 255), (60, 180, 75)]
)

model = dict(
    backbone=dict(
        _delete_=True,
        type='RePaSwin',
        arch=dict(embed_dims=32, depths=(1, 1, 2, 1), num_heads=(1, 2, 4, 8)),
        window_size=4,
        idle_ratio=0.75,
        ffn_norm='BN',
        drop_path_rate=0.0,
        out_indices=(1, 2, 3),
        init_cfg=None,
    ),
    neck=dict(in_channels=[64, 128, 256], out_channels=64, start_level=0, num_outs=5),
    bbox_head=dict(num_classes=3, in_channels=64, feat_channels=64, stacked_convs=2),
    test_cfg=dict(max_per_img=20),
)

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(type='Resize', scale=(image_size, image_size), keep_ratio=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackDetInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(image_size, image_size), keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(
        type='PackDetInputs',
        meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor'),
    ),
]
train_dataloader = dict(
    batch_size=8,
    num_workers=2,
    dataset=dict(
        data_root=data_root,
        metainfo=metainfo,
        ann_file='annotations/train.json',
        data_prefix=dict(img='train/'),
        pipeline=train_pipeline,
    ),
)
val_dataloader = dict(
    batch_size=1,
    num_workers=2,
    dataset=dict(
        data_root=data_root,
        metainfo=metainfo,
        ann_file='annotations/val.json',
        data_prefix=dict(img='val/'),
        pipeline=test_pipeline,
    ),
)
test_dataloader = val_dataloader
val_evaluator = dict(ann_file=data_root + 'annotations/val.json', metric='bbox')
test_evaluator = dict(val_evaluator, classwise=True)  # per-class AP in the test log

max_epochs = 20
train_cfg = dict(max_epochs=max_epochs, val_interval=max_epochs)
optim_wrapper = dict(
    optimizer=dict(_delete_=True, type='AdamW', lr=1e-3, weight_decay=0.05),
    paramwise_cfg=dict(
        custom_keys={
            'relative_position_bias_table': dict(decay_mult=0.0),
            'norm': dict(decay_mult=0.0),
        }
    ),
    clip_grad=dict(max_norm=10.0),
)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=100),
    dict(
        type='CosineAnnealingLR',
        by_epoch=True,
        begin=0,
        end=max_epochs,
        T_max=max_epochs,
        eta_min=1e-5,
    ),
]
default_hooks = dict(
    logger=dict(interval=20), checkpoint=dict(interval=max_epochs, max_keep_ckpts=1)
)
auto_scale_lr = dict(enable=False)
randomness = dict(seed=0)
