_base_ = './upernet_repa_swin_t_512x512_160k_ade20k.py'
pretrained = 'checkpoints/repa_swin_base_in1k.pth'
model = dict(
    backbone=dict(arch='base', init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    decode_head=dict(in_channels=[128, 256, 512, 1024]),
    auxiliary_head=dict(in_channels=512),
)
