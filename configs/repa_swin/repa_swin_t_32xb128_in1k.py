# RePa-Swin-T (idle ratio 0.75) on ImageNet-1k with RePaFormer's recipe: LAMB, batch 4096,
# 300 epochs; learning rate, minimum, weight decay and drop path of the paper's Table 7
# (the paper reports 78.5 % top-1). The checkpoint is what the RePa-Swin-T detection and
# segmentation configs load (their `pretrained`).
_base_ = ['../_base_/models/in1k_classifier.py', '../_base_/schedules/repaformer_lamb_in1k.py']

lr, min_lr = 0.005, 5e-05
# shift_small_maps=False: the 7x7 last stage at 224 px is one window without shift, as the
# released Swin computes it (the detection configs keep mmdet's shift, see
# docs/backbones/repa_swin.md#swin-as-released).
model = dict(
    backbone=dict(
        type='RePaSwin',
        arch='tiny',
        idle_ratio=0.75,
        ffn_norm='BN',
        drop_path_rate=0.1,
        shift_small_maps=False,
    ),
    head=dict(in_channels=768),
)
optim_wrapper = dict(optimizer=dict(lr=lr, weight_decay=0.2))
param_scheduler = [
    dict(
        type='LinearLR', start_factor=1e-6 / lr, by_epoch=True, end=20, convert_to_iter_based=True
    ),
    dict(type='CosineAnnealingLR', eta_min=min_lr, by_epoch=True, begin=20),
]
