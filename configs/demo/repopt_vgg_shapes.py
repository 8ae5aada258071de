# `tools/demo.py --task repopt`, step 2: the plain network (one 3x3 conv-BN-ReLU
# per layer) trained from scratch by RepOptSGD with the constants Hyper-Search found (step 1,
# exported to `scales`); tested as trained and folded (BN into the convs).
_base_ = './hs_repopt_vgg_shapes.py'

scales = 'work_dirs/demo_repopt/scales.pth'
model = dict(backbone=dict(mode='target', scales=scales))
optim_wrapper = dict(
    constructor='RepOptOptimWrapperConstructor',
    optimizer=dict(type='RepOptSGD', lr=0.05, momentum=0.9, nesterov=True, weight_decay=4e-5),
    paramwise_cfg=dict(
        _delete_=True, norm_decay_mult=0.0, bias_decay_mult=0.0, flat_decay_mult=0.0
    ),
)
max_epochs = 6
train_cfg = dict(max_epochs=max_epochs, val_interval=max_epochs)
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
default_hooks = dict(checkpoint=dict(interval=max_epochs))
