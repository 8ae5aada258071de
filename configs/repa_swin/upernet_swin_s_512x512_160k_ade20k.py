# Vanilla Swin-S baseline beside upernet_repa_swin_s_512x512_160k_ade20k.py: RePaSwin with idle_ratio=0 and
# ffn_norm='LN' is exactly mmdet's SwinTransformer and reads the official Swin weights.
_base_ = './upernet_repa_swin_s_512x512_160k_ade20k.py'
pretrained = 'https://github.com/SwinTransformer/storage/releases/download/v1.0.0/swin_small_patch4_window7_224.pth'  # noqa
model = dict(
    backbone=dict(
        idle_ratio=0.0,
        ffn_norm='LN',
        norm_eval=False,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained),
    )
)
