# Cascade Mask R-CNN, multi-scale 3x, with a ConvFormer-S18 backbone: the MetaFormer paper's
# setup (AdamW, multi-scale training, 3x, as Swin and ConvNeXt), on mmdet's ConvNeXt recipe
# (4conv1fc GIoU box heads; configs/convnext/cascade-mask-rcnn_convnext-t-p4-w7_fpn_
# 4conv1fc-giou_amp-ms-crop-3x_coco.py) with Swin's AdamW (lr 1e-4, wd 0.05), fp32.
_base_ = [
    'mmdet::convnext/cascade-mask-rcnn_convnext-t-p4-w7_fpn_4conv1fc-giou_amp-ms-crop-3x_coco.py',  # noqa
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
        init_cfg=dict(type='Pretrained', checkpoint=pretrained),
    ),
    neck=dict(in_channels=[64, 128, 320, 512]),
)

# ConvNeXt's layer-wise decay constructor only knows ConvNeXt's names: plain AdamW instead.
optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    paramwise_cfg=dict(norm_decay_mult=0.0, flat_decay_mult=0.0),
    optimizer=dict(type='AdamW', lr=0.0001, betas=(0.9, 0.999), weight_decay=0.05),
)
