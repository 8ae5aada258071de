# MetaFormer Baselines' ImageNet-1k recipe (paper §3.1.1 and appendix Table XIV): global batch
# 4096 (32 processes x 128), 300 epochs, cosine decay, 20 warm-up epochs, weight decay 0.05,
# no EMA, no LayerScale, no repeated augmentation. ConvFormer: AdamW at 4e-3 (this file);
# CAFormer: LAMB at 8e-3 (its configs change the optimizer). Drop path and head dropout are
# per model. The minimum and warm-up learning rates are not in the paper: timm's defaults
# (1e-5, 1e-6), which the authors' training script uses. Testing: the whole image resized to
# 224 (crop ratio 1.0, as the authors evaluate).
_base_ = [
    'mmpretrain::_base_/default_runtime.py',
    '../datasets/imagenet_deit_224.py',
]

lr = 4e-3
optim_wrapper = dict(
    optimizer=dict(type='AdamW', lr=lr, weight_decay=0.05, eps=1e-8, betas=(0.9, 0.999)),
    paramwise_cfg=dict(norm_decay_mult=0.0, bias_decay_mult=0.0, flat_decay_mult=0.0),
)
param_scheduler = [
    dict(
        type='LinearLR', start_factor=1e-6 / lr, by_epoch=True, end=20, convert_to_iter_based=True
    ),
    dict(type='CosineAnnealingLR', eta_min=1e-5, by_epoch=True, begin=20),
]
train_cfg = dict(by_epoch=True, max_epochs=300, val_interval=1)
val_cfg = dict()
test_cfg = dict()
auto_scale_lr = dict(base_batch_size=4096)

test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='ResizeEdge', scale=224, edge='short', backend='pillow', interpolation='bicubic'),
    dict(type='CenterCrop', crop_size=224),
    dict(type='PackInputs'),
]
val_dataloader = dict(dataset=dict(pipeline=test_pipeline))
test_dataloader = val_dataloader
