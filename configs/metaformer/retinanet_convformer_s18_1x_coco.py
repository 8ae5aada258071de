# RetinaNet 1x with a ConvFormer-S18 backbone, on mmdet's Swin RetinaNet recipe
# (configs/swin/retinanet_swin-t-p4-w7_fpn_1x_coco.py) with AdamW (lr 1e-4, wd 0.05) as in the
# MetaFormer paper's detection setups.
_base_ = [
    'mmdet::retinanet/retinanet_r50_fpn_1x_coco.py',
    '../_base_/models/metaformer.py',
]
custom_imports = dict(imports=['mmrepa'], allow_failed_imports=False)

# ImageNet-1k weights in timm's format (e.g. convformer_s18.sail_in1k) or the original
# release's; see the README for where to get them.
pretrained = 'checkpoints/convformer_s18.sail_in1k.pth'
model = dict(
    backbone=dict(
        _base_.convformer_backbone,
        _delete_=True,
        out_indices=(1, 2, 3),
        init_cfg=dict(type='Pretrained', checkpoint=pretrained),
    ),
    neck=dict(in_channels=[128, 320, 512], start_level=0, num_outs=5),
)

optim_wrapper = dict(
    optimizer=dict(_delete_=True, type='AdamW', lr=0.0001, betas=(0.9, 0.999), weight_decay=0.05),
    paramwise_cfg=dict(norm_decay_mult=0.0, flat_decay_mult=0.0),
)
