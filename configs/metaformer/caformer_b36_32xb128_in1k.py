# CAFormer-B36 on ImageNet-1k with the MetaFormer Baselines recipe (Table XIV): LAMB at
# 8e-3, batch 4096, 300 epochs, drop path 0.6, head dropout 0.5; global attention at 224 px
# (the paper reports 85.5 % top-1).
_base_ = ['../_base_/models/in1k_classifier.py', '../_base_/schedules/metaformer_in1k.py']

lr = 8e-3
model = dict(
    backbone=dict(
        type='CAFormer', arch='b36', window_size=None, drop_path_rate=0.6, out_norm_cfg=None
    ),
    head=dict(type='MetaFormerClsHead', in_channels=768, head_dropout=0.5),
)
optim_wrapper = dict(optimizer=dict(_delete_=True, type='Lamb', lr=lr, weight_decay=0.05))
param_scheduler = [
    dict(
        type='LinearLR', start_factor=1e-6 / lr, by_epoch=True, end=20, convert_to_iter_based=True
    ),
    dict(type='CosineAnnealingLR', eta_min=1e-5, by_epoch=True, begin=20),
]
