_base_ = './retinanet_repa_swin_t_1x_coco.py'
pretrained = 'checkpoints/repa_swin_small_in1k.pth'
model = dict(
    backbone=dict(
        arch='small', drop_path_rate=0.3, init_cfg=dict(type='Pretrained', checkpoint=pretrained)
    )
)
