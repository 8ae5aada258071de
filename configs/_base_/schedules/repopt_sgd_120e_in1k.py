# RepOptimizers' ImageNet schedule (paper §5.1; docs/backbones/repopt_vgg.md, "Hyper-Search and
# configs"): 120 epochs, global batch 256 (8 processes x 32), lr 0.1, 5 warm-up epochs from 0 then
# cosine to 0, label smoothing 0.1 (in the head), SGD momentum 0.9 with weight decay 4e-5 on weights
# of two or more dimensions only; Nesterov, as the official code. RepOptSGD multiplies each RepOpt
# kernel's gradient by its Hyper-Search multiplier (never the weight decay). No gradient clipping
# (it would break the equivalence with the multi-branch block; the constructor refuses it), no EMA.
_base_ = [
    'mmpretrain::_base_/default_runtime.py',
    '../datasets/imagenet_repopt_224.py',
]

lr = 0.1
optim_wrapper = dict(
    constructor='RepOptOptimWrapperConstructor',
    optimizer=dict(type='RepOptSGD', lr=lr, momentum=0.9, nesterov=True, weight_decay=4e-5),
    paramwise_cfg=dict(norm_decay_mult=0.0, bias_decay_mult=0.0, flat_decay_mult=0.0),
)
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-6, by_epoch=True, end=5, convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', eta_min=0.0, by_epoch=True, begin=5),
]
train_cfg = dict(by_epoch=True, max_epochs=120, val_interval=1)
val_cfg = dict()
test_cfg = dict()
auto_scale_lr = dict(base_batch_size=256)
