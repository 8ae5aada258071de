# RePa-DeiT-B (RePaViT 'base', idle ratio 0.75, BatchNorm FFN) on ImageNet-1k with
# RePaFormer's recipe: LAMB, batch 4096, 300 epochs; learning rate, minimum, weight decay and
# drop path of the paper's Table 7 (the paper reports 81.4 % top-1, Table 1). Classifier: the
# class token through the backbone's output LayerNorm, then a Linear (DeiT's).
_base_ = ['../_base_/models/in1k_classifier.py', '../_base_/schedules/repaformer_lamb_in1k.py']

lr, min_lr = 4e-3, 4e-5
model = dict(
    backbone=dict(
        type='RePaViT',
        arch='base',
        idle_ratio=0.75,
        ffn_norm='BN',
        out_type='cls',
        out_indices=-1,
        drop_path_rate=0.1,
    ),
    neck=None,
    head=dict(in_channels=768),
)
optim_wrapper = dict(
    optimizer=dict(lr=lr, weight_decay=0.07),
    paramwise_cfg=dict(
        custom_keys={'pos_embed': dict(decay_mult=0.0), 'cls_token': dict(decay_mult=0.0)}
    ),
)
param_scheduler = [
    dict(
        type='LinearLR', start_factor=1e-6 / lr, by_epoch=True, end=20, convert_to_iter_based=True
    ),
    dict(type='CosineAnnealingLR', eta_min=min_lr, by_epoch=True, begin=20),
]
