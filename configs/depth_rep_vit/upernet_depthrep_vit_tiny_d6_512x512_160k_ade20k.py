# UperNet 160k on ADE20K 512x512 with the joined DeiT-6-R backbone (no result in the paper), the
# recipe of mmseg's ViT/DeiT UperNet configs (configs/vit/). The four levels come from ViTDet's
# simple feature pyramid on the last block's stride-16 map (mmseg's ViT configs take four
# blocks' maps through a multi-level neck instead); window 14, global blocks 2 and 5.
_base_ = [
    'mmseg::vit/vit_deit-b16_upernet_8xb2-160k_ade20k-512x512.py',
    '../_base_/models/depth_rep_vit.py',
]
custom_imports = dict(imports=['mmrepa'], allow_failed_imports=False)

pretrained = 'work_dirs/depthrep_vit_tiny_d6_8xb128_join_in1k/epoch_48.pth'
model = dict(
    pretrained=None,
    backbone=dict(
        _base_.depthrep_vit_backbone,
        _delete_=True,
        drop_path_rate=0.1,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained),
    ),
    neck=dict(_delete_=True, type='SimpleFPN', in_channels=192, out_channels=256, num_outs=4),
    decode_head=dict(in_channels=[256, 256, 256, 256], in_index=[0, 1, 2, 3]),
    auxiliary_head=dict(in_channels=256, in_index=2),
)
