# `tools/demo.py --task classification`: a small RePa-CAFormer image classifier (mmpretrain)
# trained from scratch on generated one-shape images (mmrepa.datasets.make_shapes_classification)
# in a few CPU minutes; top-1 accuracy through mmpretrain's Accuracy.
_base_ = 'mmpretrain::_base_/default_runtime.py'
custom_imports = dict(imports=['mmrepa'], allow_failed_imports=False)

data_root = 'data/demo_shapes_cls/'
model = dict(
    type='ImageClassifier',
    data_preprocessor=dict(
        num_classes=3, mean=[123.675, 116.28, 103.53], std=[58.395, 57.12, 57.375], to_rgb=True
    ),
    backbone=dict(
        type='CAFormer',
        arch=dict(depths=(1, 1, 2, 1), dims=(32, 64, 128, 256)),
        idle_ratio=0.75,
        window_size=None,  # 3 x 3 and 2 x 2 maps at 48 px: global attention
        drop_path_rate=0.0,
        out_indices=(3,),
        init_cfg=None,
    ),
    neck=dict(type='GlobalAveragePooling'),
    head=dict(
        type='LinearClsHead',
        num_classes=3,
        in_channels=256,
        loss=dict(type='CrossEntropyLoss', loss_weight=1.0),
        topk=(1,),
    ),
)

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='RandomFlip', prob=0.5, direction='horizontal'),
    dict(type='PackInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='PackInputs'),
]
# no loader workers: a 48-px image decodes faster than a worker hands it over (2-core AMD EPYC,
# AVX2, 1 thread: an epoch of 1200 images took 9.1-9.5 s with 2 workers, 6.3-7.0 s without)
train_dataloader = dict(
    batch_size=32,
    num_workers=0,
    persistent_workers=False,
    sampler=dict(type='DefaultSampler', shuffle=True),
    dataset=dict(
        type='CustomDataset', data_root=data_root, data_prefix='train', pipeline=train_pipeline
    ),
)
val_dataloader = dict(
    batch_size=32,
    num_workers=0,
    persistent_workers=False,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(
        type='CustomDataset', data_root=data_root, data_prefix='val', pipeline=test_pipeline
    ),
)
test_dataloader = val_dataloader
val_evaluator = dict(type='Accuracy', topk=(1,))
# the test also gives each class's recall, which tools/demo.py shows when a task did not learn
test_evaluator = [val_evaluator, dict(type='SingleLabelMetric', items=('recall',), average=None)]

max_epochs = 10
train_cfg = dict(by_epoch=True, max_epochs=max_epochs, val_interval=max_epochs)
val_cfg = dict()
test_cfg = dict()
optim_wrapper = dict(
    optimizer=dict(type='AdamW', lr=1e-3, weight_decay=0.05),
    paramwise_cfg=dict(custom_keys={'norm': dict(decay_mult=0.0)}),
    clip_grad=dict(max_norm=10.0),
)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=50),
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
    logger=dict(interval=10), checkpoint=dict(interval=max_epochs, max_keep_ckpts=1)
)
randomness = dict(seed=0)
