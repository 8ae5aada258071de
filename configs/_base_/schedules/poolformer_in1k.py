# The ImageNet-1k recipe of PoolFormer (the PoolFormer release's README: AdamW at
# lr = 1e-3 x batch / 1024, the drop path of each size) and of PoolFormerV2, IdentityFormer
# and RandFormer (the MetaFormer baselines paper's Table XIII: the same values): AdamW at 4e-3
# for a global batch of 4096 (32 processes x 128), weight decay 0.05, 300 epochs, 5 warm-up
# epochs, cosine decay. The rest is the MetaFormer schedule's (metaformer_in1k.py: no decay on
# norms, scales and biases; timm's minimum and warm-up learning rates, 1e-5 and 1e-6; testing
# at 224 with crop ratio 1.0). Drop path is per model.
_base_ = ['./metaformer_in1k.py']

lr = 4e-3
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-6 / lr, by_epoch=True, end=5, convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', eta_min=1e-5, by_epoch=True, begin=5),
]
