# SLAB's ImageNet-1k recipe (paper §5.1 and appendix Table A1): AdamW (lr 1e-3, weight decay
# 0.05), global batch 1024 (8 processes x 128), 300 epochs, cosine decay, 20 warm-up epochs,
# then the BatchNorm statistics re-estimated with the weights frozen (the paper: 10 extra
# epochs, BNRecalibrationHook). Not in the paper, from the authors' Swin-based code: minimum
# and warm-up learning rates 1e-5 / 1e-6 at batch 1024, gradient clipping at norm 5, no EMA.
# The PRepBN decay (λ from 1 to 0 over T iterations) is per model. BatchNorms are synchronised
# across processes.
_base_ = [
    'mmpretrain::_base_/default_runtime.py',
    '../datasets/imagenet_deit_224.py',
]

lr = 1e-3
optim_wrapper = dict(
    optimizer=dict(type='AdamW', lr=lr, weight_decay=0.05, eps=1e-8, betas=(0.9, 0.999)),
    paramwise_cfg=dict(
        norm_decay_mult=0.0,
        bias_decay_mult=0.0,
        flat_decay_mult=0.0,
        custom_keys={'.relative_position_bias_table': dict(decay_mult=0.0)},
    ),
    clip_grad=dict(max_norm=5.0),
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
sync_bn = 'torch'
auto_scale_lr = dict(base_batch_size=1024)
