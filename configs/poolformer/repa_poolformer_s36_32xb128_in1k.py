# RePa-PoolFormer-S36 (idle ratio 0.75) on ImageNet-1k with RePaFormer's recipe: LAMB, batch
# 4096, 300 epochs; learning rate, minimum, weight decay and drop path of the paper's Table 7
# (the paper reports 76.8 % top-1). The MLPs get BatchNorms and GELU on a quarter of
# their hidden channels; the token mixer keeps its GroupNorm. 'mmrepa.PoolFormer': mmpretrain
# has a PoolFormer of its own.
_base_ = ['../_base_/models/in1k_classifier.py', '../_base_/schedules/repaformer_lamb_in1k.py']

lr, min_lr = 0.0055, 3e-06
model = dict(
    backbone=dict(type='mmrepa.PoolFormer', arch='s36', idle_ratio=0.75, drop_path_rate=0.03),
    head=dict(in_channels=512),
)
optim_wrapper = dict(optimizer=dict(lr=lr, weight_decay=0.01))
param_scheduler = [
    dict(
        type='LinearLR', start_factor=1e-6 / lr, by_epoch=True, end=20, convert_to_iter_based=True
    ),
    dict(type='CosineAnnealingLR', eta_min=min_lr, by_epoch=True, begin=20),
]
