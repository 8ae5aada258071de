_base_ = './mask-rcnn_prepbn_swin_t_1x_coco.py'
pretrained = 'https://github.com/SwinTransformer/storage/releases/download/v1.0.0/swin_small_patch4_window7_224.pth'  # noqa
model = dict(
    backbone=dict(
        arch='small', drop_path_rate=0.3, init_cfg=dict(type='Pretrained', checkpoint=pretrained)
    )
)
