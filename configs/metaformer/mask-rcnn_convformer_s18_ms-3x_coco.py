# Mask R-CNN, multi-scale 3x, with a ConvFormer-S18 backbone: the MetaFormer paper's setup
# (AdamW, multi-scale training, 3x), on mmdet's Swin recipe
# (configs/swin/mask-rcnn_swin-t-p4-w7_fpn_ms-crop-3x_coco.py).
_base_ = [
    'mmdet::swin/mask-rcnn_swin-t-p4-w7_fpn_ms-crop-3x_coco.py',
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

# AdamW lr 1e-4, wd 0.05 from the base; no decay on norms, scales and biases (timm's rule)
optim_wrapper = dict(paramwise_cfg=dict(flat_decay_mult=0.0))
