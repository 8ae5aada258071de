# ImageNet-1k as RepOptimizers' code trains it (docs/backbones/repopt_vgg.md): RandomResizedCrop
# 224, flip, RandAugment at magnitude 15 (timm's rand-m15: 1.5x the level-10 ranges); testing:
# shorter side resized to 224, centre crop 224, bilinear (no 256/224 ratio). 32 images per process.
_base_ = 'mmpretrain::_base_/datasets/imagenet_bs32.py'

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='RandomResizedCrop', scale=224, backend='pillow'),
    dict(type='RandomFlip', prob=0.5, direction='horizontal'),
    dict(
        type='RandAugment',
        policies='timm_increasing',
        num_policies=2,
        total_level=10,
        magnitude_level=15,
        magnitude_std=0.5,
        hparams=dict(pad_val=[104, 116, 124], interpolation='bilinear'),
    ),
    dict(type='PackInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='ResizeEdge', scale=224, edge='short', backend='pillow', interpolation='bilinear'),
    dict(type='CenterCrop', crop_size=224),
    dict(type='PackInputs'),
]
train_dataloader = dict(dataset=dict(pipeline=train_pipeline))
val_dataloader = dict(dataset=dict(pipeline=test_pipeline))
test_dataloader = val_dataloader
