# RetinaNet 1x with a PoolFormer-S12 backbone: the PoolFormer release's detection setup (its
# detection/configs/retinanet_poolformer_s12_fpn_1x_coco.py): mmdet's RetinaNet R-50 1x recipe,
# AdamW lr 1e-4, weight decay 1e-4, FPN on stages 2-4 with extra convs on the input (the
# release feeds it all four stages from start_level=1: the same FPN).
_base_ = [
    'mmdet::retinanet/retinanet_r50_fpn_1x_coco.py',
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
        out_indices=(1, 2, 3),
        init_cfg=dict(type='Pretrained', checkpoint=pretrained),
    ),
    neck=dict(in_channels=[128, 320, 512], start_level=0, add_extra_convs='on_input'),
)

optim_wrapper = dict(
    optimizer=dict(_delete_=True, type='AdamW', lr=0.0001, weight_decay=0.0001),
    clip_grad=None,
)
