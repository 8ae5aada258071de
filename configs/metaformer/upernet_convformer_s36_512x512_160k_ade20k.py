# ConvFormer-S36 version of upernet_convformer_s18_512x512_160k_ade20k.py.
_base_ = './upernet_convformer_s18_512x512_160k_ade20k.py'

pretrained = 'checkpoints/convformer_s36.sail_in1k.pth'
model = dict(
    backbone=dict(
        arch='s36', drop_path_rate=0.3, init_cfg=dict(type='Pretrained', checkpoint=pretrained)
    ),
    decode_head=dict(in_channels=[64, 128, 320, 512]),
    auxiliary_head=dict(in_channels=320),
)
