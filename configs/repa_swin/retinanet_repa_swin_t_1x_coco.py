# RetinaNet 1x with a RePa-Swin-T backbone (idle ratio 0.75), recipe of mmdet's
# configs/swin/retinanet_swin-t-p4-w7_fpn_1x_coco.py.
_base_ = [
    'mmdet::retinanet/retinanet_r50_fpn_1x_coco.py',
    '../_base_/models/repa_swin.py',
]
custom_imports = dict(imports=['mmrepa'], allow_failed_imports=False)

# ImageNet-1k RePa-Swin weights (RePaViT release, or any Swin checkpoint layout mmrepa reads).
pretrained = 'checkpoints/repa_swin_tiny_in1k.pth'
model = dict(
    backbone=dict(
        _base_.repa_swin_backbone,
        _delete_=True,
        out_indices=(1, 2, 3),  # only what the FPN uses
        init_cfg=dict(type='Pretrained', checkpoint=pretrained),
    ),
    neck=dict(in_channels=[192, 384, 768], start_level=0, num_outs=5),
)

optim_wrapper = dict(optimizer=dict(lr=0.01))
