# RePa-DeiT-B (RePaViT 'base', idle ratio 0.75, BatchNorm FFN): RePa-DeiT-T's recipe and
# classifier at this size; learning rate, minimum, weight decay and drop path of RePaFormer's
# Table 7 (the paper reports 81.4 % top-1, Table 1).
_base_ = './repa_deit_t_32xb128_in1k.py'

lr, min_lr = 4e-3, 4e-5
model = dict(backbone=dict(arch='base', drop_path_rate=0.1), head=dict(in_channels=768))
optim_wrapper = dict(optimizer=dict(lr=lr, weight_decay=0.07))
param_scheduler = [
    dict(
        type='LinearLR', start_factor=1e-6 / lr, by_epoch=True, end=20, convert_to_iter_based=True
    ),
    dict(type='CosineAnnealingLR', eta_min=min_lr, by_epoch=True, begin=20),
]
