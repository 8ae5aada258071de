# ConvFormer-B36 on ImageNet-1k with the MetaFormer Baselines recipe (Table XIV): AdamW at
# 4e-3, batch 4096, 300 epochs, drop path 0.6; pooled features normalised, then the MLP head
# (the paper reports 84.8 % top-1).
_base_ = ['../_base_/models/in1k_classifier.py', '../_base_/schedules/metaformer_in1k.py']

model = dict(
    backbone=dict(type='ConvFormer', arch='b36', drop_path_rate=0.6, out_norm_cfg=None),
    head=dict(type='MetaFormerClsHead', in_channels=768, head_dropout=0.0),
)
