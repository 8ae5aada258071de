# RePa-DeiT-S (RePaViT 'small', idle ratio 0.75, BatchNorm FFN): RePa-DeiT-T's recipe and
# classifier at this size; learning rate, minimum, weight decay and drop path of RePaFormer's
# Table 7 (the paper reports 77.1 % top-1, Table 1).
_base_ = './repa_deit_t_32xb128_in1k.py'

lr, min_lr = 3e-3, 4e-5
model = dict(backbone=dict(arch='small', drop_path_rate=0.04), head=dict(in_channels=384))
optim_wrapper = dict(optimizer=dict(lr=lr, weight_decay=0.05))
param_scheduler = [
    dict(
        type='LinearLR', start_factor=1e-6 / lr, by_epoch=True, end=20, convert_to_iter_based=True
    ),
    dict(type='CosineAnnealingLR', eta_min=min_lr, by_epoch=True, begin=20),
]
