# Cascade Mask R-CNN 1x with a RePa-Swin-T backbone: the Swin Mask R-CNN recipe of mmdet
# (AdamW, lr 1e-4, wd 0.05, 1x) on mmdet's Cascade Mask R-CNN: its
# cascade_rcnn/cascade-mask-rcnn_r50_fpn_1x_coco.py with the Swin schedule in place of
# schedule_1x.py.
_base_ = [
    'mmdet::_base_/models/cascade-mask-rcnn_r50_fpn.py',
    'mmdet::_base_/datasets/coco_instance.py',
    '../_base_/schedules/swin_adamw_1x.py',
    'mmdet::_base_/default_runtime.py',
]
custom_imports = dict(imports=['mmrepa'], allow_failed_imports=False)

pretrained = 'checkpoints/repa_swin_tiny_in1k.pth'
model = dict(
    backbone=dict(
        _delete_=True,
        type='RePaSwin',
        arch='tiny',
        idle_ratio=0.75,
        ffn_norm='BN',
        drop_path_rate=0.2,
        out_indices=(0, 1, 2, 3),
        norm_eval=True,
        with_cp=False,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained),
    ),
    neck=dict(in_channels=[96, 192, 384, 768]),
)
