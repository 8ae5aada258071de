# RePa-LV-ViT-M (RePaViT 'lv-vit-m'): RePa-LV-ViT-S's recipe and head at this size; drop path
# of RePaFormer's Table 7 (the paper reports 83.6 % top-1, Table 1).
_base_ = './repa_lvvit_s_8xb128_in1k.py'

model = dict(backbone=dict(arch='lv-vit-m', drop_path_rate=0.1), head=dict(in_channels=512))
