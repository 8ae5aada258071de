# ConvFormer-S36 version of cascade-mask-rcnn_convformer_s18_ms-3x_coco.py.
_base_ = './cascade-mask-rcnn_convformer_s18_ms-3x_coco.py'

pretrained = 'checkpoints/convformer_s36.sail_in1k.pth'
model = dict(
    backbone=dict(
        arch='s36', drop_path_rate=0.3, init_cfg=dict(type='Pretrained', checkpoint=pretrained)
    ),
    neck=dict(in_channels=[64, 128, 320, 512]),
)
