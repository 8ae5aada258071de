# CAFormer-B36 on ImageNet-1k with the MetaFormer Baselines recipe (Table XIV): LAMB at
# 8e-3, batch 4096, 300 epochs, drop path 0.6, head dropout 0.5; global attention at 224 px
# (the paper reports 85.5 % top-1).
_base_ = ['../_base_/models/in1k_classifier.py', '../_base_/schedules/caformer_lamb_in1k.py']

model = dict(
    backbone=dict(
        type='CAFormer', arch='b36', window_size=None, drop_path_rate=0.6, out_norm_cfg=None
    ),
    head=dict(type='MetaFormerClsHead', in_channels=768, head_dropout=0.5),
)
