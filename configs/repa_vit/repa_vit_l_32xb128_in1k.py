# RePa-ViT-L (RePaViT 'large': 24 blocks of 1024 channels, 16 x 16 patches, idle ratio 0.75,
# BatchNorm FFN) on ImageNet-1k. RePaFormer reports it in Table 1 (82.0 % top-1 after folding)
# but gives no recipe for it (its Table 7 stops at DeiT-B): RePa-DeiT-B's, LAMB at batch 4096,
# 300 epochs, its learning rate, minimum, weight decay and drop path. Not trained by us.
_base_ = './repa_deit_b_32xb128_in1k.py'

model = dict(backbone=dict(arch='large'), head=dict(in_channels=1024))
