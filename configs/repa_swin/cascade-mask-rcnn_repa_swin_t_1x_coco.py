# Cascade Mask R-CNN 1x with a RePa-Swin-T backbone: the Swin Mask R-CNN recipe of mmdet
# (AdamW, lr 1e-4, wd 0.05, 1x) on mmdet's Cascade Mask R-CNN: its
# cascade_rcnn/cascade-mask-rcnn_r50_fpn_1x_coco.py with the Swin schedule in place of
# schedule_1x.py.
_base_ = [
    'mmdet::_base_/models/cascade-mask-rcnn_r50_fpn.py',
    'mmdet::_base_/datasets/coco_instance.py',
    '../_base_/schedules/swin_adamw_1x.py',
    'mmdet::_base_/default_runtime.py',
    '../_base_/models/repa_swin.py',
]
custom_imports = dict(imports=['mmrepa'], allow_failed_imports=False)

pretrained = 'checkpoints/repa_swin_tiny_in1k.pth'
model = dict(
    backbone=dict(
        _base_.repa_swin_backbone,
        _delete_=True,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained),
    ),
    neck=dict(in_channels=[96, 192, 384, 768]),
)
