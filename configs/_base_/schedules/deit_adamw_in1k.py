# DeiT's ImageNet-1k recipe as the depth re-parameterization paper uses it (its Table 7):
# AdamW, lr 1e-3 at global batch 1024 (8 processes x 128), weight decay 0.05, 300 epochs,
# cosine decay, 5 warm-up epochs. Not in the paper: DeiT's own minimum and warm-up learning
# rates (1e-5, 1e-6) and no decay on norms, biases, class token and position embedding, as
# mmpretrain's DeiT configs.
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
        custom_keys={'.cls_token': dict(decay_mult=0.0), '.pos_embed': dict(decay_mult=0.0)},
    ),
)
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-6 / lr, by_epoch=True, end=5, convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', eta_min=1e-5, by_epoch=True, begin=5),
]
train_cfg = dict(by_epoch=True, max_epochs=300, val_interval=1)
val_cfg = dict()
test_cfg = dict()
auto_scale_lr = dict(base_batch_size=1024)
