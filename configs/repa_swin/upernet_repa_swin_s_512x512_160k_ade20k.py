_base_ = './upernet_repa_swin_t_512x512_160k_ade20k.py'
pretrained = 'checkpoints/repa_swin_small_in1k.pth'
model = dict(backbone=dict(arch='small', init_cfg=dict(type='Pretrained', checkpoint=pretrained)))
