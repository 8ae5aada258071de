# RandFormer-S12 on ImageNet-1k with the MetaFormer baselines recipe (Table XIII, as
# PoolFormerV2's: ../_base_/schedules/poolformer_in1k.py): AdamW at 4e-3, batch 4096, 300
# epochs, 5 warm-up epochs, drop path 0.1; pooled features normalised, then a Linear
# classifier (the paper reports 76.6 % top-1). Its random mixing matrices are made for 224 x
# 224 input (img_size), the size of the training crops and of the test pipeline.
_base_ = ['../_base_/models/in1k_classifier.py', '../_base_/schedules/poolformer_in1k.py']

model = dict(
    backbone=dict(
        type='RandFormer', arch='s12', img_size=224, drop_path_rate=0.1, out_norm_cfg=None
    ),
    head=dict(type='MetaFormerClsHead', in_channels=512, mlp_ratio=0),
)
