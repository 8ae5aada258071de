# `tools/demo.py --task repopt`, step 1: Hyper-Search for a small RepOpt-VGG on the
# generated one-shape images (mmrepa.datasets.make_shapes_classification): the three-branch
# network with trainable constants s, t, i, trained as hs_repopt_vgg_b1_cifar100.py (SGD
# Nesterov, weight decay on kernels, classifier and identity scales only), for a few CPU
# minutes. Only its constants are kept (tools/misc/repopt_export_scales.py).
_base_ = 'mmpretrain::_base_/default_runtime.py'
custom_imports = dict(imports=['mmrepa'], allow_failed_imports=False)

data_root = 'data/demo_shapes_cls/'
arch = dict(depths=(1, 2, 2, 1), widths=(16, 32, 64, 128), stem_width=16)
model = dict(
    type='ImageClassifier',
    data_preprocessor=dict(
        num_classes=3, mean=[123.675, 116.28, 103.53], std=[58.395, 57.12, 57.375], to_rgb=True
    ),
    backbone=dict(type='RepOptVGG', arch=arch, mode='hs', out_indices=(3,)),
    neck=dict(type='GlobalAveragePooling'),
    head=dict(
        type='LinearClsHead',
        num_classes=3,
        in_channels=128,
        loss=dict(type='LabelSmoothLoss', label_smooth_val=0.1, mode='original'),
        topk=(1,),
    ),
)

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='RandomFlip', prob=0.5, direction='horizontal'),
    dict(type='PackInputs'),
]
test_pipeline = [dict(type='LoadImageFromFile'), dict(type='PackInputs')]
train_dataloader = dict(
    batch_size=32,
    num_workers=2,
    persistent_workers=True,
    sampler=dict(type='DefaultSampler', shuffle=True),
    dataset=dict(
        type='CustomDataset', data_root=data_root, data_prefix='train', pipeline=train_pipeline
    ),
)
val_dataloader = dict(
    batch_size=32,
    num_workers=2,
    persistent_workers=True,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(
        type='CustomDataset', data_root=data_root, data_prefix='val', pipeline=test_pipeline
    ),
)
test_dataloader = val_dataloader
val_evaluator = dict(type='Accuracy', topk=(1,))
# the test also gives each class's recall, which tools/demo.py shows when a task did not learn
test_evaluator = [val_evaluator, dict(type='SingleLabelMetric', items=('recall',), average=None)]

max_epochs = 4
train_cfg = dict(by_epoch=True, max_epochs=max_epochs, val_interval=max_epochs)
val_cfg = dict()
test_cfg = dict()
optim_wrapper = dict(
    optimizer=dict(type='SGD', lr=0.05, momentum=0.9, nesterov=True, weight_decay=4e-5),
    paramwise_cfg=dict(
        norm_decay_mult=0.0,
        bias_decay_mult=0.0,
        flat_decay_mult=0.0,
        custom_keys={'scale_identity': dict(decay_mult=1.0)},
    ),
)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=30),
    dict(
        type='CosineAnnealingLR',
        by_epoch=True,
        begin=0,
        end=max_epochs,
        T_max=max_epochs,
        eta_min=0.0,
    ),
]
default_hooks = dict(
    logger=dict(interval=20), checkpoint=dict(interval=max_epochs, max_keep_ckpts=1)
)
randomness = dict(seed=0)
