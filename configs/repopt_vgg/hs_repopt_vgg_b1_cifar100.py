# Hyper-Search for RepOpt-VGG-B1 on CIFAR-100 (RepOptimizers §4, Appendix B):
# the B1 network with trainable constants s, t, i on its 3x3, 1x1 and identity branches, all five
# stride-2 layers kept at 32 x 32 (intended: stages 3-4 see 2x2 and 1x1 maps; the HS model only
# reaches about 54.5 %, the scales are what matters). The ImageNet settings with 240 epochs:
# SGD Nesterov, lr 0.1 per 256 images, 5 warm-up epochs then cosine, weight decay 4e-5 on the
# kernels, the classifier and the identity scales (not on s, t, BN, biases), label smoothing
# 0.1. Only the scales are kept: tools/misc/repopt_export_scales.py writes them in the official
# layout for the target configs' `scales`.
_base_ = [
    'mmpretrain::_base_/datasets/cifar100_bs16.py',
    'mmpretrain::_base_/default_runtime.py',
]
custom_imports = dict(imports=['mmrepa'], allow_failed_imports=False)

model = dict(
    type='ImageClassifier',
    backbone=dict(type='RepOptVGG', arch='B1', mode='hs', out_indices=(3,)),
    neck=dict(type='GlobalAveragePooling'),
    head=dict(
        type='LinearClsHead',
        num_classes=100,
        in_channels=2048,
        loss=dict(type='LabelSmoothLoss', label_smooth_val=0.1, mode='original'),
    ),
)
train_dataloader = dict(batch_size=256)
val_dataloader = dict(batch_size=256)
test_dataloader = val_dataloader

optim_wrapper = dict(
    optimizer=dict(type='SGD', lr=0.1, momentum=0.9, nesterov=True, weight_decay=4e-5),
    paramwise_cfg=dict(
        norm_decay_mult=0.0,
        bias_decay_mult=0.0,
        flat_decay_mult=0.0,
        # custom_keys win over flat_decay_mult: the identity scales decay like the kernels
        custom_keys={'scale_identity': dict(decay_mult=1.0)},
    ),
)
# clipping at norm 5 (the official README's commands) is allowed here, in ordinary training:
# optim_wrapper = dict(clip_grad=dict(max_norm=5.0))
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-6, by_epoch=True, end=5, convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', eta_min=0.0, by_epoch=True, begin=5),
]
train_cfg = dict(by_epoch=True, max_epochs=240, val_interval=10)
val_cfg = dict()
test_cfg = dict()
auto_scale_lr = dict(base_batch_size=256)
