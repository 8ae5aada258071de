# CAFormer-M36 version of cascade-mask-rcnn_caformer_s18_ms-3x_coco.py.
_base_ = './cascade-mask-rcnn_caformer_s18_ms-3x_coco.py'

pretrained = 'checkpoints/caformer_m36.sail_in1k.pth'
model = dict(
    backbone=dict(
        arch='m36', drop_path_rate=0.4, init_cfg=dict(type='Pretrained', checkpoint=pretrained)
    ),
    neck=dict(in_channels=[96, 192, 384, 576]),
)
