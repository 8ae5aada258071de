# Mask R-CNN 1x with a PoolFormer-S12 backbone: the PoolFormer release's detection setup (its
# detection/configs/mask_rcnn_poolformer_s12_fpn_1x_coco.py): mmdet's Mask R-CNN R-50 1x
# recipe, AdamW lr 2e-4, weight decay 1e-4.
_base_ = [
    'mmdet::mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py',
    '../_base_/models/poolformer.py',
]
custom_imports = dict(imports=['mmrepa'], allow_failed_imports=False)

# ImageNet-1k weights: timm's (poolformer_s12.sail_in1k), mmpretrain's or the release's
# poolformer_s12.pth.tar; see the README for where to get them.
pretrained = 'checkpoints/poolformer_s12.pth.tar'
model = dict(
    backbone=dict(
        _base_.poolformer_backbone,
        _delete_=True,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained),
    ),
    neck=dict(in_channels=[64, 128, 320, 512]),
)

optim_wrapper = dict(
    optimizer=dict(_delete_=True, type='AdamW', lr=0.0002, weight_decay=0.0001),
    clip_grad=None,
)
