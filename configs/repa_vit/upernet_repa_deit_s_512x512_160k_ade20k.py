# UperNet 160k on ADE20K 512x512 with RePa-DeiT-S, the recipe of mmseg's ViT/DeiT UperNet configs
# (configs/vit/; RePaFormer fine-tunes with "the configurations from MMSegmentation", §5.1).
# The four levels come from ViTDet's simple feature pyramid on the last block's stride-16 map
# (mmseg's ViT configs take four blocks' maps through a multi-level neck instead); windows of
# 14 with global blocks 2, 5, 8, 11; BatchNorms frozen. No result in the paper.
_base_ = [
    'mmseg::vit/vit_deit-s16_upernet_8xb2-160k_ade20k-512x512.py',
    '../_base_/models/repa_vit.py',
]
custom_imports = dict(imports=['mmrepa'], allow_failed_imports=False)

pretrained = 'work_dirs/repa_deit_s_32xb128_in1k/epoch_300.pth'
model = dict(
    pretrained=None,
    backbone=dict(
        _base_.repa_vit_backbone,
        _delete_=True,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained),
    ),
    neck=dict(_delete_=True, type='SimpleFPN', in_channels=384, out_channels=256, num_outs=4),
    decode_head=dict(in_channels=[256, 256, 256, 256], in_index=[0, 1, 2, 3]),
    auxiliary_head=dict(in_channels=256, in_index=2),
)
