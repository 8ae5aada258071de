# PoolFormerV2-S12 on ImageNet-1k with the MetaFormer baselines recipe (Table XIII): AdamW at
# 4e-3, batch 4096, 300 epochs, 5 warm-up epochs, drop path 0.1; pooled features normalised,
# then a Linear classifier (the paper reports 78.0 % top-1).
_base_ = ['../_base_/models/in1k_classifier.py', '../_base_/schedules/poolformer_in1k.py']

model = dict(
    backbone=dict(type='PoolFormerV2', arch='s12', drop_path_rate=0.1, out_norm_cfg=None),
    head=dict(type='MetaFormerClsHead', in_channels=512, mlp_ratio=0),
)
