# RePa-DeiT-S (RePaViT, idle ratio 0.75) for mmdet / mmseg configs, ViTDet style: the stride-16
# map of the last block for SimpleFPN, no class token, windows of 14 tokens (the 224-px
# pretraining grid) with global attention in blocks 2, 5, 8 and 11 (ViTDet's every fourth of
# 12). Use: list this file in `_base_`, then model = dict(backbone=dict(_base_.repa_vit_backbone,
# _delete_=True, init_cfg=...)); other sizes: arch='tiny' / 'base' and SimpleFPN's in_channels.
repa_vit_backbone = dict(
    type='RePaViT',
    arch='small',
    idle_ratio=0.75,
    ffn_norm='BN',
    img_size=224,
    with_cls_token=False,
    out_type='featmap',
    out_indices=(-1,),
    window_size=14,
    global_blocks=(2, 5, 8, 11),
    drop_path_rate=0.1,
    norm_eval=True,  # detection / segmentation batches are too small to update BN statistics
)
