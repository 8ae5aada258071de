# UperNet 160k on ADE20K 512x512 with a PoolFormer-S12 backbone, on mmseg's Swin recipe
# (configs/swin/swin-tiny-patch4-window7-in1k-pre_upernet_8xb2-160k_ade20k-512x512.py: AdamW
# lr 6e-5, weight decay 0.01, batch 16) as the MetaFormer baselines' UperNet setup. The
# PoolFormer paper itself segments with Semantic FPN (40k iterations), which mmrepa has no
# config for.
_base_ = [
    'mmseg::swin/swin-tiny-patch4-window7-in1k-pre_upernet_8xb2-160k_ade20k-512x512.py',
    '../_base_/models/poolformer.py',
]
custom_imports = dict(imports=['mmrepa'], allow_failed_imports=False)

# ImageNet-1k weights: timm's (poolformer_s12.sail_in1k), mmpretrain's or the release's
# poolformer_s12.pth.tar; see the README for where to get them.
pretrained = 'checkpoints/poolformer_s12.pth.tar'
model = dict(
    backbone=dict(
        _base_.poolformer_backbone,
        _delete_=True,
        drop_path_rate=0.1,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained),
    ),
    decode_head=dict(in_channels=[64, 128, 320, 512]),
    auxiliary_head=dict(in_channels=320),
)

# no decay on norms, scales and biases (timm's rule)
optim_wrapper = dict(paramwise_cfg=dict(flat_decay_mult=0.0))
