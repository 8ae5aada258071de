_base_ = './cascade-mask-rcnn_repa_swin_t_1x_coco.py'
pretrained = 'checkpoints/repa_swin_base_in1k.pth'
model = dict(
    backbone=dict(
        arch='base', drop_path_rate=0.3, init_cfg=dict(type='Pretrained', checkpoint=pretrained)
    ),
    neck=dict(in_channels=[128, 256, 512, 1024]),
)
