# UperNet 160k on ADE20K 512x512 with a ConvFormer-S18 backbone: the MetaFormer paper's setup
# (AdamW, batch 16, 160k iterations), on mmseg's Swin recipe
# (configs/swin/swin-tiny-patch4-window7-in1k-pre_upernet_8xb2-160k_ade20k-512x512.py).
_base_ = [
    'mmseg::swin/swin-tiny-patch4-window7-in1k-pre_upernet_8xb2-160k_ade20k-512x512.py',
    '../_base_/models/metaformer.py',
]
custom_imports = dict(imports=['mmrepa'], allow_failed_imports=False)

# ImageNet-1k weights in timm's format (e.g. convformer_s18.sail_in1k) or the original
# release's; see the README for where to get them.
pretrained = 'checkpoints/convformer_s18.sail_in1k.pth'
model = dict(
    backbone=dict(
        _base_.convformer_backbone,
        _delete_=True,
        drop_path_rate=0.3,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained),
    ),
    decode_head=dict(in_channels=[64, 128, 320, 512]),
    auxiliary_head=dict(in_channels=320),
)

# AdamW lr 6e-5, wd 0.01 from the base; no decay on norms, scales and biases (timm's rule)
optim_wrapper = dict(paramwise_cfg=dict(flat_decay_mult=0.0))
