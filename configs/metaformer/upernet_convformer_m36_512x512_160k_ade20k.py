# ConvFormer-M36 version of upernet_convformer_s18_512x512_160k_ade20k.py.
_base_ = './upernet_convformer_s18_512x512_160k_ade20k.py'

pretrained = 'checkpoints/convformer_m36.sail_in1k.pth'
model = dict(
    backbone=dict(
        arch='m36', drop_path_rate=0.4, init_cfg=dict(type='Pretrained', checkpoint=pretrained)
    ),
    decode_head=dict(in_channels=[96, 192, 384, 576]),
    auxiliary_head=dict(in_channels=384),
)
