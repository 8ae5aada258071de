# RetinaNet 1x with the joined DeiT-6-R backbone and ViTDet's simple feature pyramid (no result
# in the paper). The pyramid makes strides 8-32 from the stride-16 map and two more levels by
# pooling, the strides RetinaNet's anchors expect (8-128). AdamW as the Mask R-CNN config
# (mask-rcnn_depthrep_vit_tiny_d6_lsj-100e_coco.py); mmdet's 1x data and steps otherwise.
_base_ = [
    'mmdet::retinanet/retinanet_r50_fpn_1x_coco.py',
    '../_base_/models/depth_rep_vit.py',
]
custom_imports = dict(imports=['mmrepa'], allow_failed_imports=False)

pretrained = 'work_dirs/depthrep_vit_tiny_d6_8xb128_join_in1k/epoch_48.pth'
model = dict(
    backbone=dict(
        _base_.depthrep_vit_backbone,
        _delete_=True,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained),
    ),
    neck=dict(
        _delete_=True,
        type='SimpleFPN',
        in_channels=192,
        out_channels=256,
        num_outs=5,
        scale_factors=(2.0, 1.0, 0.5),
    ),
)
optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.05),
    paramwise_cfg=dict(
        norm_decay_mult=0.0, bias_decay_mult=0.0, custom_keys={'pos_embed': dict(decay_mult=0.0)}
    ),
)
