# `tools/demo.py --task upernet`: a small RePa-ConvFormer UperNet trained from scratch on the
# generated shapes in ADE20K's layout (mmrepa.datasets.make_shapes_ade20k) in a few CPU minutes,
# evaluated by mmseg's IoUMetric (mIoU). Real data: configs/upernet_*_ade20k.py.
_base_ = ['mmseg::_base_/models/upernet_r50.py', 'mmseg::_base_/default_runtime.py']
custom_imports = dict(
    imports=['mmrepa', 'mmrepa.datasets.shapes_ade20k'], allow_failed_imports=False
)

data_root = 'data/demo_shapes_ade/'
norm_cfg = dict(type='BN', requires_grad=True)  # one process on the CPU: no SyncBN
model = dict(
    data_preprocessor=dict(size=(48, 48)),
    pretrained=None,
    backbone=dict(
        _delete_=True,
        type='ConvFormer',
        arch=dict(depths=(1, 1, 2, 1), dims=(32, 64, 128, 256)),
        idle_ratio=0.75,
        drop_path_rate=0.0,
        out_indices=(0, 1, 2, 3),
        init_cfg=None,
    ),
    decode_head=dict(in_channels=[32, 64, 128, 256], channels=64, num_classes=4, norm_cfg=norm_cfg),
    # mmseg's auxiliary FCN head on stage 3, as in its UperNet configs: with it (and lr 2e-3),
    # triangles are told from squares within the schedule; without, seed 1 never learned them
    # (triangle IoU 6 %, mIoU 67)
    auxiliary_head=dict(in_channels=128, channels=64, num_classes=4, norm_cfg=norm_cfg),
)

# ADE20K's pipeline without the rescaling and cropping: the images are already 48 px. The
# data set reduces the zero label (ADE20K's default), LoadAnnotations follows it
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations'),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackSegInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations'),
    dict(type='PackSegInputs'),
]
# from scratch, squares and triangles are told apart only after many updates: small batches
# get there sooner on a CPU
train_dataloader = dict(
    batch_size=4,
    num_workers=2,
    persistent_workers=True,
    sampler=dict(type='DefaultSampler', shuffle=True),
    dataset=dict(
        type='ShapesADE20KDataset',
        data_root=data_root,
        data_prefix=dict(img_path='images/training', seg_map_path='annotations/training'),
        pipeline=train_pipeline,
    ),
)
val_dataloader = dict(
    batch_size=1,
    num_workers=2,
    persistent_workers=True,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(
        type='ShapesADE20KDataset',
        data_root=data_root,
        data_prefix=dict(img_path='images/validation', seg_map_path='annotations/validation'),
        pipeline=test_pipeline,
    ),
)
test_dataloader = val_dataloader
val_evaluator = dict(type='IoUMetric', iou_metrics=['mIoU'])
test_evaluator = val_evaluator

max_epochs = 8  # 2000 iterations
train_cfg = dict(type='EpochBasedTrainLoop', max_epochs=max_epochs, val_interval=max_epochs)
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')
optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=2e-3, weight_decay=0.05),
    paramwise_cfg=dict(custom_keys={'norm': dict(decay_mult=0.0)}),
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
    timer=dict(type='IterTimerHook'),
    logger=dict(type='LoggerHook', interval=20, log_metric_by_epoch=True),
    param_scheduler=dict(type='ParamSchedulerHook'),
    checkpoint=dict(type='CheckpointHook', by_epoch=True, interval=max_epochs, max_keep_ckpts=1),
    sampler_seed=dict(type='DistSamplerSeedHook'),
    visualization=dict(type='SegVisualizationHook'),
)
log_processor = dict(by_epoch=True)
randomness = dict(seed=0)
